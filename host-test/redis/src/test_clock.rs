//! The test clock's one concession on the Redis backend: with a
//! [`coord_host::clock::ManualClock`], script calls take turns, so the store's
//! time as the tests move it never goes back between two calls. Without a
//! test clock, [`RedisBackend::turn`] holds nothing and costs a branch.

use super::RedisBackend;

impl RedisBackend {
    /// With a test clock, one script call at a time, from reading the clock
    /// to the reply: the clock is read when a call is built, so calls in
    /// flight together could reach Redis out of clock order and show the
    /// store's time going back — which Redis's `TIME`, read inside the
    /// script, never does. Without a test clock, nothing is held.
    pub(super) async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.config.test_clock {
            Some(_) => Some(self.test_turn.lock().await),
            None => None,
        }
    }
}
