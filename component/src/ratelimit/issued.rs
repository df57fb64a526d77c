//! What the store remembers of a reservation it issued: the record that
//! `settle` and `cancel` decide from, so that a reservation handed back
//! with its cost, times or key edited, or with a made-up token, refunds
//! nothing it was not given.
//!
//! The record is an entry of the reservation partition of (limiter id,
//! key), keyed by the token; the partition names the key, so a reservation
//! moved to another key finds no record there. Its bytes, little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | format, [`FORMAT`] |
//! | 1 | 1 | state: 0 open, 1 settled |
//! | 2 | 1 | algorithm: 0 sliding window, 1 fixed window, 2 token bucket |
//! | 3 | 4 | the limiter's limit when reserved |
//! | 7 | 8 | the limiter's window in milliseconds |
//! | 15 | 4 | the units reserved |
//! | 19 | 8 | `reserved-at`, store time |
//! | 27 | 8 | `expires-at`, store time |

use crate::bindings::exports::coord::sync::ratelimit::{Algorithm, Limiter};

/// The record layout's version.
const FORMAT: u8 = 1;
/// The record's length in bytes.
const LEN: usize = 35;

/// A reservation as the store issued it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// Whether a settle or cancel has claimed it.
    pub settled: bool,
    /// The algorithm it was counted under.
    pub algorithm: Algorithm,
    /// The limiter's limit when it was counted.
    pub limit: u32,
    /// The limiter's window when it was counted.
    pub window_ms: u64,
    /// The units counted.
    pub cost: u32,
    /// The store time they were counted at.
    pub reserved_at: u64,
    /// The store time from which it can no longer be settled.
    pub expires_at: u64,
}

impl Issued {
    /// The limiter the units were counted under, with the caller's `id`.
    pub fn limiter(&self, id: &str) -> Limiter {
        Limiter {
            id: id.to_string(),
            limit: self.limit,
            window_ms: self.window_ms,
            algorithm: Some(self.algorithm),
        }
    }

    /// How long the record is kept from `reserved-at`: its TTL and as long
    /// again past `expires-at`, so that a repeated settle gets the first
    /// one's answer (`already-settled`, `expired`) for that long.
    pub fn kept_until(&self) -> u64 {
        let ttl = self.expires_at - self.reserved_at;
        self.expires_at.saturating_add(ttl)
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.push(FORMAT);
        out.push(u8::from(self.settled));
        out.push(match self.algorithm {
            Algorithm::SlidingWindow => 0,
            Algorithm::FixedWindow => 1,
            Algorithm::TokenBucket => 2,
        });
        out.extend_from_slice(&self.limit.to_le_bytes());
        out.extend_from_slice(&self.window_ms.to_le_bytes());
        out.extend_from_slice(&self.cost.to_le_bytes());
        out.extend_from_slice(&self.reserved_at.to_le_bytes());
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out
    }

    /// A record from its bytes; `None` for bytes no `reserve` wrote.
    pub fn decode(bytes: &[u8]) -> Option<Issued> {
        if bytes.len() != LEN || bytes[0] != FORMAT {
            return None;
        }
        let settled = match bytes[1] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let algorithm = match bytes[2] {
            0 => Algorithm::SlidingWindow,
            1 => Algorithm::FixedWindow,
            2 => Algorithm::TokenBucket,
            _ => return None,
        };
        let u32_at = |at: usize| bytes[at..at + 4].try_into().ok().map(u32::from_le_bytes);
        let u64_at = |at: usize| bytes[at..at + 8].try_into().ok().map(u64::from_le_bytes);
        let issued = Issued {
            settled,
            algorithm,
            limit: u32_at(3)?,
            window_ms: u64_at(7)?,
            cost: u32_at(15)?,
            reserved_at: u64_at(19)?,
            expires_at: u64_at(27)?,
        };
        (issued.expires_at >= issued.reserved_at).then_some(issued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_foreign_bytes_are_refused() {
        let issued = Issued {
            settled: false,
            algorithm: Algorithm::TokenBucket,
            limit: 10,
            window_ms: 60_000,
            cost: 6,
            reserved_at: 1_000,
            expires_at: 31_000,
        };
        let bytes = issued.encode();
        assert_eq!(bytes.len(), LEN);
        assert_eq!(Issued::decode(&bytes), Some(issued.clone()));
        let settled = Issued {
            settled: true,
            ..issued.clone()
        };
        assert_eq!(Issued::decode(&settled.encode()), Some(settled));
        assert_eq!(issued.kept_until(), 61_000);
        assert_eq!(Issued::decode(b""), None);
        assert_eq!(Issued::decode(&bytes[..LEN - 1]), None);
        for (at, byte) in [(0, 2), (1, 2), (2, 3)] {
            let mut bad = bytes.clone();
            bad[at] = byte;
            assert_eq!(Issued::decode(&bad), None, "byte {at} = {byte}");
        }
        let backwards = Issued {
            expires_at: 999,
            ..issued
        };
        assert_eq!(Issued::decode(&backwards.encode()), None);
    }
}
