//! A rate-limit reservation that settles itself: reserve an estimate, record
//! what the work really used, and the guard settles that when it is
//! dropped (or when told to).

use crate::ratelimit::{self, Decision, Limiter, Reservation, Settled};

/// Units reserved against a limit, settled with what was recorded when
/// the guard is dropped or [`ReservationGuard::settle`]d.
///
/// A guard dropped before any use was recorded settles nothing: the
/// reservation then counts in full when it expires, since the work may
/// have used it all (a panic, an early return).
#[derive(Debug)]
pub struct ReservationGuard {
    limiter: Limiter,
    reservation: Option<Reservation>,
    decision: Decision,
    used: Option<u32>,
}

impl ReservationGuard {
    /// Reserve `estimate` units of `limiter` for `key`, to settle within
    /// `ttl_ms`: the guard, or the decision when the limit refused it
    /// (nothing was counted).
    pub fn reserve(
        limiter: Limiter,
        key: &str,
        estimate: u32,
        ttl_ms: u64,
    ) -> Result<Result<ReservationGuard, Decision>, ratelimit::Error> {
        let reserved = ratelimit::reserve(&limiter, key, estimate, ttl_ms)?;
        let Some(reservation) = reserved.reservation else {
            return Ok(Err(reserved.decision));
        };
        Ok(Ok(ReservationGuard {
            limiter,
            reservation: Some(reservation),
            decision: reserved.decision,
            used: None,
        }))
    }

    /// The decision the reservation was counted with (its `remaining`).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Record `units` more of real use (saturating at the limit, the most a
    /// settle takes).
    pub fn record(&mut self, units: u32) {
        let total = self.used.unwrap_or(0).saturating_add(units);
        self.used = Some(total.min(self.limiter.limit));
    }

    /// Settle now with the use recorded (0 when none was): the difference
    /// from the estimate is given back or charged.
    pub fn settle(mut self) -> Result<Settled, ratelimit::Error> {
        let used = self.used.unwrap_or(0);
        self.settle_with(used)
    }

    /// Settle now with `actual` units, whatever was recorded.
    pub fn settle_at(mut self, actual: u32) -> Result<Settled, ratelimit::Error> {
        self.settle_with(actual)
    }

    fn settle_with(&mut self, actual: u32) -> Result<Settled, ratelimit::Error> {
        match self.reservation.take() {
            Some(reservation) => ratelimit::settle(&self.limiter, &reservation, actual),
            None => Ok(Settled::AlreadySettled),
        }
    }
}

impl Drop for ReservationGuard {
    fn drop(&mut self) {
        if let Some(used) = self.used {
            // A settle the store did not answer leaves the reservation to
            // count as reserved: never twice.
            let _ = self.settle_with(used);
        }
    }
}
