//! A store that is down, times out or applies a write whose reply was
//! lost, and entries the lock could not have written: never busy and never
//! acquired wrongly, and a failed attempt taken back.

use super::*;

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

#[test]
fn an_acquire_whose_write_applied_then_failed_otherwise_takes_back_its_lock() {
    // Not only `unavailable`: any store error may follow a write that
    // applied, and an acquire that answers `internal` promises to free what
    // it wrote. Else nobody knows the token that holds the lock for its TTL.
    for error in [
        StoreError::Invalid("the reply could not be decoded".into()),
        StoreError::HistoryGone(0),
    ] {
        let store = FakeStore::new(T0);
        let failing = crate::fake::Failing {
            inner: &store,
            fails: Box::new(move |call, _| (call == "put").then(|| error.clone())),
            applied: true,
        };
        let l = Locks::new(&failing, CountingEntropy::default());
        assert!(l.acquire("stock", "item:1", once(60_000)).is_err());
        assert_eq!(
            locks(&store).inspect("stock", "item:1").unwrap(),
            None,
            "the failed acquire left its token holding the lock"
        );
    }
}

#[test]
fn a_holder_answered_at_its_expiry_is_waited_for_not_tried_again_at_once() {
    // A store that answers a conflict with an entry whose expiry is its
    // `now`: the waiter must still wait (1 ms), not send attempt after
    // attempt with no wait until its deadline; on the fake store's clock,
    // which moves only when something waits, that would never end.
    let store = FakeStore::new(T0);
    acquired(
        locks(&store)
            .acquire("stock", "item:1", once(60_000))
            .unwrap(),
    );
    let replies = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counted = replies.clone();
    let tampered = Tampered {
        inner: &store,
        tamper: Box::new(move |entry: &mut Entry, now| {
            counted.set(counted.get() + 1);
            assert!(counted.get() < 10_000, "attempts with no wait in between");
            entry.expires_at = Some(now);
        }),
    };
    // Tokens of its own, not the holder's.
    let l = Locks::new(&tampered, CountingEntropy(std::cell::Cell::new(7)));
    let timeout = AcquireOptions {
        ttl_ms: None,
        wait: Some(WaitPolicy::Timeout(100)),
    };
    busy(l.acquire("stock", "item:1", timeout).unwrap());
    assert!(store.clock() >= T0 + 100, "it waited out its budget");
    assert!(replies.get() > 1);
}
