// Garbage arguments to the wrappers (coord.js) are `InvalidArgument`
// naming the field as the WIT spells it, thrown before jco lowers them:
// never wrapped to 64 or 32 bits, truncated, turned into U+FFFD or copied
// as bytes. On the memory store; the checks run before any store call.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mutex, ephemeralSpace, rateLimiter, lease, InvalidArgument } from '../coord.js';

const B64 = 2n ** 64n;
const lock = mutex({ id: 'args.lock', ttlMs: 10000, retry: { maxAttempts: 1 } });
const space = ephemeralSpace({ id: 'args.space', ttlMs: 10000, maxValueBytes: 64 });
const bytesSpace = ephemeralSpace({ id: 'args.bytes', ttlMs: 10000, maxValueBytes: 64, encoding: 'bytes' });
const limiter = rateLimiter({ id: 'args.limit', limit: 10, windowMs: 60000 });
const spaceOf = (o) => ephemeralSpace({ id: 'args.space', ttlMs: 10000, maxValueBytes: 64, ...o });
const limiterOf = (o) => rateLimiter({ id: 'args.limit', limit: 10, windowMs: 60000, ...o });

let n = 0;
const fresh = () => `item:${++n}`;
const heldLock = () => lock.acquire(fresh());
const heldLease = () => lease.acquire(`args.lease.${++n}`, 'node-a', 10000);

/** Assert that `fn` throws InvalidArgument for `field`, with the WIT variant as its payload. */
function rejects(fn, field) {
  assert.throws(fn, (e) => {
    assert.ok(e instanceof InvalidArgument, `expected InvalidArgument, got ${e?.name}: ${e?.message}`);
    assert.equal(e.field, field);
    assert.deepEqual(e.payload, { tag: 'invalid-argument', val: { field, reason: e.reason } });
    return true;
  });
}

// [what, call, field]: each one garbage input.
const cases = {
  mutex: [
    ['ttlMs -1', () => mutex({ id: 'm', ttlMs: -1 }), 'options.ttl-ms'],
    ['ttlMs -1n', () => mutex({ id: 'm', ttlMs: -1n }), 'options.ttl-ms'],
    ['ttlMs 2**70', () => mutex({ id: 'm', ttlMs: 2n ** 70n }), 'options.ttl-ms'],
    ['ttlMs 2**53 as a number', () => mutex({ id: 'm', ttlMs: 2 ** 53 }), 'options.ttl-ms'],
    ['ttlMs 1.5', () => mutex({ id: 'm', ttlMs: 1.5 }), 'options.ttl-ms'],
    ['ttlMs NaN', () => mutex({ id: 'm', ttlMs: NaN }), 'options.ttl-ms'],
    ["ttlMs '10'", () => mutex({ id: 'm', ttlMs: '10' }), 'options.ttl-ms'],
    ['id 42', () => mutex({ id: 42 }), 'id'],
    ['no options', () => mutex(), 'id'],
    ['options a string', () => mutex('inventory.stock'), 'options'],
    ['id with a lone surrogate', () => mutex({ id: 'm\uD800' }), 'id'],
    ['retry.maxAttempts 2**32 + 1', () => mutex({ id: 'm', retry: { maxAttempts: 2 ** 32 + 1 } }), 'options.wait.attempts.max-attempts'],
    ['retry.maxAttempts -1', () => mutex({ id: 'm', retry: { maxAttempts: -1 } }), 'options.wait.attempts.max-attempts'],
    ["retry.maxAttempts '1'", () => mutex({ id: 'm', retry: { maxAttempts: '1' } }), 'options.wait.attempts.max-attempts'],
    ['retry.delayMs 2**64', () => mutex({ id: 'm', retry: { delayMs: B64 } }), 'options.wait.attempts.delay-ms'],
    ['retry 5', () => mutex({ id: 'm', retry: 5 }), 'options.wait.attempts'],
    ['timeoutMs 2**64', () => mutex({ id: 'm', timeoutMs: B64 }), 'options.wait.timeout'],
    ['retry and timeoutMs', () => mutex({ id: 'm', retry: {}, timeoutMs: 1 }), 'options.wait'],
    ['acquire resource 42', () => lock.acquire(42), 'resource'],
    ['acquire resource undefined', () => lock.acquire(), 'resource'],
    ['acquire resource an object with toString', () => lock.acquire({ toString: () => 'item:1' }), 'resource'],
    ['acquire resource with a lone surrogate', () => lock.acquire('item:\uDFFF'), 'resource'],
    ['acquire options.ttlMs 2**64 + 5', () => lock.acquire(fresh(), { ttlMs: B64 + 5n }), 'options.ttl-ms'],
    ['acquire options.timeoutMs -1', () => lock.acquire(fresh(), { timeoutMs: -1 }), 'options.wait.timeout'],
    ['acquire options 7', () => lock.acquire(fresh(), 7), 'options'],
    ['extend ttlMs 2**64 + 7', () => lock.extend(heldLock(), { ttlMs: B64 + 7n }), 'ttl-ms'],
    ['extend ttlMs 0.5', () => lock.extend(heldLock(), { ttlMs: 0.5 }), 'ttl-ms'],
    ['inspect 42', () => lock.inspect(42), 'resource'],
    ['forceRelease undefined', () => lock.forceRelease(), 'resource'],
  ],
  'held-lock': [
    ['fence + 2**64 (isHeld)', () => { const h = heldLock(); return lock.isHeld({ ...h, fence: h.fence + B64 }); }, 'lock.fence'],
    ['fence + 2**64 (release)', () => { const h = heldLock(); return lock.release({ ...h, fence: h.fence + B64 }); }, 'lock.fence'],
    ['fence -1', () => lock.isHeld({ ...heldLock(), fence: -1 }), 'lock.fence'],
    ['fence 1.5', () => lock.isHeld({ ...heldLock(), fence: 1.5 }), 'lock.fence'],
    ['fence a decimal string', () => { const h = heldLock(); return lock.isHeld({ ...h, fence: String(h.fence) }); }, 'lock.fence'],
    ['fence a hex string', () => { const h = heldLock(); return lock.isHeld({ ...h, fence: `0x${h.fence.toString(16)}` }); }, 'lock.fence'],
    ['ttlMs missing', () => { const { ttlMs, ...h } = heldLock(); return lock.extend(h); }, 'lock.ttl-ms'],
    ['expiresAt 2**64', () => lock.release({ ...heldLock(), expiresAt: B64 }), 'lock.expires-at'],
    ['owner 42', () => lock.release({ ...heldLock(), owner: 42 }), 'lock.owner'],
    ['id undefined', () => lock.release({ ...heldLock(), id: undefined }), 'lock.id'],
    ['resource with a lone surrogate', () => lock.release({ ...heldLock(), resource: '\uD800' }), 'lock.resource'],
    ['null', () => lock.isHeld(null), 'lock'],
    ['a string', () => lock.release('{"fence":"1"}'), 'lock'],
    ['from JSON, u64s as strings', () => {
      const h = heldLock();
      return lock.isHeld(JSON.parse(JSON.stringify(h, (_, v) => (typeof v === 'bigint' ? v.toString() : v))));
    }, 'lock.fence'],
  ],
  ephemeralSpace: [
    ['no options', () => ephemeralSpace(), 'space.id'],
    ['id 7', () => spaceOf({ id: 7 }), 'space.id'],
    ['ttlMs 2**64 + 1000', () => spaceOf({ ttlMs: B64 + 1000n }), 'space.ttl-ms'],
    ['ttlMs -5', () => spaceOf({ ttlMs: -5 }), 'space.ttl-ms'],
    ['maxValueBytes 2**32 + 5', () => spaceOf({ maxValueBytes: 2 ** 32 + 5 }), 'space.max-value-bytes'],
    ["maxValueBytes '64'", () => spaceOf({ maxValueBytes: '64' }), 'space.max-value-bytes'],
    ['maxValueBytes 64.9', () => spaceOf({ maxValueBytes: 64.9 }), 'space.max-value-bytes'],
    ['maxValueBytes -1', () => spaceOf({ maxValueBytes: -1 }), 'space.max-value-bytes'],
    ['maxValueBytes undefined', () => spaceOf({ maxValueBytes: undefined }), 'space.max-value-bytes'],
    ["encoding 'toString'", () => spaceOf({ encoding: 'toString' }), 'encoding'],
    ["encoding '__proto__'", () => spaceOf({ encoding: '__proto__' }), 'encoding'],
    ['upsert with no arguments', () => space.upsert(), 'tenant'],
    ['upsert tenantId 42', () => space.upsert({ tenantId: 42, key: 'k', value: 1 }), 'tenant'],
    ['upsert key undefined', () => space.upsert({ tenantId: 't', value: 1 }), 'key'],
    ['upsert key with a lone surrogate', () => space.upsert({ tenantId: 't', key: 'k\uDC00', value: 1 }), 'key'],
    ['json value undefined (would store 0 bytes)', () => space.upsert({ tenantId: 't', key: 'k', value: undefined }), 'value'],
    ['json value a function', () => space.upsert({ tenantId: 't', key: 'k', value: () => 1 }), 'value'],
    ['json value a bigint', () => space.upsert({ tenantId: 't', key: 'k', value: 10n }), 'value'],
    ['json value a cycle', () => { const o = {}; o.o = o; return space.upsert({ tenantId: 't', key: 'k', value: o }); }, 'value'],
    ['bytes value a number', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: 5 }), 'value'],
    ['bytes value a string (would store 0 bytes)', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: 'abc' }), 'value'],
    ['bytes value {byteLength: 4} (would store 4 zeros)', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: { byteLength: 4 } }), 'value'],
    ['bytes value a Uint16Array', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: new Uint16Array([1, 2]) }), 'value'],
    ['bytes value an ArrayBuffer', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: new ArrayBuffer(3) }), 'value'],
    ['bytes value an array of numbers', () => bytesSpace.upsert({ tenantId: 't', key: 'k', value: [1, 2, 300] }), 'value'],
    ['touch key 5', () => space.touch({ tenantId: 't', key: 5 }), 'key'],
    ['delete tenantId null', () => space.delete({ tenantId: null, key: 'k' }), 'tenant'],
    ['snapshot prefix 5', () => space.snapshot({ tenantId: 't', prefix: 5 }), 'prefix'],
    ['snapshot with no arguments', () => space.snapshot(), 'tenant'],
    ['watch after 2**64 + 5, at the call', () => space.watch({ tenantId: 't', after: B64 + 5n }), 'after'],
    ['watch after -1', () => space.watch({ tenantId: 't', after: -1 }), 'after'],
    ['watch sliceMs 2**64', () => space.watch({ tenantId: 't', sliceMs: B64 }), 'timeout-ms'],
    ['watch tenantId 5', () => space.watch({ tenantId: 5 }), 'tenant'],
    ["watch signal 'yes'", () => space.watch({ tenantId: 't', signal: 'yes' }), 'signal'],
  ],
  rateLimiter: [
    ['no options', () => rateLimiter(), 'limiter.id'],
    ['id {}', () => limiterOf({ id: {} }), 'limiter.id'],
    ['limit 2**32 + 2', () => limiterOf({ limit: 2 ** 32 + 2 }), 'limiter.limit'],
    ["limit '10'", () => limiterOf({ limit: '10' }), 'limiter.limit'],
    ['limit 10.7', () => limiterOf({ limit: 10.7 }), 'limiter.limit'],
    ['limit -1', () => limiterOf({ limit: -1 }), 'limiter.limit'],
    ['limit NaN', () => limiterOf({ limit: NaN }), 'limiter.limit'],
    ['limit undefined', () => limiterOf({ limit: undefined }), 'limiter.limit'],
    ['windowMs 2**64 + 1000', () => limiterOf({ windowMs: B64 + 1000n }), 'limiter.window-ms'],
    ["windowMs '1000'", () => limiterOf({ windowMs: '1000' }), 'limiter.window-ms'],
    ["algorithm 'bogus'", () => limiterOf({ algorithm: 'bogus' }), 'limiter.algorithm'],
    ['algorithm 1', () => limiterOf({ algorithm: 1 }), 'limiter.algorithm'],
    ['check key 42', () => limiter.check(42), 'key'],
    ['check cost 2**32 + 1', () => limiter.check('k', { cost: 2 ** 32 + 1 }), 'cost'],
    ["check cost '3'", () => limiter.check('k', { cost: '3' }), 'cost'],
    ['check cost 1.9', () => limiter.check('k', { cost: 1.9 }), 'cost'],
    ['check cost -1', () => limiter.check('k', { cost: -1 }), 'cost'],
    ['peek key undefined', () => limiter.peek(), 'key'],
    ['reset key 1', () => limiter.reset(1), 'key'],
  ],
  lease: [
    ['acquire ttlMs 2**64 + 1000', () => lease.acquire('args.lease', 'node-a', B64 + 1000n), 'ttl-ms'],
    ['acquire ttlMs 2**70', () => lease.acquire('args.lease', 'node-a', 2n ** 70n), 'ttl-ms'],
    ['acquire ttlMs undefined', () => lease.acquire('args.lease', 'node-a'), 'ttl-ms'],
    ["acquire ttlMs '1000'", () => lease.acquire('args.lease', 'node-a', '1000'), 'ttl-ms'],
    ['acquire name 5', () => lease.acquire(5, 'node-a', 1000), 'name'],
    ['acquire node undefined', () => lease.acquire('args.lease', undefined, 1000), 'node'],
    ['check epoch + 2**64', () => { const h = heldLease(); return lease.check({ ...h, epoch: h.epoch + B64 }); }, 'lease.epoch'],
    ['renew epoch + 2**64', () => { const h = heldLease(); return lease.renew({ ...h, epoch: h.epoch + B64 }); }, 'lease.epoch'],
    ['check epoch a string', () => { const h = heldLease(); return lease.check({ ...h, epoch: String(h.epoch) }); }, 'lease.epoch'],
    ['resign epoch -1', () => lease.resign({ ...heldLease(), epoch: -1 }), 'lease.epoch'],
    ['renew ttlMs 2**64 + 1000', () => lease.renew({ ...heldLease(), ttlMs: B64 + 1000n }), 'lease.ttl-ms'],
    ['check writableAt missing', () => { const { writableAt, ...h } = heldLease(); return lease.check(h); }, 'lease.writable-at'],
    ['check node 1', () => lease.check({ ...heldLease(), node: 1 }), 'lease.node'],
    ['check null', () => lease.check(null), 'lease'],
    ['observe 5', () => lease.observe(5), 'name'],
    ['observe a lone surrogate', () => lease.observe('x\uD800'), 'name'],
  ],
};

for (const [group, list] of Object.entries(cases)) {
  describe(`${group}: garbage is InvalidArgument naming the field`, () => {
    for (const [what, call, field] of list) {
      test(`${what} -> ${field}`, () => rejects(call, field));
    }
  });
}

describe('withLock: garbage is InvalidArgument, and no lock is left behind', () => {
  for (const [what, options, field] of [
    ['refreshMs 2**64', { refreshMs: B64 }, 'options.refresh-ms'],
    ['refreshMs 2**31 (setInterval would make it 1 ms)', { refreshMs: 2 ** 31 }, 'options.refresh-ms'],
    ['refreshMs 0', { refreshMs: 0 }, 'options.refresh-ms'],
    ["refreshMs '100'", { refreshMs: '100' }, 'options.refresh-ms'],
    ['ttlMs 2**64 + 1000', { ttlMs: B64 + 1000n }, 'options.ttl-ms'],
  ]) {
    test(`${what} -> ${field}`, async () => {
      const resource = fresh();
      await assert.rejects(lock.withLock(resource, async () => 'ran', options), (e) => e instanceof InvalidArgument && e.field === field);
      assert.equal(lock.inspect(resource), undefined);
    });
  }

  test('fn not a function -> fn', async () => {
    const resource = fresh();
    await assert.rejects(lock.withLock(resource, 'not a function'), (e) => e instanceof InvalidArgument && e.field === 'fn');
    assert.equal(lock.inspect(resource), undefined);
  });
});

describe('the value that reaches the component is the value passed', () => {
  test('a ttl of 2**64 + 1000 is rejected, not taken as 1000', () => {
    const resource = fresh();
    rejects(() => mutex({ id: 'args.lock', ttlMs: B64 + 1000n }), 'options.ttl-ms');
    rejects(() => lock.acquire(resource, { ttlMs: B64 + 1000n }), 'options.ttl-ms');
    assert.equal(lock.inspect(resource), undefined, 'nothing was acquired');
    rejects(() => lease.acquire('args.lease.wrap', 'node-a', B64 + 1000n), 'ttl-ms');
    assert.equal(lease.observe('args.lease.wrap'), undefined, 'nothing was acquired');
    rejects(() => spaceOf({ ttlMs: B64 + 1000n }), 'space.ttl-ms');
    rejects(() => limiterOf({ windowMs: B64 + 1000n }), 'limiter.window-ms');
  });

  test('the largest u64 and u32 pass the wrapper, and the component checks its own range', () => {
    assert.throws(() => lock.acquire(fresh(), { ttlMs: B64 - 1n }), (e) => e instanceof InvalidArgument && e.field === 'options.ttl-ms' && /18446744073709551615/.test(e.reason));
    assert.throws(() => limiterOf({ limit: 2 ** 32 - 1 }).check('k'), (e) => e instanceof InvalidArgument && e.field === 'limiter.limit' && /4294967295/.test(e.reason));
  });

  test('numbers and bigints are the same value', () => {
    const held = lock.acquire(fresh(), { ttlMs: 5000n, retry: { maxAttempts: 1n, delayMs: 0n } });
    assert.equal(held.ttlMs, 5000n);
    assert.equal(lock.isHeld({ ...held, fence: Number(held.fence), ttlMs: 5000, expiresAt: Number(held.expiresAt) }), true);
    assert.equal(lock.extend(held, { ttlMs: 6000 }).ttlMs, 6000n);
    assert.equal(lock.release(held), true);
    assert.equal(limiterOf({ id: 'args.bigint', limit: 10n }).check('k', { cost: 3n }).remaining, 7);
    const lh = heldLease();
    assert.equal(lease.resign({ ...lh, epoch: Number(lh.epoch) }), true);
  });

  test('undefined and null leave options out', () => {
    const held = lock.acquire(fresh(), null);
    assert.equal(held.ttlMs, 10000n);
    assert.equal(lock.extend(held, null).ttlMs, 10000n);
    assert.equal(lock.release(held), true);
    assert.equal(mutex({ id: 'args.lock', ttlMs: null, retry: null }).acquire(fresh()).ttlMs, 30000n);
    assert.equal(limiter.check('k', { cost: null }).remaining, 9);
    assert.deepEqual(space.snapshot({ tenantId: 'none', prefix: null }).entries, []);
  });

  test('bytes are Uint8Arrays, a Buffer or a view included, copied exactly', () => {
    bytesSpace.upsert({ tenantId: 'b', key: 'buffer', value: Buffer.from('hi') });
    bytesSpace.upsert({ tenantId: 'b', key: 'view', value: new Uint8Array([9, 1, 2, 3, 9]).subarray(1, 4) });
    const values = Object.fromEntries(bytesSpace.snapshot({ tenantId: 'b' }).entries.map((e) => [e.key, [...e.value]]));
    assert.deepEqual(values, { buffer: [104, 105], view: [1, 2, 3] });
  });

  test('a well-formed string with a surrogate pair passes', () => {
    space.upsert({ tenantId: 'emoji', key: '\u{1F600}', value: 'ok' });
    assert.deepEqual(space.snapshot({ tenantId: 'emoji' }).entries.map((e) => e.key), ['\u{1F600}']);
  });
});
