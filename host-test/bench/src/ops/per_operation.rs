//! Each operation alone, one task: the component, the native path and the
//! references (a bare Redis lock, a fenced Lua lock, coord's commands
//! alone) in the same loop, and the store round trips each costs.

use std::sync::Arc;
use std::time::Instant;

use coord_component::keys;
use coord_host::backend::{Backend, Condition, Guard, Outcome};
use coord_host::lock::{AcquireOutcome, ExtendOutcome};
use coord_host::{Instance, Runtime};
use coord_redis::RedisBackend;

use super::{LOCK_ID, OPS, Op, component_op, native_extend, native_op, no_wait, space};
use crate::Effort;
use crate::measure::{Stats, failed, fmt_us};

/// The per-operation table at concurrency 1. Each repetition runs the
/// component's operation, the native one and (on Redis) a PING back to back,
/// so all three columns see the same moments of a shared, drifting VM.
pub async fn per_operation(
    label: &str,
    backend: Arc<dyn Backend>,
    redis: Option<(Arc<RedisBackend>, String)>,
    effort: Effort,
) -> wasmtime::Result<()> {
    let runtime = Runtime::new(backend.clone())?;
    let mut i = runtime.instantiate().await?;
    for k in 0..100 {
        component_op(Op::Upsert, &mut i, &format!("k{k}")).await?;
        i.ephemeral()
            .upsert(
                &space(),
                "bench-100",
                &format!("k{k}"),
                b"{\"user\":\"ada\"}",
            )
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?;
    }
    println!("Per operation, {label}, concurrency 1 (p50 µs)");
    if redis.is_some() {
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7}",
            "operation",
            "component",
            "native",
            "ratio",
            "PING",
            "×PING c",
            "×PING n",
            "calls",
            "trips"
        );
    } else {
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7}",
            "operation", "component", "native", "ratio", "calls"
        );
    }
    let redis_backend = redis.as_ref().map(|r| r.0.clone());
    for op in OPS {
        let row = match op {
            Op::Extend => {
                time_extend(&mut i, backend.as_ref(), redis_backend.as_ref(), effort).await?
            }
            Op::Acquire => time_acquire(&mut i, backend.as_ref(), &redis_backend, effort).await?,
            _ => time_op(op, &mut i, backend.as_ref(), &redis_backend, effort.reps).await?,
        };
        let name = match op {
            Op::AcquireRelease => "acquire+release",
            Op::PermitPair => "permit pair",
            Op::Acquire => "acquire alone",
            Op::Extend => "extend",
            Op::Check => "ratelimit check",
            Op::Upsert => "upsert",
            Op::Touch => "touch",
            Op::Snapshot100 => "snapshot of 100",
        };
        row.print(name, effort.reps, redis.is_some());
    }
    if let Some((_, url)) = &redis {
        references(url, effort).await?;
    }
    println!();
    Ok(())
}

/// `op` `reps` times on keys `k0`…`k99`, through instance `i` and natively
/// on `backend` in turns, each followed by a PING on Redis: a row of the
/// per-operation table, with the store calls and round trips counted.
pub(crate) async fn time_op(
    op: Op,
    i: &mut Instance,
    backend: &dyn Backend,
    redis: &Option<Arc<RedisBackend>>,
    reps: usize,
) -> wasmtime::Result<Row> {
    let mut row = Row::default();
    for n in 0..reps {
        let key = format!("k{}", n % 100);
        let (calls0, trips0) = (i.store_calls(), trips(redis));
        let start = Instant::now();
        component_op(op, i, &key).await?;
        row.component.push(start.elapsed());
        row.calls += i.store_calls() - calls0;
        row.trips += trips(redis) - trips0;

        let start = Instant::now();
        native_op(op, backend, &key).await?;
        row.native.push(start.elapsed());
        row.ping(redis).await?;
    }
    Ok(row)
}

/// One row of the per-operation table: samples and counters.
#[derive(Default)]
pub(crate) struct Row {
    pub(crate) component: Stats,
    pub(crate) native: Stats,
    pub(crate) pings: Stats,
    pub(crate) calls: u64,
    pub(crate) trips: u64,
}

impl Row {
    /// One PING on `redis`, timed, when the row is on Redis.
    pub(crate) async fn ping(&mut self, redis: &Option<Arc<RedisBackend>>) -> wasmtime::Result<()> {
        if let Some(r) = redis {
            let start = Instant::now();
            r.ping().await.map_err(|e| failed(&format!("{e:?}")))?;
            self.pings.push(start.elapsed());
        }
        Ok(())
    }

    pub(crate) fn print(&self, name: &str, reps: usize, on_redis: bool) {
        let (c, n) = (self.component.median(), self.native.median());
        let ratio = c.as_secs_f64() / n.as_secs_f64();
        let calls = self.calls as f64 / reps as f64;
        let trips = self.trips as f64 / reps as f64;
        if on_redis {
            let p = self.pings.median().as_secs_f64();
            let (cp, np) = (c.as_secs_f64() / p, n.as_secs_f64() / p);
            println!(
                "  {name:<16} {:>10} {:>8} {ratio:>7.2}× {:>7} {cp:>7.2}× {np:>7.2}× {calls:>7.2} {trips:>7.2}",
                fmt_us(c),
                fmt_us(n),
                fmt_us(self.pings.median())
            );
        } else {
            println!(
                "  {name:<16} {:>10} {:>8} {ratio:>7.2}× {calls:>7.2}",
                fmt_us(c),
                fmt_us(n)
            );
        }
    }
}

/// Requests sent to Redis so far, or 0 in memory.
pub(crate) fn trips(redis: &Option<Arc<RedisBackend>>) -> u64 {
    redis.as_ref().map_or(0, |r| r.round_trips())
}

/// Three reference locks and a reference check on Redis, on a connection of
/// their own, each timed in turns with the others and with a PING:
///
/// - the lock the target was set against: seed 000's bare Redis lock
///   (`SET key owner NX PX ttl`, then a compare-and-delete script), with no
///   fence, no change feed and no expiry record;
/// - the least a fenced Lua lock needs: the holder, its expiry and a fence
///   (seeded from the clock, as coord's revisions are) in one hash, read and
///   written by one script each way (`TIME`, `HMGET`, `HSET`; then `HGET`,
///   `HDEL`). It is coord's lock without the change feed, the expiry index
///   and the notification, and it tells what a lock partition without them
///   could reach at best;
/// - coord's own commands with none of its logic: the Redis commands the
///   unwatched partition's script issues for a lock's acquire and release
///   while nobody waits (`TIME`, `GET`, `SET PX`, each way), in order and
///   with values of the same sizes, on the partition's one key. The gap
///   between it and coord's lock is the script's own work; what it costs is
///   the layout's;
/// - the rate-limit check's commands with none of the meter script's logic
///   (`TIME`, `GET`, `SET PX`, with a state and a reply of the meter's
///   sizes): the least any one-script check that keeps its state in one key
///   costs, and the gap to the native check is the meter script's own work.
pub(crate) async fn references(url: &str, effort: Effort) -> wasmtime::Result<()> {
    let err = |e: ::redis::RedisError| failed(&format!("{e:?}"));
    let client = ::redis::Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let bare_release = ::redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let fenced_acquire = ::redis::Script::new(FENCED_ACQUIRE);
    let fenced_release = ::redis::Script::new(FENCED_RELEASE);
    let bare_key = format!("coordbench-bare-{}", std::process::id());
    let fenced_key = format!("coordbench-fenced-{}", std::process::id());
    let commands_acquire = ::redis::Script::new(COMMANDS_ACQUIRE);
    let commands_release = ::redis::Script::new(COMMANDS_RELEASE);
    let commands_key = format!("coordbench-commands-{{{}}}:s", std::process::id());
    // The check's one key, which its script sets with a TTL.
    let check_key = format!("coordbench-check-{}", std::process::id());
    let commands_check = ::redis::Script::new(COMMANDS_CHECK);
    let mut commands_check_call = commands_check.key(&check_key);
    // A meter's state and its reply are 33 bytes each.
    commands_check_call.arg("s".repeat(33)).arg("r".repeat(33));
    // The sizes of a lock's partition with its holder (an 18-byte header, a
    // 36-byte entry header, the key and the 32-byte owner) and without.
    let (with_holder, without) = ("h".repeat(92), "n".repeat(18));
    let owner = "0123456789abcdef0123456789abcdef";
    let (mut bare, mut fenced, mut commands, mut check, mut pings) = (
        Stats::default(),
        Stats::default(),
        Stats::default(),
        Stats::default(),
        Stats::default(),
    );
    // The hash keeps its fence between holders, and this TTL (set once, not
    // by the scripts) lets Redis drop it should the run stop half-way.
    let _: () = ::redis::pipe()
        .hset(&fenced_key, "fence", 0)
        .ignore()
        .pexpire(&fenced_key, 600_000)
        .ignore()
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    // Both take the same key and arguments on every pair.
    let [mut commands_acquire_call, mut commands_release_call] =
        [&commands_acquire, &commands_release].map(|script| script.key(&commands_key));
    for call in [&mut commands_acquire_call, &mut commands_release_call] {
        call.arg(&with_holder).arg(&without);
    }
    let mut last_fence = 0;
    for _ in 0..effort.reps {
        let start = Instant::now();
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&bare_key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        let deleted: i64 = bare_release
            .key(&bare_key)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        bare.push(start.elapsed());
        if set.is_none() || deleted != 1 {
            return Err(failed("the bare lock was not taken and released"));
        }

        let start = Instant::now();
        let fence: i64 = fenced_acquire
            .key(&fenced_key)
            .arg(owner)
            .arg(30_000)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        let released: i64 = fenced_release
            .key(&fenced_key)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        fenced.push(start.elapsed());
        if fence <= last_fence || released != 1 {
            return Err(failed(
                "the fenced lock was not taken with a new fence and released",
            ));
        }
        last_fence = fence;

        let start = Instant::now();
        let written: i64 = commands_acquire_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        let deleted: i64 = commands_release_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        commands.push(start.elapsed());
        if written != 1 || deleted != 1 {
            return Err(failed(
                "coord's commands did not write and delete the holder",
            ));
        }

        let start = Instant::now();
        let reply: Vec<u8> = commands_check_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        check.push(start.elapsed());
        if reply.len() != 33 {
            return Err(failed("the check's commands did not answer its reply"));
        }

        let start = Instant::now();
        let _: String = ::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        pings.push(start.elapsed());
    }
    let _: i64 = ::redis::cmd("DEL")
        .arg(&fenced_key)
        .arg(&commands_key)
        .arg(&check_key)
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    let p = pings.median();
    // Their round trips are not counted: by construction two per lock pair
    // and one per check.
    for (name, pair) in [
        ("bare SET NX lock", &bare),
        ("fenced Lua lock", &fenced),
        ("coord's commands", &commands),
        ("check's commands", &check),
    ] {
        let c = pair.median();
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7} {:>8} {:>7.2}× {:>7} {:>7}",
            name,
            "—",
            fmt_us(c),
            "—",
            fmt_us(p),
            "—",
            c.as_secs_f64() / p.as_secs_f64(),
            "—",
            "—"
        );
    }
    Ok(())
}

/// The fenced reference lock's acquire (its header says what it takes).
pub(crate) const FENCED_ACQUIRE: &str = include_str!("../../scripts/fenced-acquire.lua");

/// The fenced reference lock's release.
pub(crate) const FENCED_RELEASE: &str = include_str!("../../scripts/fenced-release.lua");

/// coord's lock commands without its logic, acquire (its header says more).
pub(crate) const COMMANDS_ACQUIRE: &str = include_str!("../../scripts/commands-acquire.lua");

/// coord's lock commands without its logic, release.
pub(crate) const COMMANDS_RELEASE: &str = include_str!("../../scripts/commands-release.lua");

/// The rate-limit check's commands without the meter script's logic.
pub(crate) const COMMANDS_CHECK: &str = include_str!("../../scripts/commands-check.lua");

/// Acquire alone, interleaved like the other rows: each lock is released
/// outside the timed part, so the row is the cost of one acquire.
pub(crate) async fn time_acquire(
    i: &mut Instance,
    b: &dyn Backend,
    redis: &Option<Arc<RedisBackend>>,
    effort: Effort,
) -> wasmtime::Result<Row> {
    let err = |e| failed(&format!("{e:?}"));
    let mut row = Row::default();
    for n in 0..effort.reps {
        let resource = format!("k{}", n % 100);
        let (calls0, trips0) = (i.store_calls(), trips(redis));
        let start = Instant::now();
        let AcquireOutcome::Acquired(lock) = i
            .lock()
            .acquire(LOCK_ID, &resource, no_wait())
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        else {
            return Err(failed("busy"));
        };
        row.component.push(start.elapsed());
        row.calls += i.store_calls() - calls0;
        row.trips += trips(redis) - trips0;
        i.lock()
            .release(&lock)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?;

        let partition = keys::lock_partition(LOCK_ID, &resource);
        let start = Instant::now();
        let guard = native_acquire(b, &partition).await?;
        row.native.push(start.elapsed());
        b.delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
            .await
            .map_err(err)?;
        row.ping(redis).await?;
    }
    Ok(row)
}

/// Extend, interleaved like the other rows: the component extends its held
/// lock, then the same touch runs natively on a lock of its own.
pub(crate) async fn time_extend(
    i: &mut Instance,
    b: &dyn Backend,
    redis: Option<&Arc<RedisBackend>>,
    effort: Effort,
) -> wasmtime::Result<Row> {
    let redis = redis.cloned();
    let AcquireOutcome::Acquired(mut lock) = i
        .lock()
        .acquire(LOCK_ID, "extend-me", no_wait())
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?
    else {
        return Err(failed("busy"));
    };
    let partition = keys::lock_partition(LOCK_ID, "extend-native");
    let err = |e| failed(&format!("{e:?}"));
    let guard = native_acquire(b, &partition).await?;
    let mut row = Row::default();
    for _ in 0..effort.reps {
        let (calls0, trips0) = (i.store_calls(), trips(&redis));
        let start = Instant::now();
        let ExtendOutcome::Extended(next) = i
            .lock()
            .extend(&lock, None)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        else {
            return Err(failed("lost"));
        };
        row.component.push(start.elapsed());
        row.calls += i.store_calls() - calls0;
        row.trips += trips(&redis) - trips0;
        lock = next;

        let start = Instant::now();
        native_extend(b, &partition, &guard).await?;
        row.native.push(start.elapsed());
        row.ping(&redis).await?;
    }
    i.lock()
        .release(&lock)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    b.delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
        .await
        .map_err(err)?;
    Ok(row)
}

/// A lock acquired natively, as the component would: create-if-absent with a
/// TTL; the condition that only this holder satisfies.
pub(crate) async fn native_acquire(
    b: &dyn Backend,
    partition: &str,
) -> wasmtime::Result<Condition> {
    let owner = b"0123456789abcdef0123456789abcdef";
    let reply = b
        .put(
            partition,
            keys::LOCK_HOLDER_KEY,
            owner,
            Some(30_000),
            &Condition::Absent,
        )
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    let Outcome::Applied(entry) = reply.outcome else {
        return Err(failed("busy"));
    };
    Ok(Condition::RevisionAndValue(Guard {
        revision: entry.revision,
        value: owner.to_vec(),
    }))
}
