// coord-sync: distributed locks, read-write locks, leases, semaphores, ephemeral state and
// rate limits for JavaScript, run by the unchanged coord.wasm component
// (transpiled by jco) on a store in memory or on Redis.
//
// This module is the package's public surface; the files it imports are
// not part of the API.

import * as memory from './store.js';

export {
  createCoord, mutex, semaphore, rwLock, ephemeralSpace, rateLimiter, lease,
} from './coord.js';
export {
  CoordError, InvalidArgument, Unavailable, NotHolder, InGrace, Internal,
} from './errors.js';
export { useStore, currentStore } from './host-store.js';
export { redisStore } from './redis-store.js';

/**
 * The in-memory store: one per process, shared by every instance created
 * without a store (`createCoord()`), and the shared instance's store until
 * `useStore` picks another.
 */
export const memoryStore = Object.freeze({
  now: memory.now,
  get: memory.get,
  list: memory.list,
  put: memory.put,
  delete: memory.delete,
  touch: memory.touch,
  changes: memory.changes,
  meter: memory.meter,
  wait: memory.wait,
  waitThenPut: memory.waitThenPut,
});
