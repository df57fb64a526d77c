//! Reservations: reserve an estimated cost now, settle it with the real
//! cost once the work is done (`reserve`, `settle`, `cancel` of
//! `coord:sync/ratelimit`).
//!
//! A reservation is counted by the meter exactly as a check of its cost,
//! in one store request; the reservation itself is plain data the caller
//! keeps. Settling marks it settled first, with a create-if-absent of its
//! token in an unwatched partition of its own ([`keys::reservation_partition`]),
//! so that a second settle finds the mark and changes nothing; then it
//! charges the difference (`meter-mode.charge`) or gives it back where the
//! meter still counts it (`meter-mode.refund` at the reservation's time).
//! The mark lives as long as the reservation could be settled.

use super::{Error, RateLimits, check_limiter};
use crate::bindings::exports::coord::sync::ratelimit::{Limiter, Reservation, Reserved, Settled};
use crate::keys;
use crate::lock::{hex, is_owner_token};
use crate::store::{Condition, Entropy, MeterMode, Outcome, Store};
use crate::validate::{self, Invalid};

impl<S: Store> RateLimits<S> {
    /// `reserve` of `coord:sync/ratelimit`: `cost` counted as `check`
    /// counts it, and a reservation to settle when it was allowed.
    pub fn reserve(
        &self,
        limiter: &Limiter,
        key: &str,
        cost: u32,
        ttl_ms: u64,
        entropy: &impl Entropy,
    ) -> Result<Reserved, Error> {
        check_limiter(limiter, key)?;
        validate::in_range("cost", u64::from(cost), 1, u64::from(limiter.limit))?;
        validate::ttl("ttl-ms", ttl_ms)?;
        let (decision, now) = self.meter_at(limiter, key, cost, MeterMode::Consume)?;
        let reservation = decision.allowed.then(|| Reservation {
            id: limiter.id.clone(),
            key: key.to_string(),
            token: hex(&entropy.random_16()),
            cost,
            reserved_at: now,
            expires_at: now.saturating_add(ttl_ms),
        });
        Ok(Reserved {
            decision,
            reservation,
        })
    }

    /// `settle` of `coord:sync/ratelimit`.
    pub fn settle(
        &self,
        limiter: &Limiter,
        reservation: &Reservation,
        actual: u32,
    ) -> Result<Settled, Error> {
        check_reservation(limiter, reservation)?;
        validate::in_range("actual", u64::from(actual), 0, u64::from(limiter.limit))?;
        let mark = self.store.put(
            &keys::reservation_partition(&reservation.id, &reservation.key),
            &reservation.token,
            b"",
            Some(reservation.expires_at - reservation.reserved_at),
            &Condition::Absent,
        )?;
        match mark.outcome {
            Outcome::Conflict(_) => return Ok(Settled::AlreadySettled),
            Outcome::Applied(_) if mark.now >= reservation.expires_at => {
                return Ok(Settled::Expired);
            }
            Outcome::Applied(_) => {}
        }
        let key = &reservation.key;
        if actual > reservation.cost {
            self.meter(limiter, key, actual - reservation.cost, MeterMode::Charge)?;
        } else if actual < reservation.cost {
            let refund = MeterMode::Refund(reservation.reserved_at);
            self.meter(limiter, key, reservation.cost - actual, refund)?;
        }
        Ok(Settled::Settled)
    }

    /// `cancel` of `coord:sync/ratelimit`: settle for nothing.
    pub fn cancel(&self, limiter: &Limiter, reservation: &Reservation) -> Result<Settled, Error> {
        self.settle(limiter, reservation, 0)
    }
}

/// A reservation must be one `reserve` could have given for this limiter;
/// anything else is rejected by name before the store is asked.
fn check_reservation(limiter: &Limiter, reservation: &Reservation) -> Result<(), Invalid> {
    check_limiter(limiter, &reservation.key).map_err(|e| match e.field.as_str() {
        "key" => Invalid::new("reservation.key", e.reason),
        _ => e,
    })?;
    if reservation.id != limiter.id {
        return Err(Invalid::new("reservation.id", "is not this limiter's id"));
    }
    if !is_owner_token(reservation.token.as_bytes()) {
        return Err(Invalid::new(
            "reservation.token",
            "must be 32 lowercase hex digits",
        ));
    }
    validate::in_range(
        "reservation.cost",
        u64::from(reservation.cost),
        1,
        u64::from(limiter.limit),
    )?;
    let ttl = reservation.expires_at.checked_sub(reservation.reserved_at);
    match ttl {
        Some(ttl) => validate::ttl("reservation.expires-at", ttl),
        None => Err(Invalid::new(
            "reservation.expires-at",
            "is before reserved-at",
        )),
    }
}
