//! The component's binding: the exported interfaces implemented by the
//! plain-Rust logic ([`crate::lock::Locks`], [`crate::ephemeral::Ephemeral`])
//! over the imported `coord:sync/store`.

// The `export!` expansion defines the raw ABI entry points, which are unsafe by nature.
#![allow(unsafe_code)]
use std::cell::RefCell;

use crate::bindings::coord::sync::store as host;
use crate::bindings::exports::coord::sync::ephemeral::{
    self, Event, Guest as EphemeralGuest, GuestWatcher, Space, TenantSnapshot, Written,
};
use crate::bindings::exports::coord::sync::lease::{
    self, Guest as LeaseGuest, HeldLease, Holder as LeaseHolder,
};
use crate::bindings::exports::coord::sync::lock::{
    AcquireOptions, AcquireOutcome, Error, ExtendOutcome, Guest as LockGuest, HeldLock, Holder,
};
use crate::bindings::exports::coord::sync::ratelimit::{
    self, Decision, Guest as RatelimitGuest, Limiter,
};
use crate::bindings::exports::coord::sync::rwlock::{self, Grant, Guest as RwLockGuest, Mode};
use crate::bindings::exports::coord::sync::semaphore::{self, Guest as SemaphoreGuest, Permit};
use crate::bindings::wasi::random::random;
use crate::ephemeral::{Ephemeral, Watch};
use crate::lease::Leases;
use crate::lock::Locks;
use crate::ratelimit::RateLimits;
use crate::rwlock::RwLocks;
use crate::semaphore::Semaphores;
use crate::store::*;

/// The store the host provides, reached through the component's imports.
struct HostStore;

impl Store for HostStore {
    fn now(&self) -> Result<Millis, StoreError> {
        host::now()
    }
    fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        host::get(partition, key)
    }
    fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        host::list(partition, prefix)
    }
    fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        host::put(partition, key, value, ttl_ms, condition)
    }
    fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        host::delete(partition, key, condition)
    }
    fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        host::touch(partition, key, ttl_ms, condition)
    }
    fn changes(&self, partition: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        host::changes(partition, after, max)
    }
    fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        host::meter(partition, key, *request)
    }
    fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        host::wait(partition, after, timeout_ms)
    }
    fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        host::wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
    }
}

/// Owner tokens from the host's `wasi:random`.
struct HostRandom;

impl Entropy for HostRandom {
    fn random_16(&self) -> [u8; 16] {
        // Two u64s rather than a 16-byte list: no allocation on either side.
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&random::get_random_u64().to_le_bytes());
        out[8..].copy_from_slice(&random::get_random_u64().to_le_bytes());
        out
    }
}

fn locks() -> Locks<HostStore, HostRandom> {
    Locks::new(HostStore, HostRandom)
}

/// The component's exports.
struct Component;

impl LockGuest for Component {
    fn acquire(
        id: String,
        resource: String,
        options: AcquireOptions,
    ) -> Result<AcquireOutcome, Error> {
        locks().acquire(&id, &resource, options)
    }
    fn release(lock: HeldLock) -> Result<bool, Error> {
        locks().release(&lock)
    }
    fn extend(lock: HeldLock, ttl_ms: Option<u64>) -> Result<ExtendOutcome, Error> {
        locks().extend(&lock, ttl_ms)
    }
    fn is_held(lock: HeldLock) -> Result<bool, Error> {
        locks().is_held(&lock)
    }
    fn inspect(id: String, resource: String) -> Result<Option<Holder>, Error> {
        locks().inspect(&id, &resource)
    }
    fn force_release(id: String, resource: String) -> Result<bool, Error> {
        locks().force_release(&id, &resource)
    }
}

fn semaphores() -> Semaphores<HostStore, HostRandom> {
    Semaphores::new(HostStore, HostRandom)
}

impl SemaphoreGuest for Component {
    fn acquire(
        id: String,
        resource: String,
        limit: u32,
        options: semaphore::AcquireOptions,
    ) -> Result<semaphore::AcquireOutcome, semaphore::Error> {
        semaphores().acquire(&id, &resource, limit, options)
    }
    fn release(permit: Permit) -> Result<bool, semaphore::Error> {
        semaphores().release(&permit)
    }
    fn extend(
        permit: Permit,
        ttl_ms: Option<u64>,
    ) -> Result<semaphore::ExtendOutcome, semaphore::Error> {
        semaphores().extend(&permit, ttl_ms)
    }
    fn is_held(permit: Permit) -> Result<bool, semaphore::Error> {
        semaphores().is_held(&permit)
    }
    fn inspect(id: String, resource: String) -> Result<semaphore::Usage, semaphore::Error> {
        semaphores().inspect(&id, &resource)
    }
    fn force_release(id: String, resource: String, fence: u64) -> Result<bool, semaphore::Error> {
        semaphores().force_release(&id, &resource, fence)
    }
}

fn rwlocks() -> RwLocks<HostStore, HostRandom> {
    RwLocks::new(HostStore, HostRandom)
}

impl RwLockGuest for Component {
    fn acquire(
        id: String,
        resource: String,
        mode: Mode,
        options: rwlock::AcquireOptions,
    ) -> Result<rwlock::AcquireOutcome, rwlock::Error> {
        rwlocks().acquire(&id, &resource, mode, options)
    }
    fn release(grant: Grant) -> Result<bool, rwlock::Error> {
        rwlocks().release(&grant)
    }
    fn extend(grant: Grant, ttl_ms: Option<u64>) -> Result<rwlock::ExtendOutcome, rwlock::Error> {
        rwlocks().extend(&grant, ttl_ms)
    }
    fn is_held(grant: Grant) -> Result<bool, rwlock::Error> {
        rwlocks().is_held(&grant)
    }
    fn inspect(id: String, resource: String) -> Result<rwlock::Usage, rwlock::Error> {
        rwlocks().inspect(&id, &resource)
    }
    fn force_release(id: String, resource: String, fence: u64) -> Result<bool, rwlock::Error> {
        rwlocks().force_release(&id, &resource, fence)
    }
}

impl LeaseGuest for Component {
    fn acquire(name: String, node: String, ttl_ms: u64) -> Result<HeldLease, lease::Error> {
        Leases::new(HostStore).acquire(&name, &node, ttl_ms)
    }
    fn renew(lease: HeldLease) -> Result<HeldLease, lease::Error> {
        Leases::new(HostStore).renew(&lease)
    }
    fn check(lease: HeldLease) -> Result<HeldLease, lease::Error> {
        Leases::new(HostStore).check(&lease)
    }
    fn resign(lease: HeldLease) -> Result<bool, lease::Error> {
        Leases::new(HostStore).resign(&lease)
    }
    fn observe(name: String) -> Result<Option<LeaseHolder>, lease::Error> {
        Leases::new(HostStore).observe(&name)
    }
}

impl EphemeralGuest for Component {
    type Watcher = Watcher;

    fn upsert(
        space: Space,
        tenant: String,
        key: String,
        value: Vec<u8>,
    ) -> Result<Written, ephemeral::Error> {
        Ephemeral::new(HostStore).upsert(&space, &tenant, &key, &value)
    }
    fn touch(space: Space, tenant: String, key: String) -> Result<bool, ephemeral::Error> {
        Ephemeral::new(HostStore).touch(&space, &tenant, &key)
    }
    fn delete(space: Space, tenant: String, key: String) -> Result<bool, ephemeral::Error> {
        Ephemeral::new(HostStore).delete(&space, &tenant, &key)
    }
    fn snapshot(
        space: Space,
        tenant: String,
        prefix: Option<String>,
    ) -> Result<TenantSnapshot, ephemeral::Error> {
        Ephemeral::new(HostStore).snapshot(&space, &tenant, prefix.as_deref())
    }
    fn watch(
        space: Space,
        tenant: String,
        prefix: Option<String>,
        after: Option<u64>,
    ) -> Result<ephemeral::Watcher, ephemeral::Error> {
        let watch = Ephemeral::new(HostStore).watch(&space, &tenant, prefix.as_deref(), after)?;
        Ok(ephemeral::Watcher::new(Watcher(RefCell::new(watch))))
    }
}

impl RatelimitGuest for Component {
    fn check(
        limiter: Limiter,
        key: String,
        cost: Option<u32>,
    ) -> Result<Decision, ratelimit::Error> {
        RateLimits::new(HostStore).check(&limiter, &key, cost)
    }
    fn peek(limiter: Limiter, key: String) -> Result<Decision, ratelimit::Error> {
        RateLimits::new(HostStore).peek(&limiter, &key)
    }
    fn reset(limiter: Limiter, key: String) -> Result<(), ratelimit::Error> {
        RateLimits::new(HostStore).reset(&limiter, &key)
    }
    fn reserve(
        limiter: Limiter,
        key: String,
        cost: u32,
        ttl_ms: u64,
    ) -> Result<ratelimit::Reserved, ratelimit::Error> {
        RateLimits::new(HostStore).reserve(&limiter, &key, cost, ttl_ms, &HostRandom)
    }
    fn settle(
        limiter: Limiter,
        reservation: ratelimit::Reservation,
        actual: u32,
    ) -> Result<ratelimit::Settled, ratelimit::Error> {
        RateLimits::new(HostStore).settle(&limiter, &reservation, actual)
    }
    fn cancel(
        limiter: Limiter,
        reservation: ratelimit::Reservation,
    ) -> Result<ratelimit::Settled, ratelimit::Error> {
        RateLimits::new(HostStore).cancel(&limiter, &reservation)
    }
}

/// The `watcher` resource: a [`Watch`] behind a `RefCell`, since resource
/// methods take `&self`.
struct Watcher(RefCell<Watch>);

impl GuestWatcher for Watcher {
    fn next(&self, timeout_ms: u64) -> Result<Option<Event>, ephemeral::Error> {
        self.0.borrow_mut().next(&HostStore, timeout_ms)
    }
    fn revision(&self) -> u64 {
        self.0.borrow().revision()
    }
}

crate::bindings::export!(Component with_types_in crate::bindings);
