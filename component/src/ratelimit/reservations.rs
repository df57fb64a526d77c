//! Reservations: reserve an estimated cost now, settle it with the real
//! cost once the work is done (`reserve`, `settle`, `cancel` of
//! `coord:sync/ratelimit`).
//!
//! A reservation is counted by the meter exactly as a check of its cost;
//! then the store keeps a record of what it issued ([`Issued`]: cost,
//! algorithm, window, times) under the reservation's token, in an unwatched
//! partition of the limiter's key ([`keys::reservation_partition`]). The
//! reservation handed to the caller is plain data that travels, and nothing
//! in it but its id, key and token is read back: settling reads the record,
//! claims it with a write conditioned on its revision (so two settles race
//! to one claim), then charges the difference (`meter-mode.charge`) or gives
//! it back where the meter still counts it (`meter-mode.refund` at the
//! record's time). A forged token, or a reservation moved to another key,
//! finds no record and changes nothing; an edited cost or time is ignored.

use super::issued::Issued;
use super::{Error, RateLimits, check_limiter};
use crate::bindings::exports::coord::sync::ratelimit::{
    Algorithm, Limiter, Reservation, Reserved, Settled,
};
use crate::keys;
use crate::lock::{hex, is_owner_token};
use crate::store::{Condition, Entropy, MeterMode, Outcome, Store, StoreError};
use crate::validate::{self, Invalid};

impl<S: Store> RateLimits<S> {
    /// `reserve` of `coord:sync/ratelimit`: `cost` counted as `check`
    /// counts it, then, when it was allowed, the record a settle decides
    /// from. Two store requests; when the second fails, the units stay
    /// counted (the error says `unavailable`) and nothing can refund them.
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
        if !decision.allowed {
            return Ok(Reserved {
                decision,
                reservation: None,
            });
        }
        let issued = Issued {
            settled: false,
            algorithm: limiter.algorithm.unwrap_or(Algorithm::SlidingWindow),
            limit: limiter.limit,
            window_ms: limiter.window_ms,
            cost,
            reserved_at: now,
            expires_at: now.saturating_add(ttl_ms),
        };
        let token = hex(&entropy.random_16());
        let recorded = self.store.put(
            &keys::reservation_partition(&limiter.id, key),
            &token,
            &issued.encode(),
            Some(issued.kept_until() - now),
            &Condition::Absent,
        )?;
        if let Outcome::Conflict(_) = recorded.outcome {
            // 128 random bits met an issued token: never in practice, and
            // never a reservation someone else could settle.
            return Err(StoreError::Unavailable(
                "a reservation token was drawn twice; the units stay counted".into(),
            )
            .into());
        }
        Ok(Reserved {
            decision,
            reservation: Some(Reservation {
                id: limiter.id.clone(),
                key: key.to_string(),
                token,
                cost,
                reserved_at: issued.reserved_at,
                expires_at: issued.expires_at,
            }),
        })
    }

    /// `settle` of `coord:sync/ratelimit`, decided from the store's record
    /// of the reservation alone.
    pub fn settle(
        &self,
        limiter: &Limiter,
        reservation: &Reservation,
        actual: u32,
    ) -> Result<Settled, Error> {
        check_reservation(limiter, reservation)?;
        validate::in_range("actual", u64::from(actual), 0, u64::from(limiter.limit))?;
        let partition = keys::reservation_partition(&reservation.id, &reservation.key);
        let read = self.store.get(&partition, &reservation.token)?;
        let Some((entry, issued)) = read
            .entry
            .and_then(|entry| Issued::decode(&entry.value).map(|issued| (entry, issued)))
        else {
            return Ok(Settled::Unknown);
        };
        if issued.settled {
            return Ok(Settled::AlreadySettled);
        }
        // The boundary is the store's clock at this read: from `expires-at`
        // on, it is expired, and stays so for every later call.
        if read.now >= issued.expires_at {
            return Ok(Settled::Expired);
        }
        let claimed = Issued {
            settled: true,
            ..issued.clone()
        };
        let claim = self.store.put(
            &partition,
            &reservation.token,
            &claimed.encode(),
            Some(issued.kept_until().saturating_sub(read.now).max(1)),
            &Condition::Revision(entry.revision),
        )?;
        if let Outcome::Conflict(now) = claim.outcome {
            // Only a settle rewrites a record: another one claimed it first.
            return Ok(match now {
                Some(_) => Settled::AlreadySettled,
                None => Settled::Unknown,
            });
        }
        let counted_under = issued.limiter(&reservation.id);
        let key = &reservation.key;
        if actual > issued.cost {
            let charge = actual - issued.cost;
            self.meter(&counted_under, key, charge, MeterMode::Charge)?;
        } else if actual < issued.cost {
            let refund = MeterMode::Refund(issued.reserved_at);
            self.meter(&counted_under, key, issued.cost - actual, refund)?;
        }
        Ok(Settled::Settled)
    }

    /// `cancel` of `coord:sync/ratelimit`: settle for nothing.
    pub fn cancel(&self, limiter: &Limiter, reservation: &Reservation) -> Result<Settled, Error> {
        self.settle(limiter, reservation, 0)
    }
}

/// A reservation's id, key and token must be ones `reserve` could have
/// given for this limiter; anything else is rejected by name before the
/// store is asked. Its other fields are the caller's copy, never read.
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
    Ok(())
}
