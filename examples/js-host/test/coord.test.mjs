// The idiomatic wrappers (coord.js) on both stores, memory and Redis:
// withLock, the watch iterator, the rate limiter, leases, errors as
// classes. Needs Redis at REDIS_URL; fails without it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { useStore } from '../host-store.js';
import { redisStore } from '../redis-store.js';
import { REDIS_URL, dropKeys, uniquePrefix } from './redis-env.js';

const prefix = uniquePrefix('coord');
const store = redisStore(REDIS_URL, { prefix });
useStore(store);
const { mutex, semaphore, rwLock, ephemeralSpace, rateLimiter, lease, InvalidArgument, NotHolder, Unavailable } = await import('../coord.js');

after(async () => {
  await dropKeys(prefix);
  await store.close();
});

for (const [name, backend] of [['memory', undefined], ['Redis', store]]) {
  describe(`on the ${name} store`, () => {
    before(() => useStore(backend));
    wrapperTests();
  });
}

test('an unreachable store is Unavailable from withLock, not null', async () => {
  const stock = mutex({ id: 'inventory.stock', ttlMs: 10000, retry: { maxAttempts: 1 } });
  const unreachable = redisStore('redis://127.0.0.1:1');
  const previous = useStore(unreachable);
  try {
    await assert.rejects(stock.withLock('item:4', async () => 'ran'), (e) => e instanceof Unavailable && /redis/.test(e.reason));
  } finally {
    useStore(previous);
    await unreachable.close();
  }
});

// The same tests on whichever store `useStore` picked before them.
function wrapperTests() {
  test('a read-write lock shares among readers, excludes a writer, prefers it, and withWrite releases', async () => {
    const catalog = rwLock({ id: 'inventory.catalog', ttlMs: 60000, retry: { maxAttempts: 1 } });
    const resource = `all:${Math.random()}`;
    const a = catalog.acquire(resource, 'read');
    const b = catalog.acquire(resource, 'read', { ttlMs: 1000 });
    assert.ok(a && b && a.mode === 'read');
    assert.equal(catalog.acquire(resource, 'write'), null, 'a writer beside two readers');
    const usage = catalog.inspect(resource);
    assert.equal(usage.writer, undefined, 'the writer that gave up left no claim');
    assert.deepEqual(usage.readers.map((r) => r.fence), [a.fence, b.fence]);
    assert.ok(!JSON.stringify(usage, (_, v) => (typeof v === 'bigint' ? String(v) : v)).includes(a.owner));
    assert.equal(await catalog.withWrite(resource, async () => 'ran'), null, 'fn does not run while readers hold');
    assert.equal(catalog.release(a), true);
    assert.equal(catalog.release(a), false);
    assert.equal(catalog.forceRelease(resource, b.fence), true);
    const result = await catalog.withWrite(resource, async (grant) => {
      assert.ok(grant.fence > b.fence && grant.mode === 'write');
      assert.equal(catalog.isHeld(grant), true);
      assert.equal(catalog.acquire(resource, 'read'), null, 'a reader beside the writer');
      const extended = catalog.extend(grant, { ttlMs: 5000 });
      assert.equal(extended.fence, grant.fence);
      return 'ran';
    });
    assert.equal(result, 'ran');
    assert.deepEqual(catalog.inspect(resource).readers, [], 'no reader got in');
    assert.equal(catalog.inspect(resource).writer, undefined, 'withWrite released its grant');
    assert.equal(await catalog.withRead(resource, async (grant) => grant.mode), 'read');
    assert.throws(() => catalog.acquire(resource, 'shared'), (e) => e instanceof InvalidArgument && e.field === 'mode');
    assert.throws(() => catalog.release({ ...a, mode: 'both' }), (e) => e instanceof InvalidArgument && e.field === 'grant.mode');
  });

  test('a semaphore grants at most its limit, fences rise, busy is null, and a release frees one place', async () => {
    const api = semaphore({ id: 'partner.api', limit: 2, ttlMs: 60000, retry: { maxAttempts: 1 } });
    const resource = `tenant:${Math.random()}`;
    const a = api.acquire(resource);
    const b = api.acquire(resource, { ttlMs: 1000 });
    assert.ok(b.fence > a.fence && a.limit === 2);
    assert.equal(api.acquire(resource), null, 'a third permit under a limit of 2');
    const usage = api.inspect(resource);
    assert.deepEqual(usage.permits.map((p) => p.fence), [a.fence, b.fence]);
    assert.ok(!JSON.stringify(usage, (_, v) => (typeof v === 'bigint' ? String(v) : v)).includes(a.owner));
    assert.equal(await api.withPermit(resource, async () => 'ran'), null, 'fn does not run without a place');
    assert.equal(api.release(a), true);
    assert.equal(api.release(a), false);
    const result = await api.withPermit(resource, async (permit) => {
      assert.ok(permit.fence > b.fence);
      assert.equal(api.isHeld(permit), true);
      return 'ran';
    });
    assert.equal(result, 'ran');
    assert.equal(api.inspect(resource).permits.length, 1, 'withPermit released its permit');
    const extended = api.extend(b, { ttlMs: 5000 });
    assert.equal(extended.fence, b.fence);
    assert.equal(api.forceRelease(resource, b.fence), true);
    assert.equal(api.extend(extended), null, 'force-released: lost');
  });

  test('a semaphore refuses a limit of 0, above 100000, or not a u32, naming the field', () => {
    for (const limit of [0, 100_001]) {
      const api = semaphore({ id: 'partner.api', limit });
      assert.throws(() => api.acquire('t'), (e) => e instanceof InvalidArgument && e.field === 'limit');
    }
    for (const limit of [-1, 2 ** 32, 1.5, '3']) {
      assert.throws(() => semaphore({ id: 'partner.api', limit }), (e) => e instanceof InvalidArgument && e.field === 'limit');
    }
    const api = semaphore({ id: 'partner.api', limit: 1 });
    assert.throws(() => api.release({ id: 'partner.api', resource: 't', owner: 'x'.repeat(32), fence: 1n, limit: -2, ttlMs: 1n, expiresAt: 1n }),
      (e) => e instanceof InvalidArgument && e.field === 'permit.limit');
  });

  test('withLock returns null when the lock is busy, without running fn', async () => {
    const stock = mutex({ id: 'inventory.stock', ttlMs: 10000, retry: { maxAttempts: 1 } });
    const held = stock.acquire('item:1');
    assert.equal(typeof held.fence, 'bigint');
    let ran = false;
    const result = await stock.withLock('item:1', async () => {
      ran = true;
    });
    assert.equal(result, null);
    assert.equal(ran, false);
    assert.equal(stock.release(held), true);
  });

  test('withLock keeps the lock through work longer than its TTL, same fence, then releases it', async () => {
    const stock = mutex({ id: 'inventory.stock', ttlMs: 400, retry: { maxAttempts: 1 } });
    let fence;
    const result = await stock.withLock('item:2', async (lock) => {
      fence = lock.fence;
      await sleep(1300); // over three TTLs
      assert.equal(lock.signal.aborted, false, 'not lost');
      assert.equal(stock.isHeld(lock.record), true, 'still held after three TTLs');
      assert.equal(lock.record.fence, fence, 'extending keeps the fence');
      assert.equal(stock.acquire('item:2'), null, 'nobody else gets it');
      assert.equal(stock.inspect('item:2').fence, fence);
      return 'adjusted';
    });
    assert.equal(result, 'adjusted');
    assert.equal(stock.inspect('item:2'), undefined, 'released afterwards');
    const next = stock.acquire('item:2');
    assert.ok(next.fence > fence);
    stock.release(next);
  });

  test('withLock releases when fn throws, and rethrows', async () => {
    const stock = mutex({ id: 'inventory.stock', ttlMs: 10000, retry: { maxAttempts: 1 } });
    await assert.rejects(stock.withLock('item:3', async () => {
      throw new Error('boom');
    }), /boom/);
    assert.equal(stock.inspect('item:3'), undefined);
  });

  test('errors are classes keeping the WIT fields', () => {
    const stock = mutex({ id: 'inventory.stock', ttlMs: 10000, retry: { maxAttempts: 1 } });
    assert.throws(() => stock.acquire(''), (e) => e instanceof InvalidArgument && e.field === 'resource' && e.payload.tag === 'invalid-argument');
    assert.throws(() => mutex({ id: 'x', ttlMs: 1.5 }), (e) => e instanceof InvalidArgument && e.field === 'options.ttl-ms');
  });

  test('a lease held by another node is NotHolder, naming the holder', () => {
    const held = lease.acquire('inventory.primary', 'node-a', 10000);
    assert.equal(typeof held.epoch, 'bigint');
    assert.throws(() => lease.acquire('inventory.primary', 'node-b', 10000), (e) => e instanceof NotHolder && e.holder.node === 'node-a' && e.holder.epoch === held.epoch);
    assert.equal(lease.resign(held), true);
    assert.equal(lease.observe('inventory.primary'), undefined);
  });

  test('watch is an async iterable: current entries first, then changes, ending on abort', async () => {
    const presence = ephemeralSpace({ id: 'inventory.editors', ttlMs: 30000, maxValueBytes: 4096 });
    presence.upsert({ tenantId: 'item:1', key: 'session-a', value: { userId: 'ada' } });
    const controller = new AbortController();
    const seen = [];
    for await (const event of presence.watch({ tenantId: 'item:1', signal: controller.signal, sliceMs: 200 })) {
      seen.push(event);
      if (event.type === 'upsert' && event.key === 'session-a') {
        assert.equal(presence.touch({ tenantId: 'item:1', key: 'session-a' }), true);
        presence.delete({ tenantId: 'item:1', key: 'session-a' });
      }
      if (event.type === 'delete') controller.abort();
    }
    assert.deepEqual(seen.map((e) => [e.type, e.key]), [['upsert', 'session-a'], ['delete', 'session-a']]);
    assert.deepEqual(seen[0].value, { userId: 'ada' });
    assert.equal(typeof seen[1].revision, 'bigint');
    assert.deepEqual(presence.snapshot({ tenantId: 'item:1' }).entries, []);
  });

  test('a rate limiter says limited, with retry-after, and resets', () => {
    const exports = rateLimiter({ id: 'inventory.exports', limit: 2, windowMs: 3600000, algorithm: 'token-bucket' });
    assert.equal(exports.check('user:1').allowed, true);
    assert.equal(exports.check('user:1').remaining, 0);
    const limited = exports.check('user:1');
    assert.equal(limited.limited, true);
    assert.ok(limited.retryAfterMs > 0n);
    exports.reset('user:1');
    assert.equal(exports.peek('user:1').limited, false);
  });

  test('a reservation settles to the real cost once; limited reserves nothing', () => {
    const tokens = rateLimiter({ id: 'llm.tokens', limit: 10, windowMs: 3600000, algorithm: 'fixed-window' });
    const key = `tenant:${Math.random()}`;
    const { decision, reservation } = tokens.reserve(key, 8, 60000);
    assert.equal(decision.allowed, true);
    assert.equal(decision.remaining, 2);
    assert.equal(tokens.check(key, { cost: 3 }).limited, true);
    assert.equal(tokens.settle(reservation, 2), 'settled');
    assert.equal(tokens.peek(key).remaining, 8);
    assert.equal(tokens.cancel(reservation), 'already-settled');
    // Only the store's record decides: a made-up token gives nothing back.
    assert.equal(tokens.cancel({ ...reservation, token: '0'.repeat(32), cost: 10 }), 'unknown');
    const refused = tokens.reserve(key, 9, 60000);
    assert.equal(refused.decision.limited, true);
    assert.equal(refused.reservation, null);
    assert.throws(() => tokens.settle(reservation, -1), (e) => e instanceof InvalidArgument && e.field === 'actual');
    assert.throws(() => tokens.settle({ ...reservation, token: 'x' }, 1), (e) => e instanceof InvalidArgument && e.field === 'reservation.token');
  });
}
