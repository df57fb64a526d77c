//! One component instance, and its exports grouped by interface:
//! `instance.lock().acquire(…)`, `instance.lease().renew(…)`,
//! `instance.ephemeral().upsert(…)`, `instance.ratelimit().check(…)`,
//! `instance.semaphore().acquire(…)`, `instance.rwlock().acquire(…)`.

use wasmtime::Store;

use crate::{HostState, bindings, ephemeral, lease, lock, ratelimit, rwlock, semaphore};

/// One coord component instance. The outer `Result` of each call is a trap
/// (a bug in the component or host, never caller input); the inner one is
/// the WIT `result`.
pub struct Instance {
    pub(crate) store: Store<HostState>,
    pub(crate) coordinator: bindings::Coordinator,
}

/// What a lock call returns: a trap, or the interface's own result.
pub type LockResult<T> = wasmtime::Result<Result<T, lock::Error>>;

/// What a lease call returns: a trap, or the interface's own result.
pub type LeaseResult<T> = wasmtime::Result<Result<T, lease::Error>>;

/// What an ephemeral call returns: a trap, or the interface's own result.
pub type EphemeralResult<T> = wasmtime::Result<Result<T, ephemeral::Error>>;

/// What a rate-limit call returns: a trap, or the interface's own result.
pub type RatelimitResult<T> = wasmtime::Result<Result<T, ratelimit::Error>>;

/// What a semaphore call returns: a trap, or the interface's own result.
pub type SemaphoreResult<T> = wasmtime::Result<Result<T, semaphore::Error>>;

/// What a read-write lock call returns: a trap, or the interface's own result.
pub type RwLockResult<T> = wasmtime::Result<Result<T, rwlock::Error>>;

impl Instance {
    /// How many store calls this instance has made so far.
    pub fn store_calls(&self) -> u64 {
        self.store.data().store_calls()
    }

    /// The lock's calls (`coord:sync/lock`).
    pub fn lock(&mut self) -> LockCalls<'_> {
        LockCalls { instance: self }
    }

    /// The lease's calls (`coord:sync/lease`).
    pub fn lease(&mut self) -> LeaseCalls<'_> {
        LeaseCalls { instance: self }
    }

    /// Ephemeral state's calls (`coord:sync/ephemeral`).
    pub fn ephemeral(&mut self) -> EphemeralCalls<'_> {
        EphemeralCalls { instance: self }
    }

    /// The rate limiter's calls (`coord:sync/ratelimit`).
    pub fn ratelimit(&mut self) -> RatelimitCalls<'_> {
        RatelimitCalls { instance: self }
    }

    /// The semaphore's calls (`coord:sync/semaphore`).
    pub fn semaphore(&mut self) -> SemaphoreCalls<'_> {
        SemaphoreCalls { instance: self }
    }

    /// The read-write lock's calls (`coord:sync/rwlock`).
    pub fn rwlock(&mut self) -> RwLockCalls<'_> {
        RwLockCalls { instance: self }
    }
}

/// The read-write lock interface of one [`Instance`]. Made by
/// [`Instance::rwlock`], and taken by each call.
pub struct RwLockCalls<'a> {
    instance: &'a mut Instance,
}

impl RwLockCalls<'_> {
    /// `coord:sync/rwlock.acquire`.
    pub async fn acquire(
        self,
        id: &str,
        resource: &str,
        mode: rwlock::Mode,
        options: rwlock::AcquireOptions,
    ) -> RwLockResult<rwlock::AcquireOutcome> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls
            .call_acquire(&mut self.instance.store, id, resource, mode, options)
            .await
    }

    /// `coord:sync/rwlock.release`.
    pub async fn release(self, grant: &rwlock::Grant) -> RwLockResult<bool> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls.call_release(&mut self.instance.store, grant).await
    }

    /// `coord:sync/rwlock.extend`.
    pub async fn extend(
        self,
        grant: &rwlock::Grant,
        ttl_ms: Option<u64>,
    ) -> RwLockResult<rwlock::ExtendOutcome> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls
            .call_extend(&mut self.instance.store, grant, ttl_ms)
            .await
    }

    /// `coord:sync/rwlock.is-held`: whether this grant still holds the lock
    /// (the commit-point check before a fenced write).
    pub async fn is_held(self, grant: &rwlock::Grant) -> RwLockResult<bool> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls.call_is_held(&mut self.instance.store, grant).await
    }

    /// `coord:sync/rwlock.inspect`.
    pub async fn inspect(self, id: &str, resource: &str) -> RwLockResult<rwlock::Usage> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls
            .call_inspect(&mut self.instance.store, id, resource)
            .await
    }

    /// `coord:sync/rwlock.force-release`.
    pub async fn force_release(self, id: &str, resource: &str, fence: u64) -> RwLockResult<bool> {
        let calls = self.instance.coordinator.coord_sync_rwlock();
        calls
            .call_force_release(&mut self.instance.store, id, resource, fence)
            .await
    }
}

/// The semaphore interface of one [`Instance`]. Made by
/// [`Instance::semaphore`], and taken by each call.
pub struct SemaphoreCalls<'a> {
    instance: &'a mut Instance,
}

impl SemaphoreCalls<'_> {
    /// `coord:sync/semaphore.acquire`.
    pub async fn acquire(
        self,
        id: &str,
        resource: &str,
        limit: u32,
        options: semaphore::AcquireOptions,
    ) -> SemaphoreResult<semaphore::AcquireOutcome> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls
            .call_acquire(&mut self.instance.store, id, resource, limit, options)
            .await
    }

    /// `coord:sync/semaphore.release`.
    pub async fn release(self, permit: &semaphore::Permit) -> SemaphoreResult<bool> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls.call_release(&mut self.instance.store, permit).await
    }

    /// `coord:sync/semaphore.extend`.
    pub async fn extend(
        self,
        permit: &semaphore::Permit,
        ttl_ms: Option<u64>,
    ) -> SemaphoreResult<semaphore::ExtendOutcome> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls
            .call_extend(&mut self.instance.store, permit, ttl_ms)
            .await
    }

    /// `coord:sync/semaphore.is-held`: whether this permit is still held
    /// (the commit-point check before a fenced write).
    pub async fn is_held(self, permit: &semaphore::Permit) -> SemaphoreResult<bool> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls.call_is_held(&mut self.instance.store, permit).await
    }

    /// `coord:sync/semaphore.inspect`.
    pub async fn inspect(self, id: &str, resource: &str) -> SemaphoreResult<semaphore::Usage> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls
            .call_inspect(&mut self.instance.store, id, resource)
            .await
    }

    /// `coord:sync/semaphore.force-release`.
    pub async fn force_release(
        self,
        id: &str,
        resource: &str,
        fence: u64,
    ) -> SemaphoreResult<bool> {
        let calls = self.instance.coordinator.coord_sync_semaphore();
        calls
            .call_force_release(&mut self.instance.store, id, resource, fence)
            .await
    }
}

/// The lock interface of one [`Instance`]. Made by [`Instance::lock`], and taken by
/// each call: `instance.lock().…` once per call.
pub struct LockCalls<'a> {
    instance: &'a mut Instance,
}

impl LockCalls<'_> {
    /// `coord:sync/lock.acquire`.
    pub async fn acquire(
        self,
        id: &str,
        resource: &str,
        options: lock::AcquireOptions,
    ) -> LockResult<lock::AcquireOutcome> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_acquire(&mut self.instance.store, id, resource, options)
            .await
    }

    /// `coord:sync/lock.release`.
    pub async fn release(self, held: &lock::HeldLock) -> LockResult<bool> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_release(&mut self.instance.store, held).await
    }

    /// `coord:sync/lock.extend`.
    pub async fn extend(
        self,
        held: &lock::HeldLock,
        ttl_ms: Option<u64>,
    ) -> LockResult<lock::ExtendOutcome> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_extend(&mut self.instance.store, held, ttl_ms)
            .await
    }

    /// `coord:sync/lock.is-held`: whether this acquisition still holds its
    /// lock (the commit-point check before a write).
    pub async fn is_held(self, held: &lock::HeldLock) -> LockResult<bool> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_is_held(&mut self.instance.store, held).await
    }

    /// `coord:sync/lock.inspect`.
    pub async fn inspect(self, id: &str, resource: &str) -> LockResult<Option<lock::Holder>> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_inspect(&mut self.instance.store, id, resource)
            .await
    }

    /// `coord:sync/lock.force-release`.
    pub async fn force_release(self, id: &str, resource: &str) -> LockResult<bool> {
        let lock = self.instance.coordinator.coord_sync_lock();
        lock.call_force_release(&mut self.instance.store, id, resource)
            .await
    }
}

/// The lease interface of one [`Instance`]. Made by [`Instance::lease`], and taken by
/// each call: `instance.lease().…` once per call.
pub struct LeaseCalls<'a> {
    instance: &'a mut Instance,
}

impl LeaseCalls<'_> {
    /// `coord:sync/lease.acquire`: acquire, adopt or take over `name` for `node`.
    pub async fn acquire(
        self,
        name: &str,
        node: &str,
        ttl_ms: u64,
    ) -> LeaseResult<lease::HeldLease> {
        let lease = self.instance.coordinator.coord_sync_lease();
        lease
            .call_acquire(&mut self.instance.store, name, node, ttl_ms)
            .await
    }

    /// `coord:sync/lease.renew`.
    pub async fn renew(self, held: &lease::HeldLease) -> LeaseResult<lease::HeldLease> {
        let lease = self.instance.coordinator.coord_sync_lease();
        lease.call_renew(&mut self.instance.store, held).await
    }

    /// `coord:sync/lease.check`: the commit-point check before a write.
    pub async fn check(self, held: &lease::HeldLease) -> LeaseResult<lease::HeldLease> {
        let lease = self.instance.coordinator.coord_sync_lease();
        lease.call_check(&mut self.instance.store, held).await
    }

    /// `coord:sync/lease.resign`.
    pub async fn resign(self, held: &lease::HeldLease) -> LeaseResult<bool> {
        let lease = self.instance.coordinator.coord_sync_lease();
        lease.call_resign(&mut self.instance.store, held).await
    }

    /// `coord:sync/lease.observe`.
    pub async fn observe(self, name: &str) -> LeaseResult<Option<lease::Holder>> {
        let lease = self.instance.coordinator.coord_sync_lease();
        lease.call_observe(&mut self.instance.store, name).await
    }
}

/// The ephemeral-state interface of one [`Instance`]. Made by [`Instance::ephemeral`], and taken by
/// each call: `instance.ephemeral().…` once per call.
pub struct EphemeralCalls<'a> {
    instance: &'a mut Instance,
}

impl EphemeralCalls<'_> {
    /// `coord:sync/ephemeral.upsert`.
    pub async fn upsert(
        self,
        space: &ephemeral::Space,
        tenant: &str,
        key: &str,
        value: &[u8],
    ) -> EphemeralResult<ephemeral::Written> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.call_upsert(&mut self.instance.store, space, tenant, key, value)
            .await
    }

    /// `coord:sync/ephemeral.touch`.
    pub async fn touch(
        self,
        space: &ephemeral::Space,
        tenant: &str,
        key: &str,
    ) -> EphemeralResult<bool> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.call_touch(&mut self.instance.store, space, tenant, key)
            .await
    }

    /// `coord:sync/ephemeral.delete`.
    pub async fn delete(
        self,
        space: &ephemeral::Space,
        tenant: &str,
        key: &str,
    ) -> EphemeralResult<bool> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.call_delete(&mut self.instance.store, space, tenant, key)
            .await
    }

    /// `coord:sync/ephemeral.snapshot`.
    pub async fn snapshot(
        self,
        space: &ephemeral::Space,
        tenant: &str,
        prefix: Option<&str>,
    ) -> EphemeralResult<ephemeral::TenantSnapshot> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.call_snapshot(&mut self.instance.store, space, tenant, prefix)
            .await
    }

    /// `coord:sync/ephemeral.watch`.
    pub async fn watch(
        self,
        space: &ephemeral::Space,
        tenant: &str,
        prefix: Option<&str>,
        after: Option<u64>,
    ) -> EphemeralResult<ephemeral::Watcher> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        let watcher = eph
            .call_watch(&mut self.instance.store, space, tenant, prefix, after)
            .await?;
        Ok(watcher.map(ephemeral::Watcher))
    }

    /// `watcher.next`: the next event, waiting up to `timeout_ms` for one.
    pub async fn next_event(
        self,
        watcher: &ephemeral::Watcher,
        timeout_ms: u64,
    ) -> EphemeralResult<Option<ephemeral::Event>> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.watcher()
            .call_next(&mut self.instance.store, watcher.0, timeout_ms)
            .await
    }

    /// `watcher.revision`: where to resume this watch from.
    pub async fn watch_revision(self, watcher: &ephemeral::Watcher) -> wasmtime::Result<u64> {
        let eph = self.instance.coordinator.coord_sync_ephemeral();
        eph.watcher()
            .call_revision(&mut self.instance.store, watcher.0)
            .await
    }

    /// Close a watch, freeing its state in the component.
    pub async fn close_watch(self, watcher: ephemeral::Watcher) -> wasmtime::Result<()> {
        watcher
            .0
            .resource_drop_async(&mut self.instance.store)
            .await
    }
}

/// The rate-limit interface of one [`Instance`]. Made by [`Instance::ratelimit`], and taken by
/// each call: `instance.ratelimit().…` once per call.
pub struct RatelimitCalls<'a> {
    instance: &'a mut Instance,
}

impl RatelimitCalls<'_> {
    /// `coord:sync/ratelimit.check`.
    pub async fn check(
        self,
        limiter: &ratelimit::Limiter,
        key: &str,
        cost: Option<u32>,
    ) -> RatelimitResult<ratelimit::Decision> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_check(&mut self.instance.store, limiter, key, cost)
            .await
    }

    /// `coord:sync/ratelimit.peek`.
    pub async fn peek(
        self,
        limiter: &ratelimit::Limiter,
        key: &str,
    ) -> RatelimitResult<ratelimit::Decision> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_peek(&mut self.instance.store, limiter, key).await
    }

    /// `coord:sync/ratelimit.reset`.
    pub async fn reset(self, limiter: &ratelimit::Limiter, key: &str) -> RatelimitResult<()> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_reset(&mut self.instance.store, limiter, key).await
    }

    /// `coord:sync/ratelimit.reserve`: count an estimate now, to settle later.
    pub async fn reserve(
        self,
        limiter: &ratelimit::Limiter,
        key: &str,
        cost: u32,
        ttl_ms: u64,
    ) -> RatelimitResult<ratelimit::Reserved> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_reserve(&mut self.instance.store, limiter, key, cost, ttl_ms)
            .await
    }

    /// `coord:sync/ratelimit.settle`: the real cost, once known.
    pub async fn settle(
        self,
        limiter: &ratelimit::Limiter,
        reservation: &ratelimit::Reservation,
        actual: u32,
    ) -> RatelimitResult<ratelimit::Settled> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_settle(&mut self.instance.store, limiter, reservation, actual)
            .await
    }

    /// `coord:sync/ratelimit.cancel`: settle for nothing.
    pub async fn cancel(
        self,
        limiter: &ratelimit::Limiter,
        reservation: &ratelimit::Reservation,
    ) -> RatelimitResult<ratelimit::Settled> {
        let rl = self.instance.coordinator.coord_sync_ratelimit();
        rl.call_cancel(&mut self.instance.store, limiter, reservation)
            .await
    }
}
