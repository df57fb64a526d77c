// The checks coord.js runs on what a caller passes, before jco lowers it.
// jco does not check: it wraps a u64 with BigInt.asUintN(64, …) (-1 becomes
// 18446744073709551615, 2**64 + 1000 becomes 1000), a u32 with `>>> 0`
// ('10' becomes 10, 1.5 becomes 1, 2**32 + 1 becomes 1), turns a lone
// surrogate into U+FFFD (two different ids, one lock) and copies anything
// with a `byteLength` as bytes (a string as 0 bytes, `{byteLength: 4}` as
// four zeros). So each value is checked here, and the value that reaches
// the component is exactly the value the caller passed, or an
// `InvalidArgument` is thrown naming the field as the WIT spells it
// (`options.ttl-ms`, `limiter.window-ms`, `lock.fence`); a wrapper-only
// option is spelled the same way (`options.refresh-ms`). Ranges the
// component states (a TTL of 1 to 86400000) stay the component's to check.
//
// Numbers may be numbers or bigints; a number must be a safe integer.
// An optional argument is left out with `undefined` or `null`, as in jco.

import { InvalidArgument } from './errors.js';

const U32_MAX = 2n ** 32n - 1n;
const U64_MAX = 2n ** 64n - 1n;

/** The InvalidArgument for `field`, with the WIT variant as its `payload`, as the component's own have. */
export function invalid(field, reason, cause) {
  return new InvalidArgument(field, reason, { tag: 'invalid-argument', val: { field, reason } }, cause);
}

/** `value` in words for an error message; never throws (symbols, null-prototype objects). */
export function describe(value) {
  switch (typeof value) {
    case 'string': return `${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)} (a string)`;
    case 'bigint': return `${value}n`;
    case 'number': return String(value);
    case 'undefined': case 'boolean': return String(value);
    case 'symbol': return 'a symbol';
    case 'function': return 'a function';
    default:
      if (value === null) return 'null';
      if (Array.isArray(value)) return 'an array';
      return `an object (${Object.prototype.toString.call(value).slice(8, -1)})`;
  }
}

// An integer from 0 to `max`, as a bigint, or a throw naming `field` and `type`.
function unsigned(field, value, max, type) {
  const range = () => invalid(field, `must be from 0 to ${max} (a ${type}), got ${describe(value)}`);
  if (typeof value === 'bigint') {
    if (value < 0n || value > max) throw range();
    return value;
  }
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw invalid(field, `must be an integer (a number or a bigint), got ${describe(value)}`);
  }
  if (value < 0 || value > Number(max)) throw range();
  if (!Number.isSafeInteger(value)) {
    throw invalid(field, `is above 2**53 - 1, where a number is no longer exact: pass a bigint, got ${describe(value)}`);
  }
  return BigInt(value);
}

/** A WIT `u64`: a bigint, or a safe integer number, from 0 to 2**64 - 1; returned as the bigint jco takes. */
export function u64(field, value) {
  return unsigned(field, value, U64_MAX, 'u64');
}

/** A WIT `u32`: a safe integer number, or a bigint, from 0 to 2**32 - 1; returned as the number jco takes. */
export function u32(field, value) {
  return Number(unsigned(field, value, U32_MAX, 'u32'));
}

/** `check(field, value)`, or undefined (the WIT `none`) when `value` is undefined or null. */
export function optional(check, field, value) {
  return value === undefined || value === null ? undefined : check(field, value);
}

/**
 * A WIT `string`: a string that is well-formed UTF-16. A lone surrogate is
 * rejected: UTF-8 cannot carry it, and jco would send U+FFFD in its place.
 */
export function string(field, value) {
  if (typeof value !== 'string') throw invalid(field, `must be a string, got ${describe(value)}`);
  const lone = value.search(/[\uD800-\uDFFF]/u);
  if (lone !== -1) {
    const unit = value.charCodeAt(lone).toString(16).toUpperCase();
    throw invalid(field, `has a lone surrogate (U+${unit}) at index ${lone}: not valid UTF-8, it would be sent as U+FFFD`);
  }
  return value;
}

/** A WIT `list<u8>` as the `bytes` encoding takes it: a Uint8Array (a Buffer is one), copied by jco as it is. */
export function bytes(field, value) {
  if (!(value instanceof Uint8Array)) throw invalid(field, `must be a Uint8Array (the space's encoding is bytes), got ${describe(value)}`);
  return value;
}

/** One of `cases` (strings: a WIT enum's cases, or a wrapper option's choices). */
export function oneOf(field, value, cases) {
  if (typeof value !== 'string' || !cases.includes(value)) {
    throw invalid(field, `must be one of ${cases.map((c) => `'${c}'`).join(', ')}, got ${describe(value)}`);
  }
  return value;
}

/** A bag of named arguments or options: an object, or `{}` for undefined or null. */
export function options(field, value) {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) throw invalid(field, `must be an object, got ${describe(value)}`);
  return value;
}

/** A record the caller must pass (a held lock or lease): a non-null object. */
function record(field, value) {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw invalid(field, `must be an object, got ${describe(value)}`);
  return value;
}

/**
 * A lock.wit `held-lock` as the caller gives it back (kept, sent, or rebuilt
 * from JSON): each field checked, as `lock.<field>`; returned as a new record
 * of exactly those fields, u64s as bigints.
 */
export function heldLock(value, field = 'lock') {
  const held = record(field, value);
  return {
    id: string(`${field}.id`, held.id),
    resource: string(`${field}.resource`, held.resource),
    owner: string(`${field}.owner`, held.owner),
    fence: u64(`${field}.fence`, held.fence),
    ttlMs: u64(`${field}.ttl-ms`, held.ttlMs),
    expiresAt: u64(`${field}.expires-at`, held.expiresAt),
  };
}

/** A semaphore.wit `permit`, as `heldLock` does it, fields named `permit.<field>`. */
export function permit(value, field = 'permit') {
  const held = record(field, value);
  return {
    id: string(`${field}.id`, held.id),
    resource: string(`${field}.resource`, held.resource),
    owner: string(`${field}.owner`, held.owner),
    fence: u64(`${field}.fence`, held.fence),
    limit: u32(`${field}.limit`, held.limit),
    ttlMs: u64(`${field}.ttl-ms`, held.ttlMs),
    expiresAt: u64(`${field}.expires-at`, held.expiresAt),
  };
}

/** A ratelimit.wit `reservation`, as `heldLock` does it, fields named `reservation.<field>`. */
export function reservation(value, field = 'reservation') {
  const r = record(field, value);
  return {
    id: string(`${field}.id`, r.id),
    key: string(`${field}.key`, r.key),
    token: string(`${field}.token`, r.token),
    cost: u32(`${field}.cost`, r.cost),
    reservedAt: u64(`${field}.reserved-at`, r.reservedAt),
    expiresAt: u64(`${field}.expires-at`, r.expiresAt),
  };
}

/** A lease.wit `held-lease`, as `heldLock` does it, fields named `lease.<field>`. */
export function heldLease(value, field = 'lease') {
  const held = record(field, value);
  return {
    name: string(`${field}.name`, held.name),
    node: string(`${field}.node`, held.node),
    epoch: u64(`${field}.epoch`, held.epoch),
    ttlMs: u64(`${field}.ttl-ms`, held.ttlMs),
    expiresAt: u64(`${field}.expires-at`, held.expiresAt),
    writableAt: u64(`${field}.writable-at`, held.writableAt),
  };
}

/** A function the wrapper will call (withLock's `fn`). */
export function callable(field, value) {
  if (typeof value !== 'function') throw invalid(field, `must be a function, got ${describe(value)}`);
  return value;
}

/** An AbortSignal (anything with a boolean `aborted`), or undefined for undefined or null. */
export function signal(field, value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || typeof value.aborted !== 'boolean') throw invalid(field, `must be an AbortSignal, got ${describe(value)}`);
  return value;
}
