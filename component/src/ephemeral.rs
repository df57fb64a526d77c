//! Ephemeral state: `coord:sync/ephemeral`.
//!
//! Each (space, tenant) is one store partition; each entry is one store
//! entry under the caller's key, written with the space's TTL. So upsert,
//! touch and delete are one store request each, a snapshot is one `list`,
//! and a watch reads the partition's change feed — which records expiry —
//! blocking in the store's `wait` between reads.
//!
//! A watch without `after` first replays the snapshot's entries as upserts,
//! in revision order, then continues from the snapshot's revision, so every
//! event a watcher returns has a greater revision than the one before.

use std::collections::VecDeque;

use crate::bindings::exports::coord::sync::ephemeral::{
    Entry, Error, Event, InvalidArgument, Removed, Space, TenantSnapshot, Written,
};
use crate::keys;
use crate::store::{Change, ChangeKind, Condition, Outcome, Store, StoreError};
use crate::validate::{self, Invalid, MAX_ID_BYTES, MAX_NAME_BYTES, MAX_WAIT_MS};

/// The largest `space.max-value-bytes`: 1 MiB.
pub const MAX_VALUE_BYTES: u32 = 1 << 20;
/// How many changes a watcher reads from the feed per store request.
const PAGE: u32 = 256;

validate::interface_errors!(Error, InvalidArgument);

/// The ephemeral-state operations over a store.
pub struct Ephemeral<S> {
    store: S,
}

impl<S: Store> Ephemeral<S> {
    /// Ephemeral state on `store`.
    pub fn new(store: S) -> Self {
        Ephemeral { store }
    }

    /// `upsert` of `coord:sync/ephemeral`.
    pub fn upsert(
        &self,
        space: &Space,
        tenant: &str,
        key: &str,
        value: &[u8],
    ) -> Result<Written, Error> {
        check_space(space)?;
        check_names(tenant, key)?;
        if value.len() > space.max_value_bytes as usize {
            let reason = format!(
                "is {} bytes; the space allows {}",
                value.len(),
                space.max_value_bytes
            );
            return Err(Invalid::new("value", reason).into());
        }
        let partition = keys::ephemeral_partition(&space.id, tenant);
        let reply = self.store.put(
            &partition,
            key,
            value,
            Some(space.ttl_ms),
            &Condition::Always,
        )?;
        match reply.outcome {
            Outcome::Applied(e) => Ok(Written {
                revision: e.revision,
                updated_at: e.updated_at,
            }),
            Outcome::Conflict(_) => Err(Error::Internal("an unconditional put was refused".into())),
        }
    }

    /// `touch` of `coord:sync/ephemeral`: `false` when the entry is gone.
    pub fn touch(&self, space: &Space, tenant: &str, key: &str) -> Result<bool, Error> {
        check_space(space)?;
        check_names(tenant, key)?;
        let partition = keys::ephemeral_partition(&space.id, tenant);
        let reply = self
            .store
            .touch(&partition, key, space.ttl_ms, &Condition::Always)?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `delete` of `coord:sync/ephemeral`: `false` when the entry did not exist.
    pub fn delete(&self, space: &Space, tenant: &str, key: &str) -> Result<bool, Error> {
        check_space(space)?;
        check_names(tenant, key)?;
        let partition = keys::ephemeral_partition(&space.id, tenant);
        let reply = self.store.delete(&partition, key, &Condition::Always)?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `snapshot` of `coord:sync/ephemeral`.
    pub fn snapshot(
        &self,
        space: &Space,
        tenant: &str,
        prefix: Option<&str>,
    ) -> Result<TenantSnapshot, Error> {
        check_space(space)?;
        let prefix = check_tenant_and_prefix(tenant, prefix)?;
        let partition = keys::ephemeral_partition(&space.id, tenant);
        let listing = self.store.list(&partition, prefix)?;
        let entries = listing
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
                revision: e.revision,
                updated_at: e.updated_at,
            })
            .collect();
        Ok(TenantSnapshot {
            entries,
            revision: listing.revision,
        })
    }

    /// `watch` of `coord:sync/ephemeral`: the watcher's state. Without
    /// `after`, takes the snapshot (one store request) to replay first.
    pub fn watch(
        &self,
        space: &Space,
        tenant: &str,
        prefix: Option<&str>,
        after: Option<u64>,
    ) -> Result<Watch, Error> {
        check_space(space)?;
        let prefix = check_tenant_and_prefix(tenant, prefix)?.to_string();
        let partition = keys::ephemeral_partition(&space.id, tenant);
        let mut watch = Watch {
            partition,
            prefix,
            position: 0,
            delivered: 0,
            pending: VecDeque::new(),
            closed: false,
        };
        match after {
            Some(after) => {
                watch.position = after;
                watch.delivered = after;
            }
            None => {
                let snapshot = self.snapshot(space, tenant, Some(&watch.prefix))?;
                let mut entries = snapshot.entries;
                entries.sort_by_key(|e| e.revision);
                watch.pending = entries.into_iter().map(Event::Upsert).collect();
                watch.position = snapshot.revision;
            }
        }
        Ok(watch)
    }
}

/// A watcher's state: where it is in the tenant's feed and what it has read
/// but not yet returned.
#[derive(Debug)]
pub struct Watch {
    partition: String,
    prefix: String,
    /// The feed has been read up to here (including changes outside the prefix).
    position: u64,
    /// The revision of the last event returned.
    delivered: u64,
    pending: VecDeque<Event>,
    closed: bool,
}

impl Watch {
    /// The revision to resume from: every event up to it has been returned.
    pub fn revision(&self) -> u64 {
        if self.pending.is_empty() {
            self.position
        } else {
            self.delivered
        }
    }

    /// `watcher.next`: the next event, waiting up to `timeout_ms` for one.
    pub fn next<S: Store>(&mut self, store: &S, timeout_ms: u64) -> Result<Option<Event>, Error> {
        validate::in_range("timeout-ms", timeout_ms, 0, MAX_WAIT_MS)?;
        if self.closed {
            return Ok(Some(Event::ResyncRequired));
        }
        // The deadline runs on the store's clock, from the first page read.
        let mut deadline = None;
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.delivered = revision_of(&event).unwrap_or(self.delivered);
                return Ok(Some(event));
            }
            let page = match store.changes(&self.partition, self.position, PAGE) {
                Err(StoreError::HistoryGone(_)) => {
                    self.closed = true;
                    return Ok(Some(Event::ResyncRequired));
                }
                other => other?,
            };
            let full = page.changes.len() == PAGE as usize;
            for change in page.changes {
                self.position = change.revision;
                if change.key.starts_with(&self.prefix) {
                    self.pending.push_back(event_of(change));
                }
            }
            if !self.pending.is_empty() || full {
                continue;
            }
            let deadline = *deadline.get_or_insert(page.now.saturating_add(timeout_ms));
            if page.now >= deadline {
                return Ok(None);
            }
            // Block until the tenant changes (a write or an expiry) or time
            // is up. A wake-up that brings nothing for this watcher (a key
            // outside its prefix, an early return) waits out the rest.
            store.wait(&self.partition, self.position, deadline - page.now)?;
        }
    }
}

fn event_of(change: Change) -> Event {
    let removed = |c: Change| Removed {
        key: c.key,
        revision: c.revision,
        at: c.at,
    };
    match change.kind {
        ChangeKind::Put => Event::Upsert(Entry {
            key: change.key,
            value: change.value,
            revision: change.revision,
            updated_at: change.at,
        }),
        ChangeKind::Delete => Event::Delete(removed(change)),
        ChangeKind::Expire => Event::Expire(removed(change)),
    }
}

fn revision_of(event: &Event) -> Option<u64> {
    match event {
        Event::Upsert(e) => Some(e.revision),
        Event::Delete(r) | Event::Expire(r) => Some(r.revision),
        Event::ResyncRequired => None,
    }
}

fn check_space(space: &Space) -> Result<(), Invalid> {
    validate::name("space.id", &space.id, MAX_ID_BYTES)?;
    validate::ttl("space.ttl-ms", space.ttl_ms)?;
    validate::in_range(
        "space.max-value-bytes",
        u64::from(space.max_value_bytes),
        1,
        u64::from(MAX_VALUE_BYTES),
    )
}

fn check_names(tenant: &str, key: &str) -> Result<(), Invalid> {
    validate::name("tenant", tenant, MAX_NAME_BYTES)?;
    validate::name("key", key, MAX_NAME_BYTES)
}

/// The tenant, and the prefix as a string (`""` for none).
fn check_tenant_and_prefix<'a>(tenant: &str, prefix: Option<&'a str>) -> Result<&'a str, Invalid> {
    validate::name("tenant", tenant, MAX_NAME_BYTES)?;
    let prefix = prefix.unwrap_or("");
    if prefix.len() > MAX_NAME_BYTES {
        return Err(Invalid::new(
            "prefix",
            format!("is {} bytes; the limit is {MAX_NAME_BYTES}", prefix.len()),
        ));
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests;
