//! The SQL stores beside Redis, in one run (`coord-bench --sql`): the
//! latency and round trips of each call at concurrency 1, and the rates of
//! lock pairs and rate-limit checks at 64 tasks, on Redis, PostgreSQL and a
//! SQLite file; beside them, what a PostgreSQL user picks instead of a lock
//! (`pg_try_advisory_lock` + `pg_advisory_unlock`), the round-trip floor
//! of each server (a Redis `PING`, a PostgreSQL `SELECT 1`), and a durable
//! write's on PostgreSQL (a one-row `UPDATE`, with and without a `NOTIFY`,
//! and relaxed: `synchronous_commit = off`). coord's PostgreSQL calls run
//! again with the table's durability relaxed.
//!
//! Last, a lock handed from its holder to a waiter on another backend (as
//! on another host, or in another process on the SQLite file), and on the
//! same one.
//!
//! The PostgreSQL references run on a pool of the same size as the
//! backend's, and send their statements the way the backend does (typed,
//! unnamed: one round trip each, nothing prepared).

use std::sync::Arc;
use std::time::Instant;

use coord_host::Runtime;
use coord_host::backend::Backend;
use coord_postgres::PostgresBackend;
use coord_redis::RedisBackend;
use coord_sqlite::SqliteBackend;
use deadpool_postgres::Pool;
use tokio_postgres::types::Type;

use crate::Effort;
use crate::measure::{Stats, Step, failed, fmt_us};
use crate::ops::{Op, PingStep, component_op, component_rate, one_handoff, run_tasks};
use crate::side_by_side::{Store, extend};

/// `SELECT 1` on a pooled connection: the PostgreSQL round-trip floor.
struct SelectOne(Pool);

impl Step for SelectOne {
    async fn step(&mut self) -> wasmtime::Result<()> {
        let client = self.0.get().await.map_err(|e| failed(&e.to_string()))?;
        client
            .query_typed("SELECT 1", &[])
            .await
            .map_err(|e| failed(&e.to_string()))?;
        Ok(())
    }
}

/// PostgreSQL's own lock on key `.1`: `pg_try_advisory_lock`, then
/// `pg_advisory_unlock` on the same session (the lock belongs to it).
struct AdvisoryPair(Pool, i64);

impl Step for AdvisoryPair {
    async fn step(&mut self) -> wasmtime::Result<()> {
        let client = self.0.get().await.map_err(|e| failed(&e.to_string()))?;
        let key = || {
            (
                &self.1 as &(dyn tokio_postgres::types::ToSql + Sync),
                Type::INT8,
            )
        };
        let taken: bool = client
            .query_typed("SELECT pg_try_advisory_lock($1)", &[key()])
            .await
            .map_err(|e| failed(&e.to_string()))?
            .first()
            .ok_or_else(|| failed("no row"))?
            .get(0);
        if !taken {
            return Err(failed("the advisory lock was taken"));
        }
        client
            .query_typed("SELECT pg_advisory_unlock($1)", &[key()])
            .await
            .map_err(|e| failed(&e.to_string()))?;
        Ok(())
    }
}

/// A write on PostgreSQL, one statement: `UPDATE` of row `.2` of table
/// `.1`; with `.3`, with a `NOTIFY` in the same statement, as coord's
/// writes that a waiter waits for. Durable (flushed to disk before it
/// answers) unless `.4`: then with `synchronous_commit = off` for its own
/// transaction, set as coord's relaxed writes set it.
struct UpdateRow(Pool, Arc<str>, i64, bool, bool);

impl Step for UpdateRow {
    async fn step(&mut self) -> wasmtime::Result<()> {
        let client = self.0.get().await.map_err(|e| failed(&e.to_string()))?;
        let relaxed = if self.4 {
            " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
        } else {
            ""
        };
        let update = format!("UPDATE {} SET v = v + 1 WHERE id = $1{relaxed}", self.1);
        let sql = if self.3 {
            format!(
                "WITH w AS ({update} RETURNING id) SELECT pg_notify('{}', 'x') FROM w",
                self.1
            )
        } else {
            update
        };
        let id = (
            &self.2 as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::INT8,
        );
        client
            .query_typed(&sql, &[id])
            .await
            .map_err(|e| failed(&e.to_string()))?;
        Ok(())
    }
}

/// Set the durability of `postgres`'s table, as an operator would.
async fn set_durability(
    pool: &Pool,
    postgres: &PostgresBackend,
    mode: &str,
) -> wasmtime::Result<()> {
    pool.get()
        .await
        .map_err(|e| failed(&e.to_string()))?
        .batch_execute(&format!(
            "UPDATE {}_settings SET durability = '{mode}'",
            postgres.table()
        ))
        .await
        .map_err(|e| failed(&e.to_string()))
}

/// Time `reps` steps of `step`.
async fn time_steps(step: &mut impl Step, reps: usize) -> wasmtime::Result<Stats> {
    let mut samples = Stats::default();
    for _ in 0..reps {
        let start = Instant::now();
        step.step().await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// The comparison's three tables. `pool` is a pool on the same server as
/// `postgres`, of the backend's size, for the references; `others` are a
/// second backend on each store (Redis, PostgreSQL, the SQLite file), for
/// the handoffs.
pub async fn compare(
    redis: Arc<RedisBackend>,
    postgres: Arc<PostgresBackend>,
    pool: Pool,
    sqlite: Arc<SqliteBackend>,
    others: [Arc<dyn Backend>; 3],
    effort: Effort,
) -> wasmtime::Result<()> {
    let (r, p) = (redis.clone(), postgres.clone());
    let mut stores = [
        Store::new(redis.clone(), Box::new(move || r.round_trips())).await?,
        Store::new(postgres.clone(), Box::new(move || p.round_trips())).await?,
        // A file has no round trips: its count stays 0.
        Store::new(sqlite.clone(), Box::new(|| 0)).await?,
    ];

    println!("The SQL stores beside Redis, concurrency 1 (p50 µs; store round trips per call)");
    println!(
        "  {:<30} {:>8} {:>6} {:>10} {:>6} {:>8} {:>9}",
        "operation", "Redis", "trips", "PostgreSQL", "trips", "SQLite", "PG/Redis"
    );
    let row = |name: &str, figures: [(Option<Stats>, f64); 3]| {
        let cell = |s: &Option<Stats>| s.as_ref().map_or("-".into(), |s| fmt_us(s.median()));
        let trips = |(s, t): &(Option<Stats>, f64)| {
            if s.is_some() {
                format!("{t:.2}")
            } else {
                "-".into()
            }
        };
        let ratio = match (&figures[0].0, &figures[1].0) {
            (Some(redis), Some(pg)) => {
                format!(
                    "{:.2}",
                    pg.median().as_secs_f64() / redis.median().as_secs_f64()
                )
            }
            _ => "-".into(),
        };
        println!(
            "  {name:<30} {:>8} {:>6} {:>10} {:>6} {:>8} {ratio:>9}",
            cell(&figures[0].0),
            trips(&figures[0]),
            cell(&figures[1].0),
            trips(&figures[1]),
            cell(&figures[2].0),
        );
    };
    let reps = effort.reps;
    for (op, name, fresh) in [
        (Op::AcquireRelease, "lock pair (key seen)", false),
        (Op::AcquireRelease, "lock pair (key new)", true),
        (Op::Check, "rate-limit check", false),
    ] {
        let run = std::process::id();
        for rep in 0..reps {
            let key = if fresh {
                format!("{run}-{name}-{rep}")
            } else {
                format!("k{}", rep % 10)
            };
            for store in stores.iter_mut() {
                // Warm each key once, untimed, so "seen" means seen.
                if !fresh && rep < 10 {
                    component_op(op, &mut store.instance, &key).await?;
                }
                store.time(op, &key).await?;
            }
        }
        let [a, b, c] = stores.each_mut().map(|s| {
            let (stats, trips) = s.take(reps);
            (Some(stats), trips)
        });
        row(name, [a, b, c]);
    }
    let mut extends = Vec::new();
    for store in stores.iter_mut() {
        let (stats, trips) = extend(store, reps).await?;
        extends.push((Some(stats), trips));
    }
    let [a, b, c]: [_; 3] = extends.try_into().map_err(|_| failed("three stores"))?;
    row("lock extend (back to back)", [a, b, c]);
    let advisory = time_steps(&mut AdvisoryPair(pool.clone(), 1), reps).await?;
    row(
        "advisory lock pair (PG's own)",
        [(None, 0.0), (Some(advisory), 2.0), (None, 0.0)],
    );
    let refs: Arc<str> = format!("coordbench_{}_refs", std::process::id()).into();
    pool.get()
        .await
        .map_err(|e| failed(&e.to_string()))?
        .batch_execute(&format!(
            "CREATE TABLE {refs} (id bigint PRIMARY KEY, v bigint NOT NULL); \
             INSERT INTO {refs} SELECT g, 0 FROM generate_series(0, 64) g"
        ))
        .await
        .map_err(|e| failed(&e.to_string()))?;
    let write = time_steps(
        &mut UpdateRow(pool.clone(), refs.clone(), 0, false, false),
        reps,
    )
    .await?;
    row(
        "a durable UPDATE (write limit)",
        [(None, 0.0), (Some(write), 1.0), (None, 0.0)],
    );
    let notify = time_steps(
        &mut UpdateRow(pool.clone(), refs.clone(), 0, true, false),
        reps,
    )
    .await?;
    row(
        "the UPDATE with a NOTIFY",
        [(None, 0.0), (Some(notify), 1.0), (None, 0.0)],
    );
    let relaxed_write = time_steps(
        &mut UpdateRow(pool.clone(), refs.clone(), 0, false, true),
        reps,
    )
    .await?;
    row(
        "the UPDATE, relaxed",
        [(None, 0.0), (Some(relaxed_write), 1.0), (None, 0.0)],
    );
    // coord's calls again with the table relaxed (synchronous_commit = off
    // for its writes), PostgreSQL only.
    set_durability(&pool, &postgres, "relaxed").await?;
    for (op, name) in [
        (Op::AcquireRelease, "lock pair (seen), relaxed"),
        (Op::Check, "rate-limit check, relaxed"),
    ] {
        let store = &mut stores[1];
        for rep in 0..reps {
            store.time(op, &format!("k{}", rep % 10)).await?;
        }
        let (stats, trips) = store.take(reps);
        row(name, [(None, 0.0), (Some(stats), trips), (None, 0.0)]);
    }
    set_durability(&pool, &postgres, "durable").await?;
    let ping = time_steps(&mut PingStep(redis.clone()), reps).await?;
    let select = time_steps(&mut SelectOne(pool.clone()), reps).await?;
    row(
        "bare round trip (the limit)",
        [(Some(ping), 1.0), (Some(select), 1.0), (None, 0.0)],
    );
    println!();

    const TASKS: usize = 64;
    println!("The SQL stores beside Redis, {TASKS} tasks (each its own instance and key)");
    println!(
        "  {:<30} {:>10} {:>12} {:>10} {:>9}",
        "operation", "Redis/s", "PostgreSQL/s", "SQLite/s", "PG/Redis"
    );
    for (op, name) in [
        (Op::AcquireRelease, "lock pair"),
        (Op::Check, "rate-limit check"),
    ] {
        let mut rates = Vec::new();
        for store in &stores {
            let (_, rate) = component_rate(&store.runtime, op, TASKS, effort.per_task).await?;
            rates.push(rate);
        }
        println!(
            "  {name:<30} {:>10.0} {:>12.0} {:>10.0} {:>9.2}",
            rates[0],
            rates[1],
            rates[2],
            rates[1] / rates[0]
        );
    }
    set_durability(&pool, &postgres, "relaxed").await?;
    for (op, name) in [
        (Op::AcquireRelease, "lock pair, relaxed"),
        (Op::Check, "rate-limit check, relaxed"),
    ] {
        let (_, rate) = component_rate(&stores[1].runtime, op, TASKS, effort.per_task).await?;
        println!(
            "  {name:<30} {:>10} {rate:>12.0} {:>10} {:>9}",
            "-", "-", "-"
        );
    }
    set_durability(&pool, &postgres, "durable").await?;
    let (_, advisory_rate) = run_tasks(TASKS, effort.per_task, |t| {
        let pool = pool.clone();
        async move { Ok(AdvisoryPair(pool, t as i64 + 1)) }
    })
    .await?;
    println!(
        "  {:<30} {:>10} {advisory_rate:>12.0} {:>10} {:>9}",
        "advisory lock pair (PG's own)", "-", "-", "-"
    );
    for (notify, relaxed, name) in [
        (false, false, "a durable UPDATE (write limit)"),
        (true, false, "the UPDATE with a NOTIFY"),
        (false, true, "the UPDATE, relaxed"),
    ] {
        let (_, rate) = run_tasks(TASKS, effort.per_task, |t| {
            let (pool, refs) = (pool.clone(), refs.clone());
            async move { Ok(UpdateRow(pool, refs, t as i64 + 1, notify, relaxed)) }
        })
        .await?;
        println!(
            "  {name:<30} {:>10} {rate:>12.0} {:>10} {:>9}",
            "-", "-", "-"
        );
    }
    if let Ok(client) = pool.get().await {
        let _ = client.batch_execute(&format!("DROP TABLE {refs}")).await;
    }
    let (_, ping_rate) = run_tasks(TASKS, effort.per_task, |_| {
        let redis = redis.clone();
        async move { Ok(PingStep(redis)) }
    })
    .await?;
    let (_, select_rate) = run_tasks(TASKS, effort.per_task, |_| {
        let pool = pool.clone();
        async move { Ok(SelectOne(pool)) }
    })
    .await?;
    println!(
        "  {:<30} {ping_rate:>10.0} {select_rate:>12.0} {:>10} {:>9.2}",
        "bare round trip (the limit)",
        "-",
        select_rate / ping_rate
    );
    println!();

    println!(
        "Lock handoff: release → the waiter holds it (p50 / p99 µs, {} handoffs each)",
        effort.handoffs
    );
    let names = ["Redis", "PostgreSQL", "SQLite file"];
    for ((store, other), name) in stores.iter_mut().zip(others).zip(names) {
        let apart = Arc::new(Runtime::new(other)?);
        let (mut same, mut elsewhere) = (Stats::default(), Stats::default());
        let run = std::process::id();
        for n in 0..effort.handoffs {
            let resource = format!("{run}-handoff-{n}");
            same.push(one_handoff(&mut store.instance, &store.runtime, &resource, false, n).await?);
            let resource = format!("{run}-handoff-apart-{n}");
            elsewhere.push(one_handoff(&mut store.instance, &apart, &resource, false, n).await?);
        }
        println!(
            "  {name:<12} waiter on the same backend {:>9} / {:>9}   on another {:>9} / {:>9}",
            fmt_us(same.median()),
            fmt_us(same.p99()),
            fmt_us(elsewhere.median()),
            fmt_us(elsewhere.p99()),
        );
    }
    println!();
    Ok(())
}
