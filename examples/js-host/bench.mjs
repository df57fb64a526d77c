// What the synchronous bridge costs: the same store read sent through the
// worker (the main thread blocked in Atomics.wait) and sent with the async
// client on the main thread, then lock acquire/release pairs through
// coord.wasm on Redis and in memory. `npm run bench` (REDIS_URL, N).
import { readFileSync } from 'node:fs';
import { createClient, RESP_TYPES } from 'redis';
import { useStore } from './host-store.js';
import { redisStore } from './redis-store.js';
import * as codec from './redis-codec.js';
import { dropKeys, uniquePrefix, REDIS_URL } from './test/redis-env.js';

const N = Number(process.env.N ?? 1000);
const prefix = uniquePrefix('bench');
const store = redisStore(REDIS_URL, { prefix });
const { lock } = await import('./component.js');

// Mean microseconds per call of `fn` over N calls, after N/10 to warm up.
async function perCall(fn) {
  for (let i = 0; i < N / 10; i += 1) await fn();
  const started = performance.now();
  for (let i = 0; i < N; i += 1) await fn();
  return ((performance.now() - started) * 1000) / N;
}

const partition = 'eph:5:bench:t';
store.put(partition, 'k', new Uint8Array([1]), 60000n, { tag: 'always' });

const direct = createClient({ url: REDIS_URL }).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
await direct.connect();
const { args } = codec.scriptCall(prefix, partition, 'get', { key: 'k' });
const lua = (name) => readFileSync(new URL(`../../host-test/redis/${name}`, import.meta.url), 'utf8');
// Loaded here too: the async rows call them by SHA without a NOSCRIPT retry.
const sha = await direct.sendCommand(['SCRIPT', 'LOAD', codec.storeScript(lua('redis.lua'), codec.DEFAULTS)]);
const unwatchedSha = await direct.sendCommand(['SCRIPT', 'LOAD', codec.unwatchedScript(lua('unwatched.lua'), codec.DEFAULTS)]);

const rows = [
  ['PING, async client on the main thread', await perCall(() => direct.sendCommand(['PING']))],
  ['store get (EVALSHA), async client on the main thread', await perCall(async () => codec.readGet(await direct.sendCommand(['EVALSHA', sha, ...args])))],
  ['store get (EVALSHA), sync: worker + Atomics.wait', await perCall(() => store.get(partition, 'k'))],
];
// A lock pair's two store requests without the component: the put
// (create-if-absent) and the owner-guarded delete, async on the main thread.
const token = new TextEncoder().encode('0123456789abcdef0123456789abcdef');
rows.push(['the same two scripts (put absent, guarded delete), async client, no component', await perCall(async () => {
  const put = codec.scriptCall(prefix, '~lock:5:bench:s', 'put', { key: 'holder', value: token, ttlMs: 10000n, condition: { tag: 'absent' } });
  const written = codec.readWrite(await direct.sendCommand(['EVALSHA', unwatchedSha, ...put.args]), 'holder', token);
  const guard = { tag: 'revision-and-value', val: { revision: written.outcome.val.revision, value: token } };
  const del = codec.scriptCall(prefix, '~lock:5:bench:s', 'delete', { key: 'holder', condition: guard });
  codec.readWrite(await direct.sendCommand(['EVALSHA', unwatchedSha, ...del.args]), 'holder', token);
})]);
const noWait = { ttlMs: 10000n, wait: { tag: 'no-wait' } };
const pair = () => lock.release(lock.acquire('bench', 'r', noWait).val);
useStore(store);
rows.push(['lock acquire+release pair via coord.wasm, Redis (sync bridge)', await perCall(pair)]);
useStore(undefined);
rows.push(['lock acquire+release pair via coord.wasm, memory store', await perCall(pair)]);

console.log(`N=${N}, node ${process.version}, Redis ${REDIS_URL}`);
for (const [what, us] of rows) console.log(`${us.toFixed(1).padStart(9)} µs  ${what}`);
await direct.close();
await dropKeys(prefix);
await store.close();
