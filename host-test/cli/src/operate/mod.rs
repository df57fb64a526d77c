//! Operator commands: see and change what functions see, through the
//! component, on the store a `coord serve` uses — etcd's `etcdctl lock`,
//! for coord. A table for people, `--json` for scripts.
//!
//! Whatever clients wrote is printed escaped (`crate::terminal`); every
//! error is a sentence naming the argument; a store that does not answer
//! is given up on after [`STORE_BOUND`].

use std::borrow::Cow;
use std::future::Future;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use coord_component::keys;
use coord_host::backend::Backend;
use coord_host::ephemeral::{Event, Space};
use coord_host::lock::{HeldLock, Holder};
use coord_host::ratelimit::{Decision, Limiter};
use coord_host::{Instance, Runtime};
use serde_json::json;

use crate::terminal::{json_line, text, value_field};
use crate::{StoreArgs, Target, backend_for, store_failure};

mod rwlock;
mod semaphore;
pub use rwlock::{RwLockCommand, rwlock};
pub use semaphore::{SemaphoreCommand, semaphore};

/// `coord lock …`
#[derive(Subcommand)]
pub enum LockCommand {
    /// Who holds the lock ID RESOURCE: its fence and remaining time.
    Inspect {
        /// The lock's id (what kind: `inventory.stock`).
        id: String,
        /// The lock's resource (which thing: `item:42`).
        resource: String,
        #[command(flatten)]
        common: Common,
    },
    /// Free the lock ID RESOURCE whoever holds it (a holder known to be gone).
    ///
    /// Frees exactly the holder shown at the prompt (its fence and owner
    /// token): if the lock was released and taken again meanwhile, nothing
    /// is freed, the new holder is shown, and the command exits 1. With
    /// --json: `{"released": true, "fence": "F"}`; `{"released": false,
    /// "held": false}` when it was not held; `{"released": false,
    /// "changed": true, "shown": {…}, "now": {…}}` when it changed after
    /// it was shown.
    Release {
        /// Required: this frees another owner's lock.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The lock's id.
        id: String,
        /// The lock's resource.
        resource: String,
        #[command(flatten)]
        common: Common,
    },
}

/// `coord ephemeral …`
#[derive(Subcommand)]
pub enum EphemeralCommand {
    /// The live entries of TENANT in SPACE.
    ///
    /// In the table, characters a terminal would act on or hide (controls,
    /// bidi overrides, zero-width characters) are shown escaped: `\n`,
    /// `\x1b`, `\u{202e}`, a backslash as `\\`, a byte that is not UTF-8
    /// as `\xNN`. With --json: `{"entries": [{"key", "value", "revision",
    /// "updatedAt"}], "revision"}`, where `value` is the entry's bytes as
    /// text when they are UTF-8; otherwise `value` is absent and
    /// `valueBase64` holds them in standard base64 (RFC 4648, padded).
    /// In JSON, revisions are strings, and those characters are \uNNNN
    /// escapes (the same strings).
    List {
        /// The space's id (the example's editors: `inventory.editors`).
        space: String,
        /// The tenant (the example keys its editors by the bare item:
        /// `apple`).
        tenant: String,
        #[command(flatten)]
        common: Common,
    },
    /// Stream TENANT's changes in SPACE as JSON lines, from its current
    /// entries on, until interrupted (or for --for-ms).
    ///
    /// Each line is `{"type": "upsert", "key", "value", "revision", "at"}`,
    /// `{"type": "delete" | "expire", "key", "revision", "at"}` or
    /// `{"type": "resync-required"}` (then the command ends). `value` is the
    /// entry's bytes as text when they are UTF-8; otherwise `value` is
    /// absent and `valueBase64` holds them in standard base64 (RFC 4648,
    /// padded). Characters a terminal would act on or hide are \uNNNN
    /// escapes.
    Watch {
        /// The space's id (`inventory.editors`).
        space: String,
        /// The tenant (the example keys its editors by the bare item:
        /// `apple`).
        tenant: String,
        /// Stop after this long (default: never).
        #[arg(long, value_name = "MS")]
        for_ms: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
}

/// `coord limit …`
#[derive(Subcommand)]
pub enum LimitCommand {
    /// What a check of cost 1 would answer for KEY now, counting nothing.
    Peek(LimitArgs),
    /// Forget what was counted for KEY: the full limit again.
    Reset(LimitArgs),
}

/// A limiter and a key.
#[derive(Args)]
pub struct LimitArgs {
    /// The limiter's id (`inventory.exports`).
    id: String,
    /// Whose requests (`user:42`).
    key: String,
    /// The limiter's limit, as the function uses it.
    #[arg(long, value_name = "N")]
    limit: u32,
    /// The limiter's window, in milliseconds, as the function uses it.
    #[arg(long, value_name = "MS")]
    window: u64,
    #[command(flatten)]
    common: Common,
}

/// What every operator command takes.
#[derive(Args)]
pub struct Common {
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    json: bool,
}

/// How long a step of an operator command waits for the store before it
/// gives up: the store's response timeout as README states it
/// ("Unreachable is unavailable": 2 s, `RedisConfig::response_timeout`).
/// The Redis client retries a connection that timed out twice more, so a
/// hung Redis answered an operator only after 6.6 s; this bound is around
/// the whole step (connecting included) instead.
pub const STORE_BOUND: Duration = Duration::from_secs(2);

/// The store time one step of a command may still spend: connecting and
/// the calls before a prompt are one step, the calls after it another.
/// Local work (compiling the component, the operator at the prompt) does
/// not count.
struct Budget {
    left: Duration,
}

impl Budget {
    fn new() -> Budget {
        Budget { left: STORE_BOUND }
    }

    /// `call`, unless the store takes longer than what is left.
    async fn run<T>(
        &mut self,
        call: impl Future<Output = wasmtime::Result<T>>,
    ) -> wasmtime::Result<T> {
        let start = Instant::now();
        let outcome = tokio::time::timeout(self.left, call).await;
        self.left = self.left.saturating_sub(start.elapsed());
        outcome.unwrap_or_else(|_| Err(did_not_answer()))
    }
}

fn did_not_answer() -> wasmtime::Error {
    wasmtime::format_err!(
        "the store did not answer within {} s",
        STORE_BOUND.as_secs()
    )
}

/// A component's error as a sentence for the operator.
pub(crate) trait Sentence {
    /// The error, said as the operator commands say it.
    fn sentence(&self) -> String;
}

macro_rules! sentence_for {
    ($($error:path),* $(,)?) => {$(
        impl Sentence for $error {
            fn sentence(&self) -> String {
                match self {
                    Self::Unavailable(why) => {
                        format!("the store is unavailable: {}", text(why))
                    }
                    Self::InvalidArgument(invalid) => format!(
                        "invalid argument `{}`: {}",
                        argument(&invalid.field),
                        text(&invalid.reason)
                    ),
                    Self::Internal(why) => format!(
                        "the store answered something coord did not write (an internal error): {}",
                        text(why)
                    ),
                }
            }
        }
    )*};
}

sentence_for!(
    coord_host::lock::Error,
    coord_host::ephemeral::Error,
    coord_host::ratelimit::Error,
    coord_host::semaphore::Error,
    coord_host::rwlock::Error,
);

/// A WIT field as the operator typed it: the argument or flag.
fn argument(field: &str) -> Cow<'_, str> {
    Cow::Borrowed(match field {
        "lock.id" | "limiter.id" => "id",
        "lock.resource" => "resource",
        "space.id" => "space",
        "limiter.limit" => "--limit",
        "limiter.window-ms" => "--window",
        other => return text(other),
    })
}

/// A component call's outcome, its error as a sentence.
async fn call<T, E: Sentence>(
    outcome: impl Future<Output = wasmtime::Result<Result<T, E>>>,
) -> wasmtime::Result<T> {
    outcome
        .await?
        .map_err(|e| wasmtime::format_err!("{}", e.sentence()))
}

/// An instance on the store `common` names, and that store; the in-memory
/// store is refused: it lives inside one `coord serve` process, out of this
/// one's reach. Connecting spends `budget`.
async fn open(
    common: &Common,
    budget: &mut Budget,
) -> wasmtime::Result<(Instance, Arc<dyn Backend>)> {
    let target = common.store.target();
    if matches!(target, Target::Memory) {
        wasmtime::bail!(
            "operator commands need the store a coord serve uses: --redis [URL] \
             (or COORD_REDIS_URL), --nats [URL] (or COORD_NATS_URL), --postgres [URL] \
             (or COORD_POSTGRES_URL) or --sqlite PATH (or COORD_SQLITE_PATH); the in-memory \
             store lives inside its process"
        );
    }
    // The Redis client's own timeout a little past the bound, so that the
    // bound is what the operator meets, with the same sentence every time.
    let (backend, _) = budget
        .run(backend_for(
            &target,
            Some(STORE_BOUND + Duration::from_secs(1)),
        ))
        .await?;
    let instance = Runtime::new(backend.clone())?.instantiate().await?;
    Ok((instance, backend))
}

fn holder_json(holder: Option<&Holder>) -> serde_json::Value {
    match holder {
        Some(h) => {
            json!({ "held": true, "fence": h.fence.to_string(), "remainingMs": h.remaining_ms })
        }
        None => json!({ "held": false }),
    }
}

/// The holder `inspect` shows, with its owner token, read from the lock's
/// entry at the same fence: what a release guarded by exactly that holder
/// needs. The WIT's `holder` has no owner, so the token is read from the
/// store itself; a holder that changed between the two reads is read again.
struct Shown {
    holder: Holder,
    lock: HeldLock,
}

async fn shown(
    i: &mut Instance,
    backend: &Arc<dyn Backend>,
    id: &str,
    resource: &str,
) -> wasmtime::Result<Option<Shown>> {
    let partition = keys::lock_partition(id, resource);
    for _ in 0..3 {
        let Some(holder) = call(i.lock().inspect(id, resource)).await? else {
            return Ok(None);
        };
        let read = backend
            .get(&partition, keys::LOCK_HOLDER_KEY)
            .await
            .map_err(|e| wasmtime::format_err!("{}", store_failure(&e)))?;
        let Some(entry) = read.entry.filter(|e| e.revision == holder.fence) else {
            continue;
        };
        // `inspect` checked that the entry is an owner token (hex digits).
        let owner = String::from_utf8(entry.value).map_err(|_| {
            wasmtime::format_err!("the lock's entry is not an owner token (an internal error)")
        })?;
        let lock = HeldLock {
            id: id.to_string(),
            resource: resource.to_string(),
            owner,
            fence: holder.fence,
            // Not used by a release; any TTL the interface accepts.
            ttl_ms: holder
                .remaining_ms
                .clamp(1, coord_component::validate::MAX_TTL_MS),
            expires_at: entry.expires_at.unwrap_or(read.now),
        };
        return Ok(Some(Shown { holder, lock }));
    }
    wasmtime::bail!(
        "lock {} {} changed at each of three looks: nothing was released; try again",
        text(id),
        text(resource)
    )
}

/// Run a `coord lock` command.
pub async fn lock(command: LockCommand) -> wasmtime::Result<()> {
    match command {
        LockCommand::Inspect {
            id,
            resource,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let holder = budget.run(call(i.lock().inspect(&id, &resource))).await?;
            if common.json {
                println!("{}", json_line(&holder_json(holder.as_ref())));
            } else {
                let (id, resource) = (text(&id), text(&resource));
                match holder {
                    Some(h) => println!(
                        "LOCK {id} {resource}\nheld   yes\nfence  {}\nleft   {} ms",
                        h.fence, h.remaining_ms
                    ),
                    None => println!("LOCK {id} {resource}\nheld   no"),
                }
            }
            Ok(())
        }
        LockCommand::Release {
            force: _,
            yes,
            id,
            resource,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, backend) = open(&common, &mut budget).await?;
            let shown = budget.run(shown(&mut i, &backend, &id, &resource)).await?;
            let (id_text, resource_text) = (text(&id), text(&resource));
            let Some(shown) = shown else {
                if common.json {
                    println!(
                        "{}",
                        json_line(&json!({ "released": false, "held": false }))
                    );
                } else {
                    println!("{id_text} {resource_text} was not held");
                }
                return Ok(());
            };
            let fence = shown.holder.fence;
            confirm(
                yes,
                &format!(
                    "Free lock {id_text} {resource_text}, held at fence {fence} for {} ms more?",
                    shown.holder.remaining_ms
                ),
            )?;
            // Guarded by the holder shown: its fence and owner token.
            let mut budget = Budget::new();
            if budget.run(call(i.lock().release(&shown.lock))).await? {
                if common.json {
                    println!(
                        "{}",
                        json_line(&json!({ "released": true, "fence": fence.to_string() }))
                    );
                } else {
                    println!("released {id_text} {resource_text} (fence {fence})");
                }
                return Ok(());
            }
            let now = budget.run(call(i.lock().inspect(&id, &resource))).await?;
            if common.json {
                println!(
                    "{}",
                    json_line(&json!({
                        "released": false,
                        "changed": true,
                        "shown": holder_json(Some(&shown.holder)),
                        "now": holder_json(now.as_ref()),
                    }))
                );
            }
            match now {
                // The holder shown let it go or expired: free, as asked,
                // though not by this command.
                None => {
                    if !common.json {
                        println!(
                            "{id_text} {resource_text} was not released by this command: the \
                             holder shown (fence {fence}) let it go or expired meanwhile; it is free"
                        );
                    }
                    Ok(())
                }
                Some(h) => wasmtime::bail!(
                    "not released: lock {id_text} {resource_text} changed after it was shown \
                     (fence {fence}): it is now held at fence {} for {} ms more, by a holder \
                     you were not asked about; run the command again to free that one",
                    h.fence,
                    h.remaining_ms
                ),
            }
        }
    }
}

/// The space to read: TTL and value bound do not matter to a reader, but
/// the interface checks them.
fn space(id: &str) -> Space {
    Space {
        id: id.to_string(),
        ttl_ms: 60_000,
        max_value_bytes: 1 << 20,
    }
}

/// An entry or an event as JSON, its value as [`value_field`] says.
fn with_value(mut object: serde_json::Value, value: &[u8]) -> serde_json::Value {
    let (field, value) = value_field(value);
    if let Some(object) = object.as_object_mut() {
        object.insert(field.into(), value);
    }
    object
}

/// Run a `coord ephemeral` command.
pub async fn ephemeral(command: EphemeralCommand) -> wasmtime::Result<()> {
    match command {
        EphemeralCommand::List {
            space: id,
            tenant,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let snapshot = budget
                .run(call(i.ephemeral().snapshot(&space(&id), &tenant, None)))
                .await?;
            if common.json {
                let entries: Vec<_> = snapshot
                    .entries
                    .iter()
                    .map(|e| {
                        with_value(
                            json!({
                                "key": e.key,
                                "revision": e.revision.to_string(),
                                "updatedAt": e.updated_at,
                            }),
                            &e.value,
                        )
                    })
                    .collect();
                println!(
                    "{}",
                    json_line(
                        &json!({ "entries": entries, "revision": snapshot.revision.to_string() })
                    )
                );
            } else {
                println!("{:<24} {:>20} VALUE", "KEY", "REVISION");
                for e in &snapshot.entries {
                    println!(
                        "{:<24} {:>20} {}",
                        text(&e.key),
                        e.revision,
                        crate::terminal::bytes(&e.value)
                    );
                }
                println!(
                    "({} entries at revision {})",
                    snapshot.entries.len(),
                    snapshot.revision
                );
            }
            Ok(())
        }
        EphemeralCommand::Watch {
            space: id,
            tenant,
            for_ms,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let watcher = budget
                .run(call(i.ephemeral().watch(&space(&id), &tenant, None, None)))
                .await?;
            let until = for_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
            loop {
                let wait = match until {
                    Some(until) => {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Ok(());
                        }
                        u64::try_from(left.as_millis())
                            .unwrap_or(u64::MAX)
                            .min(30_000)
                    }
                    None => 30_000,
                };
                // The wait itself, and then the store's bound.
                let mut budget = Budget {
                    left: Duration::from_millis(wait) + STORE_BOUND,
                };
                let Some(event) = budget
                    .run(call(i.ephemeral().next_event(&watcher, wait)))
                    .await?
                else {
                    continue;
                };
                let line = match &event {
                    Event::Upsert(e) => with_value(
                        json!({
                            "type": "upsert", "key": e.key,
                            "revision": e.revision.to_string(), "at": e.updated_at,
                        }),
                        &e.value,
                    ),
                    Event::Delete(r) | Event::Expire(r) => json!({
                        "type": if matches!(event, Event::Delete(_)) { "delete" } else { "expire" },
                        "key": r.key, "revision": r.revision.to_string(), "at": r.at,
                    }),
                    Event::ResyncRequired => json!({ "type": "resync-required" }),
                };
                println!("{}", json_line(&line));
                if matches!(event, Event::ResyncRequired) {
                    return Ok(());
                }
            }
        }
    }
}

fn decision_json(d: &Decision) -> serde_json::Value {
    json!({
        "allowed": d.allowed, "limit": d.limit, "remaining": d.remaining,
        "resetInMs": d.reset_in_ms, "retryAfterMs": d.retry_after_ms,
    })
}

/// Run a `coord limit` command.
pub async fn limit(command: LimitCommand) -> wasmtime::Result<()> {
    let (reset, args) = match command {
        LimitCommand::Peek(args) => (false, args),
        LimitCommand::Reset(args) => (true, args),
    };
    let limiter = Limiter {
        id: args.id.clone(),
        limit: args.limit,
        window_ms: args.window,
        algorithm: None,
    };
    let mut budget = Budget::new();
    let (mut i, _) = open(&args.common, &mut budget).await?;
    if reset {
        budget
            .run(call(i.ratelimit().reset(&limiter, &args.key)))
            .await?;
    }
    let decision = budget
        .run(call(i.ratelimit().peek(&limiter, &args.key)))
        .await?;
    if args.common.json {
        println!("{}", json_line(&decision_json(&decision)));
    } else {
        println!(
            "LIMIT {} {}\nremaining  {} of {}\nreset in   {} ms",
            text(&args.id),
            text(&args.key),
            decision.remaining,
            decision.limit,
            decision.reset_in_ms
        );
    }
    Ok(())
}

/// Unless `yes`, ask `question` on standard error and go on only on `y` or
/// `yes`; anything else is the error "not released".
fn confirm(yes: bool, question: &str) -> wasmtime::Result<()> {
    if yes {
        return Ok(());
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        wasmtime::bail!("not released");
    }
    Ok(())
}

/// What `release --force ID RESOURCE FENCE` of one of many holders (a
/// semaphore's permit, a read-write lock's grant: `what`) answers.
struct ByFence<'a> {
    what: &'a str,
    id: std::borrow::Cow<'a, str>,
    resource: std::borrow::Cow<'a, str>,
    fence: u64,
    json: bool,
}

impl ByFence<'_> {
    /// No live holder has the fence: `{"released": false}` with --json,
    /// else an error saying so.
    fn none(&self) -> wasmtime::Result<()> {
        if self.json {
            println!("{}", json_line(&json!({ "released": false })));
            return Ok(());
        }
        let ByFence {
            what,
            id,
            resource,
            fence,
            ..
        } = self;
        wasmtime::bail!("{id} {resource} holds no live {what} at fence {fence}")
    }

    /// Ask before freeing the holder shown with `remaining_ms` left
    /// (`mode`: its kind, if it has one).
    fn confirm(&self, yes: bool, mode: &str, remaining_ms: u64) -> wasmtime::Result<()> {
        let ByFence {
            what,
            id,
            resource,
            fence,
            ..
        } = self;
        let question = format!(
            "Free the {mode}{what} of {id} {resource} at fence {fence}, held for {remaining_ms} ms more?"
        );
        confirm(yes, &question)
    }

    /// Report the force-release's answer.
    fn released(&self, released: bool) -> wasmtime::Result<()> {
        let ByFence {
            what,
            id,
            resource,
            fence,
            json,
        } = self;
        if *json {
            let line = json!({ "released": released, "fence": fence.to_string() });
            println!("{}", json_line(&line));
            return Ok(());
        }
        if !released {
            wasmtime::bail!(
                "not released: the {what} at fence {fence} was released or expired meanwhile"
            );
        }
        println!("released {id} {resource} (fence {fence})");
        Ok(())
    }
}
