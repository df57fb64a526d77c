// The coord:sync/store capability for a JavaScript host, in memory: what
// host-test/host/src/backend/memory.rs is for the wasmtime host, in one file.
// Time is a clock the tests can move (`advance`); revisions, conditions,
// TTLs, the bounded change feed with expire events and the rate-limit meter
// follow wit/store.wit. JavaScript runs the component on one thread, so
// while `wait` or `wait-then-put` blocks nothing else can write: only time
// moves, so each sleeps (Atomics.wait, which Node allows on its main thread)
// until its timeout or the partition's next expiry, whichever is first.

const HISTORY = 1024;
let offset = 0n;
const partitions = new Map();

/** Move the store's clock forward by `ms` (a bigint or number). */
export function advance(ms) {
  offset += BigInt(ms);
}

function clock() {
  return BigInt(Date.now()) + offset;
}

function partition(name) {
  let p = partitions.get(name);
  if (!p) {
    p = { revision: 0n, created: 0n, entries: new Map(), feed: [], completeAfter: 0n, meters: new Map() };
    partitions.set(name, p);
  }
  return p;
}

// No revision is below the store time in microseconds, as in the Rust stores:
// a partition that starts afresh (a new process) issues revisions above every
// one an earlier incarnation issued.
function record(p, kind, key, value, at) {
  const floor = at * 1000n;
  if (p.revision === 0n) {
    // A new incarnation: its feed is complete from here on.
    p.created = floor > 0n ? floor - 1n : 0n;
    p.completeAfter = p.created;
    p.revision = p.created;
  }
  p.revision = p.revision + 1n > floor ? p.revision + 1n : floor;
  p.feed.push({ kind, key, value, revision: p.revision, at });
  while (p.feed.length > HISTORY) p.completeAfter = p.feed.shift().revision;
  return p.revision;
}

function sweep(p, now) {
  const due = [...p.entries.values()]
    .filter((e) => e.expiresAt !== undefined && e.expiresAt <= now)
    .sort((a, b) => (a.expiresAt < b.expiresAt ? -1 : a.expiresAt > b.expiresAt ? 1 : a.key < b.key ? -1 : 1));
  for (const e of due) {
    p.entries.delete(e.key);
    record(p, 'expire', e.key, new Uint8Array(), e.expiresAt);
  }
}

function open(name) {
  stats.opens += 1;
  const now = clock();
  const p = partition(name);
  sweep(p, now);
  return [p, now];
}

function equalBytes(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function holds(e, condition) {
  switch (condition.tag) {
    case 'always': return true;
    case 'absent': return e === undefined;
    case 'revision': return e !== undefined && e.revision === condition.val;
    case 'revision-and-value':
      return e !== undefined && e.revision === condition.val.revision && equalBytes(e.value, condition.val.value);
    // The count is put's to check: a delete or touch of a live key never holds.
    case 'absent-and-fewer-than': return e === undefined;
  }
  throw { tag: 'invalid', val: `condition: unknown tag ${condition.tag}` };
}

// The live entry that expires first; one without an expiry only when none
// has one (absent-and-fewer-than's conflict).
function firstToExpire(p) {
  let first;
  for (const e of p.entries.values()) {
    const sooner = e.expiresAt !== undefined && (first?.expiresAt === undefined || e.expiresAt < first.expiresAt);
    if (first === undefined || sooner) first = e;
  }
  return first;
}

const copy = (e) => (e === undefined ? undefined : { ...e });

export function now() {
  return clock();
}

export function get(name, key) {
  const [p, now] = open(name);
  return { entry: copy(p.entries.get(key)), now };
}

export function list(name, prefix) {
  const [p, now] = open(name);
  const entries = [...p.entries.values()].filter((e) => e.key.startsWith(prefix)).sort((a, b) => (a.key < b.key ? -1 : 1));
  return { entries: entries.map(copy), revision: p.revision, now };
}

export function put(name, key, value, ttlMs, condition) {
  const [p, now] = open(name);
  const current = p.entries.get(key);
  if (!holds(current, condition)) return { outcome: { tag: 'conflict', val: copy(current) }, now, revision: p.revision };
  if (condition.tag === 'absent-and-fewer-than' && p.entries.size >= condition.val) {
    return { outcome: { tag: 'conflict', val: copy(firstToExpire(p)) }, now, revision: p.revision };
  }
  const revision = record(p, 'put', key, value, now);
  const entry = { key, value, revision, updatedAt: now, expiresAt: ttlMs === undefined ? undefined : now + ttlMs };
  p.entries.set(key, entry);
  return { outcome: { tag: 'applied', val: copy(entry) }, now, revision: p.revision };
}

function remove(name, key, condition) {
  const [p, now] = open(name);
  const current = p.entries.get(key);
  if (current === undefined || !holds(current, condition)) return { outcome: { tag: 'conflict', val: copy(current) }, now, revision: p.revision };
  p.entries.delete(key);
  record(p, 'delete', key, new Uint8Array(), now);
  return { outcome: { tag: 'applied', val: copy(current) }, now, revision: p.revision };
}
export { remove as delete };

export function touch(name, key, ttlMs, condition) {
  const [p, now] = open(name);
  const current = p.entries.get(key);
  if (current === undefined || !holds(current, condition)) return { outcome: { tag: 'conflict', val: copy(current) }, now, revision: p.revision };
  current.expiresAt = now + ttlMs;
  return { outcome: { tag: 'applied', val: copy(current) }, now, revision: p.revision };
}

export function changes(name, after, max) {
  // An unwatched partition (a lock's, a lease's) keeps no feed (wit/store.wit).
  if (name.startsWith('~')) throw { tag: 'invalid', val: `partition: ${JSON.stringify(name)} is unwatched, so no change feed is kept for it` };
  const [p, now] = open(name);
  // 0 reads from this incarnation's first change.
  if (after === 0n) after = p.created;
  if (after < p.completeAfter || after > p.revision) throw { tag: 'history-gone', val: p.completeAfter };
  const page = p.feed.filter((c) => c.revision > after).slice(0, max);
  return { changes: page.map((c) => ({ ...c })), revision: p.revision, now };
}

// How many times a wait slept, for the tests: a wait that spins instead of
// sleeping shows as many store calls and few sleeps.
export const stats = { sleeps: 0, opens: 0 };

// Block the thread for `ms` milliseconds (a bigint).
const sleeper = new Int32Array(new SharedArrayBuffer(4));
function sleep(ms) {
  if (ms <= 0n) return;
  stats.sleeps += 1;
  Atomics.wait(sleeper, 0, 0, Number(ms));
}

// The earliest expiry in the partition, if any entry has a TTL.
function nextExpiry(p) {
  let next;
  for (const e of p.entries.values()) {
    if (e.expiresAt !== undefined && (next === undefined || e.expiresAt < next)) next = e.expiresAt;
  }
  return next;
}

// Block until the partition's revision passes `after`, an entry's TTL runs
// out (which records an expiry, so the revision moves) or `timeoutMs`
// passes; the latest revision.
export function wait(name, after, timeoutMs) {
  let [p, now] = open(name);
  const deadline = now + timeoutMs;
  while (p.revision <= after && now < deadline) {
    const expiry = nextExpiry(p);
    sleep((expiry !== undefined && expiry < deadline ? expiry : deadline) - now);
    [p, now] = open(name);
  }
  return p.revision;
}

// `wait` above, then the put, whichever way the wait ended. An expiry ends
// the wait too (the contract allows an early end; the put decides).
export function waitThenPut(name, key, value, ttlMs, condition, after, timeoutMs) {
  wait(name, after, timeoutMs);
  return put(name, key, value, ttlMs, condition);
}

// The rate-limit meter: component/src/meter.rs, in BigInt arithmetic.
const max = (a, b) => (a > b ? a : b);
const ceilDiv = (a, b) => (a + b - 1n) / b;

function decide(state, algorithm, l, w, n, now) {
  if (algorithm === 'fixed-window') {
    const start = now - (now % w);
    const count = state && state.a === start ? state.b : 0n;
    const allowed = count + n <= l;
    const before = max(l - count, 0n);
    const resetIn = start + w - now;
    return { allowed, after: allowed ? l - count - n : before, before, resetIn, retry: allowed ? 0n : resetIn,
      next: { a: start, b: count + n, c: 0n }, ttl: resetIn };
  }
  if (algorithm === 'sliding-window') {
    const windowStart = now - (now % w);
    let [start, curr, prev] = state ? [state.a, state.b, state.c] : [windowStart, 0n, 0n];
    if (start !== windowStart) {
      prev = windowStart === start + w ? curr : 0n;
      curr = 0n;
      start = windowStart;
    }
    const estimate = prev * (w - (now - start)) + curr * w;
    const allowed = estimate + n * w <= l * w;
    const before = max(l * w - estimate, 0n) / w;
    let retry = 0n;
    if (!allowed) {
      const room = l - n - curr;
      const t = room >= 0n && prev > 0n ? start + w - (room * w) / prev : undefined;
      if (t !== undefined && t < start + w) retry = max(t - now, 0n);
      else retry = start + w + (curr === 0n ? 0n : max(w - ((l - n) * w) / curr, 0n)) - now;
    }
    return { allowed, after: allowed ? (l * w - estimate - n * w) / w : before, before, resetIn: start + w - now, retry,
      next: { a: start, b: curr + n, c: prev }, ttl: start + 2n * w - now };
  }
  let [tat, frac] = state ? [state.a, state.b] : [0n, 0n];
  if (tat < now) [tat, frac] = [now, 0n];
  const used = (tat - now) * l + frac;
  const increment = n * w;
  let [nextTat, nextFrac] = [tat + increment / l, frac + (increment % l)];
  if (nextFrac >= l) [nextTat, nextFrac] = [nextTat + 1n, nextFrac - l];
  const usedAfter = (nextTat - now) * l + nextFrac;
  const capacity = w * l;
  const allowed = usedAfter <= capacity;
  const before = max(capacity - used, 0n) / w;
  return { allowed, after: allowed ? (capacity - usedAfter) / w : before, before,
    resetIn: ceilDiv(allowed ? usedAfter : used, l), retry: allowed ? 0n : ceilDiv(usedAfter - capacity, l),
    next: { a: nextTat, b: nextFrac, c: 0n }, ttl: ceilDiv(usedAfter, l) };
}

// A refund: give back n units counted at `at` where the state still counts
// them (meter.rs, `refund`); the refunded state and its TTL, or undefined.
function refund(state, algorithm, l, w, n, at, now) {
  if (state === undefined) return undefined;
  const start = now - (now % w);
  const atStart = at - (at % w);
  const { a, b, c } = state;
  if (algorithm === 'fixed-window') {
    if (a !== start || atStart !== start) return undefined;
    return { state: { a: start, b: max(b - n, 0n), c: 0n }, ttl: start + w - now };
  }
  if (algorithm === 'sliding-window') {
    let [curr, prev] = a === start ? [b, c] : start === a + w ? [0n, b] : [0n, 0n];
    if (atStart === start) curr = max(curr - n, 0n);
    else if (atStart + w === start) prev = max(prev - n, 0n);
    return { state: { a: start, b: curr, c: prev }, ttl: start + 2n * w - now };
  }
  if (a < now) return undefined;
  const used = max((a - now) * l + b - n * w, 0n);
  return { state: { a: now + used / l, b: used % l, c: 0n }, ttl: ceilDiv(used, l) };
}

export function meter(name, key, request) {
  const [p, now] = open(name);
  // meter-mode is a variant: {tag}, and {tag: 'refund', val: at}.
  const mode = request.mode.tag;
  const stored = p.meters.get(key);
  let live = mode !== 'reset' && stored && stored.expiresAt > now ? stored.state : undefined;
  const [l, w, n] = [BigInt(request.limit), request.windowMs, BigInt(request.cost)];
  if (mode === 'refund') {
    const refunded = refund(live, request.algorithm, l, w, n, request.mode.val, now);
    if (refunded !== undefined) {
      live = refunded.state;
      p.meters.set(key, { state: live, expiresAt: now + max(refunded.ttl, 1n) });
    }
  }
  const d = decide(live, request.algorithm, l, w, n, now);
  // A charge counts as a consume does, and counts even what does not fit.
  const force = mode === 'charge';
  const consume = mode === 'consume' || force;
  if (mode === 'reset') p.meters.delete(key);
  else if (consume && (d.allowed || force)) p.meters.set(key, { state: d.next, expiresAt: now + max(d.ttl, 1n) });
  if (force && !d.allowed) {
    const resetInMs = request.algorithm === 'gcra' ? d.ttl : d.resetIn;
    return { allowed: true, remaining: 0, resetInMs, retryAfterMs: 0n, now };
  }
  const remaining = !consume && d.allowed ? d.before : d.after;
  return { allowed: d.allowed, remaining: Number(remaining), resetInMs: d.resetIn, retryAfterMs: d.retry, now };
}
