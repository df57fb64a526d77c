// The module jco links coord.wasm's `coord:sync/store` import to
// (package.json's build: --map coord:sync/store=../host-store.js). It
// forwards each call to the store in use: the in-memory store.js until
// `useStore` picks another (redisStore(url) from redis-store.js). jco binds
// an import when the component is instantiated, at the first import of
// dist/coord.js, so the choice is made here, at run time, not at build time.

import * as memory from './store.js';

let current = memory;

/**
 * Make `store` the one coord.wasm calls from now on (`undefined`: the
 * in-memory store again); returns the one it replaces. A store is an object
 * with the functions of wit/store.wit's `store` interface, named as jco
 * names them (`waitThenPut`), synchronous.
 */
export function useStore(store) {
  const previous = current;
  current = store ?? memory;
  return previous;
}

/** The store in use. */
export function currentStore() {
  return current;
}

/** wit/store.wit `now`, on the store in use. */
export function now() {
  return current.now();
}

/** wit/store.wit `get`, on the store in use. */
export function get(partition, key) {
  return current.get(partition, key);
}

/** wit/store.wit `list`, on the store in use. */
export function list(partition, prefix) {
  return current.list(partition, prefix);
}

/** wit/store.wit `put`, on the store in use. */
export function put(partition, key, value, ttlMs, condition) {
  return current.put(partition, key, value, ttlMs, condition);
}

/** wit/store.wit `delete`, on the store in use. */
function remove(partition, key, condition) {
  return current.delete(partition, key, condition);
}
export { remove as delete };

/** wit/store.wit `touch`, on the store in use. */
export function touch(partition, key, ttlMs, condition) {
  return current.touch(partition, key, ttlMs, condition);
}

/** wit/store.wit `changes`, on the store in use. */
export function changes(partition, after, max) {
  return current.changes(partition, after, max);
}

/** wit/store.wit `meter`, on the store in use. */
export function meter(partition, key, request) {
  return current.meter(partition, key, request);
}

/** wit/store.wit `wait`, on the store in use. */
export function wait(partition, after, timeoutMs) {
  return current.wait(partition, after, timeoutMs);
}

/** wit/store.wit `wait-then-put`, on the store in use. */
export function waitThenPut(partition, key, value, ttlMs, condition, after, timeoutMs) {
  return current.waitThenPut(partition, key, value, ttlMs, condition, after, timeoutMs);
}
