//! The scripts' arguments and packed replies: what a write sends, and how
//! an applied write, a listing, a feed page and a meter's answer are read.

use ::redis::{Cmd, Value};

use coord_host::backend::{
    Change, ChangeKind, ChangesReply, Condition, Entry, ListReply, MeterAlgorithm, MeterMode,
    MeterReply, MeterRequest, Outcome, StoreError, WriteReply,
};

use super::malformed;

/// A store operation, as the store scripts know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Get,
    Put,
    Touch,
    Delete,
    List,
    /// Sweep the partition and answer `(now, revision, next expiry)`; on an
    /// unwatched partition, also say that somebody waits.
    Check,
    /// An unwatched partition's: somebody is about to block on its wake-up
    /// stream after a revision (`unwatched.lua`'s header says more).
    Arm,
    /// A watched partition's change feed.
    Changes,
}

impl Op {
    /// The operation's name, as `redis.lua` takes it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Touch => "touch",
            Op::Delete => "delete",
            Op::List => "list",
            Op::Check => "check",
            Op::Arm => "arm",
            Op::Changes => "changes",
        }
    }

    /// The operation's code, as `unwatched.lua` takes it.
    fn code(self) -> u8 {
        match self {
            Op::Get => 1,
            Op::Put => 2,
            Op::Touch => 3,
            Op::Delete => 4,
            Op::List => 5,
            Op::Check => 6,
            Op::Arm => 7,
            // Refused by the script: an unwatched partition keeps no feed
            // (and `changes` never sends it one).
            Op::Changes => 0,
        }
    }
}

/// What a store script call takes beyond its keys, operation and clock.
#[derive(Clone, Copy, Default)]
pub(super) struct Inputs<'a> {
    /// get's, put's, touch's and delete's key; list's prefix.
    pub key: &'a str,
    /// A put's value.
    pub value: Option<&'a [u8]>,
    /// A put's TTL (`None`: it never expires), or a touch's.
    pub ttl_ms: Option<i64>,
    /// A write's condition.
    pub condition: Option<&'a Condition>,
    /// changes' and arm's revision to read after.
    pub after: u64,
    /// changes' page size.
    pub max: u32,
}

impl<'a> Inputs<'a> {
    /// Append `op`'s own arguments to `cmd` as `redis.lua` reads them, only
    /// those its operation reads (the script's header lists them; each one
    /// costs Redis a string and an ARGV slot).
    pub(super) fn append_to(&self, op: Op, cmd: &mut Cmd) {
        match op {
            Op::Get | Op::List => {
                cmd.arg(self.key);
            }
            Op::Put => {
                cmd.arg(self.key)
                    .arg(self.value.unwrap_or_default())
                    .arg(self.ttl_ms.unwrap_or(-1));
            }
            Op::Touch => {
                cmd.arg(self.key).arg(self.ttl_ms.unwrap_or(-1));
            }
            Op::Delete => {
                cmd.arg(self.key);
            }
            Op::Changes => {
                cmd.arg(self.after).arg(self.max);
            }
            Op::Check | Op::Arm => {}
        }
        match self.condition {
            None => {}
            Some(Condition::Always) => {
                cmd.arg("always");
            }
            Some(Condition::Absent) => {
                cmd.arg("absent");
            }
            Some(Condition::Revision(rev)) => {
                cmd.arg("revision").arg(rev);
            }
            Some(Condition::RevisionAndValue(g)) => {
                cmd.arg("revision-and-value").arg(g.revision).arg(&g.value);
            }
            Some(Condition::AbsentAndFewerThan(limit)) => {
                cmd.arg("absent-and-fewer-than").arg(limit);
            }
        }
    }

    /// `op` and these inputs as `unwatched.lua`'s one argument (its header
    /// gives the layout), with `clock` the test clock's now or -1 for
    /// Redis's TIME. Numbers travel as doubles: revisions, TTLs and times
    /// are whole numbers below 2^53, and a guard revision above that (no
    /// store issues one) matches no entry.
    pub(super) fn packed(&self, op: Op, clock: f64) -> Vec<u8> {
        let (condition, guard, guard_value): (u8, u64, &[u8]) = match self.condition {
            None => (0, 0, b""),
            Some(Condition::Always) => (1, 0, b""),
            Some(Condition::Absent) => (2, 0, b""),
            Some(Condition::Revision(rev)) => (3, *rev, b""),
            Some(Condition::RevisionAndValue(g)) => (4, g.revision, &g.value),
            Some(Condition::AbsentAndFewerThan(limit)) => (5, u64::from(*limit), b""),
        };
        let number = match op {
            Op::Arm => self.after as f64,
            _ => self.ttl_ms.map_or(-1.0, |ttl| ttl as f64),
        };
        let value = self.value.unwrap_or_default();
        let mut packed = Vec::with_capacity(38 + self.key.len() + value.len() + guard_value.len());
        packed.extend([op.code(), condition]);
        for number in [clock, number, guard as f64] {
            packed.extend(number.to_le_bytes());
        }
        for bytes in [self.key.as_bytes(), value, guard_value] {
            // Keys and values are bounded far below 4 GiB by the contract.
            packed.extend((bytes.len() as u32).to_le_bytes());
            packed.extend(bytes);
        }
        packed
    }

    /// The value an applied write leaves, when this call sent it (the
    /// script then leaves it out of its reply): a put's own, or a guard's.
    pub(super) fn sent(&self) -> Option<&'a [u8]> {
        match (self.value, self.condition) {
            (Some(value), _) => Some(value),
            (None, Some(Condition::RevisionAndValue(g))) => Some(g.value.as_slice()),
            (None, _) => None,
        }
    }
}

/// A meter request as `meter.lua`'s one argument (its header gives the
/// layout), with `clock` the test clock's now or -1 for Redis's TIME. Every
/// number is exact as a double: the limit is at most 10^7, the window a
/// day, a test clock's now below 2^53.
pub(super) fn packed_meter(request: &MeterRequest, clock: f64) -> Vec<u8> {
    let algorithm: u8 = match request.algorithm {
        MeterAlgorithm::SlidingWindow => 1,
        MeterAlgorithm::FixedWindow => 2,
        MeterAlgorithm::Gcra => 3,
    };
    let (mode, at): (u8, u64) = match request.mode {
        MeterMode::Consume => (1, 0),
        MeterMode::Peek => (2, 0),
        MeterMode::Reset => (3, 0),
        MeterMode::Charge => (4, 0),
        MeterMode::Refund(at) => (5, at),
    };
    let mut packed = Vec::with_capacity(42);
    packed.extend([algorithm, mode]);
    for number in [
        clock,
        f64::from(request.limit),
        request.window_ms as f64,
        f64::from(request.cost),
        at as f64,
    ] {
        packed.extend(number.to_le_bytes());
    }
    packed
}

/// A write's reply: one packed string when applied, an array otherwise.
pub(super) fn write_reply(
    reply: Value,
    key: &str,
    sent: Option<&[u8]>,
) -> Result<WriteReply, StoreError> {
    let reply = match reply {
        Value::BulkString(packed) => return applied_write(&packed, key, sent),
        Value::Array(values) => values,
        other => return Err(malformed(&format!("expected an array, got {other:?}"))),
    };
    let mut r = Reader::new(&reply);
    let now = r.u64()?;
    let applied = r.u64()? == 1;
    let revision = r.u64()?;
    let entry = r.maybe_entry()?;
    let outcome = match (applied, entry) {
        (true, Some(entry)) => Outcome::Applied(entry),
        (true, None) => return Err(malformed("an applied write without its entry")),
        (false, entry) => Outcome::Conflict(entry),
    };
    Ok(WriteReply {
        outcome,
        now,
        revision,
    })
}

/// A TTL as the script takes it.
pub(super) fn ttl_arg(ttl_ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ttl_ms).map_err(|_| StoreError::Invalid("ttl-ms is too large".into()))
}

/// Reads a string the script packed with Lua's `struct` library (little
/// endian), front to back. Every number in it is a whole number below 2^53,
/// packed as a double, or -1 for none.
pub(super) struct Packed<'a> {
    bytes: &'a [u8],
}

impl<'a> Packed<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Packed { bytes }
    }

    /// The next `n` bytes.
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.bytes.len() < n {
            return Err(malformed("a packed reply cut short"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(super) fn byte(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    /// A `struct` `I4`: a length.
    pub(super) fn length(&mut self) -> Result<usize, StoreError> {
        let bytes = self
            .take(4)?
            .try_into()
            .map_err(|_| malformed("a length"))?;
        usize::try_from(u32::from_le_bytes(bytes)).map_err(|_| malformed("a length"))
    }

    pub(super) fn double(&mut self) -> Result<f64, StoreError> {
        let bytes = self
            .take(8)?
            .try_into()
            .map_err(|_| malformed("a number"))?;
        Ok(f64::from_le_bytes(bytes))
    }

    pub(super) fn number(&mut self) -> Result<u64, StoreError> {
        let n = self.double()?;
        if n.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(&n) {
            Ok(n as u64)
        } else {
            Err(malformed("a packed number"))
        }
    }

    /// A number where -1 means none.
    pub(super) fn optional(&mut self) -> Result<Option<u64>, StoreError> {
        if self.bytes.get(..8) == Some(&(-1.0f64).to_le_bytes()[..]) {
            self.take(8)?;
            return Ok(None);
        }
        self.number().map(Some)
    }

    /// What is left.
    pub(super) fn rest(self) -> &'a [u8] {
        self.bytes
    }
}

/// The reply of an applied write, packed by the script as
/// `struct.pack('<Bddddd', with_value, now, the partition's revision, the
/// entry's revision, updated-at, expires-at)` followed by the value when
/// `with_value` is 1; when it is 0, the value is `sent`, the one this call
/// sent itself.
pub(super) fn applied_write(
    packed: &[u8],
    key: &str,
    sent: Option<&[u8]>,
) -> Result<WriteReply, StoreError> {
    let mut p = Packed::new(packed);
    let with_value = p.byte()?;
    let (now, partition_revision, revision, updated_at, expires_at) = (
        p.number()?,
        p.number()?,
        p.number()?,
        p.number()?,
        p.optional()?,
    );
    let value = match (with_value, sent, p.rest()) {
        (1, _, value) => value.to_vec(),
        (0, Some(sent), []) => sent.to_vec(),
        _ => return Err(malformed("a packed write reply without its value")),
    };
    Ok(WriteReply {
        now,
        revision: partition_revision,
        outcome: Outcome::Applied(Entry {
            key: key.to_string(),
            value,
            revision,
            updated_at,
            expires_at,
        }),
    })
}

/// A listing, packed by the script as `struct.pack('<dd', now, revision)`,
/// then for each entry `struct.pack('<I4I4', #field, #stored)`, the field
/// (`=` and the key) and the stored bytes (`struct.pack('<ddd', revision,
/// updated-at, expires-at)` and the value); sorted here by key bytes.
pub(super) fn listing(packed: &[u8]) -> Result<ListReply, StoreError> {
    let mut p = Packed::new(packed);
    let (now, revision) = (p.number()?, p.number()?);
    let mut entries = Vec::new();
    while !p.bytes.is_empty() {
        let (field_len, stored_len) = (p.length()?, p.length()?);
        let key = p
            .take(field_len)?
            .strip_prefix(b"=")
            .ok_or_else(|| malformed("a listed field that is not an entry"))?;
        let key =
            String::from_utf8(key.to_vec()).map_err(|_| malformed("a key that is not UTF-8"))?;
        let mut stored = Packed::new(p.take(stored_len)?);
        let (revision, updated_at, expires_at) =
            (stored.number()?, stored.number()?, stored.optional()?);
        entries.push(Entry {
            key,
            value: stored.rest().to_vec(),
            revision,
            updated_at,
            expires_at,
        });
    }
    entries.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    Ok(ListReply {
        entries,
        revision,
        now,
    })
}

/// A meter's answer, packed by `meter.lua` as `struct.pack('<Bdddd',
/// allowed, remaining, reset-in, retry-after, now)`.
pub(super) fn meter_reply(packed: &[u8]) -> Result<MeterReply, StoreError> {
    let mut p = Packed::new(packed);
    let allowed = match p.byte()? {
        0 => false,
        1 => true,
        _ => return Err(malformed("a meter's allowed")),
    };
    let remaining = u32::try_from(p.number()?).map_err(|_| malformed("remaining"))?;
    let (reset_in_ms, retry_after_ms, now) = (p.number()?, p.number()?, p.number()?);
    if !p.rest().is_empty() {
        return Err(malformed("a meter reply too long"));
    }
    Ok(MeterReply {
        allowed,
        remaining,
        reset_in_ms,
        retry_after_ms,
        now,
    })
}

/// A page of the change feed, packed by the script as `struct.pack('<dd',
/// now, revision)`, then for each change `struct.pack('<I4I4', #id,
/// #message)`, the stream id (`<revision>-0`) and the message as the feed
/// keeps it: `struct.pack('<dddI4', at, previous, seq, #key)`, the kind
/// (`p`, `d` or `e`), the key and the value.
pub(super) fn page(packed: &[u8]) -> Result<ChangesReply, StoreError> {
    let mut p = Packed::new(packed);
    let (now, revision) = (p.number()?, p.number()?);
    let mut changes = Vec::new();
    while !p.bytes.is_empty() {
        let (id_len, message_len) = (p.length()?, p.length()?);
        let id = p.take(id_len)?;
        let change_revision = std::str::from_utf8(id)
            .ok()
            .and_then(|id| id.strip_suffix("-0")?.parse().ok())
            .ok_or_else(|| malformed("a feed id"))?;
        let mut m = Packed::new(p.take(message_len)?);
        let (at, _previous, _seq) = (m.number()?, m.number()?, m.number()?);
        let key_len = m.length()?;
        let kind = match m.byte()? {
            b'p' => ChangeKind::Put,
            b'd' => ChangeKind::Delete,
            b'e' => ChangeKind::Expire,
            _ => return Err(malformed("an unknown change kind")),
        };
        let key = String::from_utf8(m.take(key_len)?.to_vec())
            .map_err(|_| malformed("a key that is not UTF-8"))?;
        changes.push(Change {
            kind,
            key,
            value: m.rest().to_vec(),
            revision: change_revision,
            at,
        });
    }
    Ok(ChangesReply {
        changes,
        revision,
        now,
    })
}

/// Reads a flat script reply front to back.
pub(super) struct Reader<'a> {
    values: std::slice::Iter<'a, Value>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(values: &'a [Value]) -> Self {
        Reader {
            values: values.iter(),
        }
    }

    pub(super) fn next(&mut self) -> Result<&'a Value, StoreError> {
        self.values.next().ok_or_else(|| malformed("too short"))
    }

    pub(super) fn i64(&mut self) -> Result<i64, StoreError> {
        match self.next()? {
            Value::Int(n) => Ok(*n),
            other => Err(malformed(&format!("expected an integer, got {other:?}"))),
        }
    }

    pub(super) fn u64(&mut self) -> Result<u64, StoreError> {
        u64::try_from(self.i64()?).map_err(|_| malformed("a negative number"))
    }

    /// A number where -1 means none.
    pub(super) fn optional_u64(&mut self) -> Result<Option<u64>, StoreError> {
        let n = self.i64()?;
        Ok((n >= 0).then_some(n as u64))
    }

    pub(super) fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.next()? {
            Value::BulkString(b) => Ok(b.clone()),
            other => Err(malformed(&format!("expected a string, got {other:?}"))),
        }
    }

    pub(super) fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("a key that is not UTF-8"))
    }

    pub(super) fn entry(&mut self) -> Result<Entry, StoreError> {
        Ok(Entry {
            key: self.string()?,
            value: self.bytes()?,
            revision: self.u64()?,
            updated_at: self.u64()?,
            expires_at: self.optional_u64()?,
        })
    }

    /// A presence flag (0 or 1) followed, when 1, by an entry.
    pub(super) fn maybe_entry(&mut self) -> Result<Option<Entry>, StoreError> {
        if self.u64()? == 1 {
            Ok(Some(self.entry()?))
        } else {
            Ok(None)
        }
    }
}
