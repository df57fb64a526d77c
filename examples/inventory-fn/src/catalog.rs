//! The catalog: read by many requests at once, rebuilt by one with no
//! reader inside, under the `inventory.catalog` read-write lock.

use crate::http::{Reply, Request};
use crate::inventory::{MAX_WAIT_MS, optional_u64, sleep_ms};
use crate::records;
use coord_sdk::{Granted, rwlock};
use serde_json::json;

/// The read-write lock guarding the catalog.
const CATALOG_ID: &str = "inventory.catalog";
const CATALOG_RESOURCE: &str = "all";
/// A grant lasts this long unless released (a cut request's grant, or a
/// writer's claim, is given back by the host; a crashed one's expires).
const CATALOG_TTL_MS: u64 = 30_000;
/// The longest a request may ask to work while it holds the catalog.
const MAX_CATALOG_WORK_MS: u64 = 10_000;

/// `GET /catalog`: the items, read under a read grant beside any other
/// readers; 409 while a rebuild holds the catalog or waits for it.
pub fn read(request: &Request) -> Reply {
    under(request, rwlock::Mode::Read, |grant| {
        records::list().map(|records| {
            json!({ "items": records.len(), "mode": "read", "fence": grant.fence.to_string() })
        })
    })
}

/// `POST /catalog/rebuild`: hold the catalog alone for `work_ms` (no
/// reader, no other rebuild), as a rebuild would; 409 while others hold it.
pub fn rebuild(request: &Request) -> Reply {
    under(request, rwlock::Mode::Write, |grant| {
        Ok(json!({ "mode": "write", "fence": grant.fence.to_string() }))
    })
}

/// Take the catalog in `mode` (waiting up to `wait_ms`, default not at
/// all), work for `work_ms`, run `answer` with the grant, and release.
fn under(
    request: &Request,
    mode: rwlock::Mode,
    answer: impl FnOnce(&rwlock::Grant) -> Result<serde_json::Value, String>,
) -> Reply {
    let (work_ms, wait) = match (
        optional_u64(request, "work_ms", MAX_CATALOG_WORK_MS),
        optional_u64(request, "wait_ms", MAX_WAIT_MS),
    ) {
        (Ok(work), Ok(wait)) => (work.unwrap_or(0), wait),
        (Err(reply), _) | (_, Err(reply)) => return reply,
    };
    let options = rwlock::AcquireOptions {
        ttl_ms: Some(CATALOG_TTL_MS),
        wait: Some(wait.map_or(rwlock::WaitPolicy::NoWait, rwlock::WaitPolicy::Timeout)),
    };
    let work = |grant: &rwlock::Grant| {
        sleep_ms(work_ms);
        answer(grant)
    };
    let ran = match mode {
        rwlock::Mode::Read => coord_sdk::with_read(CATALOG_ID, CATALOG_RESOURCE, options, work),
        rwlock::Mode::Write => coord_sdk::with_write(CATALOG_ID, CATALOG_RESOURCE, options, work),
    };
    match ran {
        Ok(Granted::Done(Ok(body))) => Reply::ok(body),
        Ok(Granted::Done(Err(why))) => Reply::error(503, "store", &why),
        Ok(Granted::Busy(holder)) => Reply::with_status(
            409,
            json!({
                "error": match holder.mode {
                    rwlock::Mode::Write => "busy: a rebuild holds the catalog or waits for it",
                    rwlock::Mode::Read => "busy: readers hold the catalog",
                },
                "holderFence": holder.fence.to_string(),
                "retryAfterMs": holder.remaining_ms,
            }),
        )
        .header(
            "retry-after",
            holder.remaining_ms.div_ceil(1000).max(1).to_string(),
        ),
        Err(rwlock::Error::InvalidArgument(bad)) => Reply::error(400, &bad.field, &bad.reason),
        Err(rwlock::Error::Unavailable(why)) => Reply::error(503, "rwlock", &why),
        Err(rwlock::Error::Internal(why)) => Reply::error(500, "rwlock", &why),
    }
}
