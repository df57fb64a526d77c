//! The edge function end to end: composed with coord, served by `coord serve`
//! over real HTTP, on the in-memory store and on Redis — where two `coord
//! serve` processes share locks, presence and limits.

use crate::common;

/// A fresh Redis key prefix (its keys are deleted at the end of the test).
struct Prefix {
    url: String,
    name: String,
}

impl Prefix {
    async fn new(test: &str) -> Prefix {
        let url = common::redis_url().await;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Prefix {
            url,
            name: format!("serve-{test}-{}-{nanos}", std::process::id()),
        }
    }
}

mod admission;
mod command_line;
mod compose;
mod routes;
mod runtime;
mod shared;
