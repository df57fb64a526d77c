//! Unit tests of `with_lock`'s refresher and its presumed expiry.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_store_reading_places_store_times_no_later_than_they_came() {
    let sent = Instant::now();
    // The store read 5_000 at some host instant after `sent`.
    let reading = StoreClock { sent, now: 5_000 };
    let at = |ms: u64| reading.earliest(ms).unwrap();
    assert_eq!(at(5_000), sent);
    assert_eq!(at(6_500), sent + Duration::from_millis(1_500));
    // Whatever the store's clock reads against the host's: a reading of
    // 10^12 ms places the same differences the same way.
    let far = StoreClock {
        sent,
        now: 1_000_000_000_000,
    };
    assert_eq!(
        far.earliest(1_000_000_001_500).unwrap(),
        sent + Duration::from_millis(1_500)
    );

    // A later call that waited 2 s before the store read 7_000 says
    // less than the first (sent 10 ms after it, it places 7_000 at
    // sent + 10 ms; the first at sent + 2 s): the first is kept.
    let waited = StoreClock {
        sent: sent + Duration::from_millis(10),
        now: 7_000,
    };
    let kept = reading.tighter(waited);
    assert_eq!(kept.earliest(7_000).unwrap(), sent + Duration::from_secs(2));
    assert_eq!(
        waited.tighter(reading).earliest(7_000),
        kept.earliest(7_000)
    );
    // One sent 3 s later that read 5_100 says more: it is kept.
    let later = StoreClock {
        sent: sent + Duration::from_secs(3),
        now: 5_100,
    };
    assert_eq!(
        reading.tighter(later).earliest(5_100).unwrap(),
        sent + Duration::from_secs(3)
    );
}

#[tokio::test(start_paused = true)]
async fn the_presumed_expiry_stays_between_the_acquires_send_and_return_plus_the_ttl() {
    let sent = Instant::now();
    let returned = sent + Duration::from_secs(5);
    let lock = |expires_at| HeldLock {
        id: "i".into(),
        resource: "r".into(),
        owner: "o".into(),
        fence: 1,
        ttl_ms: 1_000,
        expires_at,
    };
    let reading = Some(StoreClock { sent, now: 50_000 });
    let ttl = Duration::from_secs(1);
    // Taken 4 s into a 5 s wait: expires at 55_000 on the store.
    assert_eq!(
        presumed_expiry(&lock(55_000), reading, sent, returned),
        sent + Duration::from_secs(5)
    );
    // A store clock that jumped back (a failover to a node behind):
    // never before one TTL after the acquire was sent.
    assert_eq!(
        presumed_expiry(&lock(40_000), reading, sent, returned),
        sent + ttl
    );
    // One that jumped ahead: never after one TTL after it returned.
    assert_eq!(
        presumed_expiry(&lock(90_000), reading, sent, returned),
        returned + ttl
    );
    // No reading at all: from the send, as before.
    assert_eq!(
        presumed_expiry(&lock(55_000), None, sent, returned),
        sent + ttl
    );
}
