// The worker thread behind redis-store.js: the store contract's operations
// on Redis with node-redis, answered through sync-bridge.js while the main
// thread blocks. It runs the project's own scripts, read at start from
// host-test/redis/ (no copy here), loaded exactly as the Rust backend
// loads them (redis-codec.js), so both share one Redis.
//
// Every failure to reach Redis, and every request that takes longer than
// the response timeout, is the store's `unavailable`: never a hang. A write
// carries its deadline on Redis's own clock (the Rust backend's
// deadline.rs): held by a paused server and run after its call answered
// `unavailable`, it changes nothing.

import { existsSync, readFileSync } from 'node:fs';
import { workerData } from 'node:worker_threads';
import { createClient, RESP_TYPES } from 'redis';
import { serve } from './sync-bridge.js';
import * as codec from './redis-codec.js';

const config = workerData.data;
// The package's copy (scripts/, written by `npm pack` from
// host-test/redis/), else the repository's own, in a checkout.
const packaged = new URL('./scripts/', import.meta.url);
const scriptsDir = existsSync(packaged) ? packaged : new URL('../../host-test/redis/', import.meta.url);
const read = (name) => readFileSync(new URL(name, scriptsDir), 'utf8');

// Scripts that cannot be read fail every request (rather than the thread,
// which would leave the main thread waiting out its slack).
let SCRIPTS;
let missingScripts;
try {
  SCRIPTS = {
    store: codec.storeScript(read('redis.lua'), config),
    unwatched: codec.unwatchedScript(read('unwatched.lua'), config),
    meter: read('meter.lua'),
  };
} catch (e) {
  missingScripts = codec.unavailable(`redis: cannot read the store scripts in ${scriptsDir.pathname}: ${e.message}`);
}
const SHAS = Object.fromEntries(Object.entries(SCRIPTS ?? {}).map(([name, text]) => [name, codec.sha1(text)]));
// How often a call loads the scripts again after NOSCRIPT (the Rust backend's RELOADS).
const RELOADS = 2;

// Requests sent to Redis, scripts and SCRIPT LOADs and subscriptions alike:
// tests read it to tell a wait that sleeps from one that polls.
let roundTrips = 0;

const clientOptions = {
  url: config.url,
  // Reconnecting is done here, per request (`connection`), bounded by the
  // response timeout: node-redis's own retry loop would leave a request
  // waiting on a server that is gone.
  socket: { connectTimeout: config.responseTimeoutMs, reconnectStrategy: false },
  disableOfflineQueue: true,
  commandOptions: { timeout: config.responseTimeoutMs },
};

let client; // the connection commands go on
let subscriber; // the connection `wait` listens on
let connecting;
let subscribing;

// Open a client, or fail as unavailable within the response timeout.
async function open() {
  const c = createClient(clientOptions).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
  // Errors surface as the failing request's rejection; without a listener
  // node-redis would crash the thread on them.
  c.on('error', () => {});
  try {
    await c.connect();
  } catch (e) {
    c.destroy?.();
    throw codec.unavailable(`redis: cannot connect to ${redactedUrl()}: ${e.message}`);
  }
  return c;
}

function redactedUrl() {
  try {
    const u = new URL(config.url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return 'the configured URL';
  }
}

// The command connection, re-made when it was lost.
async function connection() {
  if (client?.isReady) return client;
  connecting ??= open()
    .then((c) => {
      client?.destroy?.();
      client = c;
      return c;
    })
    .finally(() => {
      connecting = undefined;
    });
  return connecting;
}

// The subscriber connection, re-made when it was lost (its subscriptions
// with it: a waiter re-checks at least every `recheckMs` regardless).
async function subscriberConnection() {
  if (subscriber?.isReady) return subscriber;
  subscribing ??= open()
    .then((c) => {
      subscriber?.destroy?.();
      subscriber = c;
      return c;
    })
    .finally(() => {
      subscribing = undefined;
    });
  return subscribing;
}

function unavailableFrom(e) {
  if (e && typeof e === 'object' && 'tag' in e && !(e instanceof Error)) return e;
  return codec.unavailable(`redis: ${e?.message ?? String(e)}`);
}

// Send one command; a failure of any kind is the store's `unavailable`
// (an error reply from a script too: the Rust backend says the same).
async function send(args) {
  const c = await connection();
  roundTrips += 1;
  return c.sendCommand(args);
}

// EVALSHA of one of SCRIPTS; after NOSCRIPT (a restarted or flushed
// server), load the scripts the call may need and send it again.
async function evalsha(script, args, reload) {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await send(['EVALSHA', SHAS[script], ...args]);
    } catch (e) {
      if (!String(e?.message).startsWith('NOSCRIPT') || attempt >= RELOADS) throw unavailableFrom(e);
      for (const name of reload) await send(['SCRIPT', 'LOAD', SCRIPTS[name]]);
    }
  }
}

// A store call's script: store and unwatched are reloaded together, as in Rust.
function storeScript(partition, op, inputs) {
  const call = codec.scriptCall(config.prefix, partition, op, inputs);
  return evalsha(call.script, call.args, ['store', 'unwatched']);
}

// Redis's clock as last heard: [its time in ms, performance.now() then].
let heard;

function heardClock(serverMs) {
  heard = [Number(serverMs), performance.now()];
}

// The latest time on Redis's clock at which a write sent now may still
// apply: the last sample moved on to the moment its call gives up (the
// serve loop starts the response timeout's timer after this runs), less a
// millisecond per second of the sample's age; undefined without a sample
// younger than a minute.
function deadlineMs() {
  if (heard === undefined) return undefined;
  const [serverMs, at] = heard;
  const now = performance.now();
  const ageMs = now - at;
  if (ageMs > 60_000) return undefined;
  return Math.floor(serverMs + (now + config.responseTimeoutMs - at) - (Math.floor(ageMs / 1000) + 1));
}

async function write(partition, op, inputs) {
  const reply = await storeScript(partition, op, { ...inputs, deadlineMs: deadlineMs() });
  const written = codec.readWrite(reply, inputs.key, codec.sentValue(inputs.value, inputs.condition));
  heardClock(written.now);
  return written;
}

// The store's clock: `[now, revision, next expiry]` of a partition after
// sweeping it; on an unwatched partition it also marks that somebody waits,
// so the next write publishes.
async function check(partition) {
  return codec.readCheck(await storeScript(partition, 'check', {}));
}

// Listen to `channel` until the returned `stop` is called; `state.published`
// keeps the highest revision announced, `state.wake` is called on each
// announcement. Subscribed before the first check, so no change after that
// check goes unnoticed. A subscription that cannot be made is not fatal:
// the re-check bounds how late a waiter notices (and a Redis that is gone
// fails the check).
async function listen(channel, state) {
  const listener = (message) => {
    const text = String(message);
    if (/^\d+$/.test(text) && BigInt(text) > state.published) state.published = BigInt(text);
    state.wake?.();
  };
  let s;
  try {
    s = await within(subscriberConnection(), config.responseTimeoutMs);
    roundTrips += 1;
    await within(s.subscribe(channel, listener), config.responseTimeoutMs);
  } catch {
    return () => {};
  }
  // node-redis unsubscribes the channel once its last listener is gone.
  return () => {
    if (s.isReady) s.unsubscribe(channel, listener).catch(() => {});
  };
}

// `promise`, or a rejection after `ms`.
function within(promise, ms) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(codec.unavailable(`redis: no reply within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// Sleep `ms`, or less when the channel announces a change.
function sleep(state, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => state.wake(), ms);
    state.wake = () => {
      clearTimeout(timer);
      state.wake = undefined;
      resolve();
    };
  });
}

/**
 * `wait` of wit/store.wit: until the partition's revision passes `after`
 * or `timeoutMs` passes on the store's clock. Checks, then sleeps until a
 * message on the partition's channel, the next expiry (which the next
 * check records), or `recheckMs` (the bound on a lost message), and checks
 * again: a few round trips per wake-up, never a poll loop.
 */
async function wait(partition, after, timeoutMs) {
  const state = { published: 0n, wake: undefined };
  const stop = await listen(codec.key(config.prefix, partition, 'w'), state);
  try {
    let deadline;
    for (;;) {
      // A published revision past `after` answers with no check.
      if (state.published > after) return state.published;
      const [now, revision, nextExpiry] = await within(check(partition), config.responseTimeoutMs);
      deadline ??= now + timeoutMs;
      if (revision > after || now >= deadline) return revision;
      let sleepMs = deadline - now;
      if (sleepMs > BigInt(config.recheckMs)) sleepMs = BigInt(config.recheckMs);
      if (nextExpiry !== undefined) {
        const untilExpiry = nextExpiry > now ? nextExpiry - now : 1n;
        if (untilExpiry < sleepMs) sleepMs = untilExpiry;
      }
      await sleep(state, Number(sleepMs));
    }
  } finally {
    stop();
  }
}

// Each store operation, by the name redis-store.js sends.
const OPERATIONS = {
  async now() {
    const [seconds, micros] = await send(['TIME']);
    const now = BigInt(seconds.toString()) * 1000n + BigInt(micros.toString()) / 1000n;
    heardClock(now);
    return now;
  },
  async get(partition, key) {
    const read = codec.readGet(await storeScript(partition, 'get', { key }));
    heardClock(read.now);
    return read;
  },
  async list(partition, prefix) {
    return codec.readList(await storeScript(partition, 'list', { key: prefix }));
  },
  put: (partition, key, value, ttlMs, condition) => write(partition, 'put', { key, value, ttlMs, condition }),
  delete: (partition, key, condition) => write(partition, 'delete', { key, condition }),
  touch: (partition, key, ttlMs, condition) => write(partition, 'touch', { key, ttlMs, condition }),
  async changes(partition, after, max) {
    if (codec.isUnwatched(partition)) {
      throw codec.invalid(`partition: ${JSON.stringify(partition)} is unwatched (its name begins with '~'), so no change feed is kept for it`);
    }
    return codec.readChanges(await storeScript(partition, 'changes', { after, max }));
  },
  async meter(partition, key, request) {
    // A peek changes nothing, so it goes without a deadline.
    const deadline = request.mode?.tag === 'peek' ? undefined : deadlineMs();
    const args = codec.meterCall(config.prefix, partition, key, request, deadline);
    const metered = codec.readMeter(await evalsha('meter', args, ['meter']));
    heardClock(metered.now);
    return metered;
  },
  wait,
  // A put after the wait, whichever way it ended; a timeout of 0 is no wait.
  async waitThenPut(partition, key, value, ttlMs, condition, after, timeoutMs) {
    if (timeoutMs > 0n) await wait(partition, after, timeoutMs);
    return within(OPERATIONS.put(partition, key, value, ttlMs, condition), config.responseTimeoutMs);
  },
};

// Requests that may block have their own bound (subscribing, their
// timeout, then one response timeout per step); every other one answers
// within one response timeout, connecting and reloading scripts included.
const BLOCKING = new Set(['wait', 'waitThenPut']);

serve(async ({ op, args }) => {
  if (missingScripts) throw missingScripts;
  const operation = OPERATIONS[op];
  if (!operation) throw codec.invalid(`op: unknown store operation ${op}`);
  try {
    const result = BLOCKING.has(op) ? operation(...args) : within(operation(...args), config.responseTimeoutMs);
    return { result: await result, roundTrips };
  } catch (e) {
    throw unavailableFrom(e);
  }
});
