// The package as a user meets it: only the public import, two instances
// on the in-memory store, one lock between them.
import assert from 'node:assert/strict';
import { createCoord } from 'coord-sync';

const a = createCoord().mutex({ id: 'smoke' });
const b = createCoord().mutex({ id: 'smoke' });
const first = a.acquire('item:1', { ttlMs: 30000 });
assert.ok(first, 'the first instance acquires a free lock');
assert.equal(b.acquire('item:1', { ttlMs: 30000, timeoutMs: 0 }), null, 'the second is told busy');
assert.equal(a.release(first), true, 'the holder releases');
const second = b.acquire('item:1', { ttlMs: 30000 });
assert.ok(second && second.fence > first.fence, 'the second acquires with a higher fence');
console.log(`coord-sync smoke: fences ${first.fence} then ${second.fence}, ok`);
