//! Unit tests of the lock logic over the fake store, with the clock moved by hand.

use super::*;
use crate::fake::{CountingEntropy, FakeStore, Tamper, Tampered};
use crate::store::{
    ChangesReply, ListReply, MeterReply, MeterRequest, ReadReply, StoreError, WriteReply,
};

const T0: u64 = 1_000_000;

fn locks(store: &FakeStore) -> Locks<&FakeStore, CountingEntropy> {
    Locks::new(store, CountingEntropy::default())
}

fn once(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(WaitPolicy::NoWait),
    }
}

fn acquired(outcome: AcquireOutcome) -> HeldLock {
    match outcome {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

fn busy(outcome: AcquireOutcome) -> Holder {
    match outcome {
        AcquireOutcome::Busy(holder) => holder,
        AcquireOutcome::Acquired(lock) => panic!("expected busy, got acquired {lock:?}"),
    }
}

fn invalid_field(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

#[test]
fn uncontended_acquire_release_and_extend_are_one_store_call_each() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let lock = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    assert_eq!(store.calls.get(), 1);
    assert!(lock.fence > 0);
    assert_eq!(lock.expires_at, T0 + 1000);
    assert_eq!(lock.owner.len(), 32);

    store.advance(400);
    let extended = match l.extend(&lock, Some(5000)).unwrap() {
        ExtendOutcome::Extended(lock) => lock,
        ExtendOutcome::Lost => panic!("lost"),
    };
    assert_eq!(store.calls.get(), 2);
    assert_eq!(extended.fence, lock.fence, "extend keeps the fence");
    assert_eq!(extended.expires_at, T0 + 400 + 5000);

    assert!(l.release(&extended).unwrap());
    assert_eq!(store.calls.get(), 3);
    assert_eq!(l.inspect("stock", "item:1").unwrap(), None);
}

#[test]
fn busy_reports_the_holder_from_the_same_call() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let first = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    store.advance(300);
    let calls = store.calls.get();
    let holder = busy(l.acquire("stock", "item:1", once(1000)).unwrap());
    assert_eq!(store.calls.get(), calls + 1);
    assert_eq!(
        holder,
        Holder {
            fence: first.fence,
            remaining_ms: 700
        }
    );
    assert_eq!(l.inspect("stock", "item:1").unwrap(), Some(holder));
}

#[test]
fn fences_strictly_increase_across_release_expiry_and_force_release() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let a = acquired(l.acquire("stock", "item:1", once(100)).unwrap());
    assert!(l.release(&a).unwrap());
    let b = acquired(l.acquire("stock", "item:1", once(100)).unwrap());
    store.advance(100); // b expires
    let c = acquired(l.acquire("stock", "item:1", once(100)).unwrap());
    assert!(l.force_release("stock", "item:1").unwrap());
    let d = acquired(l.acquire("stock", "item:1", once(100)).unwrap());
    assert!(
        a.fence < b.fence && b.fence < c.fence && c.fence < d.fence,
        "{a:?} {b:?} {c:?} {d:?}"
    );
}

#[test]
fn a_stale_holder_cannot_release_or_extend_the_new_holders_lock() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let stale = acquired(l.acquire("stock", "item:1", once(100)).unwrap());
    store.advance(150);
    let fresh = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    assert!(!l.release(&stale).unwrap());
    assert_eq!(l.extend(&stale, None).unwrap(), ExtendOutcome::Lost);
    let holder = l.inspect("stock", "item:1").unwrap().unwrap();
    assert_eq!(holder.fence, fresh.fence);
    assert_eq!(
        holder.remaining_ms, 1000,
        "the stale extend did not touch the new holder"
    );
    assert!(l.release(&fresh).unwrap());
}

#[test]
fn a_forged_owner_or_fence_cannot_release() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let lock = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    let other_owner = HeldLock {
        owner: "0".repeat(32),
        ..lock.clone()
    };
    assert!(!l.release(&other_owner).unwrap());
    let other_fence = HeldLock {
        fence: lock.fence + 1,
        ..lock.clone()
    };
    assert!(!l.release(&other_fence).unwrap());
    assert!(l.inspect("stock", "item:1").unwrap().is_some());
    assert!(l.release(&lock).unwrap());
}

#[test]
fn a_waiter_is_woken_by_the_release_not_by_its_poll_interval() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let holder = acquired(l.acquire("stock", "item:1", once(10_000)).unwrap());
    // While the waiter waits, the holder releases (another client, same store).
    store.during_wait(move |s| {
        let other = Locks::new(s, CountingEntropy::default());
        let _ = other.release(&holder);
    });
    let options = AcquireOptions {
        ttl_ms: Some(1000),
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts: 3,
            delay_ms: 5000,
        })),
    };
    let lock = acquired(l.acquire("stock", "item:1", options).unwrap());
    assert_eq!(store.waits.get(), 1);
    assert_eq!(
        store.clock(),
        T0,
        "no time passed: the release woke the waiter"
    );
    assert_eq!(lock.expires_at, T0 + 1000);
}

#[test]
fn an_attempt_whose_reply_was_lost_is_known_by_its_token_and_held() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let holder = acquired(l.acquire("stock", "item:1", once(10_000)).unwrap());
    // CountingEntropy gives the holder's token 01…01 and the waiter's 02…02.
    let waiter_token = "02".repeat(16);
    let token = waiter_token.clone();
    // While the waiter waits, the holder releases and the waiter's own
    // attempt lands, as when a host retried a request whose reply it lost:
    // the attempt that follows finds the waiter's token already holding.
    store.during_wait(move |s| {
        let other = Locks::new(s, CountingEntropy::default());
        let _ = other.release(&holder);
        let partition = keys::lock_partition("stock", "item:1");
        s.put(
            &partition,
            LOCK_HOLDER_KEY,
            token.as_bytes(),
            Some(1000),
            &Condition::Absent,
        )
        .unwrap();
    });
    let options = AcquireOptions {
        ttl_ms: Some(1000),
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts: 3,
            delay_ms: 5000,
        })),
    };
    let lock = acquired(l.acquire("stock", "item:1", options).unwrap());
    assert_eq!(lock.owner, waiter_token);
    let now_held = l.inspect("stock", "item:1").unwrap().unwrap();
    assert_eq!(
        lock.fence, now_held.fence,
        "the fence of the attempt that landed"
    );
    assert_eq!(lock.expires_at, T0 + 1000);
    assert_eq!(store.waits.get(), 1, "known at once, not waited out");
    assert!(
        l.release(&lock).unwrap(),
        "and it releases as any held lock"
    );
}

#[test]
fn a_waiter_acquires_when_the_holder_expires() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    acquired(l.acquire("stock", "item:1", once(500)).unwrap());
    let options = AcquireOptions {
        ttl_ms: Some(1000),
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts: 10,
            delay_ms: 200,
        })),
    };
    let lock = acquired(l.acquire("stock", "item:1", options).unwrap());
    assert_eq!(
        store.clock(),
        T0 + 500,
        "acquired at the holder's expiry, not later"
    );
    assert_eq!(store.waits.get(), 3, "200 + 200 + 100 ms");
    assert_eq!(lock.expires_at, T0 + 1500);
}

#[test]
fn attempts_and_timeouts_give_up_with_busy() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    acquired(l.acquire("stock", "item:1", once(60_000)).unwrap());
    let attempts = AcquireOptions {
        ttl_ms: None,
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts: 3,
            delay_ms: 200,
        })),
    };
    busy(l.acquire("stock", "item:1", attempts).unwrap());
    assert_eq!(store.clock(), T0 + 400, "three attempts, two waits");

    let timeout = AcquireOptions {
        ttl_ms: None,
        wait: Some(WaitPolicy::Timeout(1000)),
    };
    let holder = busy(l.acquire("stock", "item:1", timeout).unwrap());
    assert_eq!(store.clock(), T0 + 1400);
    assert_eq!(holder.remaining_ms, 60_000 - 1400);

    // The default is the first attempt and ten retries, 200 ms apart: 2 s.
    busy(
        l.acquire(
            "stock",
            "item:1",
            AcquireOptions {
                ttl_ms: None,
                wait: None,
            },
        )
        .unwrap(),
    );
    assert_eq!(store.clock(), T0 + 1400 + 2000);
}

#[test]
fn invalid_arguments_are_named_and_reach_no_store() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let ok = || AcquireOptions {
        ttl_ms: None,
        wait: None,
    };
    assert_eq!(invalid_field(l.acquire("", "r", ok())), "id");
    assert_eq!(invalid_field(l.acquire("i", "", ok())), "resource");
    assert_eq!(invalid_field(l.acquire(&"x".repeat(257), "r", ok())), "id");
    assert_eq!(
        invalid_field(l.acquire("i", &"x".repeat(1 << 20), ok())),
        "resource"
    );
    assert_eq!(
        invalid_field(l.acquire("i", "r", once(0))),
        "options.ttl-ms"
    );
    assert_eq!(
        invalid_field(l.acquire("i", "r", once(u64::MAX))),
        "options.ttl-ms"
    );
    let zero_attempts = AcquireOptions {
        ttl_ms: None,
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts: 0,
            delay_ms: 1,
        })),
    };
    assert_eq!(
        invalid_field(l.acquire("i", "r", zero_attempts)),
        "options.wait.attempts.max-attempts"
    );
    let long_timeout = AcquireOptions {
        ttl_ms: None,
        wait: Some(WaitPolicy::Timeout(u64::MAX)),
    };
    assert_eq!(
        invalid_field(l.acquire("i", "r", long_timeout)),
        "options.wait.timeout"
    );
    assert_eq!(invalid_field(l.inspect("", "r")), "id");
    assert_eq!(invalid_field(l.force_release("i", "")), "resource");

    let good = HeldLock {
        id: "i".into(),
        resource: "r".into(),
        owner: "a".repeat(32),
        fence: 1,
        ttl_ms: 1000,
        expires_at: 0,
    };
    assert_eq!(
        invalid_field(l.release(&HeldLock {
            owner: "A".repeat(32),
            ..good.clone()
        })),
        "lock.owner"
    );
    assert_eq!(
        invalid_field(l.release(&HeldLock {
            owner: "abc".into(),
            ..good.clone()
        })),
        "lock.owner"
    );
    assert_eq!(
        invalid_field(l.release(&HeldLock {
            fence: 0,
            ..good.clone()
        })),
        "lock.fence"
    );
    assert_eq!(
        invalid_field(l.release(&HeldLock {
            id: String::new(),
            ..good.clone()
        })),
        "lock.id"
    );
    assert_eq!(
        invalid_field(l.extend(
            &HeldLock {
                ttl_ms: 0,
                ..good.clone()
            },
            None
        )),
        "lock.ttl-ms"
    );
    assert_eq!(invalid_field(l.extend(&good, Some(0))), "ttl-ms");
    assert_eq!(store.calls.get(), 0, "nothing invalid reached the store");
}

mod faults;
mod waiting;
