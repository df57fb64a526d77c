// An edge function in JavaScript that coordinates through coord: the
// inventory routes of examples/inventory-fn, over wasi:http with JSON bodies.
// The routes are the Python example's (examples/py-fn/app.py has the table).
//
// StarlingMonkey answers `wasi:http/incoming-handler` with the `fetch` event;
// coord's interfaces are plain imports. Their u64s are BigInts, variants are
// `{ tag, val }`, and an `err` result is thrown with the error in `payload`.
// Fences and revisions go out as JSON strings (64-bit); the stock records are
// the Rust example's (same store partition and JSON), so functions in either
// language, on one Redis, share items, locks and limits.

import * as lock from 'coord:sync/lock@0.1.0';
import * as ratelimit from 'coord:sync/ratelimit@0.1.0';
import * as ephemeral from 'coord:sync/ephemeral@0.1.0';
import * as store from 'coord:sync/store@0.1.0';

const LOCK_ID = 'inventory.stock';
const LOCK_TTL_MS = 10_000;
const MAX_WAIT_MS = 30_000;
const MAX_ITEM_BYTES = 64;
const MAX_SESSION_BYTES = 128;
const MAX_BODY_BYTES = 16 * 1024;

// The stock table, as the Rust example keeps it: each item's record in a
// partition of its own (unwatched: `~`), under the key `record`, and every
// item named in an index partition before its first record.
const recordPartition = (item) => `~inventory-record:${item}`;
const RECORD_KEY = 'record';
const ITEMS = 'inventory-items';
const INITIAL_STOCK = 100;
const MAX_RACES = 16;

const EXPORTS = {
  id: 'inventory.exports',
  limit: 10,
  windowMs: 60_000n,
  algorithm: 'sliding-window',
};

const EDITORS_ID = 'inventory.editors';
const EDITOR_TTL_MS = 30_000;
const MIN_EDITOR_TTL_MS = 100;
const MAX_EDITOR_TTL_MS = 300_000;
const MAX_EDITOR_BYTES = 4096;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A reply to send instead, thrown while reading a request. */
class Refusal extends Error {
  constructor(reply) {
    super(reply.body.error);
    this.reply = reply;
  }
}

const reply = (status, body, headers = {}) => ({ status, body, headers });
const error = (status, field, reason, extra = {}) =>
  reply(status, { error: reason, field, ...extra });

addEventListener('fetch', (event) => event.respondWith(handle(event.request)));

async function handle(request) {
  let out;
  try {
    out = route(await readRequest(request));
  } catch (e) {
    if (e instanceof Refusal) out = e.reply;
    else if (e && e.payload !== undefined) out = coordError(e.payload);
    else out = error(500, 'function', String(e));
  }
  return new Response(JSON.stringify(out.body) + '\n', {
    status: out.status,
    headers: { 'content-type': 'application/json', ...out.headers },
  });
}

async function readRequest(request) {
  const url = new URL(request.url);
  const body = new Uint8Array(await request.arrayBuffer());
  if (body.length > MAX_BODY_BYTES) {
    throw new Refusal(error(413, 'body', `larger than ${MAX_BODY_BYTES} bytes`));
  }
  return {
    method: request.method.toUpperCase(),
    segments: url.pathname.split('/').filter((s) => s).map(decodeURIComponent),
    query: url.searchParams,
    headers: request.headers,
    body,
  };
}

function route(req) {
  const s = req.segments;
  // Whether the path is `parts`, `null` matching any one segment.
  const is = (method, ...parts) =>
    req.method === method &&
    parts.length === s.length &&
    parts.every((part, i) => part === null || part === s[i]);
  if (is('GET', 'items', null)) return show(checkedItem(s[1]));
  if (is('POST', 'items', null, 'adjust')) return adjust(req, checkedItem(s[1]));
  if (is('POST', 'items', null, 'lock')) return hold(req, checkedItem(s[1]));
  if (is('DELETE', 'items', null, 'lock')) return release(req, checkedItem(s[1]));
  if (is('POST', 'exports')) return exportAll(req);
  if (is('GET', 'items', null, 'editors')) return editors(checkedItem(s[1]));
  if (is('PUT', 'items', null, 'editors', null)) {
    return join(req, checkedItem(s[1]), checkedSession(s[3]));
  }
  if (is('DELETE', 'items', null, 'editors', null)) {
    return leave(checkedItem(s[1]), checkedSession(s[3]));
  }
  return error(404, 'path', `no route for ${req.method} /${s.join('/')}`);
}

// --- input -------------------------------------------------------------------

function checkedItem(item) {
  const bytes = encoder.encode(item).length;
  if (bytes < 1 || bytes > MAX_ITEM_BYTES) {
    throw new Refusal(error(400, 'item', `1 to ${MAX_ITEM_BYTES} bytes`));
  }
  return item;
}

function checkedSession(session) {
  const bytes = encoder.encode(session).length;
  if (bytes < 1 || bytes > MAX_SESSION_BYTES) {
    throw new Refusal(error(400, 'session', `1 to ${MAX_SESSION_BYTES} bytes`));
  }
  return session;
}

/** The query parameter `name` as a whole number in [low, high]. */
function intParam(req, name, low, high, fallback) {
  const text = req.query.get(name);
  if (text === null) {
    if (fallback === undefined) throw new Refusal(error(400, name, 'required'));
    return fallback;
  }
  if (!/^[+-]?\d+$/.test(text.trim())) {
    throw new Refusal(error(400, name, 'not a whole number'));
  }
  const value = Number(text);
  if (!(value >= low && value <= high)) {
    throw new Refusal(error(400, name, `${low} to ${high}`));
  }
  return value;
}

function jsonBody(req) {
  try {
    return JSON.parse(decoder.decode(req.body));
  } catch {
    throw new Refusal(error(400, 'body', 'not JSON'));
  }
}

// --- stock under a fenced lock ----------------------------------------------

const resource = (item) => `item:${item}`;

function show(item) {
  const { record } = readRecord(item);
  return reply(200, stockJson(item, record));
}

function adjust(req, item) {
  const delta = intParam(req, 'delta', -(2 ** 53), 2 ** 53);
  const waitMs = intParam(req, 'wait_ms', 0, MAX_WAIT_MS, 0);
  const wait = waitMs ? { tag: 'timeout', val: BigInt(waitMs) } : { tag: 'no-wait' };
  const outcome = lock.acquire(LOCK_ID, resource(item), {
    ttlMs: BigInt(LOCK_TTL_MS),
    wait,
  });
  if (outcome.tag === 'busy') return busy(outcome.val);
  const held = outcome.val;
  try {
    return write(item, delta, held.fence);
  } finally {
    // A failed release leaves the lock to its TTL: the write is decided.
    try {
      lock.release(held);
    } catch {}
  }
}

/** Add `delta` to the stock if `fence` (a BigInt) is not older than the
 * newest one written: a compare-and-set on the record's revision, so the
 * check and the write are one step. */
function write(item, delta, fence) {
  if (fence > BigInt(Number.MAX_SAFE_INTEGER)) {
    return error(500, 'fence', 'beyond what this function stores exactly');
  }
  for (let race = 0; race < MAX_RACES; race++) {
    const { record, condition } = readRecord(item);
    if (fence < BigInt(record.fence)) {
      return error(409, 'fence', 'stale fence: a newer holder wrote', {
        fence: String(fence),
        newestFence: String(record.fence),
      });
    }
    const stock = record.stock + delta;
    if (stock < 0) {
      return error(409, 'delta', 'insufficient stock', { stock: record.stock });
    }
    const next = { ...record, stock, fence: Number(fence) };
    if (condition.tag === 'absent' && store.get(ITEMS, item).entry === undefined) {
      // A conflict means another request named it first: as good.
      store.put(ITEMS, item, new Uint8Array(), undefined, { tag: 'absent' });
    }
    const written = store.put(
      recordPartition(item),
      RECORD_KEY,
      encoder.encode(JSON.stringify(next)),
      undefined,
      condition,
    );
    if (written.outcome.tag === 'applied') return reply(200, stockJson(item, next));
    // Another write landed between the read and this one: read again.
  }
  return error(503, 'store', `the record of ${item} kept changing`);
}

/** The item's record and the condition that it is still the one read. */
function readRecord(item) {
  const { entry } = store.get(recordPartition(item), RECORD_KEY);
  if (entry === undefined) {
    return { record: { stock: INITIAL_STOCK, fence: 0 }, condition: { tag: 'absent' } };
  }
  return {
    record: JSON.parse(decoder.decode(entry.value)),
    condition: { tag: 'revision', val: entry.revision },
  };
}

const stockJson = (item, record) => ({
  item,
  stock: record.stock,
  fence: String(record.fence),
});

function busy(holder) {
  const seconds = Math.max(1, Math.ceil(Number(holder.remainingMs) / 1000));
  return reply(
    409,
    {
      error: "busy: another request holds the item's lock",
      holderFence: String(holder.fence),
      retryAfterMs: Number(holder.remainingMs),
    },
    { 'retry-after': String(seconds) },
  );
}

function hold(req, item) {
  const ttlMs = intParam(req, 'ttl_ms', 1, 86_400_000, LOCK_TTL_MS);
  const outcome = lock.acquire(LOCK_ID, resource(item), {
    ttlMs: BigInt(ttlMs),
    wait: { tag: 'no-wait' },
  });
  if (outcome.tag === 'busy') return busy(outcome.val);
  const held = outcome.val;
  return reply(200, {
    id: held.id,
    resource: held.resource,
    owner: held.owner,
    fence: String(held.fence),
    ttlMs: Number(held.ttlMs),
    expiresAt: Number(held.expiresAt),
  });
}

function release(req, item) {
  const body = jsonBody(req);
  if (typeof body?.owner !== 'string') {
    return error(400, 'body.owner', "the held lock's owner token");
  }
  let fence = 0n;
  try {
    fence = BigInt(body.fence);
  } catch {}
  if (fence < 1n || fence >= 2n ** 64n) {
    return error(400, 'body.fence', "the held lock's fence, a decimal string");
  }
  const released = lock.release({
    id: LOCK_ID,
    resource: resource(item),
    owner: body.owner,
    fence,
    ttlMs: BigInt(LOCK_TTL_MS),
    expiresAt: 0n,
  });
  return reply(200, { released });
}

// --- rate-limited exports ------------------------------------------------------

function exportAll(req) {
  const user = req.headers.get('x-user-id') ?? '';
  if (!user) return error(400, 'x-user-id', 'the x-user-id header is required');
  const decision = ratelimit.check(EXPORTS, `user:${user}`, undefined);
  const headers = {
    'ratelimit-limit': String(decision.limit),
    'ratelimit-remaining': String(decision.remaining),
    'ratelimit-reset': String(Math.ceil(Number(decision.resetInMs) / 1000)),
  };
  if (!decision.allowed) {
    const retryAfterMs = Number(decision.retryAfterMs);
    return reply(
      429,
      { error: 'too many exports', retryAfterMs },
      { ...headers, 'retry-after': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) },
    );
  }
  const items = store.list(ITEMS, '').entries.map((entry) => stockJson(entry.key, readRecord(entry.key).record));
  return reply(200, { items, remaining: decision.remaining }, headers);
}

// --- editors' presence -----------------------------------------------------------

const space = (ttlMs = EDITOR_TTL_MS) => ({
  id: EDITORS_ID,
  ttlMs: BigInt(ttlMs),
  maxValueBytes: MAX_EDITOR_BYTES,
});

function join(req, item, session) {
  const ttlMs = intParam(req, 'ttl_ms', MIN_EDITOR_TTL_MS, MAX_EDITOR_TTL_MS, EDITOR_TTL_MS);
  jsonBody(req); // any JSON the editor sends, kept as it came
  const written = ephemeral.upsert(space(ttlMs), item, session, req.body);
  return reply(200, {
    revision: String(written.revision),
    updatedAt: Number(written.updatedAt),
  });
}

function leave(item, session) {
  return reply(200, { deleted: ephemeral.delete(space(), item, session) });
}

function editors(item) {
  const snapshot = ephemeral.snapshot(space(), item, undefined);
  return reply(200, {
    editors: snapshot.entries.map((entry) => ({
      session: entry.key,
      value: JSON.parse(decoder.decode(entry.value)),
      revision: String(entry.revision),
      updatedAt: Number(entry.updatedAt),
    })),
    revision: String(snapshot.revision),
  });
}

// --- coord's errors ----------------------------------------------------------------

/** A coord or store error as a reply: a rejected argument is the caller's 400
 * naming coord's field; an unreachable store is 503. */
function coordError(payload) {
  switch (payload.tag) {
    case 'invalid-argument':
      return error(400, payload.val.field, payload.val.reason);
    case 'unavailable':
    case 'history-gone':
      return error(503, 'store', `unavailable: ${payload.val}`);
    default:
      return error(500, 'store', `${payload.tag}: ${payload.val}`);
  }
}
