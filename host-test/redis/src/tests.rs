//! Unit tests of the reply codec and the script text.
#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

use coord_host::backend::{ChangeKind, Entry, Outcome, StoreError, WriteReply};

use super::codec::{applied_write, listing, meter_reply, page};

/// What the script packs for an applied write.
pub(super) fn packed(with_value: u8, numbers: [f64; 5], value: &[u8]) -> Vec<u8> {
    let mut out = vec![with_value];
    for n in numbers {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(value);
    out
}

fn entry(reply: WriteReply) -> Entry {
    match reply.outcome {
        Outcome::Applied(e) => e,
        other => panic!("expected applied, got {other:?}"),
    }
}

#[test]
fn a_packed_write_reply_takes_its_value_from_the_reply_or_from_the_call() {
    // now, the partition's revision, the entry's, updated-at, expires-at (a
    // touch: the partition has moved on since the entry was put).
    let numbers = [1000.0, 1_000_007.0, 1_000_000.0, 999.0, 5000.0];
    let from_reply = applied_write(&packed(1, numbers, b"v"), "k", None).unwrap();
    assert_eq!((from_reply.now, from_reply.revision), (1000, 1_000_007));
    assert_eq!(
        entry(from_reply),
        Entry {
            key: "k".into(),
            value: b"v".to_vec(),
            revision: 1_000_000,
            updated_at: 999,
            expires_at: Some(5000),
        }
    );
    let from_call = applied_write(&packed(0, numbers, b""), "k", Some(b"sent")).unwrap();
    assert_eq!(entry(from_call).value, b"sent");
    let no_ttl = [1000.0, 1_000_000.0, 1_000_000.0, 999.0, -1.0];
    assert_eq!(
        entry(applied_write(&packed(1, no_ttl, b""), "k", None).unwrap()).expires_at,
        None
    );
}

/// What the script packs for one listed entry.
pub(super) fn listed(field: &[u8], numbers: [f64; 3], value: &[u8]) -> Vec<u8> {
    let mut stored = Vec::new();
    for n in numbers {
        stored.extend_from_slice(&n.to_le_bytes());
    }
    stored.extend_from_slice(value);
    let mut out = Vec::new();
    for len in [field.len(), stored.len()] {
        out.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
    }
    out.extend_from_slice(field);
    out.extend_from_slice(&stored);
    out
}

pub(super) fn listing_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = [7.0f64, 42.0].map(f64::to_le_bytes).concat();
    for e in entries {
        out.extend_from_slice(e);
    }
    out
}

#[test]
fn a_packed_listing_is_read_in_key_byte_order() {
    let reply = listing(&listing_of(&[
        listed(b"=b", [3.0, 1.0, -1.0], b"second"),
        listed(b"=a", [2.0, 1.0, 900.0], b""),
    ]))
    .unwrap();
    assert_eq!((reply.now, reply.revision), (7, 42));
    let got: Vec<_> = reply
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_slice(), e.revision, e.expires_at))
        .collect();
    assert_eq!(
        got,
        [
            ("a", &b""[..], 2, Some(900)),
            ("b", &b"second"[..], 3, None)
        ]
    );
    assert_eq!(listing(&listing_of(&[])).unwrap().entries, vec![]);
}

#[test]
fn a_malformed_packed_listing_is_an_error_not_a_panic() {
    let good = listed(b"=k", [2.0, 1.0, 900.0], b"v");
    let cases = [
        listing_of(std::slice::from_ref(&good))[..20].to_vec(), // cut short in the entry
        listing_of(&[good[..good.len() - 1].to_vec()]),         // stored bytes cut short
        listing_of(&[listed(b"#", [2.0, 1.0, 900.0], b"v")]),   // not an entry
        listing_of(&[listed(b"=\xff", [2.0, 1.0, 900.0], b"v")]), // key not UTF-8
        listing_of(&[listed(b"=k", [2.5, 1.0, 900.0], b"v")]),  // not a whole number
        listing_of(&[[1u8, 0, 0, 0, 200, 0, 0, 0, b'='].to_vec()]), // lengths past the end
        vec![1, 2, 3],                                          // no header
    ];
    for case in cases {
        match listing(&case) {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
            other => panic!("expected a malformed reply, got {other:?}"),
        }
    }
}

/// What the script packs for one change of a page.
pub(super) fn paged(id: &[u8], at: f64, kind: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut message = [at, 1.0, 1.0].map(f64::to_le_bytes).concat();
    message.extend_from_slice(&u32::try_from(key.len()).unwrap().to_le_bytes());
    message.push(kind);
    message.extend_from_slice(key);
    message.extend_from_slice(value);
    let mut out = Vec::new();
    for len in [id.len(), message.len()] {
        out.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
    }
    out.extend_from_slice(id);
    out.extend_from_slice(&message);
    out
}

#[test]
fn a_packed_page_of_changes_is_read_in_order_and_malformed_ones_are_errors() {
    let reply = page(&listing_of(&[
        paged(b"11-0", 5.0, b'p', b"k", b"v"),
        paged(b"12-0", 6.0, b'e', b"k", b""),
    ]))
    .unwrap();
    assert_eq!((reply.now, reply.revision), (7, 42));
    let got: Vec<_> = reply
        .changes
        .iter()
        .map(|c| (c.kind, c.key.as_str(), c.value.as_slice(), c.revision, c.at))
        .collect();
    assert_eq!(
        got,
        [
            (ChangeKind::Put, "k", &b"v"[..], 11, 5),
            (ChangeKind::Expire, "k", &b""[..], 12, 6)
        ]
    );
    let cases = [
        listing_of(&[paged(b"11", 5.0, b'p', b"k", b"v")]), // an id without its sequence
        listing_of(&[paged(b"x-0", 5.0, b'p', b"k", b"v")]), // an id that is no revision
        listing_of(&[paged(b"11-0", 5.0, b'?', b"k", b"v")]), // an unknown kind
        listing_of(&[paged(b"11-0", -3.0, b'p', b"k", b"v")]), // a negative time
        listing_of(&[paged(b"11-0", 5.0, b'p', b"k", b"v")])[..30].to_vec(), // cut short
    ];
    for case in cases {
        match page(&case) {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
            other => panic!("expected a malformed reply, got {other:?}"),
        }
    }
}

#[test]
fn a_packed_meter_reply_is_read_and_malformed_ones_are_errors() {
    let pack = |allowed: u8, numbers: [f64; 4]| {
        let mut out = vec![allowed];
        for n in numbers {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    };
    let reply = meter_reply(&pack(1, [9.0, 60_000.0, 0.0, 1000.0])).unwrap();
    assert!(reply.allowed);
    assert_eq!(
        (
            reply.remaining,
            reply.reset_in_ms,
            reply.retry_after_ms,
            reply.now
        ),
        (9, 60_000, 0, 1000)
    );
    let mut too_long = pack(1, [9.0, 1.0, 0.0, 1000.0]);
    too_long.push(0);
    let cases = [
        pack(2, [9.0, 1.0, 0.0, 1000.0]),  // allowed neither 0 nor 1
        pack(1, [5e9, 1.0, 0.0, 1000.0]),  // remaining beyond a u32
        pack(0, [9.0, 1.0, -1.0, 1000.0]), // a negative retry-after
        pack(1, [9.0, 1.0, 0.0, 1000.0])[..20].to_vec(), // cut short
        too_long,
    ];
    for case in cases {
        match meter_reply(&case) {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
            other => panic!("expected a malformed reply, got {other:?}"),
        }
    }
}

#[test]
fn a_malformed_packed_write_reply_is_an_error_not_a_panic() {
    let good = [1000.0, 1_000_000.0, 1_000_000.0, 999.0, 5000.0];
    let cases = [
        packed(1, good, b"")[..20].to_vec(),            // cut short
        packed(0, good, b""),                           // no value anywhere
        packed(0, good, b"extra"),                      // a value it should not carry
        packed(1, [1000.5, 1.0, 1.0, 1.0, 1.0], b""),   // not a whole number
        packed(1, [1000.0, 1.0, -2.0, 1.0, 1.0], b""),  // negative
        packed(1, [1000.0, -2.0, 1.0, 1.0, 1.0], b""),  // a negative partition revision
        packed(1, [1000.0, 1.0, 1.0, 1.0, -2.0], b""),  // an expiry below -1
        packed(1, [f64::NAN, 1.0, 1.0, 1.0, 1.0], b""), // not a number
    ];
    for case in cases {
        match applied_write(&case, "k", None) {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
            other => panic!("expected a malformed reply, got {other:?}"),
        }
    }
}
