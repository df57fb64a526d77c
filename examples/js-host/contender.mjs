// One Node process of the three-language test (examples/polyglot): on the
// Redis given, beside a Rust `coord serve` and a Python host, it
//  - adjusts an item's stock `rounds` times under the inventory function's
//    own lock (`inventory.stock`, `item:<item>`), each time a read, a short
//    pause and a compare-and-set write of the record the Rust function
//    keeps (partition `~inventory-record:<item>`, key `record`), carrying the lock's fence;
//  - joins the item's editors (`inventory.editors`) and waits until it sees
//    every session named in `--expect`;
//  - spends `--exports` requests of the user's export limit
//    (`inventory.exports`, 10 per 60 s, sliding).
// It prints one JSON line: {fences, allowed, editors}; it exits non-zero when
// a write met a record it did not expect (another holder wrote while this
// one held the lock) or a fence did not exceed the record's.
//
//   node contender.mjs --redis URL --prefix P --item I --rounds N \
//     --session S --expect a,b,c --user U --exports K

import { parseArgs } from 'node:util';
import { useStore, currentStore } from './host-store.js';
import { redisStore } from './redis-store.js';
import { mutex, ephemeralSpace, rateLimiter } from './coord.js';

const { values: args } = parseArgs({
  options: {
    redis: { type: 'string' },
    prefix: { type: 'string' },
    item: { type: 'string' },
    rounds: { type: 'string', default: '10' },
    session: { type: 'string' },
    expect: { type: 'string', default: '' },
    user: { type: 'string' },
    exports: { type: 'string', default: '0' },
  },
});

const store = redisStore(args.redis, { prefix: args.prefix });
useStore(store);

// The inventory function's stock table: a partition per item's record.
const RECORD_PARTITION = `~inventory-record:${args.item}`;
const RECORD_KEY = 'record';
const INITIAL_STOCK = 100;
const stock = mutex({ id: 'inventory.stock', ttlMs: 10000, timeoutMs: 20000 });
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Sleep `ms` without giving up the thread (the host is synchronous anyway). */
function pause(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Add one to the item's stock under its lock; returns the fence. */
function adjustOnce() {
  const held = stock.acquire(`item:${args.item}`);
  if (held === null) throw new Error('the lock was not acquired within 20 s');
  try {
    const read = currentStore().get(RECORD_PARTITION, RECORD_KEY);
    const record = read.entry ? JSON.parse(decoder.decode(read.entry.value)) : { stock: INITIAL_STOCK, fence: 0 };
    // Fences are below 2^53 (store microseconds), exact as JSON numbers.
    if (BigInt(record.fence) >= held.fence) {
      throw new Error(`fence ${held.fence} does not exceed the record's ${record.fence}`);
    }
    pause(3); // widen the window in which a second holder would show
    const next = { ...record, stock: record.stock + 1, fence: Number(held.fence) };
    const condition = read.entry ? { tag: 'revision', val: read.entry.revision } : { tag: 'absent' };
    const written = currentStore().put(
      RECORD_PARTITION,
      RECORD_KEY,
      encoder.encode(JSON.stringify(next)),
      undefined,
      condition,
    );
    if (written.outcome.tag !== 'applied') {
      throw new Error(`the record changed while fence ${held.fence} held the lock`);
    }
    return held.fence;
  } finally {
    stock.release(held);
  }
}

const fences = [];
for (let i = 0; i < Number(args.rounds); i += 1) fences.push(adjustOnce().toString());

const editors = ephemeralSpace({ id: 'inventory.editors', ttlMs: 30000, maxValueBytes: 4096 });
editors.upsert({ tenantId: args.item, key: args.session, value: { userId: args.session } });
const expected = args.expect.split(',').filter(Boolean);
let seen = [];
for (let tries = 0; tries < 1200; tries += 1) { // up to a minute: the others join after their last adjustment
  seen = editors.snapshot({ tenantId: args.item }).entries.map((e) => e.key).sort();
  if (expected.every((s) => seen.includes(s))) break;
  pause(50);
}

const limiter = rateLimiter({ id: 'inventory.exports', limit: 10, windowMs: 60000, algorithm: 'sliding-window' });
let allowed = 0;
for (let i = 0; i < Number(args.exports); i += 1) {
  if (limiter.check(`user:${args.user}`).allowed) allowed += 1;
}

console.log(JSON.stringify({ fences, allowed, editors: seen }));
store.close();
