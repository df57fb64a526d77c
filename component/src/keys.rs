//! How coord names become store partitions.
//!
//! Every primitive instance lives in a partition of its own, named
//! `<kind>:<length of first name>:<first name>:<second name>`. The length
//! prefix makes the encoding injective: the partition string decodes to
//! exactly one (kind, first, second) triple, so lock `a:b` on resource `c`
//! can never share a partition with lock `a` on resource `b:c`, whatever
//! characters the names hold.
//!
//! Lock and lease partitions are *unwatched* (`wit/store.wit`): their names
//! begin with [`UNWATCHED`], which tells the store it need keep no change
//! feed for them (nothing ever reads one: neither interface exports a
//! watch), so it may keep them leaner.

/// The first character of every unwatched partition's name.
pub const UNWATCHED: char = '~';

/// Whether `partition` is unwatched: the store keeps no change feed for it.
pub fn is_unwatched(partition: &str) -> bool {
    partition.starts_with(UNWATCHED)
}

/// The partition holding lock (`id`, `resource`); unwatched.
pub fn lock_partition(id: &str, resource: &str) -> String {
    partition("~lock", id, resource)
}

/// The partition holding tenant `tenant` of ephemeral space `space`.
pub fn ephemeral_partition(space: &str, tenant: &str) -> String {
    partition("eph", space, tenant)
}

/// The partition holding rate limiter `id`'s count for `key`.
pub fn ratelimit_partition(id: &str, key: &str) -> String {
    partition("rl", id, key)
}

/// The partition holding the permits of semaphore (`id`, `resource`);
/// unwatched. Each permit is an entry keyed by its owner token.
pub fn semaphore_partition(id: &str, resource: &str) -> String {
    partition(SEMAPHORE_KIND, id, resource)
}

/// The partition holding the grants of read-write lock (`id`, `resource`);
/// unwatched. The writer's entry is [`RWLOCK_WRITER_KEY`]; each reader's is
/// [`RWLOCK_READER_PREFIX`] and its owner token.
pub fn rwlock_partition(id: &str, resource: &str) -> String {
    partition(RWLOCK_KIND, id, resource)
}

/// The partition holding the store's record of each reservation made
/// against rate limiter `id`'s `key` (what was issued, and whether it was
/// settled); unwatched. Each record is an entry keyed by the reservation's
/// token.
pub fn reservation_partition(id: &str, key: &str) -> String {
    partition("~rsv", id, key)
}

/// The partition holding lease `name`; unwatched.
pub fn lease_partition(name: &str) -> String {
    partition("~lease", name, "")
}

/// Whether `partition` may hold many entries: a semaphore's, one entry per
/// permit held, up to its limit; a read-write lock's, one per reader. A store that keeps a small unwatched
/// partition as one value, read and rewritten whole by every call, keeps
/// these in a layout whose cost per call does not grow with the entries
/// (the Redis stores: `redis.lua`'s hash of entries and index of expiries,
/// as for a watched partition). Every host of one store must agree on it:
/// the Rust, JavaScript and Python Redis stores test the same names.
pub fn may_hold_many(partition: &str) -> bool {
    [SEMAPHORE_KIND, RWLOCK_KIND].iter().any(|kind| {
        partition
            .strip_prefix(kind)
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

/// The kind of every semaphore partition ([`semaphore_partition`]).
const SEMAPHORE_KIND: &str = "~sem";

/// The kind of every read-write lock partition ([`rwlock_partition`]).
const RWLOCK_KIND: &str = "~rw";

/// The key of the writer's entry inside a read-write lock partition (the
/// writer holding it, or waiting for its readers to leave); its value is
/// the writer's owner token.
pub const RWLOCK_WRITER_KEY: &str = "w";

/// The start of every reader's key inside a read-write lock partition,
/// followed by the reader's owner token (also its value).
pub const RWLOCK_READER_PREFIX: &str = "r/";

/// The key of the holder entry inside a lock partition.
pub const LOCK_HOLDER_KEY: &str = "holder";

/// The key of the holder entry inside a lease partition.
pub const LEASE_HOLDER_KEY: &str = "holder";

fn partition(kind: &str, first: &str, second: &str) -> String {
    // Built by hand rather than with `format!`, which costs more than the
    // rest of a lock call's guest work (`perf`, BENCHMARKS.md).
    let mut length = [0u8; 20];
    let mut at = length.len();
    let mut n = first.len();
    loop {
        at -= 1;
        // `n % 10` is a single decimal digit.
        length[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = std::str::from_utf8(&length[at..]).unwrap_or("0");
    let mut out = String::with_capacity(kind.len() + digits.len() + first.len() + second.len() + 3);
    for part in [kind, ":", digits, ":", first, ":", second] {
        out.push_str(part);
    }
    out
}

/// Split a partition name back into (kind, first, second); `None` when it was
/// not made by this module. Exists to state (and test) injectivity.
pub fn decode_partition(partition: &str) -> Option<(&str, &str, &str)> {
    let (kind, rest) = partition.split_once(':')?;
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let first = rest.get(..len)?;
    let second = rest.get(len..)?.strip_prefix(':')?;
    Some((kind, first, second))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_prefix_is_the_decimal_byte_length() {
        for len in [0, 1, 9, 10, 99, 100, 1024] {
            let id = "i".repeat(len);
            assert_eq!(lock_partition(&id, "r"), format!("~lock:{len}:{id}:r"));
        }
        assert_eq!(ratelimit_partition("ü", ""), "rl:2:ü:");
    }

    #[test]
    fn adversarial_names_get_distinct_partitions_that_decode_back() {
        let names = [
            ("a", "b:c"),
            ("a:b", "c"),
            ("a:1:b", "c"),
            ("", ":"),
            (":", ""),
            ("{tag}", "}{"),
            ("lock:1:a", "b"),
            ("ü", "x"),
            ("1", "1:1"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (id, resource) in names {
            let p = lock_partition(id, resource);
            assert!(
                seen.insert(p.clone()),
                "collision for ({id:?}, {resource:?}): {p}"
            );
            assert_eq!(decode_partition(&p), Some(("~lock", id, resource)));
            assert!(is_unwatched(&p));
            let e = ephemeral_partition(id, resource);
            assert!(
                seen.insert(e.clone()),
                "an ephemeral tenant met a lock: {e}"
            );
            assert_eq!(decode_partition(&e), Some(("eph", id, resource)));
            assert!(!is_unwatched(&e));
            let s = semaphore_partition(id, resource);
            assert!(is_unwatched(&s) && may_hold_many(&s));
            let rw = rwlock_partition(id, resource);
            assert!(is_unwatched(&rw) && may_hold_many(&rw));
            assert!(seen.insert(rw), "a read-write lock met another partition");
            assert!(!may_hold_many(&p) && !may_hold_many(&e));
        }
    }
}
