// The package's entry point (index.js): what it exports, and instances
// made with createCoord.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as coord from '../index.js';
import { REDIS_URL, dropKeys, uniquePrefix } from './redis-env.js';

test('the entry point exports the public API and nothing else', () => {
  assert.deepEqual(Object.keys(coord).sort(), [
    'CoordError', 'InGrace', 'Internal', 'InvalidArgument', 'NotHolder', 'Unavailable',
    'createCoord', 'currentStore', 'ephemeralSpace', 'lease', 'memoryStore', 'mutex',
    'rateLimiter', 'redisStore', 'rwLock', 'semaphore', 'useStore',
  ]);
});

test('instances made by createCoord share the in-memory store, each with its own state', () => {
  const a = coord.createCoord().semaphore({ id: 'package.pool', limit: 2 });
  const b = coord.createCoord().semaphore({ id: 'package.pool', limit: 2 });
  const held = [a.acquire('r', { timeoutMs: 0 }), b.acquire('r', { timeoutMs: 0 })];
  assert.ok(held.every(Boolean), 'two permits of two');
  assert.equal(a.acquire('r', { timeoutMs: 0 }), null, 'a third is refused, whichever instance asks');
  assert.equal(b.release(held[0]), true, 'a permit is released by another instance that has its record');
  assert.ok(a.acquire('r', { timeoutMs: 0 }));
});

test('createCoord refuses an options value that is not an object, naming it', () => {
  assert.throws(() => coord.createCoord(42), (e) => e instanceof coord.InvalidArgument && /options/.test(e.message));
});

test('an instance on a Redis store and one on the shared instance agree', async (t) => {
  const prefix = uniquePrefix();
  const store = coord.redisStore(REDIS_URL, { prefix });
  t.after(() => dropKeys(prefix));
  const a = coord.createCoord({ store }).mutex({ id: 'package.redis' });
  const b = coord.createCoord({ store }).mutex({ id: 'package.redis' });
  const first = a.acquire('item', { ttlMs: 30000, timeoutMs: 0 });
  assert.ok(first);
  assert.equal(b.acquire('item', { ttlMs: 30000, timeoutMs: 0 }), null);
  assert.equal(a.release(first), true);
  const second = b.acquire('item', { ttlMs: 30000, timeoutMs: 0 });
  assert.ok(second.fence > first.fence);
  b.release(second);
});
