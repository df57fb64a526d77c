// Type declarations for coord-sync's public API (index.js). Times and
// fences are bigints, as the component gives them; durations and counts
// may be passed as numbers or bigints.

/** A duration, count or time a caller passes: a number or a bigint. */
export type Integer = number | bigint;

/** How long to wait for a held lock or a full semaphore. Give one of the two. */
export interface WaitOptions {
  /** Try `maxAttempts` times (default 11), `delayMs` apart (default 200). */
  retry?: { maxAttempts?: number; delayMs?: Integer };
  /** Wait up to this long, woken when the holder releases (0: do not wait). */
  timeoutMs?: Integer;
}

/** A held lock: plain data, given back to release, extend or check it. */
export interface HeldLock {
  id: string;
  resource: string;
  owner: string;
  /** Rises with every acquisition of the resource: present it at the write boundary. */
  fence: bigint;
  ttlMs: bigint;
  /** On the store's clock. */
  expiresAt: bigint;
}

/** Who holds a lock, without their owner token. */
export interface LockHolder {
  fence: bigint;
  remainingMs: bigint;
}

/** What `withLock` gives the work it runs. */
export interface LockContext {
  /** The lock's fence. */
  fence: bigint;
  /** The held-lock record as last extended. */
  record: HeldLock;
  /** Aborted if the lock is lost while the work runs: stop writing then. */
  signal: AbortSignal;
}

/** A distributed mutex: one lock per resource. */
export interface Mutex {
  readonly id: string;
  /** The held lock, or null when another holder kept it. */
  acquire(resource: string, options?: { ttlMs?: Integer } & WaitOptions): HeldLock | null;
  /** True when this call freed the lock, false when it was no longer held. */
  release(held: HeldLock): boolean;
  /** The record with a new expiry (same fence), or null when the lock was lost. */
  extend(held: HeldLock, options?: { ttlMs?: Integer }): HeldLock | null;
  /** Whether `held` still holds its lock (the commit-point check). */
  isHeld(held: HeldLock): boolean;
  /** Who holds `resource`'s lock, if anyone. */
  inspect(resource: string): LockHolder | undefined;
  /** Free `resource`'s lock whoever holds it (an operator's action). */
  forceRelease(resource: string): boolean;
  /**
   * Run `fn` holding the lock, extended every `refreshMs` (default a third
   * of the TTL) and released after: what `fn` returns, or null when busy.
   */
  withLock<T>(
    resource: string,
    fn: (lock: LockContext) => T | Promise<T>,
    options?: { ttlMs?: Integer; refreshMs?: Integer } & WaitOptions,
  ): Promise<T | null>;
}

/** A semaphore's permit: plain data, given back to release or extend it. */
export interface Permit {
  id: string;
  resource: string;
  owner: string;
  fence: bigint;
  limit: number;
  ttlMs: bigint;
  expiresAt: bigint;
}

/** The permits held of a resource, without their owner tokens. */
export interface Usage {
  permits: Array<{ fence: bigint; remainingMs: bigint; limit: number }>;
  now: bigint;
}

/** A fenced counting semaphore: at most `limit` permits per resource. */
export interface Semaphore {
  readonly id: string;
  readonly limit: number;
  acquire(resource: string, options?: { ttlMs?: Integer } & WaitOptions): Permit | null;
  release(held: Permit): boolean;
  extend(held: Permit, options?: { ttlMs?: Integer }): Permit | null;
  isHeld(held: Permit): boolean;
  inspect(resource: string): Usage;
  /** Free the permit of `resource` with this fence, whoever holds it: true when one was freed. */
  forceRelease(resource: string, fence: Integer): boolean;
  /** Run `fn` holding a permit and release it after: what `fn` returns, or null when full. */
  withPermit<T>(
    resource: string,
    fn: (permit: Permit) => T | Promise<T>,
    options?: { ttlMs?: Integer } & WaitOptions,
  ): Promise<T | null>;
}

/** A read-write lock's grant: plain data, given back to release or extend it. */
export interface Grant {
  id: string;
  resource: string;
  mode: 'read' | 'write';
  owner: string;
  fence: bigint;
  ttlMs: bigint;
  expiresAt: bigint;
}

/** A grant somebody holds, without its owner token. */
export interface GrantHolder {
  mode: 'read' | 'write';
  fence: bigint;
  remainingMs: bigint;
}

/** A fenced read-write lock: many readers or one writer per resource, writers preferred. */
export interface RwLock {
  readonly id: string;
  acquire(resource: string, mode: 'read' | 'write', options?: { ttlMs?: Integer } & WaitOptions): Grant | null;
  release(held: Grant): boolean;
  extend(held: Grant, options?: { ttlMs?: Integer }): Grant | null;
  isHeld(held: Grant): boolean;
  /** The writer's entry (holding, or waiting while readers are listed) and the live readers. */
  inspect(resource: string): { writer: GrantHolder | undefined; readers: GrantHolder[]; now: bigint };
  /** Free the grant of `resource` with this fence, read or write: true when one was freed. */
  forceRelease(resource: string, fence: Integer): boolean;
  /** Run `fn` beside other readers and release after: what `fn` returns, or null when busy. */
  withRead<T>(resource: string, fn: (grant: Grant) => T | Promise<T>, options?: { ttlMs?: Integer } & WaitOptions): Promise<T | null>;
  /** Run `fn` alone (no reader, no other writer) and release after: what `fn` returns, or null when busy. */
  withWrite<T>(resource: string, fn: (grant: Grant) => T | Promise<T>, options?: { ttlMs?: Integer } & WaitOptions): Promise<T | null>;
}

/** Options of a read-write lock. */
export interface RwLockOptions extends WaitOptions {
  id: string;
  ttlMs?: Integer;
}

/** An entry of an ephemeral space, its value decoded. */
export interface Entry<V> {
  key: string;
  value: V;
  revision: bigint;
  updatedAt: bigint;
}

/** An event of a watch. */
export type EphemeralEvent<V> =
  | ({ type: 'upsert' } & Entry<V>)
  | { type: 'delete' | 'expire'; key: string; revision: bigint; at: bigint }
  | { type: 'resync-required' };

/** Per-tenant entries that expire `ttlMs` after their last upsert or touch. */
export interface EphemeralSpace<V> {
  readonly id: string;
  upsert(args: { tenantId: string; key: string; value: V }): { revision: bigint; updatedAt: bigint };
  /** Renew an entry's TTL; false when it no longer exists. */
  touch(args: { tenantId: string; key: string }): boolean;
  delete(args: { tenantId: string; key: string }): boolean;
  snapshot(args: { tenantId: string; prefix?: string }): { entries: Entry<V>[]; revision: bigint };
  /** The tenant's changes; without `after`, the current entries first. */
  watch(args: {
    tenantId: string;
    prefix?: string;
    after?: Integer;
    signal?: AbortSignal;
    sliceMs?: Integer;
  }): AsyncIterable<EphemeralEvent<V>>;
}

/** A rate-limit decision. */
export interface Decision {
  allowed: boolean;
  limited: boolean;
  limit: number;
  remaining: number;
  resetInMs: bigint;
  retryAfterMs: bigint;
}

/** A reservation: plain data; the store keeps its own record, which settle trusts. */
export interface Reservation {
  id: string;
  key: string;
  token: string;
  cost: number;
  reservedAt: bigint;
  expiresAt: bigint;
}

/** What settling a reservation did. */
export type Settled = 'settled' | 'already-settled' | 'expired' | 'unknown';

/** A rate limiter shared by every host on the store. */
export interface RateLimiter {
  readonly id: string;
  check(key: string, options?: { cost?: number }): Decision;
  peek(key: string): Decision;
  reset(key: string): void;
  reserve(key: string, cost: number, ttlMs: Integer): { decision: Decision; reservation: Reservation | null };
  settle(reservation: Reservation, actual: number): Settled;
  cancel(reservation: Reservation): Settled;
}

/** A held lease. */
export interface HeldLease {
  name: string;
  node: string;
  epoch: bigint;
  ttlMs: bigint;
  expiresAt: bigint;
  /** Before this store time the previous holder's grace runs: do not write. */
  writableAt: bigint;
}

/** Single-writer leases. */
export interface Leases {
  acquire(name: string, node: string, ttlMs: Integer): HeldLease;
  renew(held: HeldLease): HeldLease;
  check(held: HeldLease): HeldLease;
  resign(held: HeldLease): boolean;
  observe(name: string): { node: string; epoch: bigint; remainingMs: bigint; graceMs: bigint } | undefined;
}

/** Options of a mutex. */
export interface MutexOptions extends WaitOptions {
  id: string;
  ttlMs?: Integer;
}

/** Options of a semaphore. */
export interface SemaphoreOptions extends WaitOptions {
  id: string;
  limit: number;
  ttlMs?: Integer;
}

/** Options of an ephemeral space. */
export interface SpaceOptions {
  id: string;
  ttlMs: Integer;
  maxValueBytes: number;
  encoding?: 'json' | 'bytes';
}

/** Options of a rate limiter. */
export interface LimiterOptions {
  id: string;
  limit: number;
  windowMs: Integer;
  algorithm?: 'sliding-window' | 'fixed-window' | 'token-bucket';
}

/**
 * A store: the functions of wit/store.wit's `store` interface, as jco names
 * them. `memoryStore` and `redisStore(url)` are the two this package has.
 */
export interface Store {
  now(): bigint;
  get(partition: string, key: string): unknown;
  list(partition: string, prefix: string | undefined): unknown;
  put(partition: string, key: string, value: Uint8Array, ttlMs: bigint | undefined, condition: unknown): unknown;
  delete(partition: string, key: string, condition: unknown): unknown;
  touch(partition: string, key: string, ttlMs: bigint | undefined, condition: unknown): unknown;
  changes(partition: string, after: bigint, max: number): unknown;
  meter(partition: string, key: string, request: unknown): unknown;
  wait(partition: string, after: bigint, timeoutMs: bigint): unknown;
  waitThenPut(
    partition: string, key: string, value: Uint8Array, ttlMs: bigint | undefined,
    condition: unknown, after: bigint, timeoutMs: bigint,
  ): unknown;
}

/** coord's wrappers on one instance of coord.wasm. */
export interface Coord {
  mutex(options: MutexOptions): Mutex;
  semaphore(options: SemaphoreOptions): Semaphore;
  rwLock(options: RwLockOptions): RwLock;
  ephemeralSpace<V = unknown>(options: SpaceOptions): EphemeralSpace<V>;
  rateLimiter(options: LimiterOptions): RateLimiter;
  lease: Leases;
}

/**
 * A new instance of coord.wasm on `store` (default: the process's in-memory
 * store). Instances on one store share every lock, lease, permit, entry and
 * limit.
 */
export function createCoord(options?: { store?: Store }): Coord;

/** A mutex on the process's shared instance. */
export function mutex(options: MutexOptions): Mutex;
/** A semaphore on the shared instance. */
export function semaphore(options: SemaphoreOptions): Semaphore;
/** A read-write lock on the shared instance. */
export function rwLock(options: RwLockOptions): RwLock;
/** An ephemeral space on the shared instance. */
export function ephemeralSpace<V = unknown>(options: SpaceOptions): EphemeralSpace<V>;
/** A rate limiter on the shared instance. */
export function rateLimiter(options: LimiterOptions): RateLimiter;
/** Leases on the shared instance. */
export const lease: Leases;

/** Point the shared instance at `store` (undefined: the in-memory store); returns the previous one. */
export function useStore(store?: Store): Store;
/** The shared instance's store. */
export function currentStore(): Store;

/** The in-memory store: one per process. */
export const memoryStore: Store;

/** Options of the Redis store. Every host on one Redis uses the same prefix, history and retention. */
export interface RedisStoreOptions {
  prefix?: string;
  history?: number;
  retentionMs?: number;
  responseTimeoutMs?: number;
  recheckMs?: number;
}

/** A store on Redis: a Store with its connection's worker thread to stop. */
export interface RedisStore extends Store {
  /** Stop the worker thread that talks to Redis; calls after it fail. */
  close(): Promise<number>;
}

/** The store on the Redis (or Valkey) at `url`; connects on the first call. */
export function redisStore(url: string, options?: RedisStoreOptions): RedisStore;

/** Base class of every error coord throws for a WIT error. */
export class CoordError extends Error {
  readonly tag: string;
  readonly payload: unknown;
}
/** The store could not be reached or did not answer in time: never busy, never acquired. */
export class Unavailable extends CoordError {
  readonly reason: string;
}
/** An argument was refused; `field` names it as the WIT spells it. */
export class InvalidArgument extends CoordError {
  readonly field: string;
  readonly reason: string;
}
/** A bug or a corrupted store record. */
export class Internal extends CoordError {
  readonly reason: string;
}
/** A lease call by a node that does not hold the lease. */
export class NotHolder extends CoordError {
  readonly holder: unknown;
}
/** A lease in its failover grace. */
export class InGrace extends CoordError {
  readonly remainingMs: bigint;
}
