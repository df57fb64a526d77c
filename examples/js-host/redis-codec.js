// The Redis backend's layout and wire format, as host-test/redis/src
// (the Rust backend) has them, so that a Rust host, this host and any other
// host that follows them share locks, entries and limits on one Redis:
// the keys (`key`), the scripts as loaded (`storeScript`, `unwatchedScript`:
// the same text, so the same SHA-1), each operation's script arguments
// (`scriptCall`, `meterCall`) and the scripts' replies (`read*`). Pure
// functions: no connection here (redis-worker.js sends them).

import { createHash } from 'node:crypto';

/** The Rust backend's defaults (RedisConfig::new): every host sharing a Redis must agree on them. */
export const DEFAULTS = Object.freeze({
  prefix: 'coord',
  // Changes each watched partition's feed keeps.
  history: 1024,
  // How long a partition's keys outlive its last entry, in ms.
  retentionMs: 600000,
});

/** Whether `partition` is unwatched (a lock's, a lease's, a semaphore's): it keeps no feed. */
export function isUnwatched(partition) {
  return partition.startsWith('~');
}

/**
 * Whether unwatched.lua keeps `partition` as one string, read and rewritten
 * whole by every call: an unwatched partition of a few entries (a lock's, a
 * lease's). A semaphore's (`~sem:`) and a read-write lock's (`~rw:`) may
 * hold many entries, one per permit or reader, and are kept by redis.lua as a watched partition is, whose calls cost the
 * same at 10 000 entries as at none. The Rust backend's `one_string`: both
 * meet on one layout.
 */
export function oneString(partition) {
  return isUnwatched(partition) && !partition.startsWith('~sem:') && !partition.startsWith('~rw:');
}

/**
 * The Redis key of one part of a partition: `<prefix>:{p:<partition>}:<part>`,
 * with `%`, `{` and `}` escaped so the hash tag is exactly `p:<partition>`
 * and no two partitions share a key.
 */
export function key(prefix, partition, part) {
  const escaped = partition.replaceAll('%', '%25').replaceAll('{', '%7B').replaceAll('}', '%7D');
  return `${prefix}:{p:${escaped}}:${part}`;
}

/**
 * redis.lua as the Rust backend loads it on one server: behind one line of
 * configuration, byte for byte, so its SHA-1 (and so EVALSHA) is the same.
 */
export function storeScript(text, { history, retentionMs }) {
  return `local HISTORY, RETENTION, PUBLISH = '${history}', ${retentionMs}, 'PUBLISH'\n${text}`;
}

/** unwatched.lua as the Rust backend loads it on one server (wake stream kept, PUBLISH). */
export function unwatchedScript(text, { retentionMs }) {
  return `local RETENTION, PUBLISH, STREAM = ${retentionMs}, 'PUBLISH', true\n${text}`;
}

/** The SHA-1 EVALSHA names `text` by, in lowercase hex. */
export function sha1(text) {
  return createHash('sha1').update(text).digest('hex');
}

// unwatched.lua's operation codes (its header).
const OP_CODES = { get: 1, put: 2, touch: 3, delete: 4, list: 5, check: 6, arm: 7 };

/**
 * The EVALSHA call of store operation `op` on `partition`: which script
 * (`store` for redis.lua, `unwatched` for unwatched.lua) and the arguments
 * after its SHA. `inputs`: `key` (list's prefix), `value`, `ttlMs` (bigint;
 * undefined: never expires), `condition` ({tag, val} as jco gives it),
 * `after` and `max` (changes), `deadlineMs` (a number: the time on Redis's
 * clock past which the script changes nothing and answers LATE; undefined:
 * none).
 */
export function scriptCall(prefix, partition, op, inputs = {}) {
  if (oneString(partition)) {
    // One key and one packed argument; the script finds the stream and channel beside it.
    return { script: 'unwatched', args: ['1', key(prefix, partition, 's'), packInputs(op, inputs)] };
  }
  // '' for Redis's TIME, '-<deadline>' for it with a deadline.
  const clock = inputs.deadlineMs === undefined ? '' : `-${inputs.deadlineMs}`;
  const args = ['3', key(prefix, partition, 'e'), key(prefix, partition, 'x'), key(prefix, partition, 'f'), op, clock, key(prefix, partition, 'w')];
  // Then only the arguments `op` reads.
  const { key: k = '', value, ttlMs, condition } = inputs;
  switch (op) {
    case 'get': case 'list': case 'delete': args.push(k); break;
    case 'put': args.push(k, Buffer.from(value), ttlText(ttlMs)); break;
    case 'touch': args.push(k, ttlText(ttlMs)); break;
    case 'changes': args.push(String(inputs.after), String(inputs.max)); break;
    case 'check': break;
    default: throw invalid(`op: ${op} is not a store script operation`);
  }
  if (condition !== undefined) {
    switch (condition.tag) {
      case 'always': case 'absent': args.push(condition.tag); break;
      case 'revision': args.push('revision', String(condition.val)); break;
      case 'revision-and-value':
        args.push('revision-and-value', String(condition.val.revision), Buffer.from(condition.val.value));
        break;
      case 'absent-and-fewer-than': args.push('absent-and-fewer-than', String(condition.val)); break;
      default: throw invalid(`condition: unknown tag ${condition.tag}`);
    }
  }
  return { script: 'store', args };
}

// A TTL as redis.lua takes it: decimal, -1 for none.
function ttlText(ttlMs) {
  return ttlMs === undefined ? '-1' : String(checkTtl(ttlMs));
}

// The Rust backend takes a TTL as an i64 (`ttl_arg`).
function checkTtl(ttlMs) {
  if (ttlMs > 0x7fffffffffffffffn) throw invalid('ttl-ms is too large');
  return ttlMs;
}

const CONDITION_CODES = { always: 1, absent: 2, revision: 3, 'revision-and-value': 4, 'absent-and-fewer-than': 5 };

// unwatched.lua's one argument: struct.pack('<BBddd', op, condition, clock,
// number, guard revision), then the key, the value and the guard value,
// each after its length as '<I4'. Numbers travel as doubles (codec.rs,
// Inputs::packed): -1 as the clock asks for Redis's TIME, -d for it with
// the deadline d.
function packInputs(op, { key: k = '', value, ttlMs, condition, after, deadlineMs }) {
  const code = OP_CODES[op];
  if (code === undefined) throw invalid(`op: ${op} is not kept for an unwatched partition`);
  const number = op === 'arm' ? Number(after) : ttlMs === undefined ? -1 : Number(checkTtl(ttlMs));
  let guard = 0;
  let guardValue = new Uint8Array();
  let conditionCode = 0;
  if (condition !== undefined) {
    conditionCode = CONDITION_CODES[condition.tag];
    if (conditionCode === undefined) throw invalid(`condition: unknown tag ${condition.tag}`);
    // The guard number carries a revision, or absent-and-fewer-than's limit.
    if (condition.tag === 'revision' || condition.tag === 'absent-and-fewer-than') guard = Number(condition.val);
    if (condition.tag === 'revision-and-value') [guard, guardValue] = [Number(condition.val.revision), condition.val.value];
  }
  const keyBytes = Buffer.from(k, 'utf8');
  const valueBytes = value ?? new Uint8Array();
  const out = Buffer.alloc(2 + 24 + 12 + keyBytes.length + valueBytes.length + guardValue.length);
  out[0] = code;
  out[1] = conditionCode;
  let at = 2;
  for (const n of [packedClock(deadlineMs), number, guard]) at = out.writeDoubleLE(n, at);
  for (const bytes of [keyBytes, valueBytes, guardValue]) {
    at = out.writeUInt32LE(bytes.length, at);
    out.set(bytes, at);
    at += bytes.length;
  }
  return out;
}

// meter.lua's codes.
const ALGORITHM_CODES = { 'sliding-window': 1, 'fixed-window': 2, gcra: 3 };
const MODE_CODES = { consume: 1, peek: 2, reset: 3, charge: 4, refund: 5 };

// A packed clock: -1 for Redis's TIME, -d for it with the deadline d.
function packedClock(deadlineMs) {
  return deadlineMs === undefined ? -1 : -Math.max(deadlineMs, 2);
}

/**
 * The EVALSHA arguments (after the SHA) of `meter` on `partition`'s `meterKey`:
 * one key, `<key(partition, 'r:')><meterKey>`, and one packed argument,
 * struct.pack('<BBddddd', algorithm, mode, clock, limit, window-ms, cost, at),
 * the clock -1, or -d with a deadline `deadlineMs` (see `scriptCall`).
 */
export function meterCall(prefix, partition, meterKey, request, deadlineMs) {
  const algorithm = ALGORITHM_CODES[request.algorithm];
  // meter-mode is a variant: {tag}, and {tag: 'refund', val: at}.
  const mode = MODE_CODES[request.mode?.tag];
  if (algorithm === undefined) throw invalid(`request.algorithm: unknown ${request.algorithm}`);
  if (mode === undefined) throw invalid(`request.mode: unknown ${request.mode?.tag}`);
  const refundAt = request.mode.tag === 'refund' ? Number(request.mode.val) : 0;
  const packed = Buffer.alloc(42);
  packed[0] = algorithm;
  packed[1] = mode;
  let at = 2;
  for (const n of [packedClock(deadlineMs), request.limit, Number(request.windowMs), request.cost, refundAt]) at = packed.writeDoubleLE(Number(n), at);
  return ['1', `${key(prefix, partition, 'r:')}${meterKey}`, packed];
}

/**
 * The value an applied write leaves when this call sent it (the script then
 * leaves it out of its reply): a put's own, or a guard's.
 */
export function sentValue(value, condition) {
  if (value !== undefined) return value;
  if (condition?.tag === 'revision-and-value') return condition.val.value;
  return undefined;
}

/** A store error as jco lowers it: `{tag, val}` of wit/store.wit's `error`. */
export function unavailable(message) {
  return { tag: 'unavailable', val: message };
}

/** The store's `invalid` error naming the field. */
export function invalid(message) {
  return { tag: 'invalid', val: message };
}

// A reply that breaks the scripts' format: unavailable, as the Rust backend says it.
function malformed(what) {
  return unavailable(`redis: malformed reply (${what})`);
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

function text(bytes) {
  try {
    return utf8.decode(bytes);
  } catch {
    throw malformed('a key that is not UTF-8');
  }
}

// A whole number from a script's array reply (Redis turns Lua numbers into integers).
function integer(v) {
  if (typeof v !== 'number' || !Number.isInteger(v)) throw malformed(`expected an integer, got ${typeof v}`);
  return v;
}

function u64(v) {
  const n = integer(v);
  if (n < 0) throw malformed('a negative number');
  return BigInt(n);
}

const optionalU64 = (v) => (integer(v) < 0 ? undefined : BigInt(v));

function bytes(v) {
  if (!(v instanceof Uint8Array)) throw malformed(`expected a string, got ${typeof v}`);
  return new Uint8Array(v);
}

// Reads an array reply front to back.
function arrayReader(values) {
  if (!Array.isArray(values)) throw malformed(`expected an array, got ${typeof values}`);
  let at = 0;
  const next = () => {
    if (at >= values.length) throw malformed('too short');
    return values[at++];
  };
  const entry = () => ({
    key: text(bytes(next())),
    value: bytes(next()),
    revision: u64(next()),
    updatedAt: u64(next()),
    expiresAt: optionalU64(next()),
  });
  return { next, u64: () => u64(next()), optional: () => optionalU64(next()), maybeEntry: () => (u64(next()) === 1n ? entry() : undefined) };
}

// Reads a string packed by the scripts' `struct` (little endian), front to back.
function packedReader(buffer, what) {
  if (!(buffer instanceof Uint8Array)) throw malformed(`expected a packed ${what}, got ${typeof buffer}`);
  const view = Buffer.from(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  let at = 0;
  const take = (n) => {
    if (view.length - at < n) throw malformed(`a packed ${what} cut short`);
    const out = view.subarray(at, at + n);
    at += n;
    return out;
  };
  const double = () => take(8).readDoubleLE(0);
  const number = () => {
    const n = double();
    if (!Number.isInteger(n) || n < 0 || n >= 2 ** 53) throw malformed('a packed number');
    return BigInt(n);
  };
  return {
    take,
    byte: () => take(1)[0],
    length: () => take(4).readUInt32LE(0),
    number,
    // -1 means none.
    optional: () => (view.length - at >= 8 && view.readDoubleLE(at) === -1 ? (at += 8, undefined) : number()),
    rest: () => new Uint8Array(take(view.length - at)),
    done: () => at >= view.length,
  };
}

/** `get`'s reply: {now, 0} or {now, 1, key, value, revision, updated-at, expires-at}. */
export function readGet(reply) {
  const r = arrayReader(reply);
  const now = r.u64();
  return { entry: r.maybeEntry(), now };
}

/**
 * A put's, delete's or touch's reply: one packed string when applied,
 * struct.pack('<Bddddd', with-value, now, the partition's revision, the
 * entry's revision, updated-at, expires-at) then the value when with-value
 * is 1 (when 0, the value is `sent`); an array {now, 0, the partition's
 * revision, has-entry, entry...} when the condition failed.
 */
export function readWrite(reply, key, sent) {
  if (reply instanceof Uint8Array) {
    const p = packedReader(reply, 'write reply');
    const withValue = p.byte();
    const [now, partitionRevision, revision, updatedAt, expiresAt] = [p.number(), p.number(), p.number(), p.number(), p.optional()];
    let value;
    if (withValue === 1) value = p.rest();
    else if (withValue === 0 && sent !== undefined && p.done()) value = new Uint8Array(sent);
    else throw malformed('a packed write reply without its value');
    return { outcome: { tag: 'applied', val: { key, value, revision, updatedAt, expiresAt } }, now, revision: partitionRevision };
  }
  const r = arrayReader(reply);
  const now = r.u64();
  const applied = r.u64() === 1n;
  const revision = r.u64();
  const entry = r.maybeEntry();
  if (applied) {
    if (entry === undefined) throw malformed('an applied write without its entry');
    return { outcome: { tag: 'applied', val: entry }, now, revision };
  }
  return { outcome: { tag: 'conflict', val: entry }, now, revision };
}

// Byte order of two keys' UTF-8, as the Rust backend sorts a listing.
function byKeyBytes(a, b) {
  return Buffer.compare(Buffer.from(a.key, 'utf8'), Buffer.from(b.key, 'utf8'));
}

/**
 * A listing: struct.pack('<dd', now, revision), then per entry
 * struct.pack('<I4I4', #field, #stored), the field ('=' and the key) and the
 * stored bytes (struct.pack('<ddd', revision, updated-at, expires-at), value).
 * Sorted here by key bytes (the script leaves them unsorted).
 */
export function readList(reply) {
  const p = packedReader(reply, 'listing');
  const [now, revision] = [p.number(), p.number()];
  const entries = [];
  while (!p.done()) {
    const [fieldLength, storedLength] = [p.length(), p.length()];
    const field = p.take(fieldLength);
    if (field[0] !== 0x3d) throw malformed('a listed field that is not an entry');
    const stored = packedReader(p.take(storedLength), 'entry');
    const [entryRevision, updatedAt, expiresAt] = [stored.number(), stored.number(), stored.optional()];
    entries.push({ key: text(field.subarray(1)), value: stored.rest(), revision: entryRevision, updatedAt, expiresAt });
  }
  entries.sort(byKeyBytes);
  return { entries, revision, now };
}

const KINDS = { p: 'put', d: 'delete', e: 'expire' };

/**
 * A page of the change feed: struct.pack('<dd', now, revision), then per
 * change struct.pack('<I4I4', #id, #message), the stream id
 * (`<revision>-0`) and the message, struct.pack('<dddI4', at, previous,
 * seq, #key), the kind (p, d, e), the key and the value. When the history no
 * longer reaches `after`, the script answers {now, rev, complete-after, 0}:
 * thrown as `history-gone(complete-after)`.
 */
export function readChanges(reply) {
  if (Array.isArray(reply)) {
    const r = arrayReader(reply);
    r.u64();
    r.u64();
    throw { tag: 'history-gone', val: r.u64() };
  }
  const p = packedReader(reply, 'page');
  const [now, revision] = [p.number(), p.number()];
  const changes = [];
  while (!p.done()) {
    const [idLength, messageLength] = [p.length(), p.length()];
    const id = /^(\d+)-0$/.exec(p.take(idLength).toString('latin1'));
    if (!id) throw malformed('a feed id');
    const m = packedReader(p.take(messageLength), 'change');
    const at = m.number();
    m.number(); // the previous revision
    m.number(); // seq
    const keyLength = m.length();
    const kind = KINDS[String.fromCharCode(m.byte())];
    if (kind === undefined) throw malformed('an unknown change kind');
    const changedKey = text(m.take(keyLength));
    changes.push({ kind, key: changedKey, value: m.rest(), revision: BigInt(id[1]), at });
  }
  return { changes, revision, now };
}

/** `check`'s reply, {now, revision, next expiry or -1}, as [now, revision, nextExpiry]. */
export function readCheck(reply) {
  const r = arrayReader(reply);
  return [r.u64(), r.u64(), r.optional()];
}

/** meter.lua's reply: struct.pack('<Bdddd', allowed, remaining, reset-in, retry-after, now). */
export function readMeter(reply) {
  const p = packedReader(reply, 'meter reply');
  const flag = p.byte();
  if (flag > 1) throw malformed("a meter's allowed");
  const remaining = p.number();
  if (remaining > 0xffffffffn) throw malformed('remaining');
  const [resetInMs, retryAfterMs, now] = [p.number(), p.number(), p.number()];
  if (!p.done()) throw malformed('a meter reply too long');
  return { allowed: flag === 1, remaining: Number(remaining), resetInMs, retryAfterMs, now };
}
