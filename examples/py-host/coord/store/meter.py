"""The rate-limit meter's three algorithms as a pure function.

The same integer arithmetic as component/src/meter.rs and
host-test/redis/meter.lua (the Redis backend runs that script), so the
memory store answers exactly what Redis answers. State is ``(a, b, c)``:

- sliding window: current window's start, its count, the previous window's count;
- fixed window: the window's start, its count;
- GCRA: the theoretical arrival time ``a`` + ``b``/limit milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from .types import MeterReply, MeterRequest

State = Tuple[int, int, int]


class Decision(NamedTuple):
    """One algorithm's answer before the mode is applied."""

    allowed: bool
    after: int  # remaining after counting (or `before` when not allowed)
    before: int  # remaining before counting
    reset_in: int
    retry: int
    counted: State  # the state with this request counted
    ttl: int  # how long the counted state must live


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _sliding(state: Optional[State], l: int, w: int, n: int, now: int) -> Decision:
    window_start = now - now % w
    start, curr, prev = state if state else (window_start, 0, 0)
    if start != window_start:
        prev = curr if window_start == start + w else 0
        curr, start = 0, window_start
    # The estimate scaled by w: the previous window weighted by its overlap.
    estimate = prev * (w - (now - start)) + curr * w
    allowed = estimate + n * w <= l * w
    before = max(l * w - estimate, 0) // w
    after = (l * w - estimate - n * w) // w if allowed else before
    retry = 0
    if not allowed:
        room = l - n - curr
        t = start + w - (room * w) // prev if room >= 0 and prev > 0 else None
        if t is not None and t < start + w:
            # Within this window, as the previous window's weight decays.
            retry = max(t - now, 0)
        else:
            # In the next window, as this window's count decays.
            d = max(w - ((l - n) * w) // curr, 0) if curr > 0 else 0
            retry = start + w + d - now
    return Decision(allowed, after, before, start + w - now, retry,
                    (start, curr + n, prev), start + 2 * w - now)


def _fixed(state: Optional[State], l: int, w: int, n: int, now: int) -> Decision:
    start = now - now % w
    count = state[1] if state and state[0] == start else 0
    allowed = count + n <= l
    before = max(l - count, 0)
    after = l - count - n if allowed else before
    reset_in = start + w - now
    return Decision(allowed, after, before, reset_in, 0 if allowed else reset_in,
                    (start, count + n, 0), reset_in)


def _gcra(state: Optional[State], l: int, w: int, n: int, now: int) -> Decision:
    tat, frac = (state[0], state[1]) if state else (0, 0)
    if tat < now:
        tat, frac = now, 0
    used = (tat - now) * l + frac  # scaled by l; each unit costs w
    increment = n * w
    next_tat, next_frac = tat + increment // l, frac + increment % l
    if next_frac >= l:
        next_tat, next_frac = next_tat + 1, next_frac - l
    used_after = (next_tat - now) * l + next_frac
    capacity = w * l
    allowed = used_after <= capacity
    before = max(capacity - used, 0) // w
    after, occupied = ((capacity - used_after) // w, used_after) if allowed else (before, used)
    retry = 0 if allowed else _ceil_div(used_after - capacity, l)
    return Decision(allowed, after, before, _ceil_div(occupied, l), retry,
                    (next_tat, next_frac, 0), _ceil_div(used_after, l))


_ALGORITHMS = {"sliding-window": _sliding, "fixed-window": _fixed, "gcra": _gcra}


def decide(state: Optional[State], request: MeterRequest, now: int
           ) -> Tuple[MeterReply, Optional[Tuple[State, int]], bool]:
    """Decide ``request`` at store time ``now`` on ``state`` (``None``: unused or expired).

    Returns the reply, the state to store with its TTL (``None``: keep what
    is stored) and whether to forget the stored state (``reset``).
    """
    if request.mode == "refund":
        return _refund(state, request, now)
    reset = request.mode == "reset"
    d = _ALGORITHMS[request.algorithm](None if reset else state, request.limit,
                                       request.window_ms, request.cost, now)
    # A charge counts as a consume does, and counts even what does not fit.
    force = request.mode == "charge"
    consume = request.mode == "consume" or force
    # A peek (or reset) reports what is left before this request, not after.
    remaining = d.before if (not consume and d.allowed) else d.after
    reply = MeterReply(d.allowed, remaining, d.reset_in, d.retry, now)
    if force and not d.allowed:
        reset_in = d.ttl if request.algorithm == "gcra" else d.reset_in
        reply = MeterReply(True, 0, reset_in, 0, now)
    counts = consume and (d.allowed or force)
    write = (d.counted, max(d.ttl, 1)) if counts and not reset else None
    return reply, write, reset


def _refund(state: Optional[State], request: MeterRequest, now: int
            ) -> Tuple[MeterReply, Optional[Tuple[State, int]], bool]:
    """Give back ``request.cost`` units counted at ``request.refund_at``
    where the state still counts them (meter.rs, ``refund``), then answer
    as a peek of the same cost."""
    l, w, n, at = request.limit, request.window_ms, request.cost, request.refund_at
    start, at_start = now - now % w, at - at % w
    refunded: Optional[Tuple[State, int]] = None
    if state is not None:
        a, b, c = state
        if request.algorithm == "fixed-window":
            if a == start and at_start == start:
                refunded = ((start, max(b - n, 0), 0), start + w - now)
        elif request.algorithm == "sliding-window":
            curr, prev = (b, c) if a == start else ((0, b) if start == a + w else (0, 0))
            if at_start == start:
                curr = max(curr - n, 0)
            elif at_start + w == start:
                prev = max(prev - n, 0)
            refunded = ((start, curr, prev), start + 2 * w - now)
        elif a >= now:  # gcra
            used = max((a - now) * l + b - n * w, 0)
            refunded = ((now + used // l, used % l, 0), _ceil_div(used, l))
    after = refunded[0] if refunded else state
    peek = MeterRequest(request.algorithm, l, w, n, "peek")
    reply, _, _ = decide(after, peek, now)
    write = (refunded[0], max(refunded[1], 1)) if refunded else None
    return reply, write, False
