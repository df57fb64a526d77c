// The unchanged coord.wasm, transpiled by jco, on Node with store.js: the
// lock, ephemeral state and the rate limiter through the same component the
// wasmtime host runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lock, ephemeral, ratelimit } from './component.js';
import { advance, stats } from './store.js';

const noWait = { ttlMs: 1000n, wait: { tag: 'no-wait' } };

test('a lock is acquired once, busy for others, and its fence grows', () => {
  const first = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.equal(first.tag, 'acquired');
  assert.equal(first.val.owner.length, 32);
  const busy = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.equal(busy.tag, 'busy');
  assert.equal(busy.val.fence, first.val.fence);
  assert.equal(lock.release(first.val), true);
  const second = lock.acquire('inventory.stock', 'item:1', noWait);
  assert.ok(second.val.fence > first.val.fence);
  // A record serialized to JSON (fences as strings) and back releases it.
  const wire = JSON.stringify(second.val, (_, v) => (typeof v === 'bigint' ? v.toString() : v));
  const back = JSON.parse(wire);
  for (const f of ['fence', 'ttlMs', 'expiresAt']) back[f] = BigInt(back[f]);
  assert.equal(lock.release(back), true);
  assert.equal(lock.release(back), false, 'released once only');
});

test('an expired holder cannot release its successor', () => {
  const old = lock.acquire('inventory.stock', 'item:2', { ttlMs: 100n, wait: { tag: 'no-wait' } }).val;
  advance(100);
  const next = lock.acquire('inventory.stock', 'item:2', noWait).val;
  assert.equal(lock.release(old), false);
  assert.deepEqual(lock.extend(old, undefined), { tag: 'lost' });
  assert.equal(lock.inspect('inventory.stock', 'item:2').fence, next.fence);
});

test('a waiter sleeps out its budget on a held lock instead of spinning', () => {
  const holder = lock.acquire('inventory.stock', 'item:3', { ttlMs: 60000n, wait: { tag: 'no-wait' } }).val;
  const [opens, sleeps, started] = [stats.opens, stats.sleeps, Date.now()];
  const busy = lock.acquire('inventory.stock', 'item:3', { ttlMs: 1000n, wait: { tag: 'timeout', val: 300n } });
  const took = Date.now() - started;
  assert.equal(busy.tag, 'busy');
  assert.ok(took >= 300, `gave up after ${took} ms of a 300 ms budget`);
  // Before, the store's wait returned at once: over 5 000 store calls in one acquire.
  assert.ok(stats.opens - opens < 20, `${stats.opens - opens} store calls in one acquire`);
  assert.ok(stats.sleeps > sleeps, 'the wait slept');
  assert.equal(lock.release(holder), true);
});

test("a waiter is woken by the holder's expiry and takes the lock", () => {
  lock.acquire('inventory.stock', 'item:4', { ttlMs: 200n, wait: { tag: 'no-wait' } });
  const started = Date.now();
  const next = lock.acquire('inventory.stock', 'item:4', { ttlMs: 1000n, wait: { tag: 'timeout', val: 5000n } });
  const took = Date.now() - started;
  assert.equal(next.tag, 'acquired');
  assert.ok(took >= 150 && took < 2000, `took ${took} ms for a 200 ms TTL`);
  assert.equal(lock.release(next.val), true);
});

test('bad input is an error naming the field', () => {
  assert.throws(() => lock.acquire('', 'r', noWait), (e) => e.payload.tag === 'invalid-argument' && e.payload.val.field === 'id');
  assert.throws(
    () => lock.acquire('i', 'r', { ttlMs: 0n, wait: undefined }),
    (e) => e.payload.val.field === 'options.ttl-ms',
  );
});

test('ephemeral entries snapshot, watch and expire', () => {
  const space = { id: 'inventory.editors', ttlMs: 1000n, maxValueBytes: 64 };
  const value = new TextEncoder().encode(JSON.stringify({ user: 'ada' }));
  ephemeral.upsert(space, 'item:1', 'session-a', value);
  const snapshot = ephemeral.snapshot(space, 'item:1', undefined);
  assert.equal(snapshot.entries.length, 1);
  assert.equal(JSON.parse(new TextDecoder().decode(snapshot.entries[0].value)).user, 'ada');
  const watcher = ephemeral.watch(space, 'item:1', undefined, snapshot.revision);
  advance(1000);
  const event = watcher.next(0n);
  assert.equal(event.tag, 'expire');
  assert.equal(event.val.key, 'session-a');
  assert.equal(watcher.next(0n), undefined);
  assert.equal(ephemeral.touch(space, 'item:1', 'session-a'), false, 'gone: recreate it');
  assert.throws(() => ephemeral.upsert(space, 'item:1', 'k', new Uint8Array(65)), (e) => e.payload.val.field === 'value');
});

test('the rate limiter counts, limits with retry-after, and resets', () => {
  const limiter = { id: 'inventory.exports', limit: 2, windowMs: 60000n, algorithm: undefined };
  assert.equal(ratelimit.check(limiter, 'user:1', undefined).allowed, true);
  assert.equal(ratelimit.check(limiter, 'user:1', undefined).allowed, true);
  const limited = ratelimit.check(limiter, 'user:1', undefined);
  assert.equal(limited.allowed, false);
  assert.ok(limited.retryAfterMs > 0n);
  assert.equal(ratelimit.peek(limiter, 'user:1').allowed, false);
  ratelimit.reset(limiter, 'user:1');
  assert.equal(ratelimit.check(limiter, 'user:1', undefined).remaining, 1);
});
