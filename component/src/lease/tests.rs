//! Unit tests of the lease over the fake store, with the clock moved by hand.

use super::*;
use crate::fake::{FakeStore, Tampered};

const T0: u64 = 1_000_000;
const TTL: u64 = 1000;

fn leases(store: &FakeStore) -> Leases<&FakeStore> {
    Leases::new(store)
}

fn not_holder(result: Result<HeldLease, Error>) -> Option<Holder> {
    match result {
        Err(Error::NotHolder(holder)) => holder,
        other => panic!("expected not-holder, got {other:?}"),
    }
}

#[test]
fn a_free_lease_is_acquired_in_one_request_and_writable_at_once() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let lease = l.acquire("store-7", "node-a", TTL).unwrap();
    assert_eq!(store.calls.get(), 1, "one store request");
    assert_eq!(lease.expires_at, T0 + TTL);
    assert_eq!(lease.writable_at, 0, "no grace owed");
    let calls = store.calls.get();
    assert_eq!(l.check(&lease).unwrap().epoch, lease.epoch);
    assert_eq!(
        store.calls.get(),
        calls + 1,
        "the commit-point check is one read"
    );
}

#[test]
fn renewals_keep_the_epoch_and_cost_one_request() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let lease = l.acquire("s", "a", TTL).unwrap();
    store.advance(600);
    let calls = store.calls.get();
    let renewed = l.renew(&lease).unwrap();
    assert_eq!(store.calls.get(), calls + 1);
    assert_eq!(renewed.epoch, lease.epoch, "renewal keeps the epoch");
    assert_eq!(renewed.expires_at, T0 + 600 + TTL);
    // Renewed in time, it never runs out.
    for _ in 0..20 {
        store.advance(600);
        l.renew(&renewed).unwrap();
        assert!(l.check(&renewed).is_ok());
    }
}

#[test]
fn another_node_is_not_holder_while_the_lease_runs() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    store.advance(400);
    let holder = not_holder(l.acquire("s", "b", TTL)).unwrap();
    assert_eq!(holder.node, "a");
    assert_eq!(holder.epoch, a.epoch);
    assert_eq!(holder.remaining_ms, 600);
    assert_eq!(l.observe("s").unwrap().unwrap(), holder);
}

#[test]
fn a_restarted_node_adopts_its_own_lease_with_the_same_epoch() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let before = l.acquire("s", "a", TTL).unwrap();
    store.advance(700);
    // The node restarted and lost its state: it acquires again.
    let adopted = l.acquire("s", "a", TTL).unwrap();
    assert_eq!(adopted.epoch, before.epoch, "adopted, not waited out");
    assert_eq!(adopted.expires_at, T0 + 700 + TTL, "and renewed");
    assert!(l.check(&adopted).is_ok());
}

#[test]
fn a_failover_takes_over_after_the_lease_runs_out_and_writes_after_the_grace() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    // a crashes: no renewal. At T0 + TTL its lease has run out.
    store.advance(TTL);
    let b = l.acquire("s", "b", TTL).unwrap();
    assert!(b.epoch > a.epoch, "a new holder has a greater epoch");
    assert_eq!(b.writable_at, T0 + 2 * TTL, "writable when a's grace ends");
    store.advance(300);
    assert_eq!(l.check(&b), Err(Error::InGrace(TTL - 300)));
    // a comes back: its lease was taken, it cannot renew or pass the check.
    assert_eq!(not_holder(l.renew(&a)).unwrap().node, "b");
    assert_eq!(not_holder(l.check(&a)).unwrap().node, "b");
    assert!(!l.resign(&a).unwrap(), "and it cannot resign b's lease");
    // b renews as a holder does, every third of its TTL, through the grace.
    let b = l.renew(&b).unwrap();
    store.advance(300);
    let b = l.renew(&b).unwrap();
    assert_eq!(l.check(&b), Err(Error::InGrace(TTL - 600)));
    store.advance(TTL - 600 - 1);
    assert_eq!(
        l.check(&b),
        Err(Error::InGrace(1)),
        "not a millisecond early"
    );
    store.advance(1);
    assert!(l.check(&b).is_ok(), "past the grace, in store time");
    let observed = l.observe("s").unwrap().unwrap();
    assert_eq!((observed.node.as_str(), observed.grace_ms), ("b", 0));
}

#[test]
fn a_resign_hands_over_with_no_grace() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    let calls = store.calls.get();
    assert!(l.resign(&a).unwrap());
    assert_eq!(store.calls.get(), calls + 1, "one request");
    assert!(!l.resign(&a).unwrap(), "once");
    let b = l.acquire("s", "b", TTL).unwrap();
    assert_eq!(b.writable_at, 0, "no grace after a resign");
    assert!(b.epoch > a.epoch);
    assert!(l.check(&b).is_ok());
    assert_eq!(not_holder(l.check(&a)).unwrap().node, "b");
}

#[test]
fn a_lease_past_its_grace_is_free_with_no_grace_to_keep() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    store.advance(2 * TTL);
    assert_eq!(l.observe("s").unwrap(), None);
    assert_eq!(not_holder(l.check(&a)), None);
    let b = l.acquire("s", "b", TTL).unwrap();
    assert_eq!(b.writable_at, 0);
    assert!(b.epoch > a.epoch);
}

#[test]
fn a_holder_whose_lease_ran_out_fails_the_check_until_it_renews() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    store.advance(TTL + 10);
    assert_eq!(not_holder(l.check(&a)).unwrap().remaining_ms, 0);
    // Nobody took it over: its renewal still holds, at the same epoch.
    let renewed = l.renew(&a).unwrap();
    assert_eq!(renewed.epoch, a.epoch);
    assert!(l.check(&renewed).is_ok());
}

#[test]
fn forged_and_invalid_leases_are_refused() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let a = l.acquire("s", "a", TTL).unwrap();
    let impostor = HeldLease {
        node: "b".into(),
        ..a.clone()
    };
    assert!(matches!(l.renew(&impostor), Err(Error::NotHolder(_))));
    assert!(matches!(l.check(&impostor), Err(Error::NotHolder(_))));
    assert!(!l.resign(&impostor).unwrap());
    assert!(l.check(&a).is_ok(), "the real holder is untouched");
    let field = |r: Result<HeldLease, Error>| match r {
        Err(Error::InvalidArgument(bad)) => bad.field,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    assert_eq!(field(l.acquire("", "a", TTL)), "name");
    assert_eq!(field(l.acquire(&"n".repeat(257), "a", TTL)), "name");
    assert_eq!(field(l.acquire("s", "", TTL)), "node");
    assert_eq!(field(l.acquire("s", "a", 0)), "ttl-ms");
    assert_eq!(
        field(l.acquire("s", "a", validate::MAX_TTL_MS + 1)),
        "ttl-ms"
    );
    assert_eq!(
        field(l.renew(&HeldLease {
            epoch: 0,
            ..a.clone()
        })),
        "lease.epoch"
    );
}

#[test]
fn a_lease_entry_this_interface_did_not_write_is_internal() {
    let store = FakeStore::new(T0);
    (&store)
        .put(
            &keys::lease_partition("s"),
            LEASE_HOLDER_KEY,
            b"not a lease",
            Some(TTL),
            &Condition::Absent,
        )
        .unwrap();
    let l = leases(&store);
    assert!(matches!(l.acquire("s", "a", TTL), Err(Error::Internal(_))));
    assert!(matches!(l.observe("s"), Err(Error::Internal(_))));
}

/// A holding as the model check saw it: the last time it passed the
/// commit-point check (its writes may land until one TTL after that), and
/// whether its node resigned it (then it promised it had stopped).
struct Writer {
    epoch: u64,
    ttl_ms: u64,
    last_passed: Option<u64>,
    resigned: bool,
}

/// What one step of the model check does.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Acquire (or adopt, or take over) with one of the TTLs.
    Acquire(usize),
    Renew,
    Resign,
    /// Forget the lease, as a restart does.
    Crash,
    /// The commit-point check, then a write to a fenced register.
    Write,
    /// Use a record this node resigned, as a confused or stale node would.
    Replay,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0usize..3).prop_map(Step::Acquire),
        3 => Just(Step::Renew),
        1 => Just(Step::Resign),
        1 => Just(Step::Crash),
        4 => Just(Step::Write),
        1 => Just(Step::Replay),
    ]
}

/// TTLs short and long, so that a short holding takes over a long one's grace.
const TTLS: [u64; 3] = [100, 400, 1000];

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(512))]
    /// Three to five nodes with TTLs short and long, over many rounds: each
    /// step one node acquires (adopting, or taking over run-out and
    /// resigned holdings, chained), renews, resigns, crashes, replays a
    /// resigned record, or tries to write (the commit-point check, then a
    /// write to a fenced register), and store time moves on by a random
    /// step. Whatever the schedule: a write passes the check only once every
    /// write of every earlier holding that was not resigned has had its TTL
    /// to land (the grace belongs to the lease, whoever holds it next); a
    /// resigned record never renews, resigns again or passes the check; and
    /// the epochs the register sees never go back. (The two-node version of
    /// this missed a chain P → Q → R whose middle TTL was short.)
    #[test]
    fn no_write_passes_the_commit_point_inside_an_earlier_holders_grace(
        nodes in 3usize..6,
        steps in proptest::collection::vec((0usize..5, step(), 0u64..500), 1..400),
    ) {
        let store = FakeStore::new(T0);
        let l = leases(&store);
        let mut held: Vec<Option<HeldLease>> = vec![None; nodes];
        let mut resigned: Vec<Option<HeldLease>> = vec![None; nodes];
        let mut writers: Vec<Writer> = Vec::new();
        let mut highest = 0u64;
        let names = ["a", "b", "c", "d", "e"];
        for (node, action, step) in steps {
            let node = node % nodes;
            let name = names[node];
            match action {
                Step::Acquire(ttl) => {
                    if let Ok(lease) = l.acquire("s", name, TTLS[ttl]) {
                        if !writers.iter().any(|w| w.epoch == lease.epoch) {
                            writers.push(Writer {
                                epoch: lease.epoch,
                                ttl_ms: lease.ttl_ms,
                                last_passed: None,
                                resigned: false,
                            });
                        }
                        held[node] = Some(lease);
                    }
                }
                Step::Renew => {
                    held[node] = held[node].as_ref().and_then(|lease| l.renew(lease).ok());
                }
                Step::Resign => {
                    if let Some(lease) = held[node].take()
                        && l.resign(&lease).unwrap()
                    {
                        for w in writers.iter_mut().filter(|w| w.epoch == lease.epoch) {
                            w.resigned = true;
                        }
                        resigned[node] = Some(lease);
                    }
                }
                Step::Crash => held[node] = None,
                Step::Replay => {
                    if let Some(lease) = &resigned[node] {
                        let still_ours = writers.iter().any(|w| w.epoch == lease.epoch && !w.resigned);
                        if !still_ours {
                            proptest::prop_assert!(!l.resign(lease).unwrap(), "{name} resigned twice");
                            proptest::prop_assert!(l.renew(lease).is_err(), "{name} renewed a resigned lease");
                            proptest::prop_assert!(l.check(lease).is_err(), "{name} passed the check resigned");
                        }
                    }
                }
                Step::Write => {
                    if let Some(lease) = &held[node]
                        && let Ok(checked) = l.check(lease)
                    {
                        let now = store.clock();
                        proptest::prop_assert!(checked.epoch >= highest, "an epoch went back");
                        highest = checked.epoch;
                        for w in &writers {
                            if w.epoch < checked.epoch && !w.resigned
                                && let Some(passed) = w.last_passed
                            {
                                proptest::prop_assert!(
                                    now >= passed + w.ttl_ms,
                                    "{name} (epoch {}) wrote at {now}, while epoch {} may still write until {}",
                                    checked.epoch, w.epoch, passed + w.ttl_ms
                                );
                            }
                        }
                        if let Some(w) = writers.iter_mut().find(|w| w.epoch == checked.epoch) {
                            w.last_passed = Some(now);
                        }
                    }
                }
            }
            store.advance(step);
        }
    }
}

#[test]
fn resigning_in_a_grace_keeps_the_grace_for_the_next_holder() {
    // Found by the two-node property test: take over, resign, acquire again
    // and the grace was gone.
    let store = FakeStore::new(T0);
    let l = leases(&store);
    l.acquire("s", "b", TTL).unwrap();
    store.advance(TTL);
    let a = l.acquire("s", "a", TTL).unwrap();
    assert_eq!(a.writable_at, T0 + 2 * TTL);
    assert!(l.resign(&a).unwrap());
    let again = l.acquire("s", "a", TTL).unwrap();
    assert_eq!(
        again.writable_at,
        T0 + 2 * TTL,
        "the grace survives the resign"
    );
    assert_eq!(l.check(&again), Err(Error::InGrace(TTL)));
    assert!(l.resign(&again).unwrap());
    let c = l.acquire("s", "c", TTL).unwrap();
    assert_eq!(c.writable_at, T0 + 2 * TTL, "for any next holder");
    store.advance(TTL / 2);
    let c = l.renew(&c).unwrap();
    store.advance(TTL / 2);
    assert!(l.check(&c).is_ok());
}

#[test]
fn a_chained_takeover_keeps_the_first_holders_grace() {
    // Outside testers: P (ttl 1000) passes the check at t; Q takes over at
    // t+1000 with ttl 200, writable at t+2000; Q's entry was stored for 400
    // ms, so R took it over at t+1200 writable at t+1400, or acquired it as
    // free at t+1400, while P could still write until t+2000.
    for r_at in [200, 400, 800, 1000] {
        let store = FakeStore::new(T0);
        let l = leases(&store);
        let p = l.acquire("s", "p", 1000).unwrap();
        assert!(l.check(&p).is_ok(), "P passes the commit point at t");
        store.advance(1000);
        let q = l.acquire("s", "q", 200).unwrap();
        assert_eq!(q.writable_at, T0 + 2000, "Q waits out P's grace");
        // Q crashes at once; R comes along r_at later.
        store.advance(r_at);
        match l.acquire("s", "r", 200) {
            Ok(r) => {
                assert!(
                    r.writable_at >= T0 + 2000 || store.clock() >= T0 + 2000,
                    "R at +{r_at} is writable at {}, inside P's grace (to {})",
                    r.writable_at,
                    T0 + 2000
                );
                assert!(r.epoch > q.epoch);
                if store.clock() < T0 + 2000 {
                    assert!(matches!(l.check(&r), Err(Error::InGrace(_))));
                }
            }
            Err(Error::NotHolder(Some(holder))) => {
                assert_eq!(holder.node, "q");
                assert!(holder.grace_ms >= (T0 + 2000).saturating_sub(store.clock()));
            }
            Err(other) => panic!("R at +{r_at}: {other:?}"),
        }
    }
}

#[test]
fn a_short_holder_renewing_early_keeps_the_grace_it_carries() {
    // Q renews every third of its short TTL: each touch must leave the
    // entry alive until P's grace ends, however early it comes.
    let store = FakeStore::new(T0);
    let l = leases(&store);
    l.acquire("s", "p", 1000).unwrap();
    store.advance(1000);
    let mut q = l.acquire("s", "q", 200).unwrap();
    for _ in 0..3 {
        store.advance(66);
        q = l.renew(&q).unwrap();
    }
    // Q stops renewing; R waits for the entry to end or takes it over.
    store.advance(200);
    let r = loop {
        match l.acquire("s", "r", 200) {
            Ok(r) => break r,
            Err(Error::NotHolder(_)) => store.advance(50),
            Err(other) => panic!("{other:?}"),
        }
    };
    assert!(
        r.writable_at >= T0 + 2000 || store.clock() >= T0 + 2000,
        "R writable at {} at {}, inside P's grace",
        r.writable_at,
        store.clock()
    );
}

#[test]
fn a_resign_inside_a_grace_ends_the_epoch_for_good() {
    // Outside testers: Q took over, resigned at +1200 (true), resigned
    // again (true), renewed (ok, same epoch), checked at +2000 (ok) and
    // wrote, resigned.
    let store = FakeStore::new(T0);
    let l = leases(&store);
    l.acquire("s", "p", TTL).unwrap();
    store.advance(TTL);
    let q = l.acquire("s", "q", TTL).unwrap();
    store.advance(200);
    assert!(l.resign(&q).unwrap(), "the first resign gives it up");
    assert!(!l.resign(&q).unwrap(), "a second resign is false");
    assert_eq!(not_holder(l.renew(&q)), None, "renew is not-holder");
    store.advance(500);
    assert_eq!(not_holder(l.check(&q)), None, "check is not-holder");
    assert_eq!(l.observe("s").unwrap(), None, "nobody holds it");
    // And the next holder still owes P's grace: until T0 + 2 TTL.
    let r = l.acquire("s", "r", TTL).unwrap();
    assert_eq!(r.writable_at, T0 + 2 * TTL);
    store.advance(300);
    assert!(
        l.check(&r).is_ok(),
        "past the grace, the next holder writes"
    );
}

#[test]
fn the_commit_point_check_decides_from_now_and_the_entrys_end() {
    // A store that returns an entry whose end is its `now`, or before it
    // (outside testers: `is-held` said true for one): not held.
    let store = FakeStore::new(T0);
    let a = leases(&store).acquire("s", "a", TTL).unwrap();
    for back in [0, 1, 5000] {
        let lying = Tampered {
            inner: &store,
            tamper: Box::new(move |entry, now| entry.expires_at = Some(now - back)),
        };
        let l = Leases::new(&lying);
        assert!(
            matches!(l.check(&a), Err(Error::NotHolder(_))),
            "an entry that ended {back} ms ago passed the check"
        );
        assert_eq!(l.observe("s").unwrap(), None, "and nobody is observed");
    }
}

#[test]
fn entries_the_interface_could_not_have_written_are_internal_never_holders() {
    let cases: [(&str, Vec<u8>, u64); 5] = [
        ("an empty node", b"1000\n0\n".to_vec(), 0),
        (
            "a node over 256 bytes",
            format!("1000\n0\n{}", "n".repeat(257)).into_bytes(),
            0,
        ),
        ("a TTL over the maximum", b"86400001\n0\nother".to_vec(), 0),
        ("a TTL of 0", b"0\n0\nother".to_vec(), 0),
        ("a bad writable-at", b"1000\nsoon\nother".to_vec(), 0),
    ];
    for (what, value, _) in cases {
        let store = FakeStore::new(T0);
        (&store)
            .put(
                &keys::lease_partition("s"),
                LEASE_HOLDER_KEY,
                &value,
                Some(TTL),
                &Condition::Absent,
            )
            .unwrap();
        let l = leases(&store);
        assert!(
            matches!(l.observe("s"), Err(Error::Internal(_))),
            "observe read {what} as a holder"
        );
        // Even once its lease would have run out: never taken over.
        store.advance(TTL - 1);
        assert!(
            matches!(l.acquire("s", "a", TTL), Err(Error::Internal(_))),
            "acquire took over {what}"
        );
    }
    // A put reply at revision 0: never a grant with epoch 0.
    let store = FakeStore::new(T0);
    let zero = Tampered {
        inner: &store,
        tamper: Box::new(|entry, _| entry.revision = 0),
    };
    assert!(matches!(
        Leases::new(&zero).acquire("s", "a", TTL),
        Err(Error::Internal(_))
    ));
    // A put reply that is another node's holding, or already ended.
    let other = Tampered {
        inner: &store,
        tamper: Box::new(|entry, _| entry.value = b"1000\n0\nimpostor".to_vec()),
    };
    assert!(matches!(
        Leases::new(&other).acquire("t", "a", TTL),
        Err(Error::Internal(_))
    ));
    let ended = Tampered {
        inner: &store,
        tamper: Box::new(|entry, now| entry.expires_at = Some(now)),
    };
    assert!(matches!(
        Leases::new(&ended).acquire("u", "a", TTL),
        Err(Error::Internal(_))
    ));
}

#[test]
fn giving_up_for_a_cut_holder_keeps_the_grace_as_a_resign_does() {
    let store = FakeStore::new(T0);
    let l = leases(&store);
    let p = l.acquire("s", "p", TTL).unwrap();
    let value = Value::encode(p.ttl_ms, p.writable_at, &p.node);
    assert_eq!(
        give_up(&value, T0),
        Some(GiveUp::Delete),
        "no grace carried"
    );
    store.advance(TTL);
    let q = l.acquire("s", "q", TTL).unwrap();
    let value = Value::encode(q.ttl_ms, q.writable_at, &q.node);
    assert_eq!(
        give_up(&value, T0 + TTL + 100),
        Some(GiveUp::Replace {
            value: RESIGNED.to_vec(),
            ttl_ms: TTL - 100
        })
    );
    assert_eq!(give_up(&value, T0 + 2 * TTL), Some(GiveUp::Delete));
    assert_eq!(give_up(RESIGNED, T0), None);
    assert_eq!(give_up(b"garbage", T0), None);
}
