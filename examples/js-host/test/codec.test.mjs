// The Redis layout and wire format against the Rust backend's
// (host-test/redis/src), through the vectors its codec generates
// (host-test/redis/vectors.json): the keys, the scripts as loaded, the
// arguments and the replies. The last tests need Redis and fail without it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as codec from '../redis-codec.js';
import { redisStore } from '../redis-store.js';
import { REDIS_URL, directClient, dropKeys, uniquePrefix } from './redis-env.js';

const scripts = new URL('../../../host-test/redis/', import.meta.url);
const lua = (name) => readFileSync(new URL(name, scripts), 'utf8');

// The vectors the Rust codec generates (host-test/redis/src/vectors.rs):
// the same inputs must give the same bytes, and the same bytes the same
// reading, here as there.
const vectors = JSON.parse(readFileSync(new URL('vectors.json', scripts), 'utf8'));
const bytes = (hex) => (hex === null || hex === undefined ? undefined : new Uint8Array(Buffer.from(hex, 'hex')));
const big = (n) => (n === null || n === undefined ? undefined : BigInt(n));
const arg = (a) => (a.text !== undefined ? a.text : Buffer.from(a.hex, 'hex'));
const shownArg = (a) => (typeof a === 'string' ? { text: a } : { hex: Buffer.from(a).toString('hex') });
const condition = (c) => {
  if (c === null) return undefined;
  if (c.kind === 'always' || c.kind === 'absent') return { tag: c.kind };
  if (c.kind === 'revision') return { tag: 'revision', val: BigInt(c.revision) };
  if (c.kind === 'absent-and-fewer-than') return { tag: c.kind, val: c.limit };
  return { tag: 'revision-and-value', val: { revision: BigInt(c.revision), value: bytes(c.value_hex) } };
};
const entry = (e) => e && {
  key: e.key, value: bytes(e.value_hex), revision: BigInt(e.revision),
  updatedAt: BigInt(e.updated_at), expiresAt: big(e.expires_at),
};
// What a reader gives, or {error: 'unavailable'} when it refuses the bytes.
const reading = (read) => {
  try {
    return read();
  } catch (e) {
    if (e && e.tag === 'unavailable') return { error: 'unavailable' };
    throw e;
  }
};

test('keys are the Rust backend\'s, escaping and all (vectors)', () => {
  assert.ok(vectors.keys.length > 0);
  for (const v of vectors.keys) assert.equal(codec.key(v.prefix, v.partition, v.part), v.key, v.partition);
});

test('the scripts are loaded behind the Rust backend\'s configuration line, so their SHA-1s are its (vectors)', () => {
  // This host talks to one server: the cluster's configuration (SPUBLISH, no wake stream) is the Rust host's alone.
  const single = vectors.scripts.filter((v) => !v.cluster);
  assert.ok(single.length > 0);
  for (const v of single) {
    const config = { history: v.history, retentionMs: v.retention_ms };
    const store = codec.storeScript(lua('redis.lua'), config);
    assert.equal(store.split('\n')[0], v.store_line);
    assert.equal(codec.sha1(store), v.store_sha);
    const unwatched = codec.unwatchedScript(lua('unwatched.lua'), config);
    assert.equal(unwatched.split('\n')[0], v.unwatched_line);
    assert.equal(codec.sha1(unwatched), v.unwatched_sha);
  }
  assert.equal(codec.sha1(lua('meter.lua')), vectors.meter_sha);
});

test('every store call sends the Rust backend\'s arguments, byte for byte (vectors)', () => {
  assert.ok(vectors.calls.length > 0);
  for (const v of vectors.calls) {
    const call = codec.scriptCall(v.prefix, v.partition, v.op, {
      key: v.key, value: bytes(v.value_hex), ttlMs: big(v.ttl_ms),
      condition: condition(v.condition), after: BigInt(v.after), max: v.max,
    });
    assert.equal(call.script, v.script, `the script for ${v.partition}`);
    assert.deepEqual(call.args.map(shownArg), v.args, `${v.op} on ${v.partition}`);
  }
});

test('a meter request is packed as the Rust backend packs it (vectors)', () => {
  for (const v of vectors.meter_requests.filter((r) => r.clock === -1)) {
    const args = codec.meterCall('coord', 'rl:1:a:b', 'k', {
      algorithm: v.algorithm, mode: v.refund_at === null ? { tag: v.mode } : { tag: v.mode, val: BigInt(v.refund_at) },
      limit: v.limit, windowMs: BigInt(v.window_ms), cost: v.cost,
    });
    assert.equal(Buffer.from(args[2]).toString('hex'), v.packed_hex, `${v.algorithm} ${v.mode}`);
  }
});

test('write replies, listings, pages and meter replies read as the Rust codec reads them (vectors)', () => {
  for (const v of vectors.write_replies) {
    const reply = v.packed_hex !== undefined ? Buffer.from(v.packed_hex, 'hex')
      : v.array.map((a) => (typeof a === 'number' ? a : Buffer.from(a.hex, 'hex')));
    const got = reading(() => codec.readWrite(reply, v.key, bytes(v.sent_hex)));
    const want = v.reads_as.error ? v.reads_as : {
      now: BigInt(v.reads_as.now),
      revision: BigInt(v.reads_as.revision),
      outcome: { tag: v.reads_as.applied ? 'applied' : 'conflict', val: entry(v.reads_as.entry) ?? undefined },
    };
    assert.deepEqual(got, want, v.packed_hex ?? JSON.stringify(v.array));
  }
  for (const v of vectors.listings) {
    const got = reading(() => codec.readList(Buffer.from(v.packed_hex, 'hex')));
    const want = v.reads_as.error ? v.reads_as : {
      entries: v.reads_as.entries.map(entry), revision: BigInt(v.reads_as.revision), now: BigInt(v.reads_as.now),
    };
    assert.deepEqual(got, want, v.packed_hex);
  }
  for (const v of vectors.pages) {
    const got = reading(() => codec.readChanges(Buffer.from(v.packed_hex, 'hex')));
    const want = v.reads_as.error ? v.reads_as : {
      changes: v.reads_as.changes.map((c) => ({
        kind: c.kind, key: c.key, value: bytes(c.value_hex), revision: BigInt(c.revision), at: BigInt(c.at),
      })),
      revision: BigInt(v.reads_as.revision), now: BigInt(v.reads_as.now),
    };
    assert.deepEqual(got, want, v.packed_hex);
  }
  for (const v of vectors.meter_replies) {
    const got = reading(() => codec.readMeter(Buffer.from(v.packed_hex, 'hex')));
    const r = v.reads_as;
    const want = r.error ? r : {
      allowed: r.allowed, remaining: r.remaining, resetInMs: BigInt(r.reset_in_ms),
      retryAfterMs: BigInt(r.retry_after_ms), now: BigInt(r.now),
    };
    assert.deepEqual(got, want, v.packed_hex);
  }
});

test("a changes reply from past the history is history-gone with the script's revision", () => {
  assert.throws(() => codec.readChanges([1000, 90, 80, 0]), (e) => e.tag === 'history-gone' && e.val === 80n);
});

test('the SHA-1s this host sends are the ones Redis has for the project scripts', async () => {
  const prefix = uniquePrefix('codec');
  const store = redisStore(REDIS_URL, { prefix });
  const redis = await directClient();
  try {
    // One call per script (NOSCRIPT loads them if this Redis never saw them).
    store.get('eph:1:a:b', 'k');
    store.get('~lock:1:a:b', 'k');
    store.meter('rl:1:a:b', 'k', { algorithm: 'gcra', limit: 1, windowMs: 1000n, cost: 1, mode: { tag: 'peek' } });
    const shas = [
      codec.sha1(codec.storeScript(lua('redis.lua'), codec.DEFAULTS)),
      codec.sha1(codec.unwatchedScript(lua('unwatched.lua'), codec.DEFAULTS)),
      codec.sha1(lua('meter.lua')),
    ];
    assert.deepEqual(await redis.scriptExists(shas), [1, 1, 1]);
  } finally {
    await redis.close();
    await store.close();
    await dropKeys(prefix);
  }
});

test('a script this Redis has never seen is loaded on NOSCRIPT, and the call goes through', async () => {
  const prefix = uniquePrefix('noscript');
  // A retention no other run uses: a script text, and SHA-1, Redis cannot have.
  const retentionMs = 600000 + 1 + Math.floor(Math.random() * 1e6);
  const store = redisStore(REDIS_URL, { prefix, retentionMs });
  const redis = await directClient();
  try {
    const sha = codec.sha1(codec.unwatchedScript(lua('unwatched.lua'), { retentionMs }));
    assert.deepEqual(await redis.scriptExists([sha]), [0]);
    const trips = store.stats.roundTrips;
    const written = store.put('~lock:1:a:b', 'holder', new Uint8Array([1]), 1000n, { tag: 'absent' });
    assert.equal(written.outcome.tag, 'applied');
    // EVALSHA, two SCRIPT LOADs (both store scripts), EVALSHA again (after connecting).
    assert.equal(store.stats.roundTrips - trips, 4);
    assert.deepEqual(await redis.scriptExists([sha]), [1]);
  } finally {
    await redis.close();
    await store.close();
    await dropKeys(prefix);
  }
});
