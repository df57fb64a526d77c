//! Unit tests of ephemeral state over the fake store, with the clock moved by hand.

use super::*;
use crate::fake::FakeStore;

const T0: u64 = 1_000_000;

fn space() -> Space {
    Space {
        id: "inventory.editors".into(),
        ttl_ms: 1000,
        max_value_bytes: 16,
    }
}

fn keys_of(events: &[Event]) -> Vec<(String, u64, &'static str)> {
    events
        .iter()
        .map(|e| match e {
            Event::Upsert(e) => (e.key.clone(), e.revision, "upsert"),
            Event::Delete(r) => (r.key.clone(), r.revision, "delete"),
            Event::Expire(r) => (r.key.clone(), r.revision, "expire"),
            Event::ResyncRequired => (String::new(), 0, "resync"),
        })
        .collect()
}

fn drain(watch: &mut Watch, store: &FakeStore) -> Vec<Event> {
    std::iter::from_fn(|| watch.next(&store, 0).unwrap()).collect()
}

#[test]
fn upsert_touch_and_delete_are_one_store_call_each() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    let w = eph
        .upsert(&space(), "item:1", "session-a", b"{\"user\":1}")
        .unwrap();
    assert_eq!(w.updated_at, T0);
    assert_eq!(store.calls.get(), 1);
    assert!(eph.touch(&space(), "item:1", "session-a").unwrap());
    assert_eq!(store.calls.get(), 2);
    assert!(eph.delete(&space(), "item:1", "session-a").unwrap());
    assert_eq!(store.calls.get(), 3);
    assert!(!eph.delete(&space(), "item:1", "session-a").unwrap());
    assert!(!eph.touch(&space(), "item:1", "session-a").unwrap());
}

#[test]
fn entries_expire_unless_touched() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    eph.upsert(&space(), "t", "kept", b"1").unwrap();
    eph.upsert(&space(), "t", "lapsed", b"1").unwrap();
    store.advance(900);
    assert!(eph.touch(&space(), "t", "kept").unwrap());
    store.advance(100);
    let keys: Vec<_> = eph
        .snapshot(&space(), "t", None)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["kept"]);
}

#[test]
fn a_watch_replays_the_snapshot_in_revision_order_then_follows_changes_and_expiry() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    eph.upsert(&space(), "t", "b", b"1").unwrap();
    eph.upsert(&space(), "t", "a", b"1").unwrap();
    eph.upsert(&space(), "t", "other/x", b"1").unwrap();
    let mut watch = eph.watch(&space(), "t", None, None).unwrap();
    eph.delete(&space(), "t", "b").unwrap();
    store.advance(1000); // a and other/x expire
    let events = keys_of(&drain(&mut watch, &store));
    let kinds: Vec<_> = events
        .iter()
        .map(|(k, _, kind)| (k.as_str(), *kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("b", "upsert"),
            ("a", "upsert"),
            ("other/x", "upsert"),
            ("b", "delete"),
            ("a", "expire"),
            ("other/x", "expire")
        ]
    );
    assert!(
        events.windows(2).all(|w| w[0].1 < w[1].1),
        "revisions strictly increase: {events:?}"
    );
    assert_eq!(watch.revision(), events.last().unwrap().1);
}

#[test]
fn a_prefix_filters_and_resuming_from_the_revision_loses_and_repeats_nothing() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    let mut watch = eph.watch(&space(), "t", Some("user/"), None).unwrap();
    eph.upsert(&space(), "t", "user/1", b"1").unwrap();
    eph.upsert(&space(), "t", "team/1", b"1").unwrap();
    let first = keys_of(&drain(&mut watch, &store));
    assert_eq!(
        first.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        ["user/1"]
    );
    let resume_at = watch.revision();
    drop(watch);
    eph.upsert(&space(), "t", "user/2", b"1").unwrap();
    let mut resumed = eph
        .watch(&space(), "t", Some("user/"), Some(resume_at))
        .unwrap();
    let rest = keys_of(&drain(&mut resumed, &store));
    assert_eq!(
        rest.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        ["user/2"]
    );
}

#[test]
fn lost_history_is_resync_required_and_closes_the_watcher() {
    let store = FakeStore::with_history(T0, 2);
    let eph = Ephemeral::new(&store);
    let mut watch = eph.watch(&space(), "t", None, Some(0)).unwrap();
    for key in ["a", "b", "c"] {
        eph.upsert(&space(), "t", key, b"1").unwrap();
    }
    assert_eq!(watch.next(&&store, 0).unwrap(), Some(Event::ResyncRequired));
    assert_eq!(
        watch.next(&&store, 0).unwrap(),
        Some(Event::ResyncRequired),
        "it stays closed"
    );
}

#[test]
fn next_waits_in_the_store_and_times_out_with_none() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    let mut watch = eph.watch(&space(), "t", None, None).unwrap();
    assert_eq!(watch.next(&&store, 500).unwrap(), None);
    assert_eq!(store.waits.get(), 1);
    assert_eq!(
        store.clock(),
        T0 + 500,
        "the fake's wait let the timeout pass"
    );
}

#[test]
fn invalid_arguments_are_named() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    let field = |r: Result<Written, Error>| match r {
        Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    assert_eq!(field(eph.upsert(&space(), "t", "k", &[0; 17])), "value");
    assert!(
        eph.upsert(&space(), "t", "k", &[0; 16]).is_ok(),
        "exactly max-value-bytes is fine"
    );
    assert_eq!(
        field(eph.upsert(
            &Space {
                ttl_ms: 0,
                ..space()
            },
            "t",
            "k",
            b""
        )),
        "space.ttl-ms"
    );
    assert_eq!(
        field(eph.upsert(
            &Space {
                max_value_bytes: 0,
                ..space()
            },
            "t",
            "k",
            b""
        )),
        "space.max-value-bytes"
    );
    assert_eq!(
        field(eph.upsert(
            &Space {
                id: String::new(),
                ..space()
            },
            "t",
            "k",
            b""
        )),
        "space.id"
    );
    assert_eq!(field(eph.upsert(&space(), "", "k", b"")), "tenant");
    assert_eq!(field(eph.upsert(&space(), "t", "", b"")), "key");
    let mut watch = eph.watch(&space(), "t", None, Some(0)).unwrap();
    assert!(
        matches!(watch.next(&&store, u64::MAX), Err(Error::InvalidArgument(InvalidArgument { field, .. })) if field == "timeout-ms")
    );
}

#[test]
fn next_answers_none_only_once_its_timeout_has_passed_on_the_store_clock() {
    let store = FakeStore::new(T0);
    let eph = Ephemeral::new(&store);
    let mut watch = eph.watch(&space(), "t", Some("mine/"), Some(0)).unwrap();
    // While the watcher waits, another writer changes a key outside its
    // prefix, twice: each change wakes the wait with nothing for it.
    let writes = std::rc::Rc::new(std::cell::Cell::new(0));
    let counted = writes.clone();
    store.during_wait(move |s| {
        if counted.get() < 2 {
            counted.set(counted.get() + 1);
            s.advance(50);
            Ephemeral::new(s)
                .upsert(&space(), "t", "theirs", b"1")
                .unwrap();
        }
    });
    assert!(watch.next(&&store, 300).unwrap().is_none());
    assert_eq!(writes.get(), 2, "both wake-ups happened");
    assert_eq!(
        store.clock(),
        T0 + 300,
        "none after the whole 300 ms of store time, not at the first wake-up"
    );
    // An event for the watcher still ends the wait at once.
    store.during_wait(|s| {
        Ephemeral::new(s)
            .upsert(&space(), "t", "mine/a", b"1")
            .unwrap();
    });
    let before = store.clock();
    let event = watch.next(&&store, 300).unwrap();
    assert!(matches!(event, Some(Event::Upsert(e)) if e.key == "mine/a"));
    assert_eq!(store.clock(), before, "no time passed");
}
