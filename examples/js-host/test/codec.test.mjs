// The Redis layout and wire format against the Rust backend's
// (host-test/redis/src): the keys, the scripts as loaded, the
// packed arguments and replies. The last test needs Redis and fails without it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as codec from '../redis-codec.js';
import { redisStore } from '../redis-store.js';
import { REDIS_URL, directClient, dropKeys, uniquePrefix } from './redis-env.js';

const scripts = new URL('../../../host-test/redis/', import.meta.url);
const lua = (name) => readFileSync(new URL(name, scripts), 'utf8');

test('keys are <prefix>:{p:<partition, escaped>}:<part>, as RedisBackend::key makes them', () => {
  assert.equal(codec.key('coord', '~lock:15:inventory.stock:item:1', 's'), 'coord:{p:~lock:15:inventory.stock:item:1}:s');
  assert.equal(codec.key('coord', 'eph:1:a:{b}%', 'e'), 'coord:{p:eph:1:a:%7Bb%7D%25}:e');
  // Escaping `%` first keeps distinct partitions apart.
  assert.notEqual(codec.key('c', '%7B', 'e'), codec.key('c', '{', 'e'));
});

test('the scripts are loaded behind the Rust backend configuration line, byte for byte', () => {
  const store = codec.storeScript('BODY', codec.DEFAULTS);
  assert.equal(store, "local HISTORY, RETENTION, PUBLISH = '1024', 600000, 'PUBLISH'\nBODY");
  const unwatched = codec.unwatchedScript('BODY', codec.DEFAULTS);
  assert.equal(unwatched, "local RETENTION, PUBLISH, STREAM = 600000, 'PUBLISH', true\nBODY");
});

test("unwatched.lua's packed argument: op, condition, three doubles, three byte strings", () => {
  const call = codec.scriptCall('coord', '~lock:1:a:b', 'touch', {
    key: 'holder',
    ttlMs: 500n,
    condition: { tag: 'revision-and-value', val: { revision: 7n, value: new Uint8Array([1, 2]) } },
  });
  assert.equal(call.script, 'unwatched');
  assert.deepEqual(call.args.slice(0, 2), ['1', 'coord:{p:~lock:1:a:b}:s']);
  const p = call.args[2];
  assert.deepEqual([p[0], p[1]], [3, 4]);
  assert.deepEqual([p.readDoubleLE(2), p.readDoubleLE(10), p.readDoubleLE(18)], [-1, 500, 7]);
  assert.equal(p.readUInt32LE(26), 6);
  assert.equal(p.subarray(30, 36).toString(), 'holder');
  assert.equal(p.readUInt32LE(36), 0, 'a touch sends no value');
  assert.equal(p.readUInt32LE(40), 2);
  assert.deepEqual([...p.subarray(44)], [1, 2]);
});

test("redis.lua's text arguments: keys, op, clock, channel, then only the op's own", () => {
  const call = codec.scriptCall('coord', 'eph:1:a:b', 'put', {
    key: 'k',
    value: new Uint8Array([104]),
    ttlMs: undefined,
    condition: { tag: 'revision', val: 42n },
  });
  assert.equal(call.script, 'store');
  const [n, e, x, f, op, clock, w, k, v, ttl, ...condition] = call.args;
  assert.deepEqual([n, e, x, f, op, clock, w], ['3', 'coord:{p:eph:1:a:b}:e', 'coord:{p:eph:1:a:b}:x', 'coord:{p:eph:1:a:b}:f', 'put', '', 'coord:{p:eph:1:a:b}:w']);
  assert.deepEqual([k, v.toString(), ttl, ...condition], ['k', 'h', '-1', 'revision', '42']);
});

test('an applied write reply takes its value from the reply, or from the call when left out', () => {
  const packed = (withValue, numbers, value) => {
    const b = Buffer.alloc(33 + value.length);
    b[0] = withValue;
    numbers.forEach((n, i) => b.writeDoubleLE(n, 1 + 8 * i));
    b.set(value, 33);
    return b;
  };
  const fromReply = codec.readWrite(packed(1, [1000, 1e6, 999, 5000], Buffer.from('v')), 'k', undefined);
  assert.deepEqual(fromReply, { now: 1000n, outcome: { tag: 'applied', val: { key: 'k', value: new Uint8Array([118]), revision: 1000000n, updatedAt: 999n, expiresAt: 5000n } } });
  const fromCall = codec.readWrite(packed(0, [1000, 1e6, 999, -1], Buffer.alloc(0)), 'k', new Uint8Array([7]));
  assert.deepEqual(fromCall.outcome.val.value, new Uint8Array([7]));
  assert.equal(fromCall.outcome.val.expiresAt, undefined);
  assert.throws(() => codec.readWrite(packed(0, [1, 1, 1, 1], Buffer.alloc(0)), 'k', undefined), (e) => e.tag === 'unavailable');
  const conflict = codec.readWrite([1000, 0, 1, Buffer.from('k'), Buffer.from('x'), 5, 4, -1], 'k', undefined);
  assert.deepEqual(conflict.outcome, { tag: 'conflict', val: { key: 'k', value: new Uint8Array([120]), revision: 5n, updatedAt: 4n, expiresAt: undefined } });
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
    store.meter('rl:1:a:b', 'k', { algorithm: 'gcra', limit: 1, windowMs: 1000n, cost: 1, mode: 'peek' });
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
