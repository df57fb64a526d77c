//! The routes: stock under a fenced lock, rate-limited exports, editors'
//! presence, reports limited to a few at once per tenant (a semaphore),
//! and summaries charged what they produced (a rate-limit reservation).
//! The catalog's routes, under a read-write lock, are in `catalog.rs`.

use crate::http::{Reply, Request};
use crate::records::{self, Refused};
use coord_sdk::{Admitted, Ran, ReservationGuard, Space, ephemeral, lock, ratelimit, semaphore};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The stock lock (seed 000: `inventory.stock`, 10 s TTL, one attempt).
const LOCK_ID: &str = "inventory.stock";
const LOCK_TTL_MS: u64 = 10_000;
/// The longest a request may ask to wait for the lock.
pub(crate) const MAX_WAIT_MS: u64 = 30_000;

/// The export limiter (seed 000: 10 per user per 60 s, sliding).
fn exports_limiter() -> ratelimit::Limiter {
    ratelimit::Limiter {
        id: "inventory.exports".to_string(),
        limit: 10,
        window_ms: 60_000,
        algorithm: Some(ratelimit::Algorithm::SlidingWindow),
    }
}

/// The editors' presence (seed 000: 30 s TTL, values up to 4 KiB): any
/// JSON the editor sends.
fn editors() -> Space<serde_json::Value> {
    Space::new("inventory.editors", 30_000, 4_096)
}

/// The longest a watch request may poll, and the most events it returns.
const MAX_WATCH_MS: u64 = 30_000;
const MAX_WATCH_EVENTS: usize = 100;

/// Dispatch a request to its handler.
pub fn route(request: &Request) -> Reply {
    let segments: Vec<&str> = request.segments.iter().map(String::as_str).collect();
    let method = request.method.as_str();
    match (method, segments.as_slice()) {
        ("GET", ["items", item]) => show(item),
        ("POST", ["items", item, "adjust"]) => adjust(request, item),
        ("POST", ["items", item, "lock"]) => hold(request, item),
        ("POST", ["items", item, "audit"]) => audit(request, item),
        ("POST", ["items", item, "lock", "extend"]) => extend(request, item),
        ("DELETE", ["items", item, "lock"]) => release(request, item),
        ("POST", ["exports"]) => export(request),
        ("POST", ["reports", tenant]) => report(request, tenant),
        ("GET", ["catalog"]) => crate::catalog::read(request),
        ("POST", ["catalog", "rebuild"]) => crate::catalog::rebuild(request),
        ("POST", ["summaries"]) => summarize(request),
        ("GET", ["items", item, "editors"]) => snapshot(item),
        ("GET", ["items", item, "editors", "watch"]) => watch(request, item),
        ("PUT", ["items", item, "editors", session]) => join(request, item, session),
        ("POST", ["items", item, "editors", session, "touch"]) => touch(item, session),
        ("DELETE", ["items", item, "editors", session]) => leave(item, session),
        _ => Reply::error(
            404,
            "path",
            &format!("no route for {method} /{}", segments.join("/")),
        ),
    }
}

/// The lock resource of an item.
fn resource(item: &str) -> String {
    format!("item:{item}")
}

fn show(item: &str) -> Reply {
    match records::read(item) {
        Ok(record) => Reply::ok(json!({
            "item": item,
            "stock": record.stock,
            "fence": record.fence.to_string(),
        })),
        Err(why) => Reply::error(503, "store", &why),
    }
}

/// The longest item name, in bytes.
const MAX_ITEM_BYTES: usize = 64;
/// The longest `Idempotency-Key`, in bytes.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// Adjust the stock: under a lock sent in the body (held across requests), or
/// under one taken and released here. With an `Idempotency-Key`, a retry of a
/// request that applied answers as it did and applies nothing.
fn adjust(request: &Request, item: &str) -> Reply {
    if item.is_empty() || item.len() > MAX_ITEM_BYTES {
        return Reply::error(400, "item", &format!("1 to {MAX_ITEM_BYTES} bytes"));
    }
    let delta = match required_i64(request, "delta") {
        Ok(delta) => delta,
        Err(reply) => return reply,
    };
    let key = request.idempotency_key.as_deref();
    if key.is_some_and(|k| k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY_BYTES) {
        return Reply::error(
            400,
            "idempotency-key",
            &format!("1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
        );
    }
    if !request.body.is_empty() {
        let held = match LockJson::parse(&request.body) {
            Ok(held) => held,
            Err(reply) => return reply,
        };
        if held.resource != resource(item) {
            return Reply::error(400, "body.resource", "the lock is for another item");
        }
        if held.id != LOCK_ID {
            return Reply::error(400, "body.id", &format!("the stock lock is {LOCK_ID}"));
        }
        // The commit point: a lock sent by a client is only as good as the
        // store says. Without this check a made-up lock with the largest
        // fence wrote once and then locked every honest writer out.
        match lock::is_held(&held) {
            Ok(true) => {}
            Ok(false) => {
                return Reply::error(
                    409,
                    "body",
                    "the lock is not held: it expired, was released, or was never issued",
                );
            }
            Err(error) => return lock_error(error),
        }
        return write(item, delta, held.fence, key);
    }
    let wait = match optional_u64(request, "wait_ms", MAX_WAIT_MS) {
        Ok(Some(ms)) => lock::WaitPolicy::Timeout(ms),
        Ok(None) => lock::WaitPolicy::NoWait,
        Err(reply) => return reply,
    };
    let options = lock::AcquireOptions {
        ttl_ms: Some(LOCK_TTL_MS),
        wait: Some(wait),
    };
    // A failed release only leaves the lock to its TTL: the write is decided.
    match coord_sdk::with_lock(LOCK_ID, &resource(item), options, |guard| {
        write(item, delta, guard.fence(), key)
    }) {
        Ok(Ran::Done(reply)) => reply,
        Ok(Ran::Busy(holder)) => busy(&holder),
        Err(error) => lock_error(error),
    }
}

/// The most steps, and the longest step, an audit may ask for: 50 s at
/// most, inside `coord serve`'s 60 s request deadline.
const MAX_AUDIT_STEPS: u64 = 20;
const MAX_AUDIT_STEP_MS: u64 = 2_500;
/// The longest lock TTL an anonymous client may ask for (`ttl_ms`): a
/// minute. Anything a client can name is bounded by what the service would
/// let one caller hold: a day-long TTL let one request lock an item for a
/// day (outside testers).
pub const MAX_CLIENT_TTL_MS: u64 = 60_000;

/// A long job under the item's lock (seed 002's "refreshing by hand"): `steps`
/// steps of `step_ms` each, the lock kept alive between them, so the job may
/// outlast the lock's TTL (`ttl_ms`) and still hold it from start to end.
fn audit(request: &Request, item: &str) -> Reply {
    let param = |name, max, default| match optional_u64(request, name, max) {
        Ok(value) => Ok(value.unwrap_or(default)),
        Err(reply) => Err(reply),
    };
    let (steps, step_ms, ttl_ms) = match (
        param("steps", MAX_AUDIT_STEPS, 3),
        param("step_ms", MAX_AUDIT_STEP_MS, 100),
        param("ttl_ms", MAX_CLIENT_TTL_MS, LOCK_TTL_MS),
    ) {
        (Ok(steps), Ok(step_ms), Ok(ttl_ms)) => (steps, step_ms, ttl_ms),
        (Err(reply), _, _) | (_, Err(reply), _) | (_, _, Err(reply)) => return reply,
    };
    let options = lock::AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(lock::WaitPolicy::NoWait),
    };
    let ran = coord_sdk::with_lock(LOCK_ID, &resource(item), options, |guard| {
        for _ in 0..steps {
            sleep_ms(step_ms);
            guard.keep_alive()?;
        }
        Ok::<_, coord_sdk::Lost>(guard.fence())
    });
    match ran {
        Ok(Ran::Done(Ok(fence))) => Reply::ok(json!({
            "item": item,
            "steps": steps,
            "fence": fence.to_string(),
        })),
        Ok(Ran::Done(Err(lost))) => Reply::error(409, "lock", &lost.to_string()),
        Ok(Ran::Busy(holder)) => busy(&holder),
        Err(error) => lock_error(error),
    }
}

/// Block this instance for `ms` (a step of work), on `wasi:clocks`.
pub(crate) fn sleep_ms(ms: u64) {
    wasip2::clocks::monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
}

fn write(item: &str, delta: i64, fence: u64, idempotency_key: Option<&str>) -> Reply {
    match records::adjust(item, delta, fence, idempotency_key) {
        Ok(adjusted) => {
            let reply = Reply::ok(json!({
                "item": item,
                "stock": adjusted.stock,
                "fence": adjusted.fence.to_string(),
            }));
            if adjusted.replayed {
                reply.header("idempotent-replayed", "true".into())
            } else {
                reply
            }
        }
        Err(Refused::Stale { newest }) => Reply::with_status(
            409,
            json!({
                "error": "stale fence: the lock was lost and a newer holder wrote",
                "field": "fence",
                "fence": fence.to_string(),
                "newestFence": newest.to_string(),
            }),
        ),
        Err(Refused::Insufficient { stock }) => Reply::with_status(
            409,
            json!({ "error": "insufficient stock", "field": "delta", "stock": stock }),
        ),
        Err(Refused::KeyReused { delta }) => Reply::with_status(
            422,
            json!({
                "error": "this idempotency key was used for another adjustment",
                "field": "idempotency-key",
                "delta": delta,
            }),
        ),
        Err(Refused::TableFull) => Reply::error(
            409,
            "item",
            &format!(
                "the stock table holds its limit of {} items",
                records::MAX_ITEMS
            ),
        ),
        Err(Refused::Store(why)) => Reply::error(503, "store", &why),
    }
}

/// Take the item's lock and hand it to the caller, who sends it back to
/// write, extend or release.
fn hold(request: &Request, item: &str) -> Reply {
    let ttl_ms = match optional_u64(request, "ttl_ms", MAX_CLIENT_TTL_MS) {
        Ok(ttl) => ttl.or(Some(LOCK_TTL_MS)),
        Err(reply) => return reply,
    };
    let options = lock::AcquireOptions {
        ttl_ms,
        wait: Some(lock::WaitPolicy::NoWait),
    };
    match lock::acquire(LOCK_ID, &resource(item), options) {
        Ok(lock::AcquireOutcome::Acquired(held)) => Reply::ok(LockJson::from(&held).to_json()),
        Ok(lock::AcquireOutcome::Busy(holder)) => busy(&holder),
        Err(error) => lock_error(error),
    }
}

fn extend(request: &Request, item: &str) -> Reply {
    let held = match LockJson::parse(&request.body) {
        Ok(held) => held,
        Err(reply) => return reply,
    };
    if held.resource != resource(item) {
        return Reply::error(400, "body.resource", "the lock is for another item");
    }
    let ttl_ms = match optional_u64(request, "ttl_ms", MAX_CLIENT_TTL_MS) {
        Ok(ttl) => ttl,
        Err(reply) => return reply,
    };
    match lock::extend(&held, ttl_ms) {
        Ok(lock::ExtendOutcome::Extended(held)) => Reply::ok(LockJson::from(&held).to_json()),
        Ok(lock::ExtendOutcome::Lost) => Reply::error(409, "body", "the lock was lost"),
        Err(error) => lock_error(error),
    }
}

fn release(request: &Request, item: &str) -> Reply {
    let held = match LockJson::parse(&request.body) {
        Ok(held) => held,
        Err(reply) => return reply,
    };
    if held.resource != resource(item) {
        return Reply::error(400, "body.resource", "the lock is for another item");
    }
    match lock::release(&held) {
        Ok(released) => Reply::ok(json!({ "released": released })),
        Err(error) => lock_error(error),
    }
}

fn busy(holder: &lock::Holder) -> Reply {
    let seconds = holder.remaining_ms.div_ceil(1000).max(1);
    Reply::with_status(
        409,
        json!({
            "error": "busy: another request holds the item's lock",
            "holderFence": holder.fence.to_string(),
            "retryAfterMs": holder.remaining_ms,
        }),
    )
    .header("retry-after", seconds.to_string())
}

/// Export every record: rate-limited per user.
fn export(request: &Request) -> Reply {
    let Some(user) = request.user.as_deref().filter(|u| !u.is_empty()) else {
        return Reply::error(400, "x-user-id", "the x-user-id header is required");
    };
    let decision = match ratelimit::check(&exports_limiter(), &format!("user:{user}"), None) {
        Ok(decision) => decision,
        Err(ratelimit::Error::InvalidArgument(bad)) => {
            return Reply::error(400, &bad.field, &bad.reason);
        }
        Err(ratelimit::Error::Unavailable(why)) => return Reply::error(503, "ratelimit", &why),
        Err(ratelimit::Error::Internal(why)) => return Reply::error(500, "ratelimit", &why),
    };
    let limit_headers = |reply: Reply| {
        reply
            .header("ratelimit-limit", decision.limit.to_string())
            .header("ratelimit-remaining", decision.remaining.to_string())
            .header(
                "ratelimit-reset",
                decision.reset_in_ms.div_ceil(1000).to_string(),
            )
    };
    if !decision.allowed {
        let seconds = decision.retry_after_ms.div_ceil(1000).max(1);
        return limit_headers(Reply::with_status(
            429,
            json!({ "error": "Too many exports", "retryAfterMs": decision.retry_after_ms }),
        ))
        .header("retry-after", seconds.to_string());
    }
    match records::list() {
        Ok(records) => {
            let items: Vec<_> = records
                .into_iter()
                .map(|(item, record)| {
                    json!({ "item": item, "stock": record.stock, "fence": record.fence.to_string() })
                })
                .collect();
            limit_headers(Reply::ok(
                json!({ "items": items, "remaining": decision.remaining }),
            ))
        }
        Err(why) => Reply::error(503, "store", &why),
    }
}

/// Reports: at most [`REPORTS_AT_ONCE`] per tenant at once, across every
/// instance (a partner system that takes two at a time), each under a
/// permit of the `inventory.reports` semaphore.
const REPORTS_ID: &str = "inventory.reports";
/// Reports a tenant may run at once.
pub const REPORTS_AT_ONCE: u32 = 2;
/// A report's permit lasts this long unless released (a cut request's
/// permit is given back by the host; a crashed one's expires).
const REPORT_TTL_MS: u64 = 30_000;
/// The longest a report may ask to work (`work_ms`): inside the permit's TTL.
const MAX_REPORT_WORK_MS: u64 = 10_000;

/// Run a report for `tenant`, if fewer than [`REPORTS_AT_ONCE`] of its
/// reports are running: 429 with `retry-after` otherwise (or after
/// `wait_ms` of waiting for a place).
fn report(request: &Request, tenant: &str) -> Reply {
    if tenant.is_empty() || tenant.len() > MAX_ITEM_BYTES {
        return Reply::error(400, "tenant", &format!("1 to {MAX_ITEM_BYTES} bytes"));
    }
    let (work_ms, wait) = match (
        optional_u64(request, "work_ms", MAX_REPORT_WORK_MS),
        optional_u64(request, "wait_ms", MAX_WAIT_MS),
    ) {
        (Ok(work), Ok(wait)) => (work.unwrap_or(0), wait),
        (Err(reply), _) | (_, Err(reply)) => return reply,
    };
    let options = semaphore::AcquireOptions {
        ttl_ms: Some(REPORT_TTL_MS),
        wait: Some(wait.map_or(
            semaphore::WaitPolicy::NoWait,
            semaphore::WaitPolicy::Timeout,
        )),
    };
    let resource = format!("tenant:{tenant}");
    let ran = coord_sdk::with_permit(REPORTS_ID, &resource, REPORTS_AT_ONCE, options, |permit| {
        sleep_ms(work_ms);
        records::list().map(|records| (permit.fence, records.len()))
    });
    match ran {
        Ok(Admitted::Done(Ok((fence, items)))) => Reply::ok(json!({
            "tenant": tenant,
            "items": items,
            "fence": fence.to_string(),
        })),
        Ok(Admitted::Done(Err(why))) => Reply::error(503, "store", &why),
        Ok(Admitted::Full(first)) => Reply::with_status(
            429,
            json!({
                "error": "too many reports at once for this tenant",
                "limit": REPORTS_AT_ONCE,
                "retryAfterMs": first.remaining_ms,
            }),
        )
        .header(
            "retry-after",
            first.remaining_ms.div_ceil(1000).max(1).to_string(),
        ),
        Err(semaphore::Error::InvalidArgument(bad)) => Reply::error(400, &bad.field, &bad.reason),
        Err(semaphore::Error::Unavailable(why)) => Reply::error(503, "semaphore", &why),
        Err(semaphore::Error::Internal(why)) => Reply::error(500, "semaphore", &why),
    }
}

/// Summaries cost what they produce: bytes of summary per user per minute.
/// A request reserves its `estimate` first and is charged what it really
/// produced, so an estimate too high is given back at once.
fn summary_limiter() -> ratelimit::Limiter {
    ratelimit::Limiter {
        id: "inventory.summary-bytes".to_string(),
        limit: SUMMARY_BYTES_PER_MINUTE,
        window_ms: 60_000,
        algorithm: Some(ratelimit::Algorithm::SlidingWindow),
    }
}
/// The summary budget per user per minute, in bytes.
pub const SUMMARY_BYTES_PER_MINUTE: u32 = 4_096;

/// Summarize the stock table for the `x-user-id` user, reserving
/// `estimate` bytes (default 1024) of their budget and settling the bytes
/// the summary really took.
fn summarize(request: &Request) -> Reply {
    let Some(user) = request.user.as_deref().filter(|u| !u.is_empty()) else {
        return Reply::error(400, "x-user-id", "the x-user-id header is required");
    };
    let limit = u64::from(SUMMARY_BYTES_PER_MINUTE);
    let estimate = match optional_u64(request, "estimate", limit) {
        Ok(estimate) => estimate.unwrap_or(1024).max(1) as u32,
        Err(reply) => return reply,
    };
    let key = format!("user:{user}");
    let mut guard = match ReservationGuard::reserve(summary_limiter(), &key, estimate, 60_000) {
        Ok(Ok(guard)) => guard,
        Ok(Err(limited)) => {
            let seconds = limited.retry_after_ms.div_ceil(1000).max(1);
            return Reply::with_status(
                429,
                json!({ "error": "summary budget spent", "retryAfterMs": limited.retry_after_ms }),
            )
            .header("retry-after", seconds.to_string());
        }
        Err(ratelimit::Error::InvalidArgument(bad)) => {
            return Reply::error(400, &bad.field, &bad.reason);
        }
        Err(ratelimit::Error::Unavailable(why)) => return Reply::error(503, "ratelimit", &why),
        Err(ratelimit::Error::Internal(why)) => return Reply::error(500, "ratelimit", &why),
    };
    let records = match records::list() {
        Ok(records) => records,
        Err(why) => {
            // Nothing was produced: give the whole estimate back.
            let _ = guard.settle_at(0);
            return Reply::error(503, "store", &why);
        }
    };
    let summary: Vec<_> = records
        .into_iter()
        .map(|(item, record)| json!({ "item": item, "stock": record.stock }))
        .collect();
    let summary = serde_json::Value::from(summary);
    let used = summary
        .to_string()
        .len()
        .min(SUMMARY_BYTES_PER_MINUTE as usize) as u32;
    guard.record(used);
    // Settled when the guard is dropped at the end of this function.
    Reply::ok(json!({ "summary": summary, "reservedBytes": estimate, "usedBytes": used }))
}

fn join(request: &Request, item: &str, session: &str) -> Reply {
    let Ok(editor) = serde_json::from_slice::<serde_json::Value>(&request.body) else {
        return Reply::error(400, "body", "the editor's value must be JSON");
    };
    match editors().upsert(item, session, &editor) {
        Ok(written) => Reply::ok(json!({
            "revision": written.revision.to_string(),
            "updatedAt": written.updated_at,
        })),
        Err(error) => space_error(error),
    }
}

fn touch(item: &str, session: &str) -> Reply {
    match editors().touch(item, session) {
        Ok(true) => Reply::ok(json!({ "renewed": true })),
        // Seed 000: recreate the entry when touch says it is gone.
        Ok(false) => Reply::with_status(404, json!({ "renewed": false })),
        Err(error) => space_error(error),
    }
}

fn leave(item: &str, session: &str) -> Reply {
    match editors().delete(item, session) {
        Ok(deleted) => Reply::ok(json!({ "deleted": deleted })),
        Err(error) => space_error(error),
    }
}

fn snapshot(item: &str) -> Reply {
    match editors().snapshot(item, None) {
        Ok(snapshot) => Reply::ok(json!({
            "editors": snapshot.entries.iter().map(editor_json).collect::<Vec<_>>(),
            "revision": snapshot.revision.to_string(),
        })),
        Err(error) => space_error(error),
    }
}

/// Long-poll: wait up to `timeout_ms` for the first change after `after`,
/// then return it and whatever else is already there. Resume with the
/// reply's `revision`; `resync` means reopen without `after`.
fn watch(request: &Request, item: &str) -> Reply {
    let after = match optional_u64(request, "after", u64::MAX) {
        Ok(after) => after,
        Err(reply) => return reply,
    };
    let timeout_ms = match optional_u64(request, "timeout_ms", MAX_WATCH_MS) {
        Ok(timeout) => timeout.unwrap_or(10_000),
        Err(reply) => return reply,
    };
    let watcher = match ephemeral::watch(editors().raw(), item, None, after) {
        Ok(watcher) => watcher,
        Err(error) => return ephemeral_error(error),
    };
    let mut events = Vec::new();
    let mut wait = timeout_ms;
    while events.len() < MAX_WATCH_EVENTS {
        match watcher.next(wait) {
            Ok(Some(ephemeral::Event::ResyncRequired)) => {
                return Reply::ok(json!({ "events": events, "resync": true }));
            }
            Ok(Some(event)) => events.push(event_json(&event)),
            Ok(None) => break,
            Err(error) => return ephemeral_error(error),
        }
        // After the first event, only take what is already there.
        wait = 0;
    }
    Reply::ok(json!({
        "events": events,
        "revision": watcher.revision().to_string(),
        "resync": false,
    }))
}

fn editor_json(entry: &coord_sdk::Entry<serde_json::Value>) -> serde_json::Value {
    json!({
        "session": entry.key,
        "value": entry.value,
        "revision": entry.revision.to_string(),
        "updatedAt": entry.updated_at,
    })
}

fn entry_json(entry: &ephemeral::Entry) -> serde_json::Value {
    json!({
        "session": entry.key,
        "value": serde_json::from_slice::<serde_json::Value>(&entry.value)
            .unwrap_or_else(|_| json!(String::from_utf8_lossy(&entry.value))),
        "revision": entry.revision.to_string(),
        "updatedAt": entry.updated_at,
    })
}

fn event_json(event: &ephemeral::Event) -> serde_json::Value {
    let removed = |kind: &str, removed: &ephemeral::Removed| {
        json!({
            "type": kind,
            "session": removed.key,
            "revision": removed.revision.to_string(),
            "at": removed.at,
        })
    };
    match event {
        ephemeral::Event::Upsert(entry) => {
            let mut value = entry_json(entry);
            value["type"] = json!("upsert");
            value
        }
        ephemeral::Event::Delete(gone) => removed("delete", gone),
        ephemeral::Event::Expire(gone) => removed("expire", gone),
        ephemeral::Event::ResyncRequired => json!({ "type": "resync_required" }),
    }
}

/// A held lock as JSON, the fence as a string.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LockJson {
    id: String,
    resource: String,
    owner: String,
    fence: String,
    ttl_ms: u64,
    expires_at: u64,
}

impl LockJson {
    /// Parse a lock sent back by a client; every failure names the field.
    fn parse(body: &[u8]) -> Result<lock::HeldLock, Reply> {
        let json: LockJson = serde_json::from_slice(body)
            .map_err(|e| Reply::error(400, "body", &format!("not a held lock: {e}")))?;
        let fence = json
            .fence
            .parse()
            .map_err(|_| Reply::error(400, "body.fence", "not a decimal u64"))?;
        Ok(lock::HeldLock {
            id: json.id,
            resource: json.resource,
            owner: json.owner,
            fence,
            ttl_ms: json.ttl_ms,
            expires_at: json.expires_at,
        })
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }
}

impl From<&lock::HeldLock> for LockJson {
    fn from(held: &lock::HeldLock) -> Self {
        LockJson {
            id: held.id.clone(),
            resource: held.resource.clone(),
            owner: held.owner.clone(),
            fence: held.fence.to_string(),
            ttl_ms: held.ttl_ms,
            expires_at: held.expires_at,
        }
    }
}

fn required_i64(request: &Request, name: &str) -> Result<i64, Reply> {
    let text = request
        .param(name)
        .ok_or_else(|| Reply::error(400, name, "required"))?;
    text.parse()
        .map_err(|_| Reply::error(400, name, "not a whole number"))
}

pub(crate) fn optional_u64(request: &Request, name: &str, max: u64) -> Result<Option<u64>, Reply> {
    let Some(text) = request.param(name) else {
        return Ok(None);
    };
    let value: u64 = text
        .parse()
        .map_err(|_| Reply::error(400, name, "not a non-negative whole number"))?;
    if value > max {
        return Err(Reply::error(400, name, &format!("at most {max}")));
    }
    Ok(Some(value))
}

fn lock_error(error: lock::Error) -> Reply {
    match error {
        lock::Error::InvalidArgument(bad) => Reply::error(400, &bad.field, &bad.reason),
        other => Reply::error(503, "lock", &describe_lock_error(&other)),
    }
}

fn describe_lock_error(error: &lock::Error) -> String {
    match error {
        lock::Error::Unavailable(why) => format!("unavailable: {why}"),
        lock::Error::InvalidArgument(bad) => format!("{}: {}", bad.field, bad.reason),
        lock::Error::Internal(why) => format!("internal: {why}"),
    }
}

fn space_error(error: coord_sdk::SpaceError) -> Reply {
    match error {
        coord_sdk::SpaceError::Ephemeral(error) => ephemeral_error(error),
        other => Reply::error(500, "ephemeral", &other.to_string()),
    }
}

fn ephemeral_error(error: ephemeral::Error) -> Reply {
    match error {
        ephemeral::Error::InvalidArgument(bad) => Reply::error(400, &bad.field, &bad.reason),
        ephemeral::Error::Unavailable(why) => Reply::error(503, "ephemeral", &why),
        ephemeral::Error::Internal(why) => Reply::error(500, "ephemeral", &why),
    }
}
