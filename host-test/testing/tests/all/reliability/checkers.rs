//! The checkers checked: the history checker and its models reject what no
//! order explains, and the watchdog fires on no progress, not on slowness.

use super::histories::{
    EphIn, EphOut, EphemeralModel, ExpIn, ExpOut, ExpiringLockModel, LimitModel, LockIn, LockModel,
    LockOut,
};

use crate::common::{self, history};

use super::HISTORY;

#[test]
fn the_history_checker_rejects_what_no_order_explains() {
    use history::Op;
    // Two acquisitions that overlap in time both "acquired": no order works.
    let both = vec![
        Op {
            invoked: 0,
            returned: 3,
            input: LockIn::Acquire,
            output: LockOut::Acquired(5),
        },
        Op {
            invoked: 1,
            returned: 2,
            input: LockIn::Acquire,
            output: LockOut::Acquired(6),
        },
    ];
    assert!(!history::linearizable(&LockModel, &both));
    // A fence that goes backwards after a release.
    let backwards = vec![
        Op {
            invoked: 0,
            returned: 1,
            input: LockIn::Acquire,
            output: LockOut::Acquired(5),
        },
        Op {
            invoked: 2,
            returned: 3,
            input: LockIn::Release(5),
            output: LockOut::Released(true),
        },
        Op {
            invoked: 4,
            returned: 5,
            input: LockIn::Acquire,
            output: LockOut::Acquired(4),
        },
    ];
    assert!(!history::linearizable(&LockModel, &backwards));
    // Allowed past the limit.
    let over = vec![
        Op {
            invoked: 0,
            returned: 1,
            input: 2,
            output: true,
        },
        Op {
            invoked: 0,
            returned: 1,
            input: 2,
            output: true,
        },
    ];
    assert!(!history::linearizable(&LimitModel(3), &over));
    // And a concurrent pair that only one order explains is accepted.
    let racing = vec![
        Op {
            invoked: 0,
            returned: 3,
            input: LockIn::Acquire,
            output: LockOut::Busy(7),
        },
        Op {
            invoked: 1,
            returned: 2,
            input: LockIn::Acquire,
            output: LockOut::Acquired(7),
        },
    ];
    assert!(history::linearizable(&LockModel, &racing));
}

#[test]
fn the_expiry_and_ephemeral_models_reject_what_no_order_explains() {
    use history::Op;
    fn op<I, O>(invoked: u64, returned: u64, input: I, output: O) -> Op<I, O> {
        Op {
            invoked,
            returned,
            input,
            output,
        }
    }
    let acquire = |ttl| ExpIn::Acquire { ttl };
    let acquired = |fence, expires_at| ExpOut::Acquired { fence, expires_at };
    let busy = |fence, remaining| ExpOut::Busy { fence, remaining };
    // Acquired at 100 for 50 ms; another acquire at 120 (before the expiry
    // at 150) cannot have succeeded ...
    let early = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(50), acquired(2, 170)),
    ];
    assert!(!history::linearizable(&ExpiringLockModel, &early));
    // ... but at 150 it can,
    let on_time = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(50), acquired(2, 200)),
    ];
    assert!(history::linearizable(&ExpiringLockModel, &on_time));
    // and the store's time cannot run backwards between two busy replies.
    let backwards = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(9), busy(1, 10)),
        op(4, 5, acquire(9), busy(1, 30)),
    ];
    assert!(!history::linearizable(&ExpiringLockModel, &backwards));

    // An acknowledged upsert missing from a later snapshot is rejected, and
    // so is a revision that goes back.
    let upsert = |key: &str, value: &str| EphIn::Upsert(key.into(), value.into());
    let lost = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, EphIn::Snapshot, EphOut::Snapshot(vec![], 5)),
    ];
    assert!(!history::linearizable(&EphemeralModel, &lost));
    let regressed = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, upsert("b", "1"), EphOut::Written(4)),
    ];
    assert!(!history::linearizable(&EphemeralModel, &regressed));
    let kept = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, EphIn::Delete("a".into()), EphOut::Found(true)),
        op(4, 5, EphIn::Touch("a".into()), EphOut::Found(false)),
        op(6, 7, EphIn::Snapshot, EphOut::Snapshot(vec![], 6)),
    ];
    assert!(history::linearizable(&EphemeralModel, &kept));
}

/// The hang detector of every suite here ([`common::watchdog`]) fires once
/// nothing has completed for its quiet period: three steps 50 s apart,
/// then none, fail 60 s (to 60 + 7.5 s) after the last step. Tokio's
/// paused clock: no real time passes.
#[tokio::test(start_paused = true)]
async fn the_watchdog_fires_when_no_step_completes_for_its_quiet_period() {
    use std::time::Duration;
    let progress = common::Progress::new();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(async move {
        let steps = progress.clone();
        common::watchdog(&progress, Duration::from_secs(60), async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(50)).await;
                steps.bump();
            }
            std::future::pending::<()>().await // stuck
        })
        .await
    });
    let error = run.await.expect_err("the watchdog fired");
    let fired = started.elapsed();
    let message = *error.into_panic().downcast::<String>().unwrap();
    assert!(
        message.contains("no progress for 60s (3 steps completed before)"),
        "{message}"
    );
    assert!(
        fired >= Duration::from_secs(210) && fired <= Duration::from_millis(217_500),
        "fired {fired:?} after the start, the last step at 150 s"
    );
}

/// ... and never fires on work that is slow but keeps completing steps:
/// 100 steps 55 s apart, 92 minutes in all against a quiet period of 60 s
/// (the Redis fenced-writes run failed a 30 s wall-clock bound this way,
/// on a loaded machine).
#[tokio::test(start_paused = true)]
async fn the_watchdog_lets_slow_work_that_keeps_progressing_finish() {
    use std::time::Duration;
    let progress = common::Progress::new();
    let started = tokio::time::Instant::now();
    let steps = common::watchdog(&progress, Duration::from_secs(60), async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(55)).await;
            progress.bump();
        }
        progress.count()
    })
    .await;
    assert_eq!(steps, 100);
    assert!(started.elapsed() >= Duration::from_secs(5_500));
}

/// What counts as a step: a harness's store call that succeeds, but not a
/// `wait` that timed out (a waiter nobody wakes is no progress).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_counts_completed_store_calls_but_not_a_wait_that_timed_out() {
    let h = common::memory(HISTORY);
    let progress = h.progress();
    let always = coord_host::backend::Condition::Always;
    h.backend.put("p", "k", b"v", None, &always).await.unwrap();
    let revision = h.backend.list("p", "").await.unwrap().revision;
    assert_eq!(progress.count(), 2);
    let store = h.backend.clone();
    let waiting = tokio::spawn(async move { store.wait("p", revision, 1_000).await });
    common::bounded(h.until_waiting("p", 1)).await;
    h.advance(1_000);
    assert_eq!(waiting.await.unwrap().unwrap(), revision, "timed out");
    assert_eq!(progress.count(), 2, "a wait that timed out is no step");
    assert!(h.backend.wait("p", 0, 1_000).await.unwrap() > 0);
    assert_eq!(progress.count(), 3, "a wait that saw a change is one");
}
