//! `coord rwlock …`: see a read-write lock's writer and readers, or free a
//! grant whose holder is known to be gone.

use std::io::{BufRead, Write};

use clap::Subcommand;
use coord_host::rwlock::{Holder, Mode};
use serde_json::json;

use super::{Budget, Common, call, open};
use crate::terminal::{json_line, text};

/// `coord rwlock …`
#[derive(Subcommand)]
pub enum RwLockCommand {
    /// The writer and the live readers of the read-write lock ID RESOURCE:
    /// each one's fence and remaining time; a writer listed beside readers
    /// is waiting for them. With --json: `{"writer": {"fence": "F",
    /// "remainingMs", "waiting"} or null, "readers": [{"fence": "F",
    /// "remainingMs"}]}`, readers in fence order (fences are strings).
    Inspect {
        /// The lock's id (what kind: `inventory.catalog`).
        id: String,
        /// The lock's resource (which one: `all`).
        resource: String,
        #[command(flatten)]
        common: Common,
    },
    /// Free the grant of ID RESOURCE with fence FENCE, reader or writer,
    /// whoever holds it (a holder known to be gone). Only that grant. With
    /// --json: `{"released": true, "fence": "F"}`, or `{"released": false}`
    /// when no live grant has that fence.
    Release {
        /// Required: this frees another owner's grant.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The lock's id.
        id: String,
        /// The lock's resource.
        resource: String,
        /// The grant's fence, as `inspect` shows it.
        fence: u64,
        #[command(flatten)]
        common: Common,
    },
}

fn mode_word(mode: Mode) -> &'static str {
    match mode {
        Mode::Read => "read",
        Mode::Write => "write",
    }
}

/// Run a `coord rwlock` command.
pub async fn rwlock(command: RwLockCommand) -> wasmtime::Result<()> {
    match command {
        RwLockCommand::Inspect {
            id,
            resource,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let usage = budget.run(call(i.rwlock().inspect(&id, &resource))).await?;
            let waiting = !usage.readers.is_empty();
            if common.json {
                let reader = |h: &Holder| json!({ "fence": h.fence.to_string(), "remainingMs": h.remaining_ms });
                let writer = usage.writer.as_ref().map(|h| {
                    json!({ "fence": h.fence.to_string(), "remainingMs": h.remaining_ms, "waiting": waiting })
                });
                let readers: Vec<_> = usage.readers.iter().map(reader).collect();
                println!(
                    "{}",
                    json_line(&json!({ "writer": writer, "readers": readers }))
                );
                return Ok(());
            }
            println!("RWLOCK {} {}", text(&id), text(&resource));
            match &usage.writer {
                Some(h) if waiting => println!(
                    "writer waiting  fence {}  left {} ms",
                    h.fence, h.remaining_ms
                ),
                Some(h) => println!("writer  fence {}  left {} ms", h.fence, h.remaining_ms),
                None => println!("writer  none"),
            }
            println!("readers {}", usage.readers.len());
            for h in &usage.readers {
                println!("fence  {}  left {} ms", h.fence, h.remaining_ms);
            }
            Ok(())
        }
        RwLockCommand::Release {
            force: _,
            yes,
            id,
            resource,
            fence,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let usage = budget.run(call(i.rwlock().inspect(&id, &resource))).await?;
            let (id_text, resource_text) = (text(&id), text(&resource));
            let shown = usage
                .writer
                .iter()
                .chain(&usage.readers)
                .find(|h| h.fence == fence);
            let Some(shown) = shown else {
                if common.json {
                    println!("{}", json_line(&json!({ "released": false })));
                    return Ok(());
                }
                wasmtime::bail!("{id_text} {resource_text} holds no live grant at fence {fence}");
            };
            if !yes {
                eprint!(
                    "Free the {} grant of {id_text} {resource_text} at fence {fence}, held for {} ms more? [y/N] ",
                    mode_word(shown.mode),
                    shown.remaining_ms
                );
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    wasmtime::bail!("not released");
                }
            }
            let mut budget = Budget::new();
            let released = budget
                .run(call(i.rwlock().force_release(&id, &resource, fence)))
                .await?;
            if common.json {
                let line = json!({ "released": released, "fence": fence.to_string() });
                println!("{}", json_line(&line));
                return Ok(());
            }
            if released {
                println!("released {id_text} {resource_text} (fence {fence})");
                Ok(())
            } else {
                wasmtime::bail!(
                    "not released: the grant at fence {fence} was released or expired meanwhile"
                )
            }
        }
    }
}
