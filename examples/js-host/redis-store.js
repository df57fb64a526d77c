// The coord:sync/store capability on Redis, synchronous to the component:
// each call is handed to a worker thread (redis-worker.js) running the
// asynchronous node-redis client, and the main thread blocks until it
// answers (sync-bridge.js). Same layout and scripts as the Rust backend,
// so hosts in Rust, Python and here share one Redis.

import { SyncWorker } from './sync-bridge.js';
import { DEFAULTS } from './redis-codec.js';

/**
 * A store backed by the Redis at `url` (`redis://[user:password@]host[:port][/db]`,
 * or `rediss://`), to pass to `useStore`. Options: `prefix` (the first part
 * of every key, default `coord`), `history` and `retentionMs` (the Rust
 * backend's; every host on one Redis must use the same, or the scripts'
 * SHA-1s and data differ), `responseTimeoutMs` (each request's bound,
 * default 2000) and `recheckMs` (the longest a waiter sleeps between
 * checks, default 500). Connects on the first call; a Redis that cannot be
 * reached makes each call fail as `unavailable`.
 */
export function redisStore(url, options = {}) {
  const config = {
    url,
    prefix: options.prefix ?? DEFAULTS.prefix,
    history: options.history ?? DEFAULTS.history,
    retentionMs: options.retentionMs ?? DEFAULTS.retentionMs,
    responseTimeoutMs: options.responseTimeoutMs ?? 2000,
    recheckMs: options.recheckMs ?? 500,
  };
  const worker = new SyncWorker(new URL('./redis-worker.js', import.meta.url), config, 'redis');
  // The slack the main thread allows the worker beyond a request's own
  // bound before it gives up on it (a stuck worker): more until the worker
  // first answered, as starting it (loading node-redis) takes a while.
  const slack = () => (worker.answered ? 1000 : 5000);
  const once = config.responseTimeoutMs;
  // Store calls made and Redis requests sent, for tests and benchmarks.
  const stats = { calls: 0, roundTrips: 0 };

  function call(op, args, budgetMs) {
    stats.calls += 1;
    const answer = worker.call({ op, args }, budgetMs + slack());
    stats.roundTrips = answer.roundTrips;
    return answer.result;
  }
  // The worker bounds each request: one response timeout for a plain call
  // (connecting and reloading scripts included); for a wait, connecting and
  // subscribing, its timeout, and its last check.
  const single = once;
  const waiting = (timeoutMs) => Number(timeoutMs) + 3 * once;

  return {
    stats,
    now: () => call('now', [], single),
    get: (partition, key) => call('get', [partition, key], single),
    list: (partition, prefix) => call('list', [partition, prefix], single),
    put: (partition, key, value, ttlMs, condition) => call('put', [partition, key, value, ttlMs, condition], single),
    delete: (partition, key, condition) => call('delete', [partition, key, condition], single),
    touch: (partition, key, ttlMs, condition) => call('touch', [partition, key, ttlMs, condition], single),
    changes: (partition, after, max) => call('changes', [partition, after, max], single),
    meter: (partition, key, request) => call('meter', [partition, key, request], single),
    wait: (partition, after, timeoutMs) => call('wait', [partition, after, timeoutMs], waiting(timeoutMs)),
    waitThenPut: (partition, key, value, ttlMs, condition, after, timeoutMs) =>
      call('waitThenPut', [partition, key, value, ttlMs, condition, after, timeoutMs], waiting(timeoutMs) + single),
    /** Stop the worker and its connections. */
    close: () => worker.terminate(),
  };
}
