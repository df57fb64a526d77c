//! Hostile input through the real component: generated strings, bytes and
//! numbers for every exported function. The component must never trap, must
//! answer bad input with an error naming the field, and must leave the store
//! consistent (checked by using it normally afterwards).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use coord_host::backend::memory::MemoryBackend;
use coord_host::clock::ManualClock;
use coord_host::{Instance, Runtime, ephemeral, lock, ratelimit};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Names that stress the encodings: separators, hash tags, empty, huge.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z:{}/%]{1,12}",
        "\\PC{0,40}",
        (1000usize..1100).prop_map(|n| "k".repeat(n)),
        Just("x".repeat(1 << 20)),
    ]
}

/// Numbers around every limit, and the extremes.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        0..100_000u64,
        Just(86_400_000),
        Just(86_400_001),
        any::<u64>()
    ]
}

fn small(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Every generated case runs here; bad input must come back as a named error.
struct Target {
    rt: tokio::runtime::Runtime,
    instance: RefCell<Instance>,
    case: Cell<u64>,
}

impl Target {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let clock = Arc::new(ManualClock::new(1_750_000_000_000));
        let runtime = Runtime::new(Arc::new(MemoryBackend::new(clock))).unwrap();
        let instance = rt.block_on(runtime.instantiate()).unwrap();
        Target {
            rt,
            instance: RefCell::new(instance),
            case: Cell::new(0),
        }
    }

    /// A suffix that keeps generated lock resources apart, so no generated
    /// wait meets a lock held by an earlier case (the clock never moves).
    fn unique(&self) -> String {
        self.case.set(self.case.get() + 1);
        format!("#{}", self.case.get())
    }
}

fn named<T: std::fmt::Debug>(field: &str, outcome: Result<T, String>) -> Result<(), TestCaseError> {
    match outcome {
        Ok(_) => Ok(()),
        Err(f) if !f.is_empty() => Ok(()),
        Err(_) => Err(TestCaseError::fail(format!(
            "{field}: an error without a field name"
        ))),
    }
}

fn lock_field<T>(r: Result<T, lock::Error>) -> Result<T, String> {
    match r {
        Ok(v) => Ok(v),
        Err(lock::Error::InvalidArgument(a)) => Err(a.field),
        Err(other) => panic!("the in-memory store cannot fail: {other:?}"),
    }
}

fn eph_field<T>(r: Result<T, ephemeral::Error>) -> Result<T, String> {
    match r {
        Ok(v) => Ok(v),
        Err(ephemeral::Error::InvalidArgument(a)) => Err(a.field),
        Err(other) => panic!("the in-memory store cannot fail: {other:?}"),
    }
}

fn rl_field<T>(r: Result<T, ratelimit::Error>) -> Result<T, String> {
    match r {
        Ok(v) => Ok(v),
        Err(ratelimit::Error::InvalidArgument(a)) => Err(a.field),
        Err(other) => panic!("the in-memory store cannot fail: {other:?}"),
    }
}

#[test]
fn the_lock_never_traps_on_generated_input() {
    let target = Target::new();
    let wait = prop_oneof![
        Just(None),
        Just(Some(lock::WaitPolicy::NoWait)),
        (number(), number()).prop_map(|(a, d)| Some(lock::WaitPolicy::Attempts(lock::Retry {
            max_attempts: small(a),
            delay_ms: d
        }))),
        number().prop_map(|t| Some(lock::WaitPolicy::Timeout(t))),
    ];
    let forged = (
        name(),
        name(),
        "\\PC{0,40}|[0-9a-f]{32}",
        number(),
        number(),
        number(),
    );
    let strategy = (name(), name(), proptest::option::of(number()), wait, forged);
    TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    })
    .run(
        &strategy,
        |(id, resource, ttl_ms, wait, (fid, fres, owner, fence, fttl, fexp))| {
            let mut i = target.instance.borrow_mut();
            target.rt.block_on(async {
                let resource = format!("{resource}{}", target.unique());
                let options = lock::AcquireOptions { ttl_ms, wait };
                let acquired = lock_field(
                    i.lock()
                        .acquire(&id, &resource, options)
                        .await
                        .expect("no trap"),
                );
                if let Ok(lock::AcquireOutcome::Acquired(held)) = &acquired {
                    prop_assert!(held.fence > 0);
                    let released = i.lock().release(held).await.expect("no trap");
                    prop_assert_eq!(released, Ok(true), "a real lock releases");
                }
                named("acquire", acquired)?;
                let forged = lock::HeldLock {
                    id: fid,
                    resource: fres,
                    owner,
                    fence,
                    ttl_ms: fttl,
                    expires_at: fexp,
                };
                let released = lock_field(i.lock().release(&forged).await.expect("no trap"));
                prop_assert!(released != Ok(true), "a forged record released a lock");
                named("release", released)?;
                named(
                    "extend",
                    lock_field(i.lock().extend(&forged, ttl_ms).await.expect("no trap")),
                )?;
                named(
                    "inspect",
                    lock_field(i.lock().inspect(&id, &resource).await.expect("no trap")),
                )?;
                named(
                    "force-release",
                    lock_field(
                        i.lock()
                            .force_release(&id, &resource)
                            .await
                            .expect("no trap"),
                    ),
                )?;
                Ok(())
            })
        },
    )
    .unwrap();
    // The store is still consistent: ordinary use works.
    let mut i = target.instance.borrow_mut();
    target.rt.block_on(async {
        let options = lock::AcquireOptions {
            ttl_ms: Some(1000),
            wait: Some(lock::WaitPolicy::NoWait),
        };
        let lock::AcquireOutcome::Acquired(held) = i
            .lock()
            .acquire("after", "fuzz", options)
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("busy");
        };
        assert!(i.lock().release(&held).await.unwrap().unwrap());
    });
}

#[test]
fn ephemeral_state_never_traps_on_generated_input() {
    let target = Target::new();
    let space = (name(), number(), number()).prop_map(|(id, ttl_ms, max)| ephemeral::Space {
        id,
        ttl_ms,
        max_value_bytes: small(max),
    });
    let value = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (4000usize..5000).prop_map(|n| vec![7u8; n])
    ];
    let timeout = prop_oneof![Just(0u64), 600_001..u64::MAX];
    let strategy = (
        space,
        name(),
        name(),
        value,
        proptest::option::of(name()),
        proptest::option::of(number()),
        timeout,
    );
    TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    })
    .run(
        &strategy,
        |(space, tenant, key, value, prefix, after, timeout)| {
            let mut i = target.instance.borrow_mut();
            target.rt.block_on(async {
                let upserted = eph_field(
                    i.ephemeral()
                        .upsert(&space, &tenant, &key, &value)
                        .await
                        .expect("no trap"),
                );
                if upserted.is_ok() {
                    prop_assert!(
                        value.len() <= space.max_value_bytes as usize,
                        "an oversize value was stored"
                    );
                    let snapshot = eph_field(
                        i.ephemeral()
                            .snapshot(&space, &tenant, None)
                            .await
                            .expect("no trap"),
                    )
                    .unwrap();
                    prop_assert!(
                        snapshot
                            .entries
                            .iter()
                            .any(|e| e.key == key && e.value == value)
                    );
                }
                named("upsert", upserted)?;
                named(
                    "touch",
                    eph_field(
                        i.ephemeral()
                            .touch(&space, &tenant, &key)
                            .await
                            .expect("no trap"),
                    ),
                )?;
                named(
                    "snapshot",
                    eph_field(
                        i.ephemeral()
                            .snapshot(&space, &tenant, prefix.as_deref())
                            .await
                            .expect("no trap"),
                    ),
                )?;
                let watched = eph_field(
                    i.ephemeral()
                        .watch(&space, &tenant, prefix.as_deref(), after)
                        .await
                        .expect("no trap"),
                );
                if let Ok(w) = &watched {
                    let next =
                        eph_field(i.ephemeral().next_event(w, timeout).await.expect("no trap"));
                    named("next", next)?;
                }
                if let Ok(w) = watched {
                    i.ephemeral().close_watch(w).await.expect("no trap");
                }
                named(
                    "delete",
                    eph_field(
                        i.ephemeral()
                            .delete(&space, &tenant, &key)
                            .await
                            .expect("no trap"),
                    ),
                )?;
                Ok(())
            })
        },
    )
    .unwrap();
}

#[test]
fn the_rate_limiter_never_traps_on_generated_input() {
    let target = Target::new();
    let algorithm = prop_oneof![
        Just(None),
        Just(Some(ratelimit::Algorithm::SlidingWindow)),
        Just(Some(ratelimit::Algorithm::FixedWindow)),
        Just(Some(ratelimit::Algorithm::TokenBucket)),
    ];
    let limiter =
        (name(), number(), number(), algorithm).prop_map(|(id, limit, window_ms, algorithm)| {
            ratelimit::Limiter {
                id,
                limit: small(limit),
                window_ms,
                algorithm,
            }
        });
    let strategy = (limiter, name(), proptest::option::of(number()));
    TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    })
    .run(&strategy, |(limiter, key, cost)| {
        let mut i = target.instance.borrow_mut();
        target.rt.block_on(async {
            let cost = cost.map(small);
            let checked = rl_field(
                i.ratelimit()
                    .check(&limiter, &key, cost)
                    .await
                    .expect("no trap"),
            );
            if let Ok(d) = &checked {
                prop_assert!(d.remaining <= limiter.limit);
                prop_assert!(
                    cost.unwrap_or(1) <= limiter.limit,
                    "a cost above the limit was accepted"
                );
            }
            named("check", checked)?;
            named(
                "peek",
                rl_field(i.ratelimit().peek(&limiter, &key).await.expect("no trap")),
            )?;
            named(
                "reset",
                rl_field(i.ratelimit().reset(&limiter, &key).await.expect("no trap")),
            )?;
            Ok(())
        })
    })
    .unwrap();
}
