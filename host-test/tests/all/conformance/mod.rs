//! The store conformance suite: every `coord:sync/store` operation and the
//! guarantee `wit/store.wit` states for it, run against every backend.

use crate::common;

use common::Harness;
use coord_host::backend::*;

/// Changes each partition's feed keeps in this suite (small, to test trimming).
const HISTORY: usize = 8;

fn conflict(reply: WriteReply) -> Option<Entry> {
    match reply.outcome {
        Outcome::Conflict(current) => current,
        Outcome::Applied(entry) => panic!("expected conflict, got applied {entry:?}"),
    }
}

async fn put(h: &Harness, p: &str, k: &str, v: &str, ttl: Option<u64>, c: Condition) -> WriteReply {
    h.backend.put(p, k, v.as_bytes(), ttl, &c).await.unwrap()
}

mod meters;
mod reads;
mod unwatched;
mod waits;
mod writes;
