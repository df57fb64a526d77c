//! The rate-limit algorithms a store runs for `meter`, as pure functions of
//! (state, request, now).
//!
//! The in-memory store calls [`decide`] directly; the Redis backend runs the
//! same arithmetic in Lua (`host-test/redis/meter.lua`), and the store
//! conformance suite holds both to the same answers. All arithmetic is in
//! integers below 2^53, so Lua's doubles compute exactly what this does:
//! the limit is at most [`MAX_LIMIT`] and the window at most one day.

use crate::store::{MeterAlgorithm, MeterMode, MeterReply, MeterRequest};

/// The largest limit a meter accepts: limit × window-ms stays below 2^53.
pub const MAX_LIMIT: u32 = 10_000_000;

/// A meter's stored state; what each field means depends on the algorithm:
///
/// - sliding window: `a` = current window's start, `b` = its count, `c` = the previous window's count;
/// - fixed window: `a` = the window's start, `b` = its count;
/// - GCRA: the theoretical arrival time `a` + `b` / limit milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MeterState {
    /// See the type's documentation.
    pub a: u64,
    /// See the type's documentation.
    pub b: u64,
    /// See the type's documentation.
    pub c: u64,
}

/// What to do with the stored state after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Leave it as it is.
    Keep,
    /// Store this state, to expire after `ttl_ms`.
    Put(MeterState, u64),
    /// Remove it.
    Delete,
}

/// Decide `request` at store time `now` on `state` (`None`: never used, or
/// expired). Returns the reply and what to write back.
pub fn decide(state: Option<MeterState>, request: &MeterRequest, now: u64) -> (MeterReply, Write) {
    if let MeterMode::Refund(at) = request.mode {
        return refund(state, request, at, now);
    }
    let (state, reset) = match request.mode {
        MeterMode::Reset => (None, true),
        _ => (state, false),
    };
    // A charge counts as a consume does, and counts even what does not fit.
    let force = request.mode == MeterMode::Charge;
    let consume = request.mode == MeterMode::Consume || force;
    let (l, w, n) = (
        u64::from(request.limit),
        request.window_ms,
        u64::from(request.cost),
    );
    let (decision, next) = match request.algorithm {
        MeterAlgorithm::SlidingWindow => sliding(state, l, w, n, now),
        MeterAlgorithm::FixedWindow => fixed(state, l, w, n, now),
        MeterAlgorithm::Gcra => gcra(state, l, w, n, now),
    };
    let write = match (reset, consume && (decision.allowed || force)) {
        (true, _) => Write::Delete,
        (false, true) => Write::Put(next.0, next.1.max(1)),
        (false, false) => Write::Keep,
    };
    let mut reply = decision;
    if force && !decision.allowed {
        // Counted past the limit: nothing remains, and the meter is full
        // again once the charged state has gone (GCRA: its TTL).
        reply.allowed = true;
        reply.remaining = 0;
        reply.retry_after_ms = 0;
        if request.algorithm == MeterAlgorithm::Gcra {
            reply.reset_in_ms = next.1;
        }
    }
    if !consume && decision.allowed {
        // A peek reports what is left before this request, not after.
        reply.remaining = next.2;
    }
    reply.now = now;
    (reply, write)
}

/// Give back `request.cost` units counted at store time `at`, where the
/// state still counts them (`meter-mode.refund` in `wit/store.wit`), and
/// answer as a peek of the same cost would after it.
///
/// - fixed window: only while `at`'s window is the current one;
/// - sliding window: from the current or the previous window's count,
///   whichever `at` fell in (the previous one's weight keeps decaying);
/// - GCRA: the theoretical arrival time moves back by `cost` emission
///   intervals, never before now (whatever `at`: the bucket refills the
///   same way wherever the units were taken).
fn refund(
    state: Option<MeterState>,
    request: &MeterRequest,
    at: u64,
    now: u64,
) -> (MeterReply, Write) {
    let (l, w, n) = (
        u64::from(request.limit),
        request.window_ms,
        u64::from(request.cost),
    );
    let start = now - now % w;
    let at_start = at - at % w;
    let refunded = state.and_then(|s| match request.algorithm {
        MeterAlgorithm::FixedWindow => (s.a == start && at_start == start).then(|| {
            let state = MeterState {
                a: start,
                b: s.b.saturating_sub(n),
                c: 0,
            };
            (state, start + w - now)
        }),
        MeterAlgorithm::SlidingWindow => {
            // The state rolled forward to now's window, as a consume would.
            let (curr, prev) = if s.a == start {
                (s.b, s.c)
            } else if start == s.a + w {
                (0, s.b)
            } else {
                (0, 0)
            };
            let (curr, prev) = if at_start == start {
                (curr.saturating_sub(n), prev)
            } else if at_start + w == start {
                (curr, prev.saturating_sub(n))
            } else {
                (curr, prev)
            };
            let state = MeterState {
                a: start,
                b: curr,
                c: prev,
            };
            Some((state, start + 2 * w - now))
        }
        MeterAlgorithm::Gcra => (s.a >= now).then(|| {
            let used = ((s.a - now) * l + s.b).saturating_sub(n * w);
            let state = MeterState {
                a: now + used / l,
                b: used % l,
                c: 0,
            };
            (state, used.div_ceil(l))
        }),
    });
    let after = refunded.map_or(state, |(s, _)| Some(s));
    let peek = MeterRequest {
        mode: MeterMode::Peek,
        ..*request
    };
    let (reply, _) = decide(after, &peek, now);
    let write = refunded.map_or(Write::Keep, |(s, ttl)| Write::Put(s, ttl.max(1)));
    (reply, write)
}

/// The decision, the state after counting (with its TTL) and the remaining
/// capacity before counting.
type Step = (MeterReply, (MeterState, u64, u32));

fn reply(allowed: bool, remaining: u64, reset_in_ms: u64, retry_after_ms: u64) -> MeterReply {
    MeterReply {
        allowed,
        remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        reset_in_ms,
        retry_after_ms,
        now: 0,
    }
}

fn sliding(state: Option<MeterState>, l: u64, w: u64, n: u64, now: u64) -> Step {
    let window_start = now - now % w;
    let (mut start, mut curr, mut prev) = state.map_or((window_start, 0, 0), |s| (s.a, s.b, s.c));
    if start != window_start {
        prev = if window_start == start + w { curr } else { 0 };
        curr = 0;
        start = window_start;
    }
    // The estimate, scaled by w: the previous window weighted by its overlap.
    let estimate = prev * (w - (now - start)) + curr * w;
    let allowed = estimate + n * w <= l * w;
    let before = (l * w).saturating_sub(estimate) / w;
    let after = if allowed {
        (l * w - estimate - n * w) / w
    } else {
        before
    };
    let reset_in = start + w - now;
    let retry_after = if allowed {
        0
    } else {
        // Within this window, the previous window's weight decays...
        let room = (l as i128) - (n as i128) - (curr as i128);
        let in_window = (room >= 0 && prev > 0).then(|| start + w - (room as u64 * w / prev));
        match in_window {
            Some(t) if t < start + w => t.saturating_sub(now),
            // ...else the next window, where this window's count decays.
            _ => {
                let d = ((l - n) * w)
                    .checked_div(curr)
                    .map_or(0, |x| w.saturating_sub(x));
                start + w + d - now
            }
        }
    };
    let counted = MeterState {
        a: start,
        b: curr + n,
        c: prev,
    };
    let ttl = start + 2 * w - now;
    (
        reply(allowed, after, reset_in, retry_after),
        (counted, ttl, before as u32),
    )
}

fn fixed(state: Option<MeterState>, l: u64, w: u64, n: u64, now: u64) -> Step {
    let start = now - now % w;
    let count = state.filter(|s| s.a == start).map_or(0, |s| s.b);
    let allowed = count + n <= l;
    let before = l.saturating_sub(count);
    let after = if allowed { l - count - n } else { before };
    let reset_in = start + w - now;
    let retry_after = if allowed { 0 } else { reset_in };
    let counted = MeterState {
        a: start,
        b: count + n,
        c: 0,
    };
    (
        reply(allowed, after, reset_in, retry_after),
        (counted, reset_in, before as u32),
    )
}

fn gcra(state: Option<MeterState>, l: u64, w: u64, n: u64, now: u64) -> Step {
    // The theoretical arrival time as whole ms plus a fraction in 1/l ms.
    let (mut tat, mut frac) = state.map_or((0, 0), |s| (s.a, s.b));
    if tat < now {
        (tat, frac) = (now, 0);
    }
    let used = (tat - now) * l + frac; // scaled by l; each request unit costs w
    let increment = n * w;
    let (mut next_tat, mut next_frac) = (tat + increment / l, frac + increment % l);
    if next_frac >= l {
        next_tat += 1;
        next_frac -= l;
    }
    let used_after = (next_tat - now) * l + next_frac;
    let capacity = w * l;
    let allowed = used_after <= capacity;
    let before = capacity.saturating_sub(used) / w;
    let (after, occupied) = if allowed {
        ((capacity - used_after) / w, used_after)
    } else {
        (before, used)
    };
    let reset_in = occupied.div_ceil(l);
    let retry_after = if allowed {
        0
    } else {
        (used_after - capacity).div_ceil(l)
    };
    let counted = MeterState {
        a: next_tat,
        b: next_frac,
        c: 0,
    };
    (
        reply(allowed, after, reset_in, retry_after),
        (counted, used_after.div_ceil(l), before as u32),
    )
}

#[cfg(test)]
mod accuracy;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod refunds;
#[cfg(test)]
mod tests;
