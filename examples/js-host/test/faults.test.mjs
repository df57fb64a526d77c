// The JavaScript host on a Redis of its own that stalls (DEBUG SLEEP, which
// would stall every other test on a shared server): a write or a rate
// limit's count that its call answered `unavailable` for must not apply
// when Redis wakes. Before, it did: a lock held by a token nobody had.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createClient } from 'redis';
import { redisStore } from '../redis-store.js';

async function freePort() {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

const port = await freePort();
const dir = mkdtempSync(join(tmpdir(), 'coord-js-faults-'));
const server = spawn(
  'redis-server',
  ['--bind', '127.0.0.1', '--port', String(port), '--save', '', '--appendonly', 'no', '--dir', dir, '--enable-debug-command', 'local'],
  { stdio: 'ignore' },
);
const cli = (...args) => spawnSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8', timeout: 10_000 }).stdout?.trim();
// A start, not a speed: the server answers once it has started.
while (cli('PING') !== 'PONG') {
  if (server.exitCode !== null) throw new Error(`redis-server exited ${server.exitCode}`);
  await sleep(20);
}

const store = redisStore(`redis://127.0.0.1:${port}`, { prefix: 'coordfaults', responseTimeoutMs: 500 });

after(() => {
  store.close();
  server.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

// Redis asleep for 1.5 s, asked on a connection of its own; `woke`
// resolves once it woke (wrapped: an async function's promise result would
// be awaited with it). Whether it is asleep yet when the next call is sent cannot be
// known (a loaded machine may take long to deliver it), so each check below
// is made again until a call was held and answered unavailable.
async function stalled() {
  const sleeper = createClient({ url: `redis://127.0.0.1:${port}` });
  sleeper.on('error', () => {});
  await sleeper.connect();
  const woke = sleeper.sendCommand(['DEBUG', 'SLEEP', '1.5']).finally(() => sleeper.destroy());
  await sleep(200);
  return { woke };
}

// `call` while Redis sleeps, until it is answered unavailable (a round in
// which it was answered is not one that tests anything); then `check`,
// once Redis woke.
async function heldThenChecked(call, check) {
  for (let round = 0; ; round += 1) {
    const { woke } = await stalled();
    let refused = false;
    try {
      call(round);
    } catch (e) {
      if (!unavailable(e)) throw e;
      refused = true;
    }
    await woke;
    if (refused) return check(round);
    assert.ok(round < 10, 'ten calls in a row were answered although Redis was asleep');
  }
}

const unavailable = (e) => e?.payload?.tag === 'unavailable';
const bytes = (s) => new TextEncoder().encode(s);

test('a write held by a stalled Redis is unavailable and does not apply when it wakes', async () => {
  for (const partition of ['~lock:1:late:x', 'tenant']) {
    store.put(partition, 'first', bytes('v'), 60_000n, { tag: 'always' });
    await heldThenChecked(
      (round) => store.put(partition, `late${round}`, bytes('v'), 60_000n, { tag: 'absent' }),
      // On the same connection as the held write, so after it.
      (round) => assert.equal(store.get(partition, `late${round}`).entry, undefined, `${partition}: the write applied after unavailable`),
    );
  }
});

test('a rate limit count held by a stalled Redis is not counted when it wakes', async () => {
  const request = (tag) => ({ algorithm: 'fixed-window', limit: 1000, windowMs: 3_600_000n, cost: 1, mode: { tag } });
  store.meter('limits', 'k', request('consume'));
  // Each round that was answered counted one more; the held one must not.
  let counted = 1;
  await heldThenChecked(
    () => {
      store.meter('limits', 'k', request('consume'));
      counted += 1;
    },
    () => assert.equal(store.meter('limits', 'k', request('peek')).remaining, 1000 - counted, 'a count answered unavailable was counted later'),
  );
});
