"""Read-write locks through the component, on both stores."""

from __future__ import annotations

import json
import threading

import pytest

import coord


def test_readers_share_a_writer_excludes_them_and_its_fence_is_above_theirs(backend, name):
    a, b = backend.coord(), backend.coord()
    first = a.acquire_rwlock(name, "catalog", "read", ttl_ms=10_000, wait_ms=0)
    second = b.acquire_rwlock(name, "catalog", "read", ttl_ms=20_000, wait_ms=0)
    assert first.mode == second.mode == "read"
    with pytest.raises(coord.Busy) as busy:
        b.acquire_rwlock(name, "catalog", "write", wait_ms=0)
    assert busy.value.holder.mode == "read"
    assert busy.value.holder.fence == first.fence, "the reader that expires first"
    usage = a.inspect_rwlock(name, "catalog")
    assert usage.writer is None, "the writer that gave up left no claim"
    assert [r.fence for r in usage.readers] == [first.fence, second.fence]
    assert first.owner not in repr(usage)
    assert first.release() is True and first.release() is False
    # A grant carried as JSON to another instance releases there.
    carried = coord.Grant.from_dict(json.loads(json.dumps(second.to_dict())), a)
    assert a.grant_is_held(carried) is True
    assert carried.release() is True
    with a.write_lock(name, "catalog", wait_ms=0) as writer:
        assert writer.fence > second.fence
        with pytest.raises(coord.Busy) as busy:
            b.acquire_rwlock(name, "catalog", "read", wait_ms=0)
        assert busy.value.holder.mode == "write" and busy.value.holder.fence == writer.fence
        extended = a.extend_grant(writer, ttl_ms=5_000)
        assert extended.fence == writer.fence
    assert a.grant_is_held(writer) is False
    with pytest.raises(coord.Lost):
        a.extend_grant(writer)


def test_a_waiting_writer_gets_in_when_the_reader_leaves_and_turns_new_readers_away(backend, name):
    a, b, c = backend.coord(), backend.coord(), backend.coord()
    got = []
    with a.read_lock(name, "schema", ttl_ms=60_000, wait_ms=0) as reader:
        writer = threading.Thread(target=lambda: got.append(
            b.acquire_rwlock(name, "schema", "write", ttl_ms=60_000, wait_ms=60_000)))
        writer.start()
        # Once the writer waits on its claim, a new reader is turned away.
        while a.inspect_rwlock(name, "schema").writer is None:
            assert writer.is_alive(), "the writer ended without waiting"

        with pytest.raises(coord.Busy) as busy:
            c.acquire_rwlock(name, "schema", "read", wait_ms=0)
        assert busy.value.holder.mode == "write"
        assert a.grant_is_held(reader)
    writer.join()
    assert len(got) == 1 and got[0].fence > reader.fence
    assert got[0].release()


@pytest.mark.parametrize("mode", ["READ", "shared", "", None])
def test_a_mode_out_of_range_is_refused_naming_the_field(backend, name, mode):
    with pytest.raises(coord.InvalidArgument) as e:
        backend.coord().acquire_rwlock(name, "t", mode, wait_ms=0)
    assert e.value.field == "mode"


def test_a_forged_grant_is_refused_naming_the_field(backend, name):
    c = backend.coord()
    grant = c.acquire_rwlock(name, "t", "read", wait_ms=0)
    forged = coord.Grant.from_dict({**grant.to_dict(), "owner": "not-a-token"}, c)
    with pytest.raises(coord.InvalidArgument) as e:
        c.release_grant(forged)
    assert e.value.field == "grant.owner"
    assert grant.release() is True
