// A second host for the Redis tests: another process with its own
// coord.wasm instance and its own Redis store, so what the tests show is
// shared through Redis, not through one process's memory. Takes one JSON
// command (bigints as {"$big": "<digits>"}) as its argument, prints the
// result as JSON on stdout, exits 0; on failure prints the error and exits 1.
//
//   {"op": "release", "lock": <held-lock>, "delayMs": n}
//   {"op": "check", "limiter": <limiter>, "key": k, "times": n}
//   {"op": "upsert", "space": <space>, "tenant": t, "key": k, "value": "text", "delayMs": n}
//
// Environment: REDIS_URL, COORD_PREFIX (the key prefix of the test run).

import { setTimeout as sleep } from 'node:timers/promises';
import { useStore } from '../host-store.js';
import { redisStore } from '../redis-store.js';
import { decode, encode } from './wire.js';

const store = redisStore(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { prefix: process.env.COORD_PREFIX });
useStore(store);
const { lock, ephemeral, ratelimit } = await import('../component.js');

const command = decode(process.argv[2]);
await sleep(command.delayMs ?? 0);
let result;
switch (command.op) {
  case 'release':
    result = lock.release(command.lock);
    break;
  case 'check': {
    let allowed = 0;
    for (let i = 0; i < command.times; i += 1) if (ratelimit.check(command.limiter, command.key, undefined).allowed) allowed += 1;
    result = { allowed };
    break;
  }
  case 'upsert':
    result = ephemeral.upsert(command.space, command.tenant, command.key, new TextEncoder().encode(command.value));
    break;
  default:
    throw new Error(`second host: unknown op ${command.op}`);
}
process.stdout.write(encode(result));
await store.close();
