//! Operator commands: see and change what functions see, through the
//! component, on the store a `coord serve` uses — etcd's `etcdctl lock`,
//! for coord. A table for people, `--json` for scripts; whatever clients
//! wrote is printed escaped (`crate::terminal`).

use std::io::{BufRead, Write};

use clap::{Args, Subcommand};
use coord_host::ephemeral::{Event, Space};
use coord_host::lock::Holder;
use coord_host::ratelimit::{Decision, Limiter};
use coord_host::{Instance, Runtime};
use serde_json::json;

use crate::terminal::{json_line, text, value_field};
use crate::{StoreArgs, Target, backend};

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
        /// The space's id (`inventory.editors`).
        space: String,
        /// The tenant (`item:42`).
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
        /// The space's id.
        space: String,
        /// The tenant.
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

/// An instance on the store `common` names; the in-memory store is refused:
/// it lives inside one `coord serve` process, out of this one's reach.
async fn instance(common: &Common) -> wasmtime::Result<Instance> {
    let target = common.store.target();
    if matches!(target, Target::Memory) {
        wasmtime::bail!(
            "operator commands need the store a coord serve uses: --redis [URL] \
             (or COORD_REDIS_URL) or --nats [URL] (or COORD_NATS_URL); the in-memory \
             store lives inside its process"
        );
    }
    let (backend, _) = backend(&target).await?;
    Runtime::new(backend)?.instantiate().await
}

fn failed(what: impl std::fmt::Debug) -> wasmtime::Error {
    wasmtime::format_err!("{what:?}")
}

fn holder_json(holder: &Option<Holder>) -> serde_json::Value {
    match holder {
        Some(h) => {
            json!({ "held": true, "fence": h.fence.to_string(), "remainingMs": h.remaining_ms })
        }
        None => json!({ "held": false }),
    }
}

/// Run a `coord lock` command.
pub async fn lock(command: LockCommand) -> wasmtime::Result<()> {
    match command {
        LockCommand::Inspect {
            id,
            resource,
            common,
        } => {
            let mut i = instance(&common).await?;
            let holder = i.inspect(&id, &resource).await?.map_err(failed)?;
            if common.json {
                println!("{}", json_line(&holder_json(&holder)));
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
            let mut i = instance(&common).await?;
            let holder = i.inspect(&id, &resource).await?.map_err(failed)?;
            let (id_text, resource_text) = (text(&id), text(&resource));
            if let Some(h) = &holder
                && !yes
            {
                eprint!(
                    "Free lock {id_text} {resource_text}, held at fence {} for {} ms more? [y/N] ",
                    h.fence, h.remaining_ms
                );
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    wasmtime::bail!("not released");
                }
            }
            let released = i.force_release(&id, &resource).await?.map_err(failed)?;
            if common.json {
                println!("{}", json_line(&json!({ "released": released })));
            } else if released {
                println!("released {id_text} {resource_text}");
            } else {
                println!("{id_text} {resource_text} was not held");
            }
            Ok(())
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
            let mut i = instance(&common).await?;
            let snapshot = i
                .snapshot(&space(&id), &tenant, None)
                .await?
                .map_err(failed)?;
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
            let mut i = instance(&common).await?;
            let watcher = i
                .watch(&space(&id), &tenant, None, None)
                .await?
                .map_err(failed)?;
            let until =
                for_ms.map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
            loop {
                let wait = match until {
                    Some(until) => {
                        let left = until.saturating_duration_since(std::time::Instant::now());
                        if left.is_zero() {
                            return Ok(());
                        }
                        u64::try_from(left.as_millis())
                            .unwrap_or(u64::MAX)
                            .min(30_000)
                    }
                    None => 30_000,
                };
                let Some(event) = i.next_event(&watcher, wait).await?.map_err(failed)? else {
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
    let mut i = instance(&args.common).await?;
    if reset {
        i.reset(&limiter, &args.key).await?.map_err(failed)?;
    }
    let decision = i.peek(&limiter, &args.key).await?.map_err(failed)?;
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
