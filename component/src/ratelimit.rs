//! The rate limiter: `coord:sync/ratelimit`.
//!
//! Each (limiter id, key) is one store partition holding one meter; a check
//! is one `meter` request, which the store decides atomically on its own
//! clock (the algorithms are in [`crate::meter`]), so every instance on
//! every host shares the limit. Reservations (reserve, then settle to the
//! real cost) are in the `reservations` module beside this one.

use crate::bindings::exports::coord::sync::ratelimit::{
    Algorithm, Decision, Error, InvalidArgument, Limiter,
};
use crate::keys;
use crate::meter::MAX_LIMIT;
use crate::store::{MeterAlgorithm, MeterMode, MeterReply, MeterRequest, Store};
use crate::validate::{self, Invalid, MAX_ID_BYTES, MAX_NAME_BYTES};

/// The key of the meter inside a rate-limit partition.
const METER_KEY: &str = "meter";

validate::interface_errors!(Error, InvalidArgument);

/// The rate-limit operations over a store.
pub struct RateLimits<S> {
    store: S,
}

impl<S: Store> RateLimits<S> {
    /// Rate limits on `store`.
    pub fn new(store: S) -> Self {
        RateLimits { store }
    }

    /// `check` of `coord:sync/ratelimit`.
    pub fn check(
        &self,
        limiter: &Limiter,
        key: &str,
        cost: Option<u32>,
    ) -> Result<Decision, Error> {
        let cost = cost.unwrap_or(1);
        check_limiter(limiter, key)?;
        validate::in_range("cost", u64::from(cost), 1, u64::from(limiter.limit))?;
        self.meter(limiter, key, cost, MeterMode::Consume)
    }

    /// `peek` of `coord:sync/ratelimit`.
    pub fn peek(&self, limiter: &Limiter, key: &str) -> Result<Decision, Error> {
        check_limiter(limiter, key)?;
        self.meter(limiter, key, 1, MeterMode::Peek)
    }

    /// `reset` of `coord:sync/ratelimit`.
    pub fn reset(&self, limiter: &Limiter, key: &str) -> Result<(), Error> {
        check_limiter(limiter, key)?;
        self.meter(limiter, key, 1, MeterMode::Reset).map(|_| ())
    }

    fn meter(
        &self,
        limiter: &Limiter,
        key: &str,
        cost: u32,
        mode: MeterMode,
    ) -> Result<Decision, Error> {
        self.meter_at(limiter, key, cost, mode)
            .map(|(decision, _)| decision)
    }

    /// One `meter` request for (`limiter`, `key`): the decision, and the
    /// store's clock when it was made.
    fn meter_at(
        &self,
        limiter: &Limiter,
        key: &str,
        cost: u32,
        mode: MeterMode,
    ) -> Result<(Decision, u64), Error> {
        let algorithm = match limiter.algorithm.unwrap_or(Algorithm::SlidingWindow) {
            Algorithm::SlidingWindow => MeterAlgorithm::SlidingWindow,
            Algorithm::FixedWindow => MeterAlgorithm::FixedWindow,
            Algorithm::TokenBucket => MeterAlgorithm::Gcra,
        };
        let request = MeterRequest {
            algorithm,
            limit: limiter.limit,
            window_ms: limiter.window_ms,
            cost,
            mode,
        };
        let partition = keys::ratelimit_partition(&limiter.id, key);
        let MeterReply {
            allowed,
            remaining,
            reset_in_ms,
            retry_after_ms,
            now,
        } = self.store.meter(&partition, METER_KEY, &request)?;
        let decision = Decision {
            allowed,
            limit: limiter.limit,
            remaining,
            reset_in_ms,
            retry_after_ms,
        };
        Ok((decision, now))
    }
}

fn check_limiter(limiter: &Limiter, key: &str) -> Result<(), Invalid> {
    validate::name("limiter.id", &limiter.id, MAX_ID_BYTES)?;
    validate::in_range(
        "limiter.limit",
        u64::from(limiter.limit),
        1,
        u64::from(MAX_LIMIT),
    )?;
    validate::ttl("limiter.window-ms", limiter.window_ms)?;
    validate::name("key", key, MAX_NAME_BYTES)
}

mod issued;
mod reservations;
#[cfg(test)]
mod tests;
