//! Every limit the WIT states, tried at its edge through the component: the
//! largest (or smallest) value accepted, and one past it refused with
//! `invalid-argument` naming the field. Outside testers found limits the
//! component enforced that the WIT did not state; each is now stated beside
//! its item, and this suite keeps the two in step.

use std::sync::Arc;

use coord_host::backend::memory::MemoryBackend;
use coord_host::{ephemeral, lease, lock, ratelimit};

/// What a call answered, as the rejected field's name or "accepted".
trait Verdict {
    fn verdict(self) -> String;
}

macro_rules! verdict_for {
    ($($interface:ident),*) => {$(
        impl<T> Verdict for wasmtime::Result<Result<T, $interface::Error>> {
            fn verdict(self) -> String {
                match self.expect("no trap") {
                    Ok(_) => "accepted".into(),
                    Err(e) => match e {
                        $interface::Error::InvalidArgument(bad) => bad.field,
                        other => panic!("expected invalid-argument or success, got {other:?}"),
                    },
                }
            }
        }
    )*};
}
verdict_for!(lock, ephemeral, ratelimit, lease);

fn text(bytes: usize) -> String {
    "a".repeat(bytes)
}

const ACCEPTED: &str = "accepted";
const DAY_MS: u64 = 86_400_000;

fn options(ttl_ms: u64, wait: lock::WaitPolicy) -> lock::AcquireOptions {
    lock::AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(wait),
    }
}

fn attempts(max_attempts: u32, delay_ms: u64) -> lock::WaitPolicy {
    lock::WaitPolicy::Attempts(lock::Retry {
        max_attempts,
        delay_ms,
    })
}

#[tokio::test]
async fn lock_limits_hold_at_their_edges() {
    let mut i = crate::common::instance_on(Arc::new(MemoryBackend::default())).await;
    let no_wait = lock::WaitPolicy::NoWait;
    // Each accepted acquire takes a fresh resource, so none is busy.
    let mut n = 0;
    let mut fresh = || {
        n += 1;
        format!("r{n}")
    };
    let i_ = || String::from("i");
    let cases = vec![
        ("id", text(256), fresh(), options(1, no_wait)),
        ("id", text(257), fresh(), options(1, no_wait)),
        ("id", String::new(), fresh(), options(1, no_wait)),
        ("resource", i_(), text(1024), options(1, no_wait)),
        ("resource", i_(), text(1025), options(1, no_wait)),
        ("options.ttl-ms", i_(), fresh(), options(DAY_MS, no_wait)),
        (
            "options.ttl-ms",
            i_(),
            fresh(),
            options(DAY_MS + 1, no_wait),
        ),
        ("options.ttl-ms", i_(), fresh(), options(0, no_wait)),
        ("max-attempts", i_(), fresh(), options(1, attempts(1000, 0))),
        ("max-attempts", i_(), fresh(), options(1, attempts(1001, 0))),
        ("max-attempts", i_(), fresh(), options(1, attempts(1, 0))),
        ("max-attempts", i_(), fresh(), options(1, attempts(0, 0))),
        ("delay-ms", i_(), fresh(), options(1, attempts(2, 60_000))),
        ("delay-ms", i_(), fresh(), options(1, attempts(2, 60_001))),
        (
            "timeout",
            i_(),
            fresh(),
            options(1, lock::WaitPolicy::Timeout(600_000)),
        ),
        (
            "timeout",
            i_(),
            fresh(),
            options(1, lock::WaitPolicy::Timeout(600_001)),
        ),
    ];
    let mut verdicts = Vec::new();
    for (what, id, resource, options) in cases {
        verdicts.push((
            what,
            i.lock().acquire(&id, &resource, options).await.verdict(),
        ));
    }
    let expected = [
        ("id", ACCEPTED),
        ("id", "id"),
        ("id", "id"),
        ("resource", ACCEPTED),
        ("resource", "resource"),
        ("options.ttl-ms", ACCEPTED),
        ("options.ttl-ms", "options.ttl-ms"),
        ("options.ttl-ms", "options.ttl-ms"),
        ("max-attempts", ACCEPTED),
        ("max-attempts", "options.wait.attempts.max-attempts"),
        ("max-attempts", ACCEPTED),
        ("max-attempts", "options.wait.attempts.max-attempts"),
        ("delay-ms", ACCEPTED),
        ("delay-ms", "options.wait.attempts.delay-ms"),
        ("timeout", ACCEPTED),
        ("timeout", "options.wait.timeout"),
    ];
    let verdicts: Vec<(&str, &str)> = verdicts.iter().map(|(w, v)| (*w, v.as_str())).collect();
    assert_eq!(verdicts, expected);

    // A held lock's fields, through extend, release, is-held.
    let held = match i
        .lock()
        .acquire("i", "held", options(1000, no_wait))
        .await
        .unwrap()
        .unwrap()
    {
        lock::AcquireOutcome::Acquired(held) => held,
        busy => panic!("{busy:?}"),
    };
    assert_eq!(
        i.lock().extend(&held, Some(DAY_MS)).await.verdict(),
        ACCEPTED
    );
    assert_eq!(
        i.lock().extend(&held, Some(DAY_MS + 1)).await.verdict(),
        "ttl-ms"
    );
    assert_eq!(i.lock().extend(&held, Some(0)).await.verdict(), "ttl-ms");
    let with = |change: &dyn Fn(&mut lock::HeldLock)| {
        let mut forged = held.clone();
        change(&mut forged);
        forged
    };
    for (forged, field) in [
        (with(&|l| l.id = text(257)), "lock.id"),
        (with(&|l| l.resource = text(1025)), "lock.resource"),
        (with(&|l| l.owner = "A".repeat(32)), "lock.owner"),
        (with(&|l| l.owner.push('0')), "lock.owner"),
        (with(&|l| l.fence = 0), "lock.fence"),
        (with(&|l| l.ttl_ms = DAY_MS + 1), "lock.ttl-ms"),
    ] {
        assert_eq!(i.lock().is_held(&forged).await.verdict(), field);
        assert_eq!(i.lock().release(&forged).await.verdict(), field);
        assert_eq!(i.lock().extend(&forged, None).await.verdict(), field);
    }
    assert_eq!(i.lock().inspect(&text(256), "r").await.verdict(), ACCEPTED);
    assert_eq!(i.lock().inspect(&text(257), "r").await.verdict(), "id");
    assert_eq!(
        i.lock().force_release("i", &text(1024)).await.verdict(),
        ACCEPTED
    );
    assert_eq!(
        i.lock().force_release("i", &text(1025)).await.verdict(),
        "resource"
    );
}

fn space(id: String, ttl_ms: u64, max_value_bytes: u32) -> ephemeral::Space {
    ephemeral::Space {
        id,
        ttl_ms,
        max_value_bytes,
    }
}

#[tokio::test]
async fn ephemeral_limits_hold_at_their_edges() {
    let mut i = crate::common::instance_on(Arc::new(MemoryBackend::default())).await;
    let ok = space("s".into(), 1000, 16);
    let mut verdicts = Vec::new();
    for (s, tenant, key, value) in [
        (space(text(256), 1000, 16), text(1), text(1), vec![0u8; 1]),
        (space(text(257), 1000, 16), text(1), text(1), vec![0u8; 1]),
        (
            space("s".into(), DAY_MS, 16),
            text(1),
            text(1),
            vec![0u8; 1],
        ),
        (
            space("s".into(), DAY_MS + 1, 16),
            text(1),
            text(1),
            vec![0u8; 1],
        ),
        (space("s".into(), 0, 16), text(1), text(1), vec![0u8; 1]),
        (
            space("s".into(), 1000, 1 << 20),
            text(1),
            text(1),
            vec![0u8; 1 << 20],
        ),
        (
            space("s".into(), 1000, (1 << 20) + 1),
            text(1),
            text(1),
            vec![0u8; 1],
        ),
        (space("s".into(), 1000, 0), text(1), text(1), vec![]),
        (ok.clone(), text(1024), text(1), vec![0u8; 1]),
        (ok.clone(), text(1025), text(1), vec![0u8; 1]),
        (ok.clone(), String::new(), text(1), vec![0u8; 1]),
        (ok.clone(), text(1), text(1024), vec![0u8; 1]),
        (ok.clone(), text(1), text(1025), vec![0u8; 1]),
        (ok.clone(), text(1), String::new(), vec![0u8; 1]),
        (ok.clone(), text(1), text(1), vec![0u8; 16]),
        (ok.clone(), text(1), text(1), vec![0u8; 17]),
    ] {
        verdicts.push(
            i.ephemeral()
                .upsert(&s, &tenant, &key, &value)
                .await
                .verdict(),
        );
    }
    assert_eq!(
        verdicts,
        [
            ACCEPTED,
            "space.id",
            ACCEPTED,
            "space.ttl-ms",
            "space.ttl-ms",
            ACCEPTED,
            "space.max-value-bytes",
            "space.max-value-bytes",
            ACCEPTED,
            "tenant",
            "tenant",
            ACCEPTED,
            "key",
            "key",
            ACCEPTED,
            "value",
        ]
    );
    assert_eq!(
        i.ephemeral()
            .snapshot(&ok, "t", Some(&text(1024)))
            .await
            .verdict(),
        ACCEPTED
    );
    assert_eq!(
        i.ephemeral()
            .snapshot(&ok, "t", Some(&text(1025)))
            .await
            .verdict(),
        "prefix"
    );
    assert_eq!(
        i.ephemeral()
            .watch(&ok, "t", Some(&text(1025)), None)
            .await
            .verdict(),
        "prefix"
    );
    // A watcher's timeout: the longest is accepted (it returns at once with
    // the replayed entry), one more is refused.
    i.ephemeral()
        .upsert(&ok, "t", "k", b"v")
        .await
        .unwrap()
        .unwrap();
    let watcher = i
        .ephemeral()
        .watch(&ok, "t", None, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        i.ephemeral().next_event(&watcher, 600_001).await.verdict(),
        "timeout-ms"
    );
    assert_eq!(
        i.ephemeral().next_event(&watcher, 600_000).await.verdict(),
        ACCEPTED
    );
}

fn limiter(id: String, limit: u32, window_ms: u64) -> ratelimit::Limiter {
    ratelimit::Limiter {
        id,
        limit,
        window_ms,
        algorithm: None,
    }
}

#[tokio::test]
async fn rate_limit_limits_hold_at_their_edges() {
    let mut i = crate::common::instance_on(Arc::new(MemoryBackend::default())).await;
    let ok = limiter("l".into(), 10, 1000);
    let mut verdicts = Vec::new();
    for (l, key, cost) in [
        (limiter(text(256), 10, 1000), text(1), None),
        (limiter(text(257), 10, 1000), text(1), None),
        (limiter("l".into(), 10_000_000, 1000), text(1), None),
        (limiter("l".into(), 10_000_001, 1000), text(1), None),
        (limiter("l".into(), 0, 1000), text(1), None),
        (limiter("l".into(), 10, DAY_MS), text(1), None),
        (limiter("l".into(), 10, DAY_MS + 1), text(1), None),
        (limiter("l".into(), 10, 0), text(1), None),
        (ok.clone(), text(1024), None),
        (ok.clone(), text(1025), None),
        (ok.clone(), String::new(), None),
        (ok.clone(), "c".into(), Some(10)),
        (ok.clone(), "c".into(), Some(11)),
        (ok.clone(), "c".into(), Some(0)),
    ] {
        verdicts.push(i.ratelimit().check(&l, &key, cost).await.verdict());
    }
    assert_eq!(
        verdicts,
        [
            ACCEPTED,
            "limiter.id",
            ACCEPTED,
            "limiter.limit",
            "limiter.limit",
            ACCEPTED,
            "limiter.window-ms",
            "limiter.window-ms",
            ACCEPTED,
            "key",
            "key",
            ACCEPTED,
            "cost",
            "cost",
        ]
    );
    assert_eq!(i.ratelimit().peek(&ok, &text(1025)).await.verdict(), "key");
    assert_eq!(i.ratelimit().reset(&ok, &text(1025)).await.verdict(), "key");
}

#[tokio::test]
async fn lease_limits_hold_at_their_edges() {
    let mut i = crate::common::instance_on(Arc::new(MemoryBackend::default())).await;
    let mut verdicts = Vec::new();
    for (name, node, ttl) in [
        (text(256), "n".to_string(), 1000),
        (text(257), "n".into(), 1000),
        (String::new(), "n".into(), 1000),
        ("l1".into(), text(256), 1000),
        ("l2".into(), text(257), 1000),
        ("l3".into(), String::new(), 1000),
        ("l4".into(), "n".into(), DAY_MS),
        ("l5".into(), "n".into(), DAY_MS + 1),
        ("l6".into(), "n".into(), 0),
    ] {
        verdicts.push(i.lease().acquire(&name, &node, ttl).await.verdict());
    }
    assert_eq!(
        verdicts,
        [
            ACCEPTED, "name", "name", ACCEPTED, "node", "node", ACCEPTED, "ttl-ms", "ttl-ms"
        ]
    );
    let held = i.lease().acquire("held", "n", 1000).await.unwrap().unwrap();
    let with = |change: &dyn Fn(&mut lease::HeldLease)| {
        let mut forged = held.clone();
        change(&mut forged);
        forged
    };
    for (forged, field) in [
        (with(&|l| l.name = text(257)), "lease.name"),
        (with(&|l| l.node = text(257)), "lease.node"),
        (with(&|l| l.epoch = 0), "lease.epoch"),
        (with(&|l| l.ttl_ms = DAY_MS + 1), "lease.ttl-ms"),
    ] {
        assert_eq!(i.lease().renew(&forged).await.verdict(), field);
        assert_eq!(i.lease().check(&forged).await.verdict(), field);
        assert_eq!(i.lease().resign(&forged).await.verdict(), field);
    }
    assert_eq!(i.lease().observe(&text(257)).await.verdict(), "name");
}
