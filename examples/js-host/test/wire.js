// JSON with bigints, for handing records to and from the second host
// process: a bigint travels as {"$big": "<digits>"}.

/** `value` as JSON, bigints included. */
export function encode(value) {
  return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? { $big: v.toString() } : v));
}

/** What `encode` wrote, bigints restored. */
export function decode(text) {
  return JSON.parse(text, (_, v) => (v && typeof v === 'object' && typeof v.$big === 'string' ? BigInt(v.$big) : v));
}
