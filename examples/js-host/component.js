// coord.wasm, transpiled by jco into dist/ (`--instantiation sync`), as
// instances: each one is the component's own memory and state, linked to a
// store of the caller's choosing. Core modules are compiled once per
// process and shared by every instance.

import { readFileSync } from 'node:fs';
import { instantiate as instantiateTranspiled } from './dist/coord.js';
import * as hostStore from './host-store.js';

const compiled = new Map();

// jco asks for each core module by its file name in dist/.
function coreModule(name) {
  let module = compiled.get(name);
  if (!module) {
    module = new WebAssembly.Module(readFileSync(new URL(`./dist/${name}`, import.meta.url)));
    compiled.set(name, module);
  }
  return module;
}

// wasi:random/random, the component's one other import: owner tokens come
// from it, so it is the platform's cryptographic generator.
const random = {
  getRandomU64: () => crypto.getRandomValues(new BigUint64Array(1))[0],
};

/**
 * A new instance of coord.wasm on `store` (an object with the functions of
 * wit/store.wit's `store` interface, named as jco names them; default: the
 * forwarder of host-store.js, which `useStore` points). Returns its exports:
 * `{ lock, lease, semaphore, rwlock, ephemeral, ratelimit }`, as jco binds them.
 */
export function instantiate(store = hostStore) {
  const exports = instantiateTranspiled(coreModule, {
    'coord:sync/store': store,
    'wasi:random/random': random,
  });
  return {
    lock: exports.lock,
    lease: exports.lease,
    semaphore: exports.semaphore,
    rwlock: exports.rwlock,
    ephemeral: exports.ephemeral,
    ratelimit: exports.ratelimit,
  };
}

/** The process's shared instance, on host-store.js's forwarder. */
export const shared = instantiate();

/** The shared instance's interfaces, for the tests and the benchmark. */
export const { lock, lease, semaphore, rwlock, ephemeral, ratelimit } = shared;
