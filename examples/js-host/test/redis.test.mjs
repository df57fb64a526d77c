// coord.wasm on the Redis store: the lock, ephemeral state and the rate
// limiter through Redis, with a second host process sharing them. Redis must
// answer at REDIS_URL (default redis://127.0.0.1:6379): if it does not,
// these tests fail, they do not skip.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { useStore } from '../host-store.js';
import { redisStore } from '../redis-store.js';
import { key } from '../redis-codec.js';
import { REDIS_URL, directClient, dropKeys, secondHost, uniquePrefix } from './redis-env.js';

const prefix = uniquePrefix('redis');
const store = redisStore(REDIS_URL, { prefix });
useStore(store);
// Imported after useStore only for clarity: the store is looked up per call.
const { lock, ephemeral, ratelimit } = await import('../component.js');

after(async () => {
  await dropKeys(prefix);
  await store.close();
});

const noWait = { ttlMs: 10000n, wait: { tag: 'no-wait' } };
const bytes = (s) => new TextEncoder().encode(s);
const text = (b) => new TextDecoder().decode(b);

test('Redis answers at REDIS_URL', () => {
  // Fails (never skips) when Redis is not there: every test below needs it.
  assert.equal(typeof store.now(), 'bigint');
});

test('a lock on Redis: acquired, busy, released, then a higher fence, in the Rust layout', async () => {
  const first = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.equal(first.tag, 'acquired');
  const busy = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.equal(busy.tag, 'busy');
  assert.equal(busy.val.fence, first.val.fence);
  // The lock lives where the Rust backend keeps it: one string under the partition's hash tag.
  const redis = await directClient();
  try {
    const layoutKey = key(prefix, '~lock:15:inventory.stock:item:1', 's');
    assert.equal(await redis.exists(layoutKey), 1, `${layoutKey} holds the lock`);
  } finally {
    await redis.close();
  }
  assert.equal(lock.release(first.val), true);
  assert.equal(lock.release(first.val), false, 'released once only');
  const second = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.equal(second.tag, 'acquired');
  assert.ok(second.val.fence > first.val.fence, `${second.val.fence} > ${first.val.fence}`);
  assert.equal(lock.release(second.val), true);
});

test('a waiter gets the lock when a second host process releases it', async () => {
  const holder = lock.acquire('inventory.stock', 'item:2', { ttlMs: 30000n, wait: { tag: 'no-wait' } }).val;
  const released = secondHost(prefix, { op: 'release', lock: holder, delayMs: 300 });
  const started = Date.now();
  // Blocks this thread; the other process releases meanwhile.
  const next = lock.acquire('inventory.stock', 'item:2', { ttlMs: 10000n, wait: { tag: 'timeout', val: 8000n } });
  const took = Date.now() - started;
  assert.equal(next.tag, 'acquired', `after ${took} ms`);
  assert.ok(next.val.fence > holder.fence);
  assert.ok(took < 7000, `took ${took} ms of an 8000 ms budget: woken by the release, not the timeout`);
  assert.equal(await released, true, 'the second host released it');
  assert.equal(lock.release(next.val), true);
});

test('a waiter on a held lock gives up after its budget, not early, without spinning', () => {
  const holder = lock.acquire('inventory.stock', 'item:3', { ttlMs: 60000n, wait: { tag: 'no-wait' } }).val;
  const [calls, trips, started] = [store.stats.calls, store.stats.roundTrips, Date.now()];
  const busy = lock.acquire('inventory.stock', 'item:3', { ttlMs: 1000n, wait: { tag: 'timeout', val: 1200n } });
  const took = Date.now() - started;
  assert.equal(busy.tag, 'busy');
  assert.equal(busy.val.fence, holder.fence);
  assert.ok(took >= 1200 && took < 2500, `gave up after ${took} ms of a 1200 ms budget`);
  // A check per 500 ms re-check, a subscription, the puts: a handful.
  assert.ok(store.stats.calls - calls <= 5, `${store.stats.calls - calls} store calls`);
  assert.ok(store.stats.roundTrips - trips < 15, `${store.stats.roundTrips - trips} Redis requests in one acquire`);
  assert.equal(lock.release(holder), true);
});

test('ephemeral entries on Redis: upsert, snapshot in key order, watch across hosts, expiry', async () => {
  const space = { id: 'inventory.editors', ttlMs: 10000n, maxValueBytes: 64 };
  ephemeral.upsert(space, 'item:1', 'session-b', bytes('bob'));
  ephemeral.upsert(space, 'item:1', 'session-a', bytes('ada'));
  const snapshot = ephemeral.snapshot(space, 'item:1', undefined);
  assert.deepEqual(snapshot.entries.map((e) => [e.key, text(e.value)]), [['session-a', 'ada'], ['session-b', 'bob']]);

  const watcher = ephemeral.watch(space, 'item:1', undefined, snapshot.revision);
  const written = secondHost(prefix, { op: 'upsert', space, tenant: 'item:1', key: 'session-c', value: 'cy', delayMs: 200 });
  // Blocks until the other process's upsert is published.
  const event = watcher.next(8000n);
  assert.equal(event?.tag, 'upsert');
  assert.equal(event.val.key, 'session-c');
  assert.equal(text(event.val.value), 'cy');
  assert.equal(event.val.revision, (await written).revision);

  const short = { id: 'inventory.cursors', ttlMs: 300n, maxValueBytes: 64 };
  const w = ephemeral.upsert(short, 'item:1', 'cursor', bytes('1,2'));
  const expiring = ephemeral.watch(short, 'item:1', undefined, w.revision);
  const started = Date.now();
  const expired = expiring.next(3000n);
  assert.equal(expired?.tag, 'expire');
  assert.equal(expired.val.key, 'cursor');
  assert.ok(Date.now() - started < 2000, 'woken at the expiry');
  assert.equal(ephemeral.touch(short, 'item:1', 'cursor'), false, 'gone: recreate it');
});

test('a rate limit shared with a second host process allows exactly the limit in total', async () => {
  // A token bucket refilled over an hour: no window boundary or refill can
  // add to the 10 while the test runs.
  const limiter = { id: 'inventory.exports', limit: 10, windowMs: 3600000n, algorithm: 'token-bucket' };
  const other = secondHost(prefix, { op: 'check', limiter, key: 'user:1', times: 8 });
  let here = 0;
  for (let i = 0; i < 8; i += 1) if (ratelimit.check(limiter, 'user:1', undefined).allowed) here += 1;
  const there = (await other).allowed;
  assert.equal(here + there, 10, `${here} here + ${there} there`);
  const limited = ratelimit.check(limiter, 'user:1', undefined);
  assert.equal(limited.allowed, false);
  assert.ok(limited.retryAfterMs > 0n);
});

test('an unreachable Redis is unavailable, never busy or acquired, and does not hang', () => {
  const unreachable = redisStore('redis://127.0.0.1:1');
  const previous = useStore(unreachable);
  try {
    for (const call of [
      () => lock.acquire('inventory.stock', 'item:9', noWait),
      () => lock.acquire('inventory.stock', 'item:9', { ttlMs: 1000n, wait: { tag: 'timeout', val: 1000n } }),
      () => ratelimit.check({ id: 'x', limit: 1, windowMs: 1000n, algorithm: undefined }, 'k', undefined),
      () => ephemeral.snapshot({ id: 's', ttlMs: 1000n, maxValueBytes: 8 }, 't', undefined),
    ]) {
      const started = Date.now();
      assert.throws(call, (e) => e.payload?.tag === 'unavailable' && /redis/.test(e.payload.val));
      assert.ok(Date.now() - started < 4000, `answered in ${Date.now() - started} ms`);
    }
  } finally {
    useStore(previous);
    unreachable.close();
  }
});
