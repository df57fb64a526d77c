//! The Redis wire format as test vectors, generated from this crate's own
//! codec into `host-test/redis/vectors.json`, which the JavaScript host
//! (`examples/js-host/test/codec.test.mjs`) and the Python host
//! (`examples/py-host/tests/test_codec_vectors.py`) check their codecs
//! against: the keys, the scripts as loaded (their configuration lines and
//! SHA-1s), each operation's script arguments, and the scripts' packed
//! replies as this codec reads them.
//!
//! The test fails when the file differs from what the codec generates;
//! `COORD_WRITE_VECTORS=1 cargo test -p coord-redis vectors` writes it
//! again (then the other hosts' tests say whether they still agree).

use ::redis::Value;
use coord_host::backend::{
    ChangeKind, ChangesReply, Condition, Entry, Guard, ListReply, MeterAlgorithm, MeterMode,
    MeterReply, MeterRequest, Outcome, StoreError, WriteReply,
};
use serde_json::{Value as Json, json};

use super::codec::{
    Inputs, Op, applied_write, listing, meter_reply, packed_meter, page, write_reply,
};
use super::tests::{listed, listing_of, packed, paged};
use super::{
    METER_SCRIPT, RedisConfig, ScriptClock, one_string, partition_key, script_command, sha1_hex,
    store_script, unwatched_script,
};

/// Where the vectors live, beside the scripts they describe.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors.json");

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn condition_json(condition: Option<&Condition>) -> Json {
    match condition {
        None => Json::Null,
        Some(Condition::Always) => json!({ "kind": "always" }),
        Some(Condition::Absent) => json!({ "kind": "absent" }),
        Some(Condition::Revision(revision)) => json!({ "kind": "revision", "revision": revision }),
        Some(Condition::RevisionAndValue(g)) => json!({
            "kind": "revision-and-value", "revision": g.revision, "value_hex": hex(&g.value),
        }),
        Some(Condition::AbsentAndFewerThan(limit)) => {
            json!({ "kind": "absent-and-fewer-than", "limit": limit })
        }
    }
}

fn entry_json(entry: &Entry) -> Json {
    json!({
        "key": entry.key,
        "value_hex": hex(&entry.value),
        "revision": entry.revision,
        "updated_at": entry.updated_at,
        "expires_at": entry.expires_at,
    })
}

/// A reply as this codec reads it, or `{"error": "unavailable"}`.
fn read_json<T>(read: Result<T, StoreError>, shown: impl Fn(&T) -> Json) -> Json {
    match read {
        Ok(reply) => shown(&reply),
        Err(StoreError::Unavailable(_)) => json!({ "error": "unavailable" }),
        Err(other) => panic!("a reply read as {other:?}"),
    }
}

fn write_json(reply: &WriteReply) -> Json {
    let (applied, entry) = match &reply.outcome {
        Outcome::Applied(entry) => (true, Some(entry)),
        Outcome::Conflict(entry) => (false, entry.as_ref()),
    };
    json!({
        "now": reply.now,
        "revision": reply.revision,
        "applied": applied,
        "entry": entry.map(entry_json),
    })
}

fn list_json(reply: &ListReply) -> Json {
    let entries: Vec<Json> = reply.entries.iter().map(entry_json).collect();
    json!({ "now": reply.now, "revision": reply.revision, "entries": entries })
}

fn page_json(reply: &ChangesReply) -> Json {
    let changes: Vec<Json> = reply
        .changes
        .iter()
        .map(|c| {
            json!({
                "kind": match c.kind {
                    ChangeKind::Put => "put",
                    ChangeKind::Delete => "delete",
                    ChangeKind::Expire => "expire",
                },
                "key": c.key,
                "value_hex": hex(&c.value),
                "revision": c.revision,
                "at": c.at,
            })
        })
        .collect();
    json!({ "now": reply.now, "revision": reply.revision, "changes": changes })
}

fn meter_json(reply: &MeterReply) -> Json {
    json!({
        "allowed": reply.allowed,
        "remaining": reply.remaining,
        "reset_in_ms": reply.reset_in_ms,
        "retry_after_ms": reply.retry_after_ms,
        "now": reply.now,
    })
}

/// One store call's inputs, named as the vectors name them.
struct Call {
    partition: &'static str,
    op: Op,
    key: &'static str,
    value: Option<&'static [u8]>,
    ttl_ms: Option<i64>,
    condition: Option<Condition>,
    after: u64,
    max: u32,
}

impl Call {
    fn new(partition: &'static str, op: Op, key: &'static str) -> Call {
        Call {
            partition,
            op,
            key,
            value: None,
            ttl_ms: None,
            condition: None,
            after: 0,
            max: 0,
        }
    }

    /// The call as a vector: its inputs, and the arguments after the SHA
    /// (text arguments as strings, others as hex), with Redis's TIME and
    /// with a test clock.
    fn vector(&self) -> Json {
        let inputs = Inputs {
            key: self.key,
            value: self.value,
            ttl_ms: self.ttl_ms,
            condition: self.condition.as_ref(),
            after: self.after,
            max: self.max,
        };
        let args = |clock: Option<u64>| -> Vec<Json> {
            let clock = clock.map_or(ScriptClock::Redis, ScriptClock::Test);
            let cmd = script_command("SHA", "coord", self.partition, self.op, &inputs, clock);
            cmd.args_iter()
                .skip(2) // EVALSHA and the SHA
                .map(|arg| match arg {
                    ::redis::Arg::Simple(bytes) => match std::str::from_utf8(bytes) {
                        Ok(text) if self.is_text(text) => json!({ "text": text }),
                        _ => json!({ "hex": hex(bytes) }),
                    },
                    _ => unreachable!("a script call has no cursor"),
                })
                .collect()
        };
        json!({
            "prefix": "coord",
            "partition": self.partition,
            // Which script keeps the partition: every host must choose alike.
            "script": if one_string(self.partition) { "unwatched" } else { "store" },
            "op": self.op.name(),
            "key": self.key,
            "value_hex": self.value.map(hex),
            "ttl_ms": self.ttl_ms,
            "condition": condition_json(self.condition.as_ref()),
            "after": self.after,
            "max": self.max,
            "args": args(None),
            "args_at_clock_1750000000000": args(Some(1_750_000_000_000)),
        })
    }

    /// Whether an argument is shown as text: every one but a value, a
    /// guard's value, and unwatched.lua's packed argument.
    fn is_text(&self, text: &str) -> bool {
        let bytes = text.as_bytes();
        let value = self.value.is_some_and(|v| v == bytes);
        let guard =
            matches!(&self.condition, Some(Condition::RevisionAndValue(g)) if g.value == bytes);
        !value && !guard && !text.contains('\0')
    }
}

fn calls() -> Vec<Call> {
    let guard = |revision, value: &[u8]| {
        Some(Condition::RevisionAndValue(Guard {
            revision,
            value: value.to_vec(),
        }))
    };
    let mut calls = Vec::new();
    // A watched partition, a lock's (one string) and a semaphore's (an
    // unwatched partition that may hold many entries: redis.lua's layout).
    for partition in [
        "eph:1:a:b",
        "~lock:15:inventory.stock:item:{1}%",
        "~sem:11:partner.api:tenant:1",
    ] {
        calls.push(Call::new(partition, Op::Get, "k"));
        calls.push(Call {
            value: Some(b"h"),
            condition: Some(Condition::Revision(42)),
            ..Call::new(partition, Op::Put, "k")
        });
        calls.push(Call {
            value: Some(b"\x00\xffv"),
            ttl_ms: Some(500),
            condition: Some(Condition::Absent),
            ..Call::new(partition, Op::Put, "holder")
        });
        calls.push(Call {
            value: Some(b"0123456789abcdef0123456789abcdef"),
            ttl_ms: Some(500),
            condition: Some(Condition::AbsentAndFewerThan(3)),
            ..Call::new(partition, Op::Put, "permit")
        });
        calls.push(Call {
            ttl_ms: Some(500),
            condition: guard(7, &[1, 2]),
            ..Call::new(partition, Op::Touch, "holder")
        });
        calls.push(Call {
            condition: Some(Condition::Always),
            ..Call::new(partition, Op::Delete, "k")
        });
        calls.push(Call::new(partition, Op::List, "user:"));
        calls.push(Call::new(partition, Op::Check, ""));
    }
    calls.push(Call {
        after: 5,
        max: 100,
        ..Call::new("eph:1:a:b", Op::Changes, "")
    });
    calls.push(Call {
        after: 9,
        ..Call::new("~lease:3:job", Op::Arm, "")
    });
    calls
}

fn scripts() -> Vec<Json> {
    let configs = [
        RedisConfig::new("redis://unused"),
        RedisConfig {
            history: 8,
            retention_ms: 60_000,
            cluster: true,
            ..RedisConfig::new("redis://unused")
        },
    ];
    configs
        .iter()
        .map(|config| {
            let store = store_script(config);
            let unwatched = unwatched_script(config);
            let first_line = |text: &str| text.lines().next().unwrap_or_default().to_string();
            json!({
                "history": config.history,
                "retention_ms": config.retention_ms,
                "cluster": config.cluster,
                "store_line": first_line(&store),
                "store_sha": sha1_hex(&store),
                "unwatched_line": first_line(&unwatched),
                "unwatched_sha": sha1_hex(&unwatched),
            })
        })
        .collect()
}

fn keys() -> Vec<Json> {
    [
        ("coord", "~lock:15:inventory.stock:item:1", "s"),
        ("coord", "eph:1:a:{b}%", "e"),
        ("c", "%7B", "e"),
        ("c", "{", "e"),
        ("tenant-9", "rl:1:m:x", "r:"),
    ]
    .iter()
    .map(|(prefix, partition, part)| {
        json!({
            "prefix": prefix, "partition": partition, "part": part,
            "key": partition_key(prefix, partition, part),
        })
    })
    .collect()
}

fn write_replies() -> Vec<Json> {
    let mut out = Vec::new();
    let mut packed_case = |bytes: Vec<u8>, key: &str, sent: Option<&[u8]>| {
        out.push(json!({
            "packed_hex": hex(&bytes),
            "key": key,
            "sent_hex": sent.map(hex),
            "reads_as": read_json(applied_write(&bytes, key, sent), write_json),
        }));
    };
    // now, the partition's revision, the entry's, updated-at, expires-at.
    packed_case(
        packed(1, [1000.0, 1e6, 1e6, 999.0, 5000.0], b"v"),
        "k",
        None,
    );
    packed_case(
        packed(0, [1000.0, 1e6 + 3.0, 1e6, 999.0, -1.0], b""),
        "k",
        Some(&[7]),
    );
    packed_case(packed(0, [1.0, 1.0, 1.0, 1.0, 1.0], b""), "k", None);
    packed_case(packed(1, [1.5, 1.0, 1.0, 1.0, 1.0], b"v"), "k", None);
    packed_case(packed(1, [1.0, -2.0, 1.0, 1.0, 1.0], b"v"), "k", None);
    packed_case(
        packed(1, [1000.0, 1e6, 1e6, 1.0, 1.0], b"")[..20].to_vec(),
        "k",
        None,
    );
    // A conflict: an array of numbers and strings (bytes as hex): now, 0
    // (not applied), the partition's revision, then 1 and the entry or 0.
    let conflicts: [Vec<Value>; 2] = [
        vec![
            Value::Int(1000),
            Value::Int(0),
            Value::Int(9),
            Value::Int(1),
            Value::BulkString(b"k".to_vec()),
            Value::BulkString(b"x".to_vec()),
            Value::Int(5),
            Value::Int(4),
            Value::Int(-1),
        ],
        vec![
            Value::Int(1000),
            Value::Int(0),
            Value::Int(7),
            Value::Int(0),
        ],
    ];
    for reply in conflicts {
        let shown: Vec<Json> = reply
            .iter()
            .map(|v| match v {
                Value::Int(n) => json!(n),
                Value::BulkString(bytes) => json!({ "hex": hex(bytes) }),
                other => unreachable!("{other:?}"),
            })
            .collect();
        out.push(json!({
            "array": shown,
            "key": "k",
            "sent_hex": null,
            "reads_as": read_json(write_reply(Value::Array(reply), "k", None), write_json),
        }));
    }
    out
}

fn listings() -> Vec<Json> {
    let good = listed(b"=k", [2.0, 1.0, 900.0], b"v");
    [
        listing_of(&[
            listed(b"=b", [3.0, 2.0, -1.0], b"two"),
            good.clone(),
            listed(b"=a\xc3\xa9", [4.0, 3.0, 5000.0], b""),
        ]),
        listing_of(&[]),
        listing_of(&[good[..good.len() - 1].to_vec()]),
        listing_of(&[listed(b"#", [2.0, 1.0, 900.0], b"v")]),
        listing_of(&[listed(b"=k", [2.5, 1.0, 900.0], b"v")]),
        vec![1, 2, 3],
    ]
    .iter()
    .map(|bytes| json!({ "packed_hex": hex(bytes), "reads_as": read_json(listing(bytes), list_json) }))
    .collect()
}

fn pages() -> Vec<Json> {
    let header = [1000.0f64, 12.0].map(f64::to_le_bytes).concat();
    let with = |changes: &[Vec<u8>]| {
        let mut bytes = header.clone();
        for change in changes {
            bytes.extend_from_slice(change);
        }
        bytes
    };
    [
        with(&[
            paged(b"10-0", 900.0, b'p', b"k", b"v1"),
            paged(b"11-0", 950.0, b'd', b"k", b""),
            paged(b"12-0", 990.0, b'e', b"j", b""),
        ]),
        with(&[]),
        with(&[paged(b"10-1", 900.0, b'p', b"k", b"v")]),
        with(&[paged(b"10-0", 900.0, b'x', b"k", b"v")]),
        with(&[paged(b"10-0", 900.0, b'p', b"k", b"v")[..20].to_vec()]),
    ]
    .iter()
    .map(|bytes| json!({ "packed_hex": hex(bytes), "reads_as": read_json(page(bytes), page_json) }))
    .collect()
}

fn meters() -> (Vec<Json>, Vec<Json>) {
    let requests = [
        (
            MeterAlgorithm::SlidingWindow,
            MeterMode::Consume,
            10,
            60_000,
            1,
            -1.0,
        ),
        (
            MeterAlgorithm::FixedWindow,
            MeterMode::Peek,
            5,
            1000,
            2,
            1_750_000_000_000.0,
        ),
        (
            MeterAlgorithm::Gcra,
            MeterMode::Reset,
            10_000_000,
            86_400_000,
            3,
            -1.0,
        ),
        (
            MeterAlgorithm::SlidingWindow,
            MeterMode::Charge,
            10,
            60_000,
            4,
            -1.0,
        ),
        (
            MeterAlgorithm::Gcra,
            MeterMode::Refund(1_749_999_999_000),
            100,
            1000,
            5,
            1_750_000_000_000.0,
        ),
    ]
    .iter()
    .map(|&(algorithm, mode, limit, window_ms, cost, clock)| {
        let request = MeterRequest {
            algorithm,
            mode,
            limit,
            window_ms,
            cost,
        };
        json!({
            "algorithm": match algorithm {
                MeterAlgorithm::SlidingWindow => "sliding-window",
                MeterAlgorithm::FixedWindow => "fixed-window",
                MeterAlgorithm::Gcra => "gcra",
            },
            "mode": match mode {
                MeterMode::Consume => "consume",
                MeterMode::Peek => "peek",
                MeterMode::Reset => "reset",
                MeterMode::Charge => "charge",
                MeterMode::Refund(_) => "refund",
            },
            "refund_at": match mode {
                MeterMode::Refund(at) => Some(at),
                _ => None,
            },
            "limit": limit, "window_ms": window_ms, "cost": cost, "clock": clock,
            "packed_hex": hex(&packed_meter(&request, clock)),
        })
    })
    .collect();
    let reply = |allowed: u8, numbers: [f64; 4]| {
        let mut bytes = vec![allowed];
        bytes.extend(numbers.map(f64::to_le_bytes).concat());
        bytes
    };
    let replies = [
        reply(1, [4.0, 60_000.0, 0.0, 1000.0]),
        reply(0, [0.0, 10.0, 25.0, 1000.0]),
        reply(2, [0.0, 10.0, 25.0, 1000.0]),
        reply(1, [4.5, 60_000.0, 0.0, 1000.0]),
        reply(1, [4.0, 60_000.0, 0.0, 1000.0])[..30].to_vec(),
    ]
    .iter()
    .map(|bytes| json!({ "packed_hex": hex(bytes), "reads_as": read_json(meter_reply(bytes), meter_json) }))
    .collect();
    (requests, replies)
}

/// Every vector, as the file holds it.
fn generate() -> Json {
    let (meter_requests, meter_replies) = meters();
    json!({
        "about": "The Redis wire format, generated from host-test/redis/src/codec.rs by \
                  `COORD_WRITE_VECTORS=1 cargo test -p coord-redis vectors`; do not edit.",
        "keys": keys(),
        "scripts": scripts(),
        "meter_sha": sha1_hex(METER_SCRIPT),
        "calls": calls().iter().map(Call::vector).collect::<Vec<_>>(),
        "write_replies": write_replies(),
        "listings": listings(),
        "pages": pages(),
        "meter_requests": meter_requests,
        "meter_replies": meter_replies,
    })
}

#[test]
fn the_vectors_file_is_what_the_codec_generates() {
    let generated = serde_json::to_string_pretty(&generate()).expect("JSON") + "\n";
    if std::env::var_os("COORD_WRITE_VECTORS").is_some() {
        std::fs::write(PATH, &generated).expect("write vectors.json");
    }
    let kept = std::fs::read_to_string(PATH).unwrap_or_default();
    assert!(
        kept == generated,
        "{PATH} is not what the codec generates: run \
         `COORD_WRITE_VECTORS=1 cargo test -p coord-redis vectors`, then the JS and \
         Python hosts' codec tests"
    );
}
