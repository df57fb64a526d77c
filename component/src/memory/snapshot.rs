//! A [`Partition`] as bytes and back, for stores that keep each partition as
//! one value on a server (the NATS backend keeps it as one message).
//!
//! The layout is private to this module and versioned by its first byte:
//! little-endian integers, strings and byte strings prefixed by a `u32`
//! length. Decoding never panics: bytes that are not a snapshot this
//! version wrote (truncated, a wrong tag, a key that is not UTF-8) are an
//! error naming what was wrong.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::Partition;
use crate::meter::MeterState;
use crate::store::{Change, ChangeKind, Entry};

/// The layout's version, the first byte of every snapshot.
const VERSION: u8 = 1;

impl Partition {
    /// The partition as bytes that [`Partition::decode`] reads back.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Writer(Vec::with_capacity(64));
        out.0.push(VERSION);
        out.u64(self.revision);
        out.u64(self.created);
        out.u64(self.complete_after);
        out.u64(self.history as u64);
        out.len(self.entries.len());
        for entry in self.entries.values() {
            out.bytes(entry.key.as_bytes());
            out.bytes(&entry.value);
            out.u64(entry.revision);
            out.u64(entry.updated_at);
            out.optional(entry.expires_at);
        }
        out.len(self.feed.len());
        for change in &self.feed {
            out.0.push(match change.kind {
                ChangeKind::Put => 1,
                ChangeKind::Delete => 2,
                ChangeKind::Expire => 3,
            });
            out.bytes(change.key.as_bytes());
            out.bytes(&change.value);
            out.u64(change.revision);
            out.u64(change.at);
        }
        out.len(self.meters.len());
        for (key, (state, expires)) in &self.meters {
            out.bytes(key.as_bytes());
            for n in [state.a, state.b, state.c, *expires] {
                out.u64(n);
            }
        }
        out.0
    }

    /// Read a partition [`Partition::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Partition, String> {
        let mut r = Reader(bytes);
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(format!(
                "snapshot version {version}, this build reads {VERSION}"
            ));
        }
        let revision = r.u64("revision")?;
        let created = r.u64("created")?;
        let complete_after = r.u64("complete-after")?;
        let history = usize::try_from(r.u64("history")?)
            .map_err(|_| "history does not fit this machine".to_string())?
            .max(1);
        let mut entries = BTreeMap::new();
        let mut expiries = BTreeSet::new();
        for _ in 0..r.u32("entry count")? {
            let key = r.string("entry key")?;
            let entry = Entry {
                key: key.clone(),
                value: r.bytes("entry value")?.to_vec(),
                revision: r.u64("entry revision")?,
                updated_at: r.u64("entry updated-at")?,
                expires_at: r.optional("entry expires-at")?,
            };
            if let Some(at) = entry.expires_at {
                expiries.insert((at, key.clone()));
            }
            entries.insert(key, entry);
        }
        let mut feed = VecDeque::new();
        for _ in 0..r.u32("change count")? {
            let kind = match r.u8("change kind")? {
                1 => ChangeKind::Put,
                2 => ChangeKind::Delete,
                3 => ChangeKind::Expire,
                other => return Err(format!("change kind {other} is none of 1, 2, 3")),
            };
            feed.push_back(Change {
                kind,
                key: r.string("change key")?,
                value: r.bytes("change value")?.to_vec(),
                revision: r.u64("change revision")?,
                at: r.u64("change at")?,
            });
        }
        let mut meters = BTreeMap::new();
        for _ in 0..r.u32("meter count")? {
            let key = r.string("meter key")?;
            let state = MeterState {
                a: r.u64("meter state")?,
                b: r.u64("meter state")?,
                c: r.u64("meter state")?,
            };
            meters.insert(key, (state, r.u64("meter expiry")?));
        }
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the snapshot's end", r.0.len()));
        }
        Ok(Partition {
            revision,
            entries,
            expiries,
            feed,
            history,
            created,
            complete_after,
            meters,
            clock_us: 0,
            outside: 0,
        })
    }
}

/// Appends the snapshot's fields.
struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, n: u64) {
        self.0.extend(n.to_le_bytes());
    }

    /// A count or a length: `u32`, as no partition holds 4 GiB.
    fn len(&mut self, n: usize) {
        self.0
            .extend(u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend(b);
    }

    fn optional(&mut self, n: Option<u64>) {
        match n {
            Some(n) => {
                self.0.push(1);
                self.u64(n);
            }
            None => self.0.push(0),
        }
    }
}

/// Reads the snapshot's fields, each named in the error when the bytes end early.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("the snapshot ends inside its {what}"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        String::from_utf8(self.bytes(what)?.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn optional(&mut self, what: &str) -> Result<Option<u64>, String> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(what)?)),
            other => Err(format!("{what} has presence tag {other}, not 0 or 1")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Condition, MeterAlgorithm, MeterMode, MeterRequest};

    fn busy_partition() -> Partition {
        let mut p = Partition::new(4);
        p.put("a", b"1", Some(100), &Condition::Always, 10);
        p.put("b\0é", b"", None, &Condition::Always, 11);
        p.put("c", &[0, 255, 7], Some(5), &Condition::Always, 12);
        p.delete("a", &Condition::Always, 13);
        p.sweep(20); // c expires: an expire change
        for _ in 0..3 {
            p.put("d", b"x", Some(1000), &Condition::Always, 21); // trims the feed
        }
        let request = MeterRequest {
            algorithm: MeterAlgorithm::Gcra,
            limit: 5,
            window_ms: 1000,
            cost: 2,
            mode: MeterMode::Consume,
        };
        p.meter("m", &request, 22);
        p
    }

    #[test]
    fn a_partition_reads_back_as_it_was_written() {
        let p = busy_partition();
        let back = Partition::decode(&p.encode()).expect("decodes");
        assert_eq!(format!("{back:?}"), format!("{p:?}"));
        assert_eq!(back.encode(), p.encode());
        let empty = Partition::new(1);
        assert_eq!(
            format!("{:?}", Partition::decode(&empty.encode()).expect("decodes")),
            format!("{empty:?}")
        );
    }

    #[test]
    fn every_truncation_and_a_wrong_version_are_errors_not_panics() {
        let bytes = busy_partition().encode();
        for end in 0..bytes.len() {
            assert!(Partition::decode(&bytes[..end]).is_err(), "cut at {end}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Partition::decode(&longer).is_err());
        let mut other = bytes;
        other[0] = 9;
        let error = Partition::decode(&other).expect_err("version 9");
        assert!(error.contains("version 9"), "{error}");
    }
}
