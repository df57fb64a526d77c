//! `coord rwlock …`: see a read-write lock's writer and readers, or free a
//! grant whose holder is known to be gone.

use clap::Subcommand;
use coord_host::rwlock::{Holder, Mode};
use serde_json::json;

use super::{Budget, ByFence, Common, call, open};
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
            let answer = ByFence {
                what: "grant",
                id: text(&id),
                resource: text(&resource),
                fence,
                json: common.json,
            };
            let shown = usage
                .writer
                .iter()
                .chain(&usage.readers)
                .find(|h| h.fence == fence);
            let Some(shown) = shown else {
                return answer.none();
            };
            let mode = format!("{} ", mode_word(shown.mode));
            answer.confirm(yes, &mode, shown.remaining_ms)?;
            let mut budget = Budget::new();
            let released = budget
                .run(call(i.rwlock().force_release(&id, &resource, fence)))
                .await?;
            answer.released(released)
        }
    }
}
