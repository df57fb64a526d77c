//! What only the NATS backend has to show: the server it needs, the real
//! clock, a stream deleted under it, a partition too big for one message,
//! bytes on its subjects that it did not write, and processes on one server
//! sharing locks. The contract itself is checked by the shared suites
//! (`conformance.rs` and the others run on NATS too).

use crate::common;

use common::applied;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{NatsServer, nats_config, nats_url, server_version};
use coord_host::backend::*;
use coord_nats::{NatsBackend, NatsConfig};

/// A backend on the shared test server, on the server's own clock.
async fn on_server_clock() -> (NatsBackend, NatsConfig) {
    let config = nats_config(&nats_url(), 64, None);
    (NatsBackend::connect(config.clone()).await.unwrap(), config)
}

#[tokio::test]
async fn a_server_older_than_2_11_is_refused_at_connect_naming_the_version_needed() {
    // Debian's package (2.9.10 on this machine kind); .ci/run installs it.
    let old = Path::new("/usr/sbin/nats-server");
    let version = server_version(old)
        .expect("Debian's nats-server at /usr/sbin (apt-get install nats-server)");
    assert!(
        version < (2, 11, 0),
        "{old:?} is {version:?}, not an old server"
    );
    let server = NatsServer::spawn(old, &["-js", "-sd", "./js"]).unwrap();
    let error = NatsBackend::connect(NatsConfig::new(&server.url()))
        .await
        .err()
        .expect("an old server is refused");
    let StoreError::Invalid(message) = error else {
        panic!("expected invalid, got {error:?}");
    };
    let (a, b, c) = version;
    assert!(message.contains(&format!("{a}.{b}.{c}")), "{message}");
    assert!(message.contains("2.11.0 or later"), "{message}");
}

#[tokio::test]
async fn a_server_without_jetstream_is_refused_naming_the_flag() {
    let binary = common::nats_server_binary().unwrap();
    let server = NatsServer::spawn(&binary, &[]).unwrap();
    let error = NatsBackend::connect(NatsConfig::new(&server.url()))
        .await
        .err()
        .expect("no JetStream, no coord");
    assert!(
        matches!(&error, StoreError::Invalid(m) if m.contains("without JetStream")),
        "{error:?}"
    );
}

#[tokio::test]
async fn no_server_at_the_url_is_unavailable() {
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = nothing.local_addr().unwrap().port();
    drop(nothing);
    let mut config = NatsConfig::new(&format!("nats://127.0.0.1:{port}"));
    config.response_timeout = Duration::from_millis(500);
    let error = NatsBackend::connect(config).await.err().unwrap();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
}

#[tokio::test]
async fn the_clock_is_the_servers_and_expiry_happens_on_it() {
    let (backend, _) = on_server_clock().await;
    let local = || {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    };
    let (before, now, after) = (local(), backend.now().await.unwrap(), local());
    // The server runs on this machine: its clock is this one.
    assert!(
        before <= now + 5 && now <= after + 5,
        "{before} {now} {after}"
    );
    let put = applied(
        backend
            .put("p", "k", b"v", Some(150), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert_eq!(put.expires_at, Some(put.updated_at + 150));
    // Live when read before its expiry (a busy machine may read later).
    let early = backend.get("p", "k").await.unwrap();
    assert_eq!(
        early.entry.is_some(),
        early.now < put.updated_at + 150,
        "read at {}",
        early.now
    );
    while backend.now().await.unwrap() <= put.updated_at + 150 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read = backend.get("p", "k").await.unwrap();
    assert!(
        read.entry.is_none(),
        "expired 150 ms after the put, read at {}",
        read.now
    );
    let feed = backend.changes("p", put.revision, 10).await.unwrap();
    assert_eq!(feed.changes.len(), 1);
    assert_eq!(feed.changes[0].kind, ChangeKind::Expire);
    assert_eq!(feed.changes[0].at, put.updated_at + 150);
}

#[tokio::test]
async fn a_stream_deleted_under_the_backend_is_made_again_and_revisions_still_only_go_up() {
    let (backend, config) = on_server_clock().await;
    let first = applied(
        backend
            .put("tenant", "k", b"v", None, &Condition::Always)
            .await
            .unwrap(),
    );
    let client = async_nats::connect(config.url.as_str()).await.unwrap();
    async_nats::jetstream::new(client)
        .delete_stream(&config.stream)
        .await
        .unwrap();
    // The first call after the loss may fail (unavailable); the next work.
    let mut again = None;
    for _ in 0..3 {
        if let Ok(reply) = backend
            .put("tenant", "k", b"w", None, &Condition::Absent)
            .await
        {
            again = Some(applied(reply));
            break;
        }
    }
    let again = again.expect("the stream is made again");
    assert!(again.revision > first.revision, "{again:?} after {first:?}");
    // A watcher from before the loss must resynchronise.
    assert!(matches!(
        backend.changes("tenant", first.revision, 10).await,
        Err(StoreError::HistoryGone(_))
    ));
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn a_partition_too_big_for_one_message_is_refused_naming_the_value_and_kept_as_it_was() {
    let (backend, config) = on_server_clock().await;
    let half = vec![7u8; 400 * 1024];
    applied(
        backend
            .put("big", "a", &half, None, &Condition::Always)
            .await
            .unwrap(),
    );
    // The feed would hold both values: it is trimmed, the put applies.
    let b = applied(
        backend
            .put("big", "b", &half, None, &Condition::Always)
            .await
            .unwrap(),
    );
    // Three values cannot fit in the server's 1 MiB max_payload.
    let error = backend
        .put("big", "c", &half, None, &Condition::Always)
        .await
        .unwrap_err();
    let StoreError::Invalid(message) = error else {
        panic!("expected invalid, got {error:?}");
    };
    assert!(message.starts_with("value:"), "{message}");
    let listed = backend.list("big", "").await.unwrap();
    assert_eq!(listed.entries.len(), 2, "nothing of the refused put landed");
    assert_eq!(listed.revision, b.revision);
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn bytes_on_a_partitions_subject_that_coord_did_not_write_are_unavailable_not_a_panic() {
    let (backend, config) = on_server_clock().await;
    applied(
        backend
            .put("forged", "k", b"v", None, &Condition::Always)
            .await
            .unwrap(),
    );
    let client = async_nats::connect(config.url.as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let token = format!(
        "_{}",
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, "forged")
    );
    for garbage in [&b""[..], b"short", &[0xff; 64]] {
        js.publish(
            format!("{}.p.{token}", config.subject_prefix),
            garbage.to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
        let error = backend.get("forged", "k").await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Unavailable(m) if m.contains("not a coord partition")),
            "{error:?}"
        );
    }
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_separate_connections_grant_a_key_to_exactly_one() {
    let url = nats_url();
    let config = nats_config(&url, 64, None);
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            NatsBackend::connect(config.clone()).await.unwrap(),
        ));
    }
    for round in 0..20 {
        let key = format!("lock{round}");
        let mut racers = Vec::new();
        for (i, b) in backends.iter().enumerate() {
            let (b, key) = (b.clone(), key.clone());
            racers.push(tokio::spawn(async move {
                b.put("~locks", &key, &[i as u8], Some(60_000), &Condition::Absent)
                    .await
                    .unwrap()
            }));
        }
        let mut winners = 0;
        let mut holders = Vec::new();
        for r in racers {
            match r.await.unwrap().outcome {
                Outcome::Applied(_) => winners += 1,
                Outcome::Conflict(holder) => holders.push(holder.unwrap().value),
            }
        }
        assert_eq!(winners, 1, "round {round}");
        let stored = backends[0]
            .get("~locks", &key)
            .await
            .unwrap()
            .entry
            .unwrap();
        assert!(
            holders.iter().all(|h| *h == stored.value),
            "losers saw the winner"
        );
    }
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn a_holders_extend_and_release_are_one_round_trip_and_a_stale_write_reads_again() {
    let (backend, config) = on_server_clock().await;
    let trips = |f: u64| backend.round_trips() - f;
    let p = "~lock";
    let start = backend.round_trips();
    let held = applied(
        backend
            .put(p, "holder", b"me", Some(10_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert_eq!(
        trips(start),
        2,
        "a partition never seen: read, then publish"
    );
    let guard = Condition::RevisionAndValue(Guard {
        revision: held.revision,
        value: b"me".to_vec(),
    });
    for _ in 0..5 {
        // A touch in the millisecond of the last write would change nothing,
        // which proves nothing: the backend then reads.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        let start = backend.round_trips();
        let touched = applied(backend.touch(p, "holder", 10_000, &guard).await.unwrap());
        assert_eq!(trips(start), 1, "an extend of a lock this host holds");
        assert_eq!(touched.revision, held.revision, "the fence stays");
    }
    let start = backend.round_trips();
    applied(backend.delete(p, "holder", &guard).await.unwrap());
    assert_eq!(trips(start), 1, "a release");
    let start = backend.round_trips();
    applied(
        backend
            .put(p, "holder", b"me", Some(10_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert_eq!(
        trips(start),
        2,
        "taken again: a create-if-absent always reads first, so a holder that \
         released does not beat the waiters its release woke"
    );

    // Another host writes: this one's memory is stale, the server refuses
    // its publish, and it reads and decides again.
    let other = NatsBackend::connect(config.clone()).await.unwrap();
    let theirs = applied(
        other
            .put(p, "other", b"x", None, &Condition::Always)
            .await
            .unwrap(),
    );
    let start = backend.round_trips();
    let mine = applied(
        backend
            .put(p, "mine", b"y", None, &Condition::Always)
            .await
            .unwrap(),
    );
    assert_eq!(
        trips(start),
        3,
        "a stale publish refused, a read, a publish"
    );
    assert!(mine.revision > theirs.revision);
    let listed = backend.list(p, "").await.unwrap();
    assert_eq!(listed.entries.len(), 3, "nothing lost: {listed:?}");
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn a_holder_that_remembers_a_deleted_stream_cannot_extend_over_the_next_holder() {
    let (a, config) = on_server_clock().await;
    let held = applied(
        a.put("~l", "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    let client = async_nats::connect(config.url.as_str()).await.unwrap();
    async_nats::jetstream::new(client)
        .delete_stream(&config.stream)
        .await
        .unwrap();
    // Another host makes the stream again and takes the lock: its message
    // is the partition's first in the new stream.
    let b = NatsBackend::connect(config.clone()).await.unwrap();
    let theirs = applied(
        b.put("~l", "holder", b"b", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // A, within a second of its last clock reading, extends what it holds
    // from memory: the new stream's sequences start above the old one's,
    // so its condition is refused and it reads B's holder.
    tokio::time::sleep(Duration::from_millis(3)).await;
    let guard = Condition::RevisionAndValue(Guard {
        revision: held.revision,
        value: b"a".to_vec(),
    });
    let extend = a.touch("~l", "holder", 60_000, &guard).await.unwrap();
    match extend.outcome {
        Outcome::Conflict(current) => assert_eq!(current, Some(theirs.clone())),
        Outcome::Applied(entry) => panic!("A's stale memory renewed over B's lock: {entry:?}"),
    }
    assert_eq!(
        b.get("~l", "holder").await.unwrap().entry,
        Some(theirs),
        "B still holds it, untouched"
    );
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn a_stream_with_a_limit_that_would_drop_held_partitions_is_refused_naming_it() {
    let url = nats_url();
    let config = nats_config(&url, 64, None);
    let client = async_nats::connect(url.as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: config.stream.clone(),
        subjects: vec![format!("{}.p.>", config.subject_prefix)],
        max_messages_per_subject: 1,
        allow_message_ttl: true,
        max_age: Duration::from_secs(60),
        ..Default::default()
    })
    .await
    .unwrap();
    let error = NatsBackend::connect(config.clone()).await.err().unwrap();
    assert!(
        matches!(&error, StoreError::Invalid(m) if m.starts_with("stream:") && m.contains("max_age")),
        "{error:?}"
    );
    js.delete_stream(&config.stream).await.unwrap();
}

/// Outside testers: each partition is one message that every write
/// rewrites, and its feed was trimmed only to the 1 MiB message limit:
/// 232 KB after 100 keyed adjusts, 1.04 MB after 400, and a sequential
/// adjust slowed from 43 ms to 107 ms. The feed a partition carries is now
/// bounded in bytes ([`FEED_BYTES`], or the live entries' size if more),
/// so a write's size, and with it its cost, follows the live entries
/// however long the history.
#[tokio::test]
async fn a_partitions_message_stays_its_live_entries_plus_a_bounded_feed() {
    use coord_nats::FEED_BYTES;
    let config = nats_config(&nats_url(), coord_component::memory::DEFAULT_HISTORY, None);
    let backend = NatsBackend::connect(config.clone()).await.unwrap();
    let client = async_nats::connect(config.url.as_str()).await.unwrap();
    let stream_bytes = || {
        let client = client.clone();
        let stream = config.stream.clone();
        async move {
            let reply = client
                .request(format!("$JS.API.STREAM.INFO.{stream}"), "".into())
                .await
                .unwrap();
            let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
            info["state"]["bytes"].as_u64().unwrap() as usize
        }
    };
    let value = vec![b's'; 2_000];
    let mut sizes = Vec::new();
    for n in 0..400u32 {
        applied(
            backend
                .put("stock", "apple", &value, None, &Condition::Always)
                .await
                .unwrap(),
        );
        if n == 99 || n == 399 {
            sizes.push(stream_bytes().await);
        }
    }
    // The live entry (2 kB) plus at most FEED_BYTES of feed (more than the
    // live entry), and headers.
    let bound = value.len() + FEED_BYTES + 4_096;
    assert!(
        sizes.iter().all(|size| *size <= bound),
        "the partition's message grew past {bound} bytes: {sizes:?} after 100 and 400 writes"
    );
    assert!(
        sizes[1] <= sizes[0] + 2_100,
        "it kept growing with its history: {sizes:?}"
    );
    // The history kept still serves a watcher that is not far behind.
    let latest = backend.list("stock", "").await.unwrap().revision;
    let page = backend.changes("stock", latest - 1, 10).await;
    assert!(page.is_ok(), "{page:?}");
    common::delete_stream(config.url.clone(), config.stream.clone());
}

#[tokio::test]
async fn ready_exercises_a_write_and_says_no_while_the_stream_refuses_them() {
    // A sealed stream answers its info and tells the time, but takes no
    // write: readiness must say so, as it must for one out of storage.
    let config = nats_config(&nats_url(), 64, None);
    let backend = NatsBackend::connect(config.clone()).await.unwrap();
    backend.ready().await.unwrap();
    let client = async_nats::connect(config.url.as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(&config.stream).await.unwrap();
    let mut sealed = stream.info().await.unwrap().config.clone();
    sealed.sealed = true;
    js.update_stream(sealed).await.unwrap();
    backend.now().await.unwrap();
    let refused = backend.ready().await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "ready while the stream takes no write: {refused:?}"
    );
    js.delete_stream(&config.stream).await.unwrap();
}

/// The response timeout bounds a whole call, its reads and its write's
/// acknowledgement together. A create (which reads first) whose read was
/// held most of the timeout, and whose write was then held, used to wait
/// the client's own full timeout for the acknowledgement on top: 3 s of
/// stall plus 4 s, where 4 s was stated. The margins either side of the
/// bound are 1.5 s, so neither a slow machine nor the old wait passes for
/// the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_read_and_write_are_stalled_answers_within_the_response_timeout() {
    let url = nats_url();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = common::stall_proxy::StallProxy::start(port).await;
    let mut config = nats_config(&format!("nats://127.0.0.1:{}", proxy.port), 64, None);
    config.response_timeout = Duration::from_secs(4);
    let backend = Arc::new(NatsBackend::connect(config.clone()).await.unwrap());
    applied(
        backend
            .put("~lock", "first", b"x", None, &Condition::Always)
            .await
            .unwrap(),
    );
    proxy.stall(true);
    let call = {
        let backend = backend.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let answer = backend
                .put("~lock", "second", b"y", Some(60_000), &Condition::Absent)
                .await;
            (answer, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The read goes through; the write that follows it is held.
    proxy.stall_when_sent(format!("PUB {}.p.", config.subject_prefix).as_bytes());
    proxy.stall(false);
    let (answer, took) = call.await.unwrap();
    proxy.stall(false);
    eprintln!("answered after {took:?}: {answer:?}");
    assert!(
        matches!(&answer, Err(StoreError::Unavailable(_))),
        "a held write is unavailable: {answer:?}"
    );
    assert!(
        took < Duration::from_millis(5_500),
        "answered after {took:?} with a 4 s response timeout: {answer:?}"
    );
    common::delete_stream(config.url.clone(), config.stream.clone());
}
