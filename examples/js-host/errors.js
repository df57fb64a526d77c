// The WIT interfaces' `error` variants as JavaScript error classes. jco
// throws a result's error as a ComponentError whose `payload` is the
// variant ({tag, val}); `toCoordError` turns it into one of these, keeping
// every field of the variant, so callers can `instanceof` instead of
// comparing tags.

/** Base class of every error coord's wrappers throw for a WIT error. */
export class CoordError extends Error {
  /** `tag` is the WIT variant's case, `payload` the variant as jco gave it. */
  constructor(message, tag, payload, cause) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.tag = tag;
    this.payload = payload;
  }
}

/**
 * `unavailable`: the store could not be reached or did not answer. The
 * call MAY have taken effect; it is neither acquired nor busy, allowed nor
 * limited, as far as the caller can know.
 */
export class Unavailable extends CoordError {
  /** `reason` is the store's message. */
  constructor(reason, payload, cause) {
    super(`coord: store unavailable: ${reason}`, 'unavailable', payload, cause);
    this.reason = reason;
  }
}

/** `invalid-argument`: rejected before the store was asked; `field` is named as the WIT spells it. */
export class InvalidArgument extends CoordError {
  /** `field` is the argument's name (for example `options.ttl-ms`), `reason` why it was rejected. */
  constructor(field, reason, payload, cause) {
    super(`coord: invalid ${field}: ${reason}`, 'invalid-argument', payload, cause);
    this.field = field;
    this.reason = reason;
  }
}

/** `internal`: the store returned something that breaks its contract. */
export class Internal extends CoordError {
  /** `reason` is the component's description. */
  constructor(reason, payload, cause) {
    super(`coord: internal: ${reason}`, 'internal', payload, cause);
    this.reason = reason;
  }
}

/** lease `not-holder`: another node holds the lease (`holder`), or nobody does (`holder` undefined). */
export class NotHolder extends CoordError {
  /** `holder` is the lease's holder record as the store saw it, or undefined. */
  constructor(holder, payload, cause) {
    super(holder ? `coord: lease held by ${holder.node} at epoch ${holder.epoch}` : 'coord: lease not held', 'not-holder', payload, cause);
    this.holder = holder;
  }
}

/** lease `in-grace`: this node holds the lease but may not write for `remainingMs` (a bigint) more. */
export class InGrace extends CoordError {
  /** `remainingMs` is the time until the previous holder's grace ends. */
  constructor(remainingMs, payload, cause) {
    super(`coord: lease in its failover grace for ${remainingMs} ms more`, 'in-grace', payload, cause);
    this.remainingMs = remainingMs;
  }
}

/**
 * The CoordError for what a coord.wasm export threw: a ComponentError
 * (anything with a `payload` of `{tag, val}`) becomes its class; anything
 * else (a trap, a bug) is returned as it is.
 */
export function toCoordError(e) {
  const payload = e?.payload;
  if (!payload || typeof payload.tag !== 'string') return e;
  const { tag, val } = payload;
  switch (tag) {
    case 'unavailable': return new Unavailable(val, payload, e);
    case 'invalid-argument': return new InvalidArgument(val.field, val.reason, payload, e);
    case 'internal': return new Internal(val, payload, e);
    case 'not-holder': return new NotHolder(val, payload, e);
    case 'in-grace': return new InGrace(val, payload, e);
    default: return e;
  }
}

/** Run `fn`, rethrowing a WIT error as its CoordError class. */
export function translated(fn) {
  try {
    return fn();
  } catch (e) {
    throw toCoordError(e);
  }
}
