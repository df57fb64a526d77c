// Compiled by `npm test` (tsc --noEmit --strict): the declarations in
// index.d.ts describe the API as a TypeScript user calls it.
import {
  createCoord, mutex, rateLimiter, memoryStore, redisStore, InvalidArgument,
  type HeldLock, type Decision, type Settled, type Coord,
} from '../index.js';

const coord: Coord = createCoord({ store: memoryStore });
const held: HeldLock | null = coord.mutex({ id: 'types' }).acquire('r', { ttlMs: 1000, timeoutMs: 0 });
if (held) {
  const fence: bigint = held.fence;
  coord.mutex({ id: 'types' }).release(held);
  void fence;
}
const result: Promise<number | null> = mutex({ id: 'types' }).withLock('r', async ({ fence, signal }) => {
  void signal.aborted;
  return Number(fence);
});
const decision: Decision = rateLimiter({ id: 'types', limit: 1, windowMs: 1000 }).check('k');
const space = coord.ephemeralSpace<{ userId: string }>({ id: 'types', ttlMs: 1000, maxValueBytes: 64 });
space.upsert({ tenantId: 't', key: 'k', value: { userId: 'ann' } });
const { reservation } = coord.rateLimiter({ id: 'types', limit: 5, windowMs: 1000 }).reserve('k', 2, 1000);
const settled: Settled | undefined = reservation
  ? coord.rateLimiter({ id: 'types', limit: 5, windowMs: 1000 }).settle(reservation, 1)
  : undefined;
const other: Coord = createCoord({ store: redisStore('redis://127.0.0.1:6379', { prefix: 'types' }) });
const error: InvalidArgument | null = null;
void [result, decision, settled, other, error];
