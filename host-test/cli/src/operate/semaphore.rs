//! `coord semaphore …`: see a semaphore's permits, or free one whose holder
//! is known to be gone.

use clap::Subcommand;
use coord_host::semaphore::Holder;
use serde_json::json;

use super::{Budget, ByFence, Common, call, open};
use crate::terminal::{json_line, text};

/// `coord semaphore …`
#[derive(Subcommand)]
pub enum SemaphoreCommand {
    /// The live permits of the semaphore ID RESOURCE: each one's fence,
    /// remaining time and the limit it was acquired under. With --json:
    /// `{"permits": [{"fence": "F", "remainingMs", "limit"}]}`, in fence
    /// order (fences are strings).
    Inspect {
        /// The semaphore's id (what kind: `partner.api`).
        id: String,
        /// The semaphore's resource (which one: `tenant:42`).
        resource: String,
        #[command(flatten)]
        common: Common,
    },
    /// Free the permit of ID RESOURCE with fence FENCE, whoever holds it (a
    /// holder known to be gone). Only that permit: one granted later has a
    /// higher fence. With --json: `{"released": true, "fence": "F"}`, or
    /// `{"released": false}` when no live permit has that fence.
    Release {
        /// Required: this frees another owner's permit.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The semaphore's id.
        id: String,
        /// The semaphore's resource.
        resource: String,
        /// The permit's fence, as `inspect` shows it.
        fence: u64,
        #[command(flatten)]
        common: Common,
    },
}

fn holder_json(h: &Holder) -> serde_json::Value {
    json!({ "fence": h.fence.to_string(), "remainingMs": h.remaining_ms, "limit": h.limit })
}

/// Run a `coord semaphore` command.
pub async fn semaphore(command: SemaphoreCommand) -> wasmtime::Result<()> {
    match command {
        SemaphoreCommand::Inspect {
            id,
            resource,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let usage = budget
                .run(call(i.semaphore().inspect(&id, &resource)))
                .await?;
            if common.json {
                let permits: Vec<_> = usage.permits.iter().map(holder_json).collect();
                println!("{}", json_line(&json!({ "permits": permits })));
                return Ok(());
            }
            println!("SEMAPHORE {} {}", text(&id), text(&resource));
            println!("held   {}", usage.permits.len());
            for h in &usage.permits {
                println!(
                    "fence  {}  left {} ms  limit {}",
                    h.fence, h.remaining_ms, h.limit
                );
            }
            Ok(())
        }
        SemaphoreCommand::Release {
            force: _,
            yes,
            id,
            resource,
            fence,
            common,
        } => {
            let mut budget = Budget::new();
            let (mut i, _) = open(&common, &mut budget).await?;
            let usage = budget
                .run(call(i.semaphore().inspect(&id, &resource)))
                .await?;
            let answer = ByFence {
                what: "permit",
                id: text(&id),
                resource: text(&resource),
                fence,
                json: common.json,
            };
            let Some(shown) = usage.permits.iter().find(|h| h.fence == fence) else {
                return answer.none();
            };
            answer.confirm(yes, "", shown.remaining_ms)?;
            let mut budget = Budget::new();
            let released = budget
                .run(call(i.semaphore().force_release(&id, &resource, fence)))
                .await?;
            answer.released(released)
        }
    }
}
