// Idiomatic JavaScript over coord.wasm's exports (seed 000's shapes): a
// mutex with `withLock` that keeps the lock alive while an async function
// runs, ephemeral state with an async-iterable watch, and a rate limiter.
// Errors are the classes of errors.js; contention is a value (null, false,
// `limited`), never an exception. Fences, revisions and store times are
// bigints; durations and counts may be given as numbers or bigints.
//
// Every argument is checked before it reaches jco (arguments.js): one of
// the wrong type, or outside its WIT type's range, throws `InvalidArgument`
// naming the field as the WIT spells it (`options.ttl-ms`), so the value
// the component sees is the value the caller passed, never a wrapped one.
//
// The component is synchronous: a call that waits (an acquire with a wait
// policy, a watch's next) blocks this thread for as long as it waits.

import { instantiate, shared } from './component.js';
import * as memory from './store.js';
import { Unavailable, translated } from './errors.js';
import * as arg from './arguments.js';

export * from './errors.js';

// Whether an optional option was given (undefined and null leave it out).
const given = (value) => value !== undefined && value !== null;

// setInterval's longest delay: it runs a longer one after 1 ms.
const MAX_TIMER_MS = 2 ** 31 - 1;

// The WIT wait policy for `retry` ({maxAttempts, delayMs}) or `timeoutMs`;
// undefined leaves the component's default (11 attempts, 200 ms apart).
function waitPolicy({ retry, timeoutMs }) {
  if (given(retry) && given(timeoutMs)) {
    throw arg.invalid('options.wait', 'give either retry or timeoutMs, not both');
  }
  if (given(timeoutMs)) return { tag: 'timeout', val: arg.u64('options.wait.timeout', timeoutMs) };
  if (!given(retry)) return undefined;
  const { maxAttempts, delayMs } = arg.options('options.wait.attempts', retry);
  return {
    tag: 'attempts',
    val: {
      maxAttempts: arg.u32('options.wait.attempts.max-attempts', maxAttempts ?? 11),
      delayMs: arg.u64('options.wait.attempts.delay-ms', delayMs ?? 200),
    },
  };
}

/**
 * A distributed mutex named `id` (for example `inventory.stock`), one lock
 * per resource. `ttlMs` (default 30000) is how long an acquisition lasts
 * unless extended; `retry` ({maxAttempts, delayMs}) or `timeoutMs` says how
 * long to wait for a held lock (default: 11 attempts, 200 ms apart).
 */
function mutexOn(c, options) {
  const { id, ttlMs, retry, timeoutMs } = arg.options('options', options);
  arg.string('id', id);
  const defaults = { ttlMs: arg.u64('options.ttl-ms', ttlMs ?? 30000), wait: waitPolicy({ retry, timeoutMs }) };

  /**
   * Acquire the lock on `resource`: the held-lock record (plain data with a
   * bigint `fence`), or null when another holder kept it. Options override
   * the mutex's `ttlMs`, `retry`, `timeoutMs`.
   */
  function acquire(resource, options) {
    arg.string('resource', resource);
    const opts = arg.options('options', options);
    const ttlMs = given(opts.ttlMs) ? arg.u64('options.ttl-ms', opts.ttlMs) : defaults.ttlMs;
    const wait = given(opts.retry) || given(opts.timeoutMs) ? waitPolicy(opts) : defaults.wait;
    const outcome = translated(() => c.lock.acquire(id, resource, { ttlMs, wait }));
    return outcome.tag === 'acquired' ? outcome.val : null;
  }

  /** Release a held lock: true when this call freed it, false when it was no longer held. */
  function release(held) {
    const lock = arg.heldLock(held);
    return translated(() => c.lock.release(lock));
  }

  /**
   * Push a held lock's expiry to `ttlMs` (default: its own TTL) from now:
   * the updated record (same fence), or null when the lock was lost.
   */
  function extend(held, options) {
    const lock = arg.heldLock(held);
    const ttlMs = arg.optional(arg.u64, 'ttl-ms', arg.options('options', options).ttlMs);
    const outcome = translated(() => c.lock.extend(lock, ttlMs));
    return outcome.tag === 'extended' ? outcome.val : null;
  }

  /** Whether `held` still holds its lock (the commit-point check). */
  function isHeld(held) {
    const lock = arg.heldLock(held);
    return translated(() => c.lock.isHeld(lock));
  }

  /** Who holds `resource`'s lock: {fence, remainingMs}, or undefined. */
  function inspect(resource) {
    arg.string('resource', resource);
    return translated(() => c.lock.inspect(id, resource));
  }

  /** Free `resource`'s lock whoever holds it (an operator's action); true when a holder was removed. */
  function forceRelease(resource) {
    arg.string('resource', resource);
    return translated(() => c.lock.forceRelease(id, resource));
  }

  /**
   * Run `fn` holding the lock on `resource`; returns what `fn` returns, or
   * null when the lock could not be acquired (busy: `fn` did not run).
   * While `fn` runs, the lock is extended every `refreshMs` (default a
   * third of the TTL; 1 to 2147483647, setInterval's longest delay), so
   * work longer than the TTL keeps it with the same fence; afterwards it
   * is released, whether `fn` returned or threw.
   *
   * `fn(lock)` gets `lock.fence` (a bigint: present it at the write
   * boundary), `lock.record` (the held-lock record as last extended) and
   * `lock.signal`, an AbortSignal aborted if the lock is lost (an extend
   * answered `lost`, or the store stayed unreachable until the lock's
   * expiry): stop writing then. Refreshing runs on this thread's event
   * loop, so `fn` must await (not block) for it to happen. A release the
   * store does not answer is left to the TTL rather than thrown.
   */
  async function withLock(resource, fn, options) {
    // Checked before acquiring, so a bad argument leaves no lock behind.
    arg.callable('fn', fn);
    const opts = arg.options('options', options);
    const refreshMs = arg.optional(arg.u64, 'options.refresh-ms', opts.refreshMs);
    if (refreshMs !== undefined && (refreshMs < 1n || refreshMs > BigInt(MAX_TIMER_MS))) {
      throw arg.invalid('options.refresh-ms', `must be from 1 to ${MAX_TIMER_MS} (setInterval's longest delay), got ${arg.describe(opts.refreshMs)}`);
    }
    const held = acquire(resource, opts);
    if (held === null) return null;
    let current = held;
    const controller = new AbortController();
    const everyMs = refreshMs === undefined ? Math.min(MAX_TIMER_MS, Math.max(1, Math.floor(Number(held.ttlMs) / 3))) : Number(refreshMs);
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

// A JSON value as bytes: what JSON.stringify gives, or `InvalidArgument`
// (`value`) for what it cannot encode (a cycle, a bigint) or encodes as
// nothing (undefined, a function, a symbol), which would store 0 bytes.
function jsonBytes(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    throw arg.invalid('value', `cannot be encoded as JSON: ${e.message}`, e);
  }
  if (text === undefined) throw arg.invalid('value', `has no JSON form, got ${arg.describe(value)}`);
  return encoder.encode(text);
}

const codecs = {
  json: { encode: jsonBytes, decode: (b) => JSON.parse(decoder.decode(b)) },
  bytes: { encode: (v) => arg.bytes('value', v), decode: (b) => b },
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
function ephemeralSpaceOn(c, options) {
  const { id, ttlMs, maxValueBytes, encoding } = arg.options('space', options);
  const codec = codecs[arg.oneOf('encoding', encoding ?? 'json', Object.keys(codecs))];
  const space = {
    id: arg.string('space.id', id),
    ttlMs: arg.u64('space.ttl-ms', ttlMs),
    maxValueBytes: arg.u32('space.max-value-bytes', maxValueBytes),
  };

  // The checked tenant and key of an entry call's arguments.
  function entryKey({ tenantId, key }) {
    return [arg.string('tenant', tenantId), arg.string('key', key)];
  }

  /** Create or replace `key` of `tenantId`: {revision, updatedAt}. */
  function upsert(args) {
    const named = arg.options('options', args);
    const [tenant, key] = entryKey(named);
    const value = codec.encode(named.value);
    return translated(() => c.ephemeral.upsert(space, tenant, key, value));
  }

  /** Renew `key`'s TTL; false when it no longer exists (recreate it). */
  function touch(args) {
    const [tenant, key] = entryKey(arg.options('options', args));
    return translated(() => c.ephemeral.touch(space, tenant, key));
  }

  /** Remove `key`; false when it did not exist. */
  function remove(args) {
    const [tenant, key] = entryKey(arg.options('options', args));
    return translated(() => c.ephemeral.delete(space, tenant, key));
  }

  /** The live entries (under `prefix`, if given) and the tenant's revision. */
  function snapshot(args) {
    const { tenantId, prefix } = arg.options('options', args);
    const tenant = arg.string('tenant', tenantId);
    const under = arg.optional(arg.string, 'prefix', prefix);
    const s = translated(() => c.ephemeral.snapshot(space, tenant, under));
    return { entries: s.entries.map((e) => entryOf(codec, e)), revision: s.revision };
  }

  /**
   * The tenant's changes as an async iterable of events ({type: 'upsert',
   * key, value, revision, updatedAt}, {type: 'delete' | 'expire', key,
   * revision, at}, {type: 'resync-required'}). Without `after`, the current
   * entries come first as upserts. Ends after `resync-required` (reopen
   * without `after`), when `signal` aborts, or when the loop breaks. Each
   * step blocks this thread for at most `sliceMs` (default 1000; the
   * watcher's `timeout-ms`, 0 to 600000) waiting for an event, then yields
   * to the event loop. Bad arguments throw here, not at the first step.
   */
  function watch(args) {
    const { tenantId, prefix, after, signal, sliceMs } = arg.options('options', args);
    return watching({
      tenant: arg.string('tenant', tenantId),
      prefix: arg.optional(arg.string, 'prefix', prefix),
      after: arg.optional(arg.u64, 'after', after),
      signal: arg.signal('signal', signal),
      slice: arg.u64('timeout-ms', sliceMs ?? 1000),
    });
  }

  // The watch, on checked arguments.
  async function* watching({ tenant, prefix, after, signal, slice }) {
    const watcher = translated(() => c.ephemeral.watch(space, tenant, prefix, after));
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
 * A fenced counting semaphore named `id` (wit/semaphore.wit): at most
 * `limit` permits per resource held at once by every host on the store.
 * `ttlMs` (default 30000) is how long a permit lasts unless extended;
 * `retry` or `timeoutMs` how long to wait for a place (default: 11
 * attempts, 200 ms apart). Permits are plain data with a bigint `fence`.
 */
function semaphoreOn(c, options) {
  const { id, limit, ttlMs, retry, timeoutMs } = arg.options('options', options);
  arg.string('id', id);
  const places = arg.u32('limit', limit);
  const defaults = { ttlMs: arg.u64('options.ttl-ms', ttlMs ?? 30000), wait: waitPolicy({ retry, timeoutMs }) };

  /** A permit of `resource`, or null when every place stayed taken. Options override `ttlMs`, `retry`, `timeoutMs`. */
  function acquire(resource, options) {
    arg.string('resource', resource);
    const opts = arg.options('options', options);
    const ttlMs = given(opts.ttlMs) ? arg.u64('options.ttl-ms', opts.ttlMs) : defaults.ttlMs;
    const wait = given(opts.retry) || given(opts.timeoutMs) ? waitPolicy(opts) : defaults.wait;
    const outcome = translated(() => c.semaphore.acquire(id, resource, places, { ttlMs, wait }));
    return outcome.tag === 'acquired' ? outcome.val : null;
  }

  /** Release a permit: true when this call freed it, false when it was no longer held. */
  function release(held) {
    const record = arg.permit(held);
    return translated(() => c.semaphore.release(record));
  }

  /** Push a permit's expiry to `ttlMs` (default: its own TTL) from now: the updated permit, or null when it was lost. */
  function extend(held, options) {
    const record = arg.permit(held);
    const ttlMs = arg.optional(arg.u64, 'ttl-ms', arg.options('options', options).ttlMs);
    const outcome = translated(() => c.semaphore.extend(record, ttlMs));
    return outcome.tag === 'extended' ? outcome.val : null;
  }

  /** Whether `held` is still held (the commit-point check before a fenced write). */
  function isHeld(held) {
    const record = arg.permit(held);
    return translated(() => c.semaphore.isHeld(record));
  }

  /** The live permits of `resource`: {permits: [{fence, remainingMs, limit}], now}. */
  function inspect(resource) {
    arg.string('resource', resource);
    return translated(() => c.semaphore.inspect(id, resource));
  }

  /** Free the permit of `resource` with this fence (an operator's action); true when it was removed. */
  function forceRelease(resource, fence) {
    arg.string('resource', resource);
    const f = arg.u64('fence', fence);
    return translated(() => c.semaphore.forceRelease(id, resource, f));
  }

  /**
   * Run `fn(permit)` holding a permit of `resource`, and release it after,
   * whether `fn` returned or threw; returns what `fn` returns, or null
   * when no place was free (`fn` did not run). The permit is not extended
   * while `fn` runs: give a `ttlMs` longer than the work, or extend it.
   */
  async function withPermit(resource, fn, options) {
    arg.callable('fn', fn);
    const held = acquire(resource, options);
    if (held === null) return null;
    try {
      return await fn(held);
    } finally {
      release(held);
    }
  }

  return { id, limit: places, acquire, release, extend, isHeld, inspect, forceRelease, withPermit };
}

// wit/rwlock.wit's `mode` cases.
const MODES = ['read', 'write'];

/**
 * A fenced read-write lock named `id` (wit/rwlock.wit): many readers or one
 * writer per resource, across every host on the store; writers are
 * preferred. `ttlMs` (default 30000) is how long a grant lasts unless
 * extended; `retry` or `timeoutMs` how long to wait (default: 11 attempts,
 * 200 ms apart). Grants are plain data with a bigint `fence`.
 */
function rwLockOn(c, options) {
  const { id, ttlMs, retry, timeoutMs } = arg.options('options', options);
  arg.string('id', id);
  const defaults = { ttlMs: arg.u64('options.ttl-ms', ttlMs ?? 30000), wait: waitPolicy({ retry, timeoutMs }) };

  /** A grant of `resource` in `mode` ('read' or 'write'), or null when busy. Options override `ttlMs`, `retry`, `timeoutMs`. */
  function acquire(resource, mode, options) {
    arg.string('resource', resource);
    arg.oneOf('mode', mode, MODES);
    const opts = arg.options('options', options);
    const ttlMs = given(opts.ttlMs) ? arg.u64('options.ttl-ms', opts.ttlMs) : defaults.ttlMs;
    const wait = given(opts.retry) || given(opts.timeoutMs) ? waitPolicy(opts) : defaults.wait;
    const outcome = translated(() => c.rwlock.acquire(id, resource, mode, { ttlMs, wait }));
    return outcome.tag === 'acquired' ? outcome.val : null;
  }

  /** Release a grant: true when this call freed it, false when it was no longer held. */
  function release(held) {
    const record = grant(held);
    return translated(() => c.rwlock.release(record));
  }

  /** Push a grant's expiry to `ttlMs` (default: its own TTL) from now: the updated grant, or null when it was lost. */
  function extend(held, options) {
    const record = grant(held);
    const ttlMs = arg.optional(arg.u64, 'ttl-ms', arg.options('options', options).ttlMs);
    const outcome = translated(() => c.rwlock.extend(record, ttlMs));
    return outcome.tag === 'extended' ? outcome.val : null;
  }

  /** Whether `held` still holds the lock (the commit-point check before a fenced write). */
  function isHeld(held) {
    const record = grant(held);
    return translated(() => c.rwlock.isHeld(record));
  }

  /** The writer's entry and the live readers of `resource`: {writer, readers: [{mode, fence, remainingMs}], now}. */
  function inspect(resource) {
    arg.string('resource', resource);
    return translated(() => c.rwlock.inspect(id, resource));
  }

  /** Free the grant of `resource` with this fence, read or write (an operator's action); true when it was removed. */
  function forceRelease(resource, fence) {
    arg.string('resource', resource);
    const f = arg.u64('fence', fence);
    return translated(() => c.rwlock.forceRelease(id, resource, f));
  }

  /**
   * Run `fn(grant)` holding `resource` in `mode`, and release it after,
   * whether `fn` returned or threw; returns what `fn` returns, or null when
   * busy (`fn` did not run). The grant is not extended while `fn` runs.
   */
  async function withMode(mode, resource, fn, options) {
    arg.callable('fn', fn);
    const held = acquire(resource, mode, options);
    if (held === null) return null;
    try {
      return await fn(held);
    } finally {
      release(held);
    }
  }

  return {
    id, acquire, release, extend, isHeld, inspect, forceRelease,
    withRead: (resource, fn, options) => withMode('read', resource, fn, options),
    withWrite: (resource, fn, options) => withMode('write', resource, fn, options),
  };
}

/** A rwlock.wit `grant` as the caller gives it back, fields named `grant.<field>`. */
function grant(value) {
  const held = arg.heldLock(value, 'grant');
  return { ...held, mode: arg.oneOf('grant.mode', value.mode, MODES) };
}

// wit/ratelimit.wit's `algorithm` cases.
const ALGORITHMS = ['sliding-window', 'fixed-window', 'token-bucket'];

/**
 * A rate limiter named `id`: `limit` requests (cost units) per `windowMs`,
 * counted by `algorithm` (`sliding-window`, the default, `fixed-window` or
 * `token-bucket`), shared by every host on the store.
 */
function rateLimiterOn(c, options) {
  const { id, limit, windowMs, algorithm } = arg.options('limiter', options);
  const limiter = {
    id: arg.string('limiter.id', id),
    limit: arg.u32('limiter.limit', limit),
    windowMs: arg.u64('limiter.window-ms', windowMs),
    algorithm: arg.optional((field, value) => arg.oneOf(field, value, ALGORITHMS), 'limiter.algorithm', algorithm),
  };
  const decision = (d) => ({ ...d, limited: !d.allowed });

  /** Count a request of `cost` (default 1) against `key` if it fits: {allowed, limited, limit, remaining, resetInMs, retryAfterMs}. */
  function check(key, options) {
    arg.string('key', key);
    const cost = arg.optional(arg.u32, 'cost', arg.options('options', options).cost);
    return decision(translated(() => c.ratelimit.check(limiter, key, cost)));
  }

  /** What check(key) would answer now, counting nothing. */
  function peek(key) {
    arg.string('key', key);
    return decision(translated(() => c.ratelimit.peek(limiter, key)));
  }

  /** Forget what was counted for `key`. */
  function reset(key) {
    arg.string('key', key);
    translated(() => c.ratelimit.reset(limiter, key));
  }

  /**
   * Count an estimated `cost` against `key` now, as check would, for work
   * whose real cost is known only after it: {decision, reservation}, the
   * reservation (plain data) null when limited. Settle it within `ttlMs`.
   */
  function reserve(key, cost, ttlMs) {
    const args = [arg.string('key', key), arg.u32('cost', cost), arg.u64('ttl-ms', ttlMs)];
    const { decision: d, reservation } = translated(() => c.ratelimit.reserve(limiter, ...args));
    return { decision: decision(d), reservation: reservation ?? null };
  }

  /** Settle a reservation with the units really used: 'settled', 'already-settled', 'expired' or 'unknown' (the store has no record of it: forged, edited or long gone). */
  function settle(reservation, actual) {
    const r = arg.reservation(reservation);
    const units = arg.u32('actual', actual);
    return translated(() => c.ratelimit.settle(limiter, r, units));
  }

  /** Give a reservation back whole (settle with 0). */
  function cancel(reservation) {
    const r = arg.reservation(reservation);
    return translated(() => c.ratelimit.cancel(limiter, r));
  }

  return { id, check, peek, reset, reserve, settle, cancel };
}

/**
 * Single-writer leases (wit/lease.wit) with errors as classes: `NotHolder`,
 * `InGrace`, `Unavailable`, `InvalidArgument`. Records pass through as jco
 * gives them (epochs and times as bigints); a held lease given back is
 * checked field by field (`lease.epoch`), a number field becoming a bigint.
 */
function leaseOn(c) {
  return {
    /** Acquire, adopt or take over `name` for `node`: the held lease. */
    acquire(name, node, ttlMs) {
      const args = [arg.string('name', name), arg.string('node', node), arg.u64('ttl-ms', ttlMs)];
      return translated(() => c.lease.acquire(...args));
    },
    /** Renew a held lease for its TTL from now. */
    renew(held) {
      const record = arg.heldLease(held);
      return translated(() => c.lease.renew(record));
    },
    /** The commit-point check before a write: the lease as the store has it, or a throw. */
    check(held) {
      const record = arg.heldLease(held);
      return translated(() => c.lease.check(record));
    },
    /** Give the lease up: true when this call gave it up. */
    resign(held) {
      const record = arg.heldLease(held);
      return translated(() => c.lease.resign(record));
    },
    /** Who holds `name`, if anyone. */
    observe(name) {
      arg.string('name', name);
      return translated(() => c.lease.observe(name));
    },
  };
}

/**
 * coord's wrappers bound to a new instance of coord.wasm on `store`
 * (default: the in-memory store, one per process, shared by every instance
 * that uses it; or `redisStore(url)`). Instances on one store share every
 * lock, lease, permit, entry and limit; each runs one call at a time.
 */
export function createCoord(options) {
  const { store } = arg.options('options', options ?? {});
  const c = instantiate(store ?? memory);
  return {
    mutex: (o) => mutexOn(c, o),
    semaphore: (o) => semaphoreOn(c, o),
    rwLock: (o) => rwLockOn(c, o),
    ephemeralSpace: (o) => ephemeralSpaceOn(c, o),
    rateLimiter: (o) => rateLimiterOn(c, o),
    lease: leaseOn(c),
  };
}

// The process's shared instance, on the store `useStore` picks (host-store.js).

/** A mutex on the shared instance (`createCoord().mutex` on an instance of your own). */
export const mutex = (options) => mutexOn(shared, options);
/** A semaphore on the shared instance. */
export const semaphore = (options) => semaphoreOn(shared, options);
/** A read-write lock on the shared instance. */
export const rwLock = (options) => rwLockOn(shared, options);
/** An ephemeral space on the shared instance. */
export const ephemeralSpace = (options) => ephemeralSpaceOn(shared, options);
/** A rate limiter on the shared instance. */
export const rateLimiter = (options) => rateLimiterOn(shared, options);
/** Leases on the shared instance. */
export const lease = leaseOn(shared);
