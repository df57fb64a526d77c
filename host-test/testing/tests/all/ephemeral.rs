//! Ephemeral state, end to end: the real `coord.wasm` over every backend, the
//! store's clock moved by hand. Includes the watch properties of etcd's
//! robustness suite, checked with concurrent writers and several watchers.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use common::{Harness, T0, settle};
use coord_component::keys::ephemeral_partition;
use coord_host::ephemeral::*;
use coord_host::{Instance, Runtime};

/// Changes a tenant's feed keeps in this suite: more than the concurrent
/// test writes, fewer than the trimming test does.
const HISTORY: usize = 128;

per_backend!(
    upsert_touch_and_delete_cost_one_store_call_each,
    values_are_limited_by_the_space_and_bad_arguments_are_named,
    a_snapshot_filters_by_prefix_and_carries_the_revision,
    entries_expire_unless_touched,
    a_watch_replays_current_entries_then_follows_changes_and_expiry,
    a_watch_after_a_snapshot_continues_it_exactly,
    next_blocks_in_the_stores_wait_and_is_woken_by_a_write,
    lost_history_is_resync_required_and_closes_the_watcher,
    tenants_never_see_each_others_entries,
    watches_are_ordered_unique_resumable_and_reliable_under_concurrent_writers,
);

fn space() -> Space {
    Space {
        id: "inventory.editors".into(),
        ttl_ms: 1000,
        max_value_bytes: 64,
    }
}

async fn upsert(i: &mut Instance, tenant: &str, key: &str, value: &str) -> Written {
    i.ephemeral()
        .upsert(&space(), tenant, key, value.as_bytes())
        .await
        .unwrap()
        .unwrap()
}

async fn keys(i: &mut Instance, tenant: &str) -> Vec<String> {
    let snapshot = i
        .ephemeral()
        .snapshot(&space(), tenant, None)
        .await
        .unwrap()
        .unwrap();
    snapshot.entries.into_iter().map(|e| e.key).collect()
}

/// Every event that is ready, without waiting.
async fn ready(i: &mut Instance, w: &Watcher) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(event) = i.ephemeral().next_event(w, 0).await.unwrap().unwrap() {
        events.push(event);
    }
    events
}

fn summary(events: &[Event]) -> Vec<(String, &'static str)> {
    events
        .iter()
        .map(|e| match e {
            Event::Upsert(e) => (e.key.clone(), "upsert"),
            Event::Delete(r) => (r.key.clone(), "delete"),
            Event::Expire(r) => (r.key.clone(), "expire"),
            Event::ResyncRequired => (String::new(), "resync-required"),
        })
        .collect()
}

fn revision(event: &Event) -> u64 {
    match event {
        Event::Upsert(e) => e.revision,
        Event::Delete(r) | Event::Expire(r) => r.revision,
        Event::ResyncRequired => panic!("no revision on resync-required"),
    }
}

async fn upsert_touch_and_delete_cost_one_store_call_each(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    let written = upsert(&mut i, "item:1", "session-a", r#"{"user":"ada"}"#).await;
    assert_eq!(i.store_calls(), 1, "upsert");
    assert_eq!(written.updated_at, T0);
    assert!(
        i.ephemeral()
            .touch(&space(), "item:1", "session-a")
            .await
            .unwrap()
            .unwrap()
    );
    assert_eq!(i.store_calls(), 2, "touch");
    assert!(
        i.ephemeral()
            .delete(&space(), "item:1", "session-a")
            .await
            .unwrap()
            .unwrap()
    );
    assert_eq!(i.store_calls(), 3, "delete");
    assert!(
        !i.ephemeral()
            .delete(&space(), "item:1", "session-a")
            .await
            .unwrap()
            .unwrap()
    );
    assert!(
        !i.ephemeral()
            .touch(&space(), "item:1", "session-a")
            .await
            .unwrap()
            .unwrap(),
        "recreate with upsert"
    );
    let again = upsert(&mut i, "item:1", "session-a", "{}").await;
    assert!(again.revision > written.revision);
}

async fn values_are_limited_by_the_space_and_bad_arguments_are_named(h: Harness) {
    fn field<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
        match r {
            Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
            other => panic!("expected invalid-argument, got {other:?}"),
        }
    }
    let (_rt, mut i) = h.runtime_and_instance().await;
    let at_limit = vec![b'x'; 64];
    assert!(
        i.ephemeral()
            .upsert(&space(), "t", "k", &at_limit)
            .await
            .unwrap()
            .is_ok()
    );
    let over = vec![b'x'; 65];
    assert_eq!(
        field(
            i.ephemeral()
                .upsert(&space(), "t", "k", &over)
                .await
                .unwrap()
        ),
        "value"
    );
    let calls = i.store_calls();
    let huge = Space {
        max_value_bytes: u32::MAX,
        ..space()
    };
    assert_eq!(
        field(i.ephemeral().upsert(&huge, "t", "k", b"v").await.unwrap()),
        "space.max-value-bytes"
    );
    let forever = Space {
        ttl_ms: u64::MAX,
        ..space()
    };
    assert_eq!(
        field(i.ephemeral().touch(&forever, "t", "k").await.unwrap()),
        "space.ttl-ms"
    );
    assert_eq!(
        field(i.ephemeral().delete(&space(), "", "k").await.unwrap()),
        "tenant"
    );
    assert_eq!(
        field(i.ephemeral().delete(&space(), "t", "").await.unwrap()),
        "key"
    );
    let long = "p".repeat(1 << 20);
    assert_eq!(
        field(
            i.ephemeral()
                .snapshot(&space(), "t", Some(&long))
                .await
                .unwrap()
        ),
        "prefix"
    );
    assert_eq!(
        field(
            i.ephemeral()
                .watch(&space(), &long, None, None)
                .await
                .unwrap()
        ),
        "tenant"
    );
    assert_eq!(i.store_calls(), calls, "nothing invalid reached the store");
    assert_eq!(
        keys(&mut i, "t").await,
        ["k"],
        "the rejected write changed nothing"
    );
}

async fn a_snapshot_filters_by_prefix_and_carries_the_revision(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    upsert(&mut i, "t", "user/2", "b").await;
    upsert(&mut i, "t", "user/1", "a").await;
    let last = upsert(&mut i, "t", "team/1", "c").await;
    let snapshot = i
        .ephemeral()
        .snapshot(&space(), "t", Some("user/"))
        .await
        .unwrap()
        .unwrap();
    let entries: Vec<_> = snapshot
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_slice()))
        .collect();
    assert_eq!(entries, [("user/1", &b"a"[..]), ("user/2", &b"b"[..])]);
    assert_eq!(snapshot.revision, last.revision);
    assert_eq!(i.store_calls(), 4, "a snapshot is one store call");
}

async fn entries_expire_unless_touched(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    upsert(&mut i, "t", "kept", "1").await;
    upsert(&mut i, "t", "lapsed", "1").await;
    h.advance(900);
    assert!(
        i.ephemeral()
            .touch(&space(), "t", "kept")
            .await
            .unwrap()
            .unwrap()
    );
    h.advance(100);
    assert_eq!(keys(&mut i, "t").await, ["kept"]);
    h.advance(900);
    assert_eq!(keys(&mut i, "t").await, Vec::<String>::new());
}

async fn a_watch_replays_current_entries_then_follows_changes_and_expiry(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    upsert(&mut i, "t", "b", "1").await;
    upsert(&mut i, "t", "a", "1").await;
    let w = i
        .ephemeral()
        .watch(&space(), "t", None, None)
        .await
        .unwrap()
        .unwrap();
    upsert(&mut i, "t", "c", "1").await;
    i.ephemeral()
        .delete(&space(), "t", "b")
        .await
        .unwrap()
        .unwrap();
    h.advance(1000); // a and c expire with nobody writing
    let events = ready(&mut i, &w).await;
    let expected = [
        ("b", "upsert"),
        ("a", "upsert"),
        ("c", "upsert"),
        ("b", "delete"),
        ("a", "expire"),
        ("c", "expire"),
    ];
    let got = summary(&events);
    assert_eq!(
        got.iter()
            .map(|(k, kind)| (k.as_str(), *kind))
            .collect::<Vec<_>>(),
        expected
    );
    let revisions: Vec<u64> = events.iter().map(revision).collect();
    assert!(
        revisions.windows(2).all(|r| r[0] < r[1]),
        "ordered and unique: {revisions:?}"
    );
    let Event::Expire(expired) = &events[4] else {
        unreachable!()
    };
    assert_eq!(expired.at, T0 + 1000, "expiry is reported at the TTL's end");
    assert_eq!(
        i.ephemeral().watch_revision(&w).await.unwrap(),
        *revisions.last().unwrap()
    );
    i.ephemeral().close_watch(w).await.unwrap();
}

async fn a_watch_after_a_snapshot_continues_it_exactly(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    upsert(&mut i, "t", "a", "1").await;
    let snapshot = i
        .ephemeral()
        .snapshot(&space(), "t", None)
        .await
        .unwrap()
        .unwrap();
    upsert(&mut i, "t", "b", "1").await;
    let w = i
        .ephemeral()
        .watch(&space(), "t", None, Some(snapshot.revision))
        .await
        .unwrap()
        .unwrap();
    upsert(&mut i, "t", "a", "2").await;
    let events = summary(&ready(&mut i, &w).await);
    assert_eq!(
        events,
        [("b".to_string(), "upsert"), ("a".to_string(), "upsert")]
    );
}

async fn next_blocks_in_the_stores_wait_and_is_woken_by_a_write(h: Harness) {
    let (runtime, mut writer) = h.runtime_and_instance().await;
    let mut reader = runtime.instantiate().await.unwrap();
    let w = reader
        .ephemeral()
        .watch(&space(), "t", None, None)
        .await
        .unwrap()
        .unwrap();
    let calls = reader.store_calls();
    let watching = tokio::spawn(async move {
        // The store's clock never moves in this test: only a write can end this.
        let event = reader
            .ephemeral()
            .next_event(&w, 600_000)
            .await
            .unwrap()
            .unwrap();
        (event, reader.store_calls() - calls)
    });
    h.until_waiting(&ephemeral_partition("inventory.editors", "t"), 1)
        .await;
    upsert(&mut writer, "t", "a", "1").await;
    let (event, calls) = watching.await.unwrap();
    assert_eq!(summary(&[event.unwrap()]), [("a".to_string(), "upsert")]);
    assert_eq!(calls, 3, "read the feed, wait, read the feed: no polling");
}

async fn lost_history_is_resync_required_and_closes_the_watcher(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    let w = i
        .ephemeral()
        .watch(&space(), "t", None, None)
        .await
        .unwrap()
        .unwrap();
    for n in 0..=HISTORY {
        upsert(&mut i, "t", &format!("k{}", n % 4), "v").await;
    }
    assert_eq!(
        i.ephemeral().next_event(&w, 0).await.unwrap().unwrap(),
        Some(Event::ResyncRequired)
    );
    assert_eq!(
        i.ephemeral().next_event(&w, 0).await.unwrap().unwrap(),
        Some(Event::ResyncRequired),
        "closed"
    );
    // Reopening without `after` brings the current state back.
    let fresh = i
        .ephemeral()
        .watch(&space(), "t", None, None)
        .await
        .unwrap()
        .unwrap();
    let replay = summary(&ready(&mut i, &fresh).await);
    assert_eq!(replay.len(), 4);
    assert!(replay.iter().all(|(_, kind)| *kind == "upsert"));
}

async fn tenants_never_see_each_others_entries(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    // Pairs that a naive "tenant/key" encoding would confuse.
    let pairs = [
        ("a/b", "c"),
        ("a", "b/c"),
        ("a:1:b", "c"),
        ("a", "1:b:c"),
        ("{x}", "}"),
        ("x", ""),
    ];
    let mut watchers = Vec::new();
    for (tenant, _) in pairs {
        watchers.push(
            i.ephemeral()
                .watch(&space(), tenant, None, None)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    for (tenant, key) in pairs.iter().filter(|(_, k)| !k.is_empty()) {
        upsert(&mut i, tenant, key, tenant).await;
    }
    for ((tenant, _), w) in pairs.iter().zip(&watchers) {
        // What this tenant should hold: exactly the pairs written to it.
        let mut expected: Vec<(&str, &[u8])> = pairs
            .iter()
            .filter(|(t, k)| t == tenant && !k.is_empty())
            .map(|(_, k)| (*k, tenant.as_bytes()))
            .collect();
        expected.sort();
        let snapshot = i
            .ephemeral()
            .snapshot(&space(), tenant, None)
            .await
            .unwrap()
            .unwrap();
        let seen: Vec<_> = snapshot
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_slice()))
            .collect();
        assert_eq!(seen, expected, "tenant {tenant:?}");
        let mut events: Vec<String> = summary(&ready(&mut i, w).await)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        events.sort();
        let expected_keys: Vec<String> = expected.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(
            events, expected_keys,
            "tenant {tenant:?} watched another's writes"
        );
    }
}

async fn watches_are_ordered_unique_resumable_and_reliable_under_concurrent_writers(h: Harness) {
    const WRITERS: u64 = 4;
    const OPS: u64 = 20;
    let (runtime, mut main) = h.runtime_and_instance().await;
    let start = main
        .ephemeral()
        .snapshot(&space(), "doc", None)
        .await
        .unwrap()
        .unwrap()
        .revision;
    let target = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    // How many `next` calls the watchers have completed: the clock below
    // moves again only once a watcher has acted on its last move.
    let returned = Arc::new(AtomicU64::new(0));
    let opened = Arc::new(tokio::sync::Barrier::new(4));

    // Three watchers, each in its own instance: one replays from a snapshot,
    // one starts after `start`, one closes halfway and resumes from its revision.
    let mut watchers = Vec::new();
    for kind in 0..3 {
        let (runtime, target, finished) = (runtime.clone(), target.clone(), finished.clone());
        let (opened, returned) = (opened.clone(), returned.clone());
        watchers.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let after = (kind == 1).then_some(start);
            let mut w = i
                .ephemeral()
                .watch(&space(), "doc", None, after)
                .await
                .unwrap()
                .unwrap();
            opened.wait().await; // every watch is open before the first write
            let mut events = Vec::new();
            let mut resumed = false;
            loop {
                let goal = target.load(Ordering::SeqCst);
                if goal != 0 && i.ephemeral().watch_revision(&w).await.unwrap() >= goal {
                    break;
                }
                let next = i.ephemeral().next_event(&w, 10_000).await.unwrap().unwrap();
                returned.fetch_add(1, Ordering::SeqCst);
                if let Some(event) = next {
                    assert_ne!(event, Event::ResyncRequired, "history was long enough");
                    events.push(event);
                }
                if kind == 2 && !resumed && events.len() >= 10 {
                    let at = i.ephemeral().watch_revision(&w).await.unwrap();
                    i.ephemeral().close_watch(w).await.unwrap();
                    w = i
                        .ephemeral()
                        .watch(&space(), "doc", None, Some(at))
                        .await
                        .unwrap()
                        .unwrap();
                    resumed = true;
                }
            }
            finished.fetch_add(1, Ordering::SeqCst);
            events
        }));
    }
    opened.wait().await;
    let mut writers = Vec::new();
    for n in 0..WRITERS {
        let runtime = runtime.clone();
        writers.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut seed = n * 7919 + 17;
            for op in 0..OPS {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("k{}", (seed >> 33) % 6);
                if (seed >> 40) % 3 == 0 {
                    i.ephemeral()
                        .delete(&space(), "doc", &key)
                        .await
                        .unwrap()
                        .unwrap();
                } else {
                    let value = format!("w{n}-{op}");
                    i.ephemeral()
                        .upsert(&space(), "doc", &key, value.as_bytes())
                        .await
                        .unwrap()
                        .unwrap();
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    h.advance(1000); // every entry expires
    upsert(&mut main, "doc", "survivor", "1").await; // records the expiries, then writes
    let last = upsert(&mut main, "doc", "k0", "final").await;
    let final_state: BTreeMap<String, Vec<u8>> = main
        .ephemeral()
        .snapshot(&space(), "doc", None)
        .await
        .unwrap()
        .unwrap()
        .entries
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    assert_eq!(final_state.len(), 2, "the survivor and k0");
    target.store(last.revision, Ordering::SeqCst);
    // Watchers blocked in a wait wake when their timeout passes on the
    // store's clock. Move it when every watcher still running is blocked
    // there, and again only after one of them has returned from `next`: a
    // woken watcher counts as waiting until its task runs, and a clock
    // moved on meanwhile, round after round, would pass the retention and
    // let the in-memory store drop the quiet tenant under the watchers.
    let partition = ephemeral_partition("inventory.editors", "doc");
    let mut moved_at = None;
    let mut rounds = 0;
    while finished.load(Ordering::SeqCst) < 3 {
        let acted = returned.load(Ordering::SeqCst);
        let blocked = h.waiting(&partition) >= 3 - finished.load(Ordering::SeqCst);
        if blocked && moved_at != Some(acted) {
            h.advance(10_000);
            moved_at = Some(acted);
        }
        settle().await;
        rounds += 1;
        assert!(rounds < 100_000, "watchers never caught up");
    }

    // The reference: the tenant's feed up to the last write, read straight
    // from the store (moving the clock since has expired more).
    let feed = h.backend.changes(&partition, start, 10_000).await.unwrap();
    let upto: Vec<_> = feed
        .changes
        .iter()
        .filter(|c| c.revision <= last.revision)
        .collect();
    let reference: Vec<u64> = upto.iter().map(|c| c.revision).collect();
    let expired = upto
        .iter()
        .any(|c| c.kind == coord_host::backend::ChangeKind::Expire);
    assert!(expired, "expiry is in the feed");
    for (kind, watcher) in watchers.into_iter().enumerate() {
        // A watcher may go on past the last write (expiries the clock moves
        // cause while it finishes): compare up to the last write.
        let mut events = watcher.await.unwrap();
        events.retain(|e| revision(e) <= last.revision);
        let revisions: Vec<u64> = events.iter().map(revision).collect();
        assert!(
            revisions.windows(2).all(|r| r[0] < r[1]),
            "watcher {kind}: ordered and unique"
        );
        assert_eq!(
            revisions, reference,
            "watcher {kind}: every change, none twice, no gap"
        );
        let mut state = BTreeMap::new();
        for event in events {
            match event {
                Event::Upsert(e) => {
                    state.insert(e.key, e.value);
                }
                Event::Delete(r) | Event::Expire(r) => {
                    state.remove(&r.key);
                }
                Event::ResyncRequired => unreachable!(),
            }
        }
        assert_eq!(
            state, final_state,
            "watcher {kind}: replaying its events gives the final state"
        );
    }
}

/// The in-memory store drops a tenant's partition once it has had no live
/// entry for the retention, as Redis's keys expire; nothing a caller counts
/// on goes with it. A watcher that resumes from before the drop is told to
/// resync (within the retention it would have had the changes), and the
/// partition made again writes above every revision it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_quiet_tenant_is_dropped_after_the_retention_and_watchers_resync() {
    use coord_host::backend::memory::MemoryBackend;
    use coord_host::clock::ManualClock;
    const RETENTION_MS: u64 = 60_000;
    common::bounded(async {
        let clock = Arc::new(ManualClock::new(T0));
        let backend = Arc::new(
            MemoryBackend::with_history(clock.clone(), HISTORY).with_retention(RETENTION_MS),
        );
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();

        let written = upsert(&mut i, "t", "a", "1").await;
        let within = i
            .ephemeral()
            .watch(&space(), "t", None, Some(written.revision))
            .await;
        let within = within.unwrap().unwrap();
        let after_it = i
            .ephemeral()
            .watch(&space(), "t", None, Some(written.revision))
            .await;
        let after_it = after_it.unwrap().unwrap();
        // The entry expires (the space's TTL is 1 s); the tenant stays for
        // the retention, so a watcher resuming inside it sees the expiry.
        clock.advance(1_000 + RETENTION_MS - 1);
        assert_eq!(keys(&mut i, "t").await, Vec::<String>::new());
        assert_eq!(backend.partitions(), 1, "kept within the retention");
        assert_eq!(
            summary(&ready(&mut i, &within).await),
            [("a".to_string(), "expire")]
        );

        // Past it, the next sweep drops the tenant, with nothing in it.
        clock.advance(RETENTION_MS);
        assert_eq!(keys(&mut i, "other").await, Vec::<String>::new());
        assert_eq!(backend.partitions(), 0, "a quiet tenant is dropped");
        assert_eq!(
            i.ephemeral()
                .next_event(&after_it, 0)
                .await
                .unwrap()
                .unwrap(),
            Some(Event::ResyncRequired),
            "a watcher from before the drop resyncs"
        );
        let again = upsert(&mut i, "t", "a", "2").await;
        assert!(
            again.revision > written.revision,
            "revision {} after the drop <= {} before it",
            again.revision,
            written.revision
        );
    })
    .await
}
