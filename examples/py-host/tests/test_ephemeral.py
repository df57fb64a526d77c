"""Ephemeral state through the component, on both stores."""

from __future__ import annotations

import threading
import time

import pytest

import coord


def test_put_get_list_snapshot_touch_delete(backend, name):
    c = backend.coord()
    space = coord.Space(name, ttl_ms=60_000, max_value_bytes=64)
    w1 = c.put(space, "item:1", "session-b", b'{"user": "bob"}')
    w2 = c.put(space, "item:1", "session-a", "ada")
    c.put(space, "item:1", "other", b"x")
    c.put(space, "item:2", "session-z", b"elsewhere")
    assert w2.revision > w1.revision and w2.updated_at >= w1.updated_at

    got = c.get(space, "item:1", "session-a")
    assert got.value == b"ada" and got.text == "ada" and got.revision == w2.revision
    assert c.get(space, "item:1", "session") is None, "a prefix is not a key"
    assert c.get(space, "item:1", "missing") is None

    assert [e.key for e in c.list(space, "item:1", prefix="session-")] == ["session-a",
                                                                           "session-b"]
    snapshot = c.snapshot(space, "item:1")
    assert [e.key for e in snapshot.entries] == ["other", "session-a", "session-b"]
    assert snapshot.revision >= w2.revision

    assert c.touch(space, "item:1", "session-a") is True
    assert c.delete(space, "item:1", "session-a") is True
    assert c.delete(space, "item:1", "session-a") is False
    assert c.touch(space, "item:1", "session-a") is False, "gone: recreate it"
    assert c.get(space, "item:1", "session-a") is None


def test_a_watch_sees_put_delete_expire_and_resumes_from_its_cursor(backend, name):
    writer, watcher = backend.coord(), backend.coord()
    space = coord.Space(name, ttl_ms=400)
    writer.put(space, "doc", "existing", b"0")

    # Without `after`, the current entries come first, as upserts.
    with watcher.watch(space, "doc") as w:
        first = w.next(0)
        assert (first.kind, first.key, first.value) == ("upsert", "existing", b"0")
        assert w.next(0) is None
        start = w.revision

    with watcher.watch(space, "doc", after=start, timeout_ms=100) as w:
        writer.put(space, "doc", "a", b"1")
        writer.put(space, "doc", "b", b"2")
        writer.delete(space, "doc", "a")
        events = list(w)  # ends after 100 ms with nothing new
        assert [(e.kind, e.key, e.value) for e in events] == [
            ("upsert", "a", b"1"), ("upsert", "b", b"2"), ("delete", "a", b"")]
        assert all(x.revision < y.revision for x, y in zip(events, events[1:]))
        cursor = w.revision
        assert cursor == events[-1].revision

    backend.advance(450)  # "existing" and "b" run out with nobody watching
    with watcher.watch(space, "doc", after=cursor) as w:
        expired = [w.next(2_000), w.next(2_000)]
        assert sorted((e.kind, e.key) for e in expired) == [("expire", "b"),
                                                           ("expire", "existing")]
        assert all(e.revision > cursor for e in expired)
        assert w.next(0) is None, "nothing repeated"


def test_a_watch_is_woken_by_an_expiry(backend, name):
    c = backend.coord()
    space = coord.Space(name, ttl_ms=300)
    c.put(space, "doc", "k", b"v")
    snapshot = c.snapshot(space, "doc")
    if backend.kind == "memory":
        # Nothing writes while the watch waits: only the clock moves.
        threading.Timer(0.2, backend.advance, [300]).start()
    with c.watch(space, "doc", after=snapshot.revision) as w:
        started = time.monotonic()
        event = w.next(5_000)
        took = time.monotonic() - started
    assert (event.kind, event.key) == ("expire", "k")
    assert 0.15 <= took < 2.0, f"woken after {took:.3f} s"


def test_a_watch_too_far_behind_is_told_to_resync(backend, name):
    c = backend.coord(history=4)
    space = coord.Space(name, ttl_ms=60_000)
    start = c.snapshot(space, "doc").revision
    c.put(space, "doc", "k", b"0")
    first = c.snapshot(space, "doc").revision
    for i in range(8):
        c.put(space, "doc", "k", str(i).encode())
    events = list(c.watch(space, "doc", after=first, timeout_ms=0))
    assert [e.kind for e in events] == ["resync-required"]
    assert start < first


def test_bad_ephemeral_input_names_the_field(backend, name):
    c = backend.coord()
    space = coord.Space(name, ttl_ms=1_000, max_value_bytes=4)
    cases = [
        (lambda: c.put(space, "t", "k", b"12345"), "value"),
        (lambda: c.put(coord.Space(name, ttl_ms=0), "t", "k", b"v"), "space.ttl-ms"),
        (lambda: c.put(space, "", "k", b"v"), "tenant"),
        (lambda: c.put(space, "t", "k" * 1025, b"v"), "key"),
        (lambda: c.snapshot(space, "t", prefix="p" * 1025), "prefix"),
    ]
    for call, field in cases:
        with pytest.raises(coord.InvalidArgument) as invalid:
            call()
        assert invalid.value.field == field, invalid.value
    assert sum(c.store_calls.values()) == 0, "the store was asked"
