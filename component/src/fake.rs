//! A single-threaded store for unit tests: [`memory::Partition`]s, a clock
//! the test moves by hand, and a count of store calls.
//!
//! `wait` cannot block (nothing else runs), so it lets simulated time pass:
//! it first runs the test's `during_wait` hook (another client acting while
//! this one waits) and, if the partition still has not changed, moves the
//! clock forward by the timeout.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::memory::{DEFAULT_HISTORY, Partition};
use crate::store::*;

type Hook = Box<dyn FnMut(&FakeStore)>;

#[derive(Default)]
pub struct FakeStore {
    history: Cell<Option<usize>>,
    now: Cell<u64>,
    partitions: RefCell<HashMap<String, Partition>>,
    pub calls: Cell<usize>,
    pub waits: Cell<usize>,
    during_wait: RefCell<Option<Hook>>,
}

impl FakeStore {
    pub fn new(now: u64) -> Self {
        let store = FakeStore::default();
        store.now.set(now);
        store
    }

    pub fn with_history(now: u64, history: usize) -> Self {
        let store = FakeStore::new(now);
        store.history.set(Some(history));
        store
    }

    pub fn advance(&self, ms: u64) {
        self.now.set(self.now.get() + ms);
    }

    pub fn clock(&self) -> u64 {
        self.now.get()
    }

    pub fn during_wait(&self, hook: impl FnMut(&FakeStore) + 'static) {
        *self.during_wait.borrow_mut() = Some(Box::new(hook));
    }

    fn count(&self) {
        self.calls.set(self.calls.get() + 1);
    }

    fn with<T>(&self, partition: &str, f: impl FnOnce(&mut Partition, u64) -> T) -> T {
        let mut partitions = self.partitions.borrow_mut();
        let p = partitions
            .entry(partition.to_string())
            .or_insert_with(|| Partition::new(self.history.get().unwrap_or(DEFAULT_HISTORY)));
        f(p, self.now.get())
    }

    fn write(
        &self,
        partition: &str,
        f: impl FnOnce(&mut Partition, u64) -> Outcome,
    ) -> Result<WriteReply, StoreError> {
        self.count();
        Ok(self.with(partition, |p, now| {
            let outcome = f(p, now);
            WriteReply {
                outcome,
                now,
                revision: p.revision(),
            }
        }))
    }
}

impl Store for &FakeStore {
    fn now(&self) -> Result<Millis, StoreError> {
        self.count();
        Ok(self.now.get())
    }
    fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        self.count();
        Ok(self.with(partition, |p, now| ReadReply {
            entry: p.get(key, now),
            now,
        }))
    }
    fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.count();
        Ok(self.with(partition, |p, now| {
            let entries = p.list(prefix, now);
            ListReply {
                entries,
                revision: p.revision(),
                now,
            }
        }))
    }
    fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.write(partition, |p, now| {
            p.put(key, value, ttl_ms, condition, now)
        })
    }
    fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.write(partition, |p, now| p.delete(key, condition, now))
    }
    fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.write(partition, |p, now| p.touch(key, ttl_ms, condition, now))
    }
    fn changes(&self, partition: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        self.count();
        self.with(partition, |p, now| {
            let changes = p.changes(after, max, now)?;
            Ok(ChangesReply {
                changes,
                revision: p.revision(),
                now,
            })
        })
    }
    fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.count();
        Ok(self.with(partition, |p, now| p.meter(key, request, now)))
    }
    fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        self.count();
        self.waits.set(self.waits.get() + 1);
        let hook = self.during_wait.borrow_mut().take();
        if let Some(mut hook) = hook {
            hook(self);
            *self.during_wait.borrow_mut() = Some(hook);
        }
        let changed = self.with(partition, |p, now| {
            p.sweep(now);
            p.revision() > after
        });
        if !changed {
            // Sleep until the first expiry in the partition or the timeout.
            let deadline = self.now.get() + timeout_ms;
            let wake = self
                .with(partition, |p, _| p.next_expiry())
                .map_or(deadline, |e| e.min(deadline));
            self.now.set(wake.max(self.now.get()));
        }
        Ok(self.with(partition, |p, now| {
            p.sweep(now);
            p.revision()
        }))
    }
}

/// Entropy that counts up, so owner tokens differ and tests are repeatable.
#[derive(Default)]
pub struct CountingEntropy(pub Cell<u8>);

impl crate::store::Entropy for CountingEntropy {
    fn random_16(&self) -> [u8; 16] {
        self.0.set(self.0.get().wrapping_add(1));
        [self.0.get(); 16]
    }
}

/// A store that breaks its contract on purpose: every entry it returns, in
/// any reply, first passes through `tamper` with that reply's `now`. For
/// the tests that the interfaces answer `internal` (or decide from `now`
/// themselves) instead of believing a broken store.
pub struct Tampered<'a> {
    pub inner: &'a FakeStore,
    pub tamper: Tamper,
}

/// What a [`Tampered`] store does to each entry it returns, given the reply's `now`.
pub type Tamper = Box<dyn Fn(&mut Entry, u64)>;

impl Tampered<'_> {
    fn outcome(&self, mut reply: WriteReply) -> WriteReply {
        match &mut reply.outcome {
            Outcome::Applied(entry) | Outcome::Conflict(Some(entry)) => {
                (self.tamper)(entry, reply.now)
            }
            Outcome::Conflict(None) => {}
        }
        reply
    }
}

impl Store for &Tampered<'_> {
    fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now()
    }
    fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let mut reply = self.inner.get(partition, key)?;
        if let Some(entry) = &mut reply.entry {
            (self.tamper)(entry, reply.now);
        }
        Ok(reply)
    }
    fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let mut reply = self.inner.list(partition, prefix)?;
        for entry in &mut reply.entries {
            (self.tamper)(entry, reply.now);
        }
        Ok(reply)
    }
    fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let reply = self.inner.put(partition, key, value, ttl_ms, condition)?;
        Ok(self.outcome(reply))
    }
    fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let reply = self.inner.delete(partition, key, condition)?;
        Ok(self.outcome(reply))
    }
    fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let reply = self.inner.touch(partition, key, ttl_ms, condition)?;
        Ok(self.outcome(reply))
    }
    fn changes(&self, partition: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        self.inner.changes(partition, after, max)
    }
    fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.inner.meter(partition, key, request)
    }
    fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        self.inner.wait(partition, after, timeout_ms)
    }
}

/// A store that fails the calls a test picks: `fails(call, key)` is asked
/// before each call reaches `inner` (`call` is the store function's name,
/// `key` its key, or its prefix for `list`, or "" where it has none), and a
/// `Some` error is returned instead. With `applied`, the failing call is
/// still made first and only its reply is lost (a write that applied, then
/// timed out or failed on its way back); without, it is not made.
pub struct Failing<'a> {
    pub inner: &'a FakeStore,
    pub fails: FailWhen,
    pub applied: bool,
}

/// Which calls a [`Failing`] store fails, and how: given the call's name and key.
pub type FailWhen = Box<dyn Fn(&str, &str) -> Option<StoreError>>;

impl Failing<'_> {
    fn run<T>(
        &self,
        call: &str,
        key: &str,
        make: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match (self.fails)(call, key) {
            None => make(),
            Some(error) => {
                if self.applied {
                    let _ = make();
                }
                Err(error)
            }
        }
    }
}

impl Store for &Failing<'_> {
    fn now(&self) -> Result<Millis, StoreError> {
        self.run("now", "", || self.inner.now())
    }
    fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        self.run("get", key, || self.inner.get(partition, key))
    }
    fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.run("list", prefix, || self.inner.list(partition, prefix))
    }
    fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.run("put", key, || {
            self.inner.put(partition, key, value, ttl_ms, condition)
        })
    }
    fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.run("delete", key, || {
            self.inner.delete(partition, key, condition)
        })
    }
    fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.run("touch", key, || {
            self.inner.touch(partition, key, ttl_ms, condition)
        })
    }
    fn changes(&self, partition: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        self.run("changes", "", || self.inner.changes(partition, after, max))
    }
    fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.run("meter", key, || self.inner.meter(partition, key, request))
    }
    fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        self.run("wait", "", || self.inner.wait(partition, after, timeout_ms))
    }
}
