//! Waiting: wake-ups that find the lock held again, and the wait policies'
//! budgets over any sequence of wake-ups.

use super::*;

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
