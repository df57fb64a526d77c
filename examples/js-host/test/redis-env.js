// What the Redis tests share: where Redis is, a key prefix of their own per
// run (so runs, and test files, never see each other's data), removing that
// prefix's keys afterwards, and running the second host process.

import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createClient } from 'redis';
import { decode, encode } from './wire.js';

/** The Redis the tests use: REDIS_URL, by default the local one. */
export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A key prefix no other run or test file uses. */
export function uniquePrefix(name) {
  return `coordtest:${name}:${process.pid}:${Date.now().toString(36)}`;
}

/** A plain async client, for tests that look at Redis directly. Close it after use. */
export async function directClient() {
  const client = createClient({ url: REDIS_URL, socket: { connectTimeout: 2000, reconnectStrategy: false } });
  client.on('error', () => {});
  await client.connect();
  return client;
}

/** Delete every key under `prefix` (the whole run's data). */
export async function dropKeys(prefix) {
  const client = await directClient();
  try {
    for await (const keys of client.scanIterator({ MATCH: `${prefix}:*`, COUNT: 500 })) {
      if (keys.length > 0) await client.unlink(keys);
    }
  } finally {
    await client.close();
  }
}

const secondHostPath = fileURLToPath(new URL('./second-host.mjs', import.meta.url));

/**
 * Run `command` in a second host process on the same Redis and `prefix`
 * (test/second-host.mjs lists the commands); resolves to its result, or
 * rejects with its stderr. Starts at once: the caller may block right after.
 */
export function secondHost(prefix, command) {
  const child = spawn(process.execPath, [secondHostPath, encode(command)], {
    env: { ...process.env, REDIS_URL, COORD_PREFIX: prefix },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(decode(out)) : reject(new Error(`second host exited ${code}: ${err}`))));
  });
}
