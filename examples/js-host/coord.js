// Idiomatic JavaScript over coord.wasm's exports (seed 000's shapes): a
// mutex with `withLock` that keeps the lock alive while an async function
// runs, ephemeral state with an async-iterable watch, and a rate limiter.
// Errors are the classes of errors.js; contention is a value (null, false,
// `limited`), never an exception. Fences, revisions and store times are
// bigints; durations may be given as numbers or bigints.
//
// The component is synchronous: a call that waits (an acquire with a wait
// policy, a watch's next) blocks this thread for as long as it waits.

import { lock as locks, ephemeral, ratelimit, lease as leases } from './dist/coord.js';
import { InvalidArgument, Unavailable, translated } from './errors.js';

export * from './errors.js';

// A duration option as the bigint the component takes; `field` names it in the error.
function millis(field, value) {
  if (typeof value === 'bigint' && value >= 0n) return value;
  if (Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  throw new InvalidArgument(field, `must be a whole number of milliseconds, got ${String(value)}`);
}

const optionalMillis = (field, value) => (value === undefined ? undefined : millis(field, value));

// The WIT wait policy for `retry` ({maxAttempts, delayMs}) or `timeoutMs`;
// undefined leaves the component's default (11 attempts, 200 ms apart).
function waitPolicy({ retry, timeoutMs }) {
  if (retry !== undefined && timeoutMs !== undefined) {
    throw new InvalidArgument('retry', 'give either retry or timeoutMs, not both');
  }
  if (timeoutMs !== undefined) return { tag: 'timeout', val: millis('timeoutMs', timeoutMs) };
  if (retry === undefined) return undefined;
  const maxAttempts = retry.maxAttempts ?? 11;
  if (!Number.isSafeInteger(maxAttempts)) throw new InvalidArgument('retry.maxAttempts', 'must be a whole number');
  return { tag: 'attempts', val: { maxAttempts, delayMs: millis('retry.delayMs', retry.delayMs ?? 200) } };
}

/**
 * A distributed mutex named `id` (for example `inventory.stock`), one lock
 * per resource. `ttlMs` (default 30000) is how long an acquisition lasts
 * unless extended; `retry` ({maxAttempts, delayMs}) or `timeoutMs` says how
 * long to wait for a held lock (default: 11 attempts, 200 ms apart).
 */
export function mutex({ id, ttlMs = 30000, retry, timeoutMs } = {}) {
  const defaults = { ttlMs: millis('ttlMs', ttlMs), retry, timeoutMs };

  /**
   * Acquire the lock on `resource`: the held-lock record (plain data with a
   * bigint `fence`), or null when another holder kept it. Options override
   * the mutex's `ttlMs`, `retry`, `timeoutMs`.
   */
  function acquire(resource, options = {}) {
    const ttl = options.ttlMs === undefined ? defaults.ttlMs : millis('ttlMs', options.ttlMs);
    const overrides = options.retry !== undefined || options.timeoutMs !== undefined;
    const wait = waitPolicy(overrides ? options : defaults);
    const outcome = translated(() => locks.acquire(id, resource, { ttlMs: ttl, wait }));
    return outcome.tag === 'acquired' ? outcome.val : null;
  }

  /** Release a held lock: true when this call freed it, false when it was no longer held. */
  function release(held) {
    return translated(() => locks.release(held));
  }

  /**
   * Push a held lock's expiry to `ttlMs` (default: its own TTL) from now:
   * the updated record (same fence), or null when the lock was lost.
   */
  function extend(held, { ttlMs: ttl } = {}) {
    const outcome = translated(() => locks.extend(held, optionalMillis('ttlMs', ttl)));
    return outcome.tag === 'extended' ? outcome.val : null;
  }

  /** Whether `held` still holds its lock (the commit-point check). */
  function isHeld(held) {
    return translated(() => locks.isHeld(held));
  }

  /** Who holds `resource`'s lock: {fence, remainingMs}, or undefined. */
  function inspect(resource) {
    return translated(() => locks.inspect(id, resource));
  }

  /** Free `resource`'s lock whoever holds it (an operator's action); true when a holder was removed. */
  function forceRelease(resource) {
    return translated(() => locks.forceRelease(id, resource));
  }

  /**
   * Run `fn` holding the lock on `resource`; returns what `fn` returns, or
   * null when the lock could not be acquired (busy: `fn` did not run).
   * While `fn` runs, the lock is extended every `refreshMs` (default a
   * third of the TTL), so work longer than the TTL keeps it with the same
   * fence; afterwards it is released, whether `fn` returned or threw.
   *
   * `fn(lock)` gets `lock.fence` (a bigint: present it at the write
   * boundary), `lock.record` (the held-lock record as last extended) and
   * `lock.signal`, an AbortSignal aborted if the lock is lost (an extend
   * answered `lost`, or the store stayed unreachable until the lock's
   * expiry): stop writing then. Refreshing runs on this thread's event
   * loop, so `fn` must await (not block) for it to happen. A release the
   * store does not answer is left to the TTL rather than thrown.
   */
  async function withLock(resource, fn, options = {}) {
    // Checked before acquiring, so a bad option leaves no lock behind.
    const refreshMs = options.refreshMs === undefined ? undefined : Number(millis('refreshMs', options.refreshMs));
    const held = acquire(resource, options);
    if (held === null) return null;
    let current = held;
    const controller = new AbortController();
    const everyMs = refreshMs ?? Math.max(1, Math.floor(Number(held.ttlMs) / 3));
    // The local time by which the lock has surely expired without an extend.
    let expiresBy = Date.now() + Number(held.ttlMs);
    const refresh = setInterval(() => {
      try {
        const started = Date.now();
        const next = extend(current);
        if (next === null) {
          controller.abort(new Error(`coord: lock ${id}/${resource} was lost (fence ${held.fence})`));
          clearInterval(refresh);
          return;
        }
        current = next;
        expiresBy = started + Number(next.ttlMs);
      } catch (e) {
        // Unreachable for now: the lock may still be held; give up once it
        // has surely expired.
        if (!(e instanceof Unavailable) || Date.now() >= expiresBy) {
          controller.abort(e);
          clearInterval(refresh);
        }
      }
    }, everyMs);
    const lock = {
      fence: held.fence,
      signal: controller.signal,
      get record() {
        return current;
      },
    };
    try {
      return await fn(lock);
    } finally {
      clearInterval(refresh);
      if (!controller.signal.aborted) {
        try {
          release(current);
        } catch (e) {
          if (!(e instanceof Unavailable)) throw e;
        }
      }
    }
  }

  return { id, acquire, release, extend, isHeld, inspect, forceRelease, withLock };
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const codecs = {
  json: { encode: (v) => encoder.encode(JSON.stringify(v)), decode: (b) => JSON.parse(decoder.decode(b)) },
  bytes: { encode: (v) => v, decode: (b) => b },
};

// A WIT entry with its value decoded.
const entryOf = (codec, e) => ({ key: e.key, value: codec.decode(e.value), revision: e.revision, updatedAt: e.updatedAt });

// A WIT event as {type, ...}: `upsert` with the entry, `delete` and `expire`
// with {key, revision, at}, `resync-required` alone.
function eventOf(codec, event) {
  switch (event.tag) {
    case 'upsert': return { type: 'upsert', ...entryOf(codec, event.val) };
    case 'delete': case 'expire': return { type: event.tag, ...event.val };
    default: return { type: event.tag };
  }
}

/**
 * An ephemeral space: entries per tenant that expire `ttlMs` after their
 * last upsert or touch. `maxValueBytes` bounds an encoded value; `encoding`
 * is `json` (the default: values are JSON) or `bytes` (Uint8Arrays as they are).
 */
export function ephemeralSpace({ id, ttlMs, maxValueBytes, encoding = 'json' }) {
  const codec = codecs[encoding];
  if (!codec) throw new InvalidArgument('encoding', `must be json or bytes, got ${encoding}`);
  const space = { id, ttlMs: millis('ttlMs', ttlMs), maxValueBytes };

  /** Create or replace `key` of `tenantId`: {revision, updatedAt}. */
  function upsert({ tenantId, key, value }) {
    return translated(() => ephemeral.upsert(space, tenantId, key, codec.encode(value)));
  }

  /** Renew `key`'s TTL; false when it no longer exists (recreate it). */
  function touch({ tenantId, key }) {
    return translated(() => ephemeral.touch(space, tenantId, key));
  }

  /** Remove `key`; false when it did not exist. */
  function remove({ tenantId, key }) {
    return translated(() => ephemeral.delete(space, tenantId, key));
  }

  /** The live entries (under `prefix`, if given) and the tenant's revision. */
  function snapshot({ tenantId, prefix }) {
    const s = translated(() => ephemeral.snapshot(space, tenantId, prefix));
    return { entries: s.entries.map((e) => entryOf(codec, e)), revision: s.revision };
  }

  /**
   * The tenant's changes as an async iterable of events ({type: 'upsert',
   * key, value, revision, updatedAt}, {type: 'delete' | 'expire', key,
   * revision, at}, {type: 'resync-required'}). Without `after`, the current
   * entries come first as upserts. Ends after `resync-required` (reopen
   * without `after`), when `signal` aborts, or when the loop breaks. Each
   * step blocks this thread for at most `sliceMs` (default 1000) waiting
   * for an event, then yields to the event loop.
   */
  async function* watch({ tenantId, prefix, after, signal, sliceMs = 1000 }) {
    const slice = millis('sliceMs', sliceMs);
    const watcher = translated(() => ephemeral.watch(space, tenantId, prefix, optionalMillis('after', after)));
    try {
      while (!signal?.aborted) {
        const event = translated(() => watcher.next(slice));
        if (event !== undefined) {
          yield eventOf(codec, event);
          if (event.tag === 'resync-required') return;
        } else {
          // Let timers and the signal's listeners run between slices.
          await new Promise((resolve) => setImmediate(resolve));
        }
      }
    } finally {
      // jco's disposer (Symbol.for('dispose') where Node has no Symbol.dispose).
      watcher[Symbol.dispose ?? Symbol.for('dispose')]?.();
    }
  }

  return { id, upsert, touch, delete: remove, snapshot, watch };
}

/**
 * A rate limiter named `id`: `limit` requests (cost units) per `windowMs`,
 * counted by `algorithm` (`sliding-window`, the default, `fixed-window` or
 * `token-bucket`), shared by every host on the store.
 */
export function rateLimiter({ id, limit, windowMs, algorithm }) {
  const limiter = { id, limit, windowMs: millis('windowMs', windowMs), algorithm };
  const decision = (d) => ({ ...d, limited: !d.allowed });

  /** Count a request of `cost` (default 1) against `key` if it fits: {allowed, limited, limit, remaining, resetInMs, retryAfterMs}. */
  function check(key, { cost } = {}) {
    return decision(translated(() => ratelimit.check(limiter, key, cost)));
  }

  /** What check(key) would answer now, counting nothing. */
  function peek(key) {
    return decision(translated(() => ratelimit.peek(limiter, key)));
  }

  /** Forget what was counted for `key`. */
  function reset(key) {
    translated(() => ratelimit.reset(limiter, key));
  }

  return { id, check, peek, reset };
}

/**
 * Single-writer leases (wit/lease.wit) with errors as classes: `NotHolder`,
 * `InGrace`, `Unavailable`, `InvalidArgument`. Records pass through as jco
 * gives them (epochs and times as bigints).
 */
export const lease = {
  /** Acquire, adopt or take over `name` for `node`: the held lease. */
  acquire: (name, node, ttlMs) => translated(() => leases.acquire(name, node, millis('ttlMs', ttlMs))),
  /** Renew a held lease for its TTL from now. */
  renew: (held) => translated(() => leases.renew(held)),
  /** The commit-point check before a write: the lease as the store has it, or a throw. */
  check: (held) => translated(() => leases.check(held)),
  /** Give the lease up: true when this call gave it up. */
  resign: (held) => translated(() => leases.resign(held)),
  /** Who holds `name`, if anyone. */
  observe: (name) => translated(() => leases.observe(name)),
};
