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

/// A store that cannot be reached.
struct Down;

impl Store for Down {
    fn now(&self) -> Result<u64, StoreError> {
        Err(down())
    }
    fn get(&self, _: &str, _: &str) -> Result<ReadReply, StoreError> {
        Err(down())
    }
    fn list(&self, _: &str, _: &str) -> Result<ListReply, StoreError> {
        Err(down())
    }
    fn put(
        &self,
        _: &str,
        _: &str,
        _: &[u8],
        _: Option<u64>,
        _: &Condition,
    ) -> Result<WriteReply, StoreError> {
        Err(down())
    }
    fn delete(&self, _: &str, _: &str, _: &Condition) -> Result<WriteReply, StoreError> {
        Err(down())
    }
    fn touch(&self, _: &str, _: &str, _: u64, _: &Condition) -> Result<WriteReply, StoreError> {
        Err(down())
    }
    fn changes(&self, _: &str, _: u64, _: u32) -> Result<ChangesReply, StoreError> {
        Err(down())
    }
    fn wait(&self, _: &str, _: u64, _: u64) -> Result<u64, StoreError> {
        Err(down())
    }
    fn meter(&self, _: &str, _: &str, _: &MeterRequest) -> Result<MeterReply, StoreError> {
        Err(down())
    }
}

fn down() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

#[test]
fn an_unreachable_store_is_unavailable_never_busy_or_acquired() {
    let l = Locks::new(Down, CountingEntropy::default());
    let lock = HeldLock {
        id: "i".into(),
        resource: "r".into(),
        owner: "a".repeat(32),
        fence: 1,
        ttl_ms: 1000,
        expires_at: 0,
    };
    assert!(matches!(
        l.acquire("i", "r", once(1000)),
        Err(Error::Unavailable(_))
    ));
    assert!(matches!(l.release(&lock), Err(Error::Unavailable(_))));
    assert!(matches!(l.extend(&lock, None), Err(Error::Unavailable(_))));
    assert!(matches!(l.inspect("i", "r"), Err(Error::Unavailable(_))));
    assert!(matches!(
        l.force_release("i", "r"),
        Err(Error::Unavailable(_))
    ));
}

#[test]
fn owner_tokens_are_two_lowercase_hex_digits_per_byte() {
    assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    let bytes: Vec<u8> = (0..=255).collect();
    let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex(&bytes), expected);
}

#[test]
fn wake_ups_that_find_the_lock_held_again_do_not_spend_the_waiters_budget() {
    // Outside testers: four contending processes gave up after 0.6-0.8 s of
    // the 2 s default, because each wake-up (another waiter's acquisition)
    // spent an attempt. Here every wait is woken 10 ms in by a new holder.
    let store = FakeStore::new(T0);
    let l = locks(&store);
    acquired(l.acquire("stock", "item:1", once(60_000)).unwrap());
    let handoffs = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counted = handoffs.clone();
    store.during_wait(move |s| {
        s.advance(10);
        let other = Locks::new(s, CountingEntropy(std::cell::Cell::new(100)));
        other.force_release("stock", "item:1").unwrap();
        acquired(other.acquire("stock", "item:1", once(60_000)).unwrap());
        counted.set(counted.get() + 1);
    });
    let holder = busy(
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
    assert!(
        store.clock() >= T0 + 2000,
        "kept trying for the default's 2 s, gave up after {} ms",
        store.clock() - T0
    );
    assert!(store.clock() <= T0 + 2010, "and not much longer");
    assert!(handoffs.get() >= 200, "woken {} times", handoffs.get());
    assert!(holder.fence > 0);
}

#[test]
fn a_lock_entry_that_is_not_an_owner_token_is_internal_never_busy() {
    for corrupt in [&b"not-an-owner-token!"[..], &[0xff, 0xfe, 0x00][..]] {
        let store = FakeStore::new(T0);
        let partition = keys::lock_partition("stock", "item:1");
        (&store)
            .put(
                &partition,
                LOCK_HOLDER_KEY,
                corrupt,
                Some(10_000),
                &Condition::Absent,
            )
            .unwrap();
        let l = locks(&store);
        assert!(
            matches!(
                l.acquire("stock", "item:1", once(1000)),
                Err(Error::Internal(_))
            ),
            "acquire over {corrupt:?}"
        );
        assert!(
            matches!(l.inspect("stock", "item:1"), Err(Error::Internal(_))),
            "inspect over {corrupt:?}"
        );
    }
}

#[test]
fn is_held_answers_for_exactly_this_owner_at_this_fence_in_one_read() {
    let store = FakeStore::new(T0);
    let l = locks(&store);
    let lock = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    let calls = store.calls.get();
    assert!(l.is_held(&lock).unwrap());
    assert_eq!(store.calls.get(), calls + 1, "one store read");

    let forged_fence = HeldLock {
        fence: u64::MAX,
        ..lock.clone()
    };
    assert!(!l.is_held(&forged_fence).unwrap(), "a fence never issued");
    let forged_owner = HeldLock {
        owner: "0".repeat(32),
        ..lock.clone()
    };
    assert!(!l.is_held(&forged_owner).unwrap(), "someone else's token");

    store.advance(1000);
    assert!(!l.is_held(&lock).unwrap(), "expired on the store's clock");
    let next = acquired(l.acquire("stock", "item:1", once(1000)).unwrap());
    assert!(!l.is_held(&lock).unwrap(), "after a new holder took it");
    assert!(l.is_held(&next).unwrap());
    assert!(l.release(&next).unwrap());
    assert!(!l.is_held(&next).unwrap(), "after its release");
    assert_eq!(
        invalid_field(l.is_held(&HeldLock {
            fence: 0,
            ..next.clone()
        })),
        "lock.fence"
    );
}

/// The fake store, but after `passing` puts the next `failing` ones answer
/// `unavailable`; with `applied`, each is applied first (a request that
/// timed out at the host and ran when the store woke).
struct TimesOut<'a> {
    inner: &'a FakeStore,
    passing: std::cell::Cell<u32>,
    failing: std::cell::Cell<u32>,
    applied: bool,
}

impl TimesOut<'_> {
    fn fails_now(&self) -> bool {
        if self.passing.get() > 0 {
            self.passing.set(self.passing.get() - 1);
            return false;
        }
        self.failing.get() > 0
    }

    fn fail<T>(&self, reply: Result<T, StoreError>, fails: bool) -> Result<T, StoreError> {
        if !fails {
            return reply;
        }
        self.failing.set(self.failing.get() - 1);
        Err(StoreError::Unavailable("redis: timed out".into()))
    }
}

impl Store for &TimesOut<'_> {
    fn now(&self) -> Result<u64, StoreError> {
        self.inner.now()
    }
    fn get(&self, p: &str, k: &str) -> Result<ReadReply, StoreError> {
        self.inner.get(p, k)
    }
    fn list(&self, p: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.inner.list(p, prefix)
    }
    fn put(
        &self,
        p: &str,
        k: &str,
        v: &[u8],
        ttl: Option<u64>,
        c: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let fails = self.fails_now();
        if fails && !self.applied {
            return self.fail(Err(StoreError::Unavailable(String::new())), true);
        }
        let reply = self.inner.put(p, k, v, ttl, c);
        self.fail(reply, fails)
    }
    fn delete(&self, p: &str, k: &str, c: &Condition) -> Result<WriteReply, StoreError> {
        self.inner.delete(p, k, c)
    }
    fn touch(&self, p: &str, k: &str, ttl: u64, c: &Condition) -> Result<WriteReply, StoreError> {
        self.inner.touch(p, k, ttl, c)
    }
    fn changes(&self, p: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        self.inner.changes(p, after, max)
    }
    fn meter(&self, p: &str, k: &str, r: &MeterRequest) -> Result<MeterReply, StoreError> {
        self.inner.meter(p, k, r)
    }
    fn wait(&self, p: &str, after: u64, timeout: u64) -> Result<u64, StoreError> {
        self.inner.wait(p, after, timeout)
    }
}

#[test]
fn an_acquire_that_timed_out_but_applied_takes_back_its_lock() {
    // Outside testers: during `DEBUG SLEEP 3` an acquire answered
    // unavailable after 2 s, then applied when Redis woke, and for the
    // lock's whole TTL every request was busy behind a holder nobody had.
    let store = FakeStore::new(T0);
    let flaky = TimesOut {
        inner: &store,
        passing: std::cell::Cell::new(0),
        failing: std::cell::Cell::new(1),
        applied: true,
    };
    let l = Locks::new(&flaky, CountingEntropy::default());
    assert!(matches!(
        l.acquire("stock", "item:1", once(10_000)),
        Err(Error::Unavailable(_))
    ));
    assert_eq!(
        locks(&store).inspect("stock", "item:1").unwrap(),
        None,
        "free again at once, not after the 10 s TTL"
    );

    // A waiter's attempt that timed out after the release let it in: the
    // same, through wait-then-put.
    let holder = acquired(locks(&store).acquire("stock", "item:1", once(500)).unwrap());
    flaky.passing.set(1); // the first attempt finds the holder
    flaky.failing.set(1);
    let waiting = AcquireOptions {
        ttl_ms: Some(10_000),
        wait: Some(WaitPolicy::Timeout(1000)),
    };
    assert!(matches!(
        l.acquire("stock", "item:1", waiting),
        Err(Error::Unavailable(_))
    ));
    assert_eq!(locks(&store).inspect("stock", "item:1").unwrap(), None);
    assert!(store.clock() >= T0 + 500, "it waited out the holder first");
    assert!(holder.fence > 0);
}

#[test]
fn taking_back_a_failed_attempt_never_frees_another_owner() {
    let store = FakeStore::new(T0);
    let other = acquired(
        locks(&store)
            .acquire("stock", "item:1", once(10_000))
            .unwrap(),
    );
    let flaky = TimesOut {
        inner: &store,
        passing: std::cell::Cell::new(0),
        failing: std::cell::Cell::new(1),
        applied: false,
    };
    let l = Locks::new(&flaky, CountingEntropy(std::cell::Cell::new(50)));
    assert!(matches!(
        l.acquire("stock", "item:1", once(10_000)),
        Err(Error::Unavailable(_))
    ));
    let holder = locks(&store).inspect("stock", "item:1").unwrap();
    assert_eq!(
        holder.map(|h| h.fence),
        Some(other.fence),
        "still the other owner's"
    );
}

proptest::proptest! {
    /// Over any sequence of wake-ups (each wait ends anywhere from at once
    /// to its full length), an attempts or timeout policy gives up only
    /// after its whole budget of store time and its promised attempts, asks
    /// for no wait longer than `delay-ms`, and ends at its deadline.
    #[test]
    fn a_wait_policy_spends_its_whole_budget_whatever_wakes_it(
        max_attempts in 1u32..30,
        delay_ms in 0u64..500,
        timeout in proptest::option::of(0u64..5000),
        wakes in proptest::collection::vec(0.0f64..=1.0, 0..400),
    ) {
        let (policy, budget, owed) = match timeout {
            Some(ms) => (WaitPolicy::Timeout(ms), ms, 1),
            None => (
                WaitPolicy::Attempts(Retry { max_attempts, delay_ms }),
                u64::from(max_attempts - 1) * delay_ms,
                max_attempts,
            ),
        };
        let mut patience = Patience::new(policy);
        let (start, mut now, mut attempts) = (T0, T0, 1u32);
        // Past the generated wake-ups, every wait runs its full length.
        let mut fractions = wakes.into_iter().chain(std::iter::repeat(1.0));
        while let Some(wait) = patience.next_wait(now) {
            if timeout.is_none() {
                proptest::prop_assert!(wait <= delay_ms, "asked to wait {wait} > {delay_ms}");
            }
            proptest::prop_assert!(now + wait <= start + budget || attempts < owed,
                "waits past the deadline with no attempt owed");
            let fraction = fractions.next().unwrap_or(1.0);
            now += (wait as f64 * fraction) as u64;
            attempts += 1;
            proptest::prop_assert!(attempts < 100_000, "never ends");
        }
        proptest::prop_assert!(now >= start + budget, "gave up after {} of {budget} ms", now - start);
        proptest::prop_assert!(attempts >= owed, "{attempts} of {owed} attempts");
        proptest::prop_assert!(now <= start + budget, "went on to {} past {budget} ms", now - start);
    }
}

#[test]
fn is_held_decides_from_now_and_the_entrys_expiry() {
    // Outside testers' store answered an entry whose `expires-at` was its
    // own `now`, or before it: `is-held` said true. It is not held.
    let store = FakeStore::new(T0);
    let lock = acquired(
        locks(&store)
            .acquire("stock", "item:1", once(1000))
            .unwrap(),
    );
    for back in [0, 1, 60_000] {
        let lying = Tampered {
            inner: &store,
            tamper: Box::new(move |entry, now| entry.expires_at = Some(now - back)),
        };
        let l = Locks::new(&lying, CountingEntropy::default());
        assert!(
            !l.is_held(&lock).unwrap(),
            "an entry that expired {back} ms ago is held"
        );
        assert_eq!(l.inspect("stock", "item:1").unwrap(), None);
    }
    assert!(
        locks(&store).is_held(&lock).unwrap(),
        "the honest store: held"
    );
}

#[test]
fn a_broken_grant_is_internal_and_taken_back_never_acquired() {
    // A put reply at revision 0 gave `acquired` with fence 0 (WIT: never 0).
    let cases: [(&str, Tamper); 4] = [
        ("revision 0", Box::new(|entry, _| entry.revision = 0)),
        ("no expiry", Box::new(|entry, _| entry.expires_at = None)),
        (
            "already expired",
            Box::new(|entry, now| entry.expires_at = Some(now)),
        ),
        (
            "another owner",
            Box::new(|entry, _| entry.value = b"0123456789abcdef0123456789abcdef".to_vec()),
        ),
    ];
    for (what, tamper) in cases {
        let store = FakeStore::new(T0);
        let broken = Tampered {
            inner: &store,
            tamper,
        };
        let l = Locks::new(&broken, CountingEntropy::default());
        assert!(
            matches!(
                l.acquire("stock", "item:1", once(1000)),
                Err(Error::Internal(_))
            ),
            "a grant with {what} was not internal"
        );
        // Where the store still reports our revision and token, the
        // take-back frees it; a store that lies about those too cannot be
        // cleaned up after by a guarded delete.
        if !matches!(what, "revision 0" | "another owner") {
            assert_eq!(
                locks(&store).inspect("stock", "item:1").unwrap(),
                None,
                "a grant with {what} was left held"
            );
        }
    }
    // A holder at revision 0 is not a holder to wait for either.
    let store = FakeStore::new(T0);
    locks(&store)
        .acquire("stock", "item:1", once(1000))
        .unwrap();
    let zero = Tampered {
        inner: &store,
        tamper: Box::new(|entry, _| entry.revision = 0),
    };
    let l = Locks::new(&zero, CountingEntropy::default());
    assert!(matches!(
        l.acquire("stock", "item:1", once(1000)),
        Err(Error::Internal(_))
    ));
    assert!(matches!(
        l.inspect("stock", "item:1"),
        Err(Error::Internal(_))
    ));
}
