//! Unit tests of the read-write lock logic over the fake store, with the
//! clock moved by hand.

use std::cell::Cell;

use super::*;
use crate::bindings::exports::coord::sync::rwlock::Retry;
use crate::fake::FakeStore;

const T0: u64 = 1_000_000;

/// Owner tokens that never repeat, from a counter starting at `from`
/// (each hook of a test starts its own far from the others).
struct Tokens(Cell<u64>);

impl Entropy for Tokens {
    fn random_16(&self) -> [u8; 16] {
        self.0.set(self.0.get() + 1);
        let mut bytes = [0u8; 16];
        bytes[8..].copy_from_slice(&self.0.get().to_be_bytes());
        bytes
    }
}

fn rwlocks(store: &FakeStore, from: u64) -> RwLocks<&FakeStore, Tokens> {
    RwLocks::new(store, Tokens(Cell::new(from)))
}

fn once(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(WaitPolicy::NoWait),
    }
}

fn waiting(ttl_ms: u64, timeout_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(WaitPolicy::Timeout(timeout_ms)),
    }
}

fn acquired(outcome: AcquireOutcome) -> Grant {
    match outcome {
        AcquireOutcome::Acquired(grant) => grant,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

fn busy(outcome: AcquireOutcome) -> Holder {
    match outcome {
        AcquireOutcome::Busy(holder) => holder,
        AcquireOutcome::Acquired(grant) => panic!("expected busy, got acquired {grant:?}"),
    }
}

fn invalid_field(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

#[test]
fn readers_share_a_writer_excludes_them_and_every_grant_has_a_higher_fence() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let calls = store.calls.get();
    let a = acquired(rw.acquire("cfg", "x", Mode::Read, once(3_000)).unwrap());
    assert_eq!(
        store.calls.get() - calls,
        2,
        "an uncontended read is a write and a read"
    );
    let b = acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    assert!(b.fence > a.fence && a.owner != b.owner);
    assert_eq!((b.mode, b.expires_at), (Mode::Read, T0 + 1_000));

    // A writer finds two readers: busy, naming the first to expire, and it
    // leaves no claim behind when it does not wait.
    let first = busy(rw.acquire("cfg", "x", Mode::Write, once(1_000)).unwrap());
    assert_eq!(
        first,
        Holder {
            mode: Mode::Read,
            fence: b.fence,
            remaining_ms: 1_000
        }
    );
    assert_eq!(rw.inspect("cfg", "x").unwrap().writer, None);
    // Another resource is another lock.
    acquired(rw.acquire("cfg", "y", Mode::Write, once(1_000)).unwrap());

    assert!(rw.release(&a).unwrap());
    assert!(rw.release(&b).unwrap());
    assert!(!rw.release(&b).unwrap(), "a release frees once");
    let calls = store.calls.get();
    let w = acquired(rw.acquire("cfg", "x", Mode::Write, once(1_000)).unwrap());
    assert_eq!(store.calls.get() - calls, 2, "an uncontended write too");
    assert!(w.fence > b.fence);
    // While it holds, neither a reader nor another writer is granted.
    let seen = busy(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    assert_eq!((seen.mode, seen.fence), (Mode::Write, w.fence));
    let seen = busy(rw.acquire("cfg", "x", Mode::Write, once(1_000)).unwrap());
    assert_eq!((seen.mode, seen.fence), (Mode::Write, w.fence));
    let usage = rw.inspect("cfg", "x").unwrap();
    assert!(
        usage.readers.is_empty(),
        "the reader that stepped aside left nothing"
    );
    assert!(rw.release(&w).unwrap());
    let c = acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    assert!(c.fence > w.fence);
}

#[test]
fn a_waiting_writer_stops_new_readers_and_is_granted_when_the_last_reader_leaves() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let reader = acquired(rw.acquire("cfg", "x", Mode::Read, once(10_000)).unwrap());
    let newcomer = Cell::new(None);
    let newcomer = std::rc::Rc::new(newcomer);
    let seen = newcomer.clone();
    let rounds = std::rc::Rc::new(Cell::new(0));
    let counted = rounds.clone();
    store.during_wait(move |store| {
        counted.set(counted.get() + 1);
        let other = rwlocks(store, 1_000 * counted.get());
        if counted.get() == 1 {
            // A reader arriving while the writer waits is turned away, by
            // the writer's claim, which is lowered to the claim's TTL.
            let usage = other.inspect("cfg", "x").unwrap();
            let claim = usage.writer.expect("the waiting writer's claim");
            assert!(claim.remaining_ms <= WRITER_CLAIM_MS, "{claim:?}");
            assert_eq!(usage.readers.len(), 1);
            seen.set(Some(busy(
                other.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap(),
            )));
        } else if counted.get() == 3 {
            other.release(&reader).unwrap();
        }
    });
    let writer = acquired(
        rw.acquire("cfg", "x", Mode::Write, waiting(30_000, 60_000))
            .unwrap(),
    );
    let turned_away = newcomer.get().expect("the newcomer tried");
    assert_eq!(
        (turned_away.mode, turned_away.fence),
        (Mode::Write, writer.fence)
    );
    // Granted with its own TTL, not the claim's.
    assert_eq!(writer.expires_at, store.clock() + 30_000);
    assert!(rw.is_held(&writer).unwrap());
    assert!(rounds.get() >= 3);
}

#[test]
fn a_writer_that_gives_up_withdraws_its_claim() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let reader = acquired(rw.acquire("cfg", "x", Mode::Read, once(60_000)).unwrap());
    let first = busy(
        rw.acquire("cfg", "x", Mode::Write, waiting(30_000, 5_000))
            .unwrap(),
    );
    assert_eq!((first.mode, first.fence), (Mode::Read, reader.fence));
    assert!(store.clock() >= T0 + 5_000, "it waited its whole budget");
    assert_eq!(rw.inspect("cfg", "x").unwrap().writer, None);
    acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
}

#[test]
fn a_claim_left_by_a_writer_that_stopped_lapses_within_the_claims_ttl() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let reader = acquired(rw.acquire("cfg", "x", Mode::Read, once(60_000)).unwrap());
    // The writer's first wait is its last: it stops there (its process
    // killed), its claim lowered and never renewed.
    store.during_wait(|_| panic!("the writer stops while waiting"));
    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rw.acquire("cfg", "x", Mode::Write, waiting(30_000, 60_000))
    }));
    assert!(stopped.is_err());
    store.during_wait(|_| {});
    let usage = rw.inspect("cfg", "x").unwrap();
    assert!(
        usage
            .writer
            .is_some_and(|w| w.remaining_ms <= WRITER_CLAIM_MS)
    );
    busy(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    store.advance(WRITER_CLAIM_MS);
    acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    assert!(rw.is_held(&reader).unwrap());
}

#[test]
fn a_reader_waits_for_the_writer_by_reading_and_writes_only_once_it_is_gone() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let writer = acquired(rw.acquire("cfg", "x", Mode::Write, once(1_000)).unwrap());
    let revisions = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = revisions.clone();
    store.during_wait(move |store| {
        let listing = store.list(&keys::rwlock_partition("cfg", "x"), "").unwrap();
        seen.borrow_mut().push(listing.revision);
    });
    let reader = acquired(
        rw.acquire(
            "cfg",
            "x",
            Mode::Read,
            AcquireOptions {
                ttl_ms: Some(1_000),
                wait: Some(WaitPolicy::Attempts(Retry {
                    max_attempts: 20,
                    delay_ms: 100,
                })),
            },
        )
        .unwrap(),
    );
    assert!(reader.fence > writer.fence);
    assert!(store.clock() >= writer.expires_at);
    let revisions = revisions.borrow();
    assert!(revisions.len() >= 5, "{revisions:?}");
    // Its own step aside is one revision; its waits after it wrote nothing.
    assert!(
        revisions.windows(2).skip(1).all(|w| w[0] == w[1]),
        "{revisions:?}"
    );
}

#[test]
fn at_most_max_readers_hold_at_once() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    for _ in 0..MAX_READERS {
        acquired(rw.acquire("cfg", "x", Mode::Read, once(5_000)).unwrap());
    }
    let full = busy(rw.acquire("cfg", "x", Mode::Read, once(5_000)).unwrap());
    assert_eq!(full.mode, Mode::Read);
    assert_eq!(
        rw.inspect("cfg", "x").unwrap().readers.len(),
        MAX_READERS as usize
    );
}

#[test]
fn a_grant_answers_only_for_its_own_mode_owner_and_fence() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let reader = acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    let as_writer = Grant {
        mode: Mode::Write,
        ..reader.clone()
    };
    assert!(rw.is_held(&reader).unwrap());
    assert!(!rw.is_held(&as_writer).unwrap());
    assert!(!rw.release(&as_writer).unwrap());
    let later = Grant {
        fence: reader.fence + 1,
        ..reader.clone()
    };
    assert!(!rw.is_held(&later).unwrap());
    assert_eq!(rw.extend(&later, None).unwrap(), ExtendOutcome::Lost);
    store.advance(500);
    let ExtendOutcome::Extended(extended) = rw.extend(&reader, Some(2_000)).unwrap() else {
        panic!("the reader still holds");
    };
    assert_eq!(
        (extended.fence, extended.expires_at),
        (reader.fence, T0 + 2_500)
    );
    store.advance(1_999);
    assert!(rw.is_held(&extended).unwrap());
    store.advance(1);
    assert!(
        !rw.is_held(&extended).unwrap(),
        "expired on the store's clock"
    );
    assert_eq!(rw.extend(&extended, None).unwrap(), ExtendOutcome::Lost);
}

#[test]
fn force_release_removes_exactly_the_grant_with_that_fence() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let a = acquired(rw.acquire("cfg", "x", Mode::Read, once(60_000)).unwrap());
    let b = acquired(rw.acquire("cfg", "x", Mode::Read, once(60_000)).unwrap());
    assert!(rw.force_release("cfg", "x", a.fence).unwrap());
    assert!(!rw.force_release("cfg", "x", a.fence).unwrap());
    assert!(!rw.is_held(&a).unwrap() && rw.is_held(&b).unwrap());
    assert!(rw.force_release("cfg", "x", b.fence).unwrap());
    let w = acquired(rw.acquire("cfg", "x", Mode::Write, once(60_000)).unwrap());
    assert!(rw.force_release("cfg", "x", w.fence).unwrap());
    assert!(!rw.release(&w).unwrap());
    acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
}

#[test]
fn bad_arguments_are_named_before_the_store_is_asked() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let grant = acquired(rw.acquire("cfg", "x", Mode::Read, once(1_000)).unwrap());
    let calls = store.calls.get();
    assert_eq!(
        invalid_field(rw.acquire("", "x", Mode::Read, once(1_000))),
        "id"
    );
    assert_eq!(
        invalid_field(rw.acquire("cfg", "x", Mode::Write, once(0))),
        "options.ttl-ms"
    );
    let forged = Grant {
        owner: "not-a-token".into(),
        ..grant.clone()
    };
    assert_eq!(invalid_field(rw.release(&forged)), "grant.owner");
    let zero = Grant {
        fence: 0,
        ..grant.clone()
    };
    assert_eq!(invalid_field(rw.is_held(&zero)), "grant.fence");
    assert_eq!(invalid_field(rw.extend(&grant, Some(0))), "ttl-ms");
    assert_eq!(invalid_field(rw.force_release("cfg", "x", 0)), "fence");
    assert_eq!(store.calls.get(), calls);
}

#[test]
fn an_entry_that_is_not_a_grant_is_internal_never_a_holder() {
    let store = FakeStore::new(T0);
    let rw = rwlocks(&store, 0);
    let partition = keys::rwlock_partition("cfg", "x");
    (&store)
        .put(&partition, "w", b"garbage", Some(1_000), &Condition::Always)
        .unwrap();
    assert!(matches!(
        rw.acquire("cfg", "x", Mode::Read, once(1_000)),
        Err(Error::Internal(_))
    ));
    assert!(matches!(rw.inspect("cfg", "x"), Err(Error::Internal(_))));
    // The reader that found it took back its own entry.
    let listing = (&store).list(&partition, RWLOCK_READER_PREFIX).unwrap();
    assert!(listing.entries.is_empty(), "{listing:?}");
}

#[test]
fn a_writer_that_claims_again_after_waiting_claims_only_for_the_claims_ttl() {
    // Outside the claim's bound only between a writer's first write and
    // its first wait: a claim written again later (the first lapsed, or
    // was force-released, while the writer waited) is short until granted.
    let store = FakeStore::new(T0);
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let recorded = seen.clone();
    let recording = crate::fake::Tampered {
        inner: &store,
        tamper: Box::new(move |entry, now| {
            if entry.key == RWLOCK_WRITER_KEY {
                let left = entry.expires_at.map_or(u64::MAX, |end| end - now);
                recorded.borrow_mut().push(left);
            }
        }),
    };
    let rw = RwLocks::new(&recording, Tokens(Cell::new(0)));
    let reader = acquired(
        rwlocks(&store, 100)
            .acquire("cfg", "x", Mode::Read, once(60_000))
            .unwrap(),
    );
    let rounds = std::rc::Rc::new(Cell::new(0));
    let counted = rounds.clone();
    store.during_wait(move |store| {
        counted.set(counted.get() + 1);
        let other = rwlocks(store, 1_000 * counted.get());
        if counted.get() == 1 {
            let claim = other.inspect("cfg", "x").unwrap().writer.expect("a claim");
            assert!(other.force_release("cfg", "x", claim.fence).unwrap());
        } else if counted.get() == 2 {
            other.release(&reader).unwrap();
        }
    });
    let writer = acquired(
        rw.acquire("cfg", "x", Mode::Write, waiting(30_000, 60_000))
            .unwrap(),
    );
    assert_eq!(writer.expires_at, store.clock() + 30_000);
    let seen = seen.borrow();
    // The first write, then short claims only, then the grant's raise.
    assert_eq!(seen.first(), Some(&30_000), "{seen:?}");
    assert_eq!(seen.last(), Some(&30_000), "{seen:?}");
    let between = &seen[1..seen.len() - 1];
    assert!(
        between.len() >= 3,
        "a renewal, a new claim and its renewal: {seen:?}"
    );
    assert!(
        between.iter().all(|&left| left <= WRITER_CLAIM_MS),
        "a claim written after a wait ran past {WRITER_CLAIM_MS} ms: {seen:?}"
    );
}

#[test]
fn a_writer_whose_claim_cannot_be_withdrawn_is_unavailable_not_busy() {
    let store = FakeStore::new(T0);
    acquired(
        rwlocks(&store, 100)
            .acquire("cfg", "x", Mode::Read, once(60_000))
            .unwrap(),
    );
    let failing = crate::fake::Failing {
        inner: &store,
        fails: Box::new(|call, key| {
            (call == "delete" && key == RWLOCK_WRITER_KEY)
                .then(|| StoreError::Unavailable("connection reset".into()))
        }),
        applied: false,
    };
    let rw = RwLocks::new(&failing, Tokens(Cell::new(0)));
    for options in [once(30_000), waiting(30_000, 1_000)] {
        assert!(
            matches!(
                rw.acquire("cfg", "x", Mode::Write, options),
                Err(Error::Unavailable(_))
            ),
            "a writer that could not give up its claim answered as if it had"
        );
        // What could not be withdrawn lapses by itself.
        store.advance(30_000);
    }
}

#[test]
fn an_acquire_whose_read_fails_after_its_write_takes_the_write_back() {
    for (mode, read) in [
        (Mode::Read, RWLOCK_WRITER_KEY),
        (Mode::Write, RWLOCK_READER_PREFIX),
    ] {
        let store = FakeStore::new(T0);
        let failing = crate::fake::Failing {
            inner: &store,
            fails: Box::new(move |call, prefix| {
                (call == "list" && prefix == read)
                    .then(|| StoreError::Invalid("the store refused the read".into()))
            }),
            applied: false,
        };
        let rw = RwLocks::new(&failing, Tokens(Cell::new(0)));
        assert!(rw.acquire("cfg", "x", mode, once(30_000)).is_err());
        let usage = rwlocks(&store, 100).inspect("cfg", "x").unwrap();
        assert_eq!(
            (usage.writer, usage.readers.len()),
            (None, 0),
            "{mode:?} left its entry behind"
        );
    }
}
