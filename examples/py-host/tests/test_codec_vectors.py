"""The Redis wire format against the vectors the Rust codec generates
(host-test/redis/vectors.json, written by host-test/redis/src/vectors.rs):
the same inputs give the same keys, script lines, SHA-1s and argument
bytes here as there, and the same reply bytes the same reading."""

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from coord.store import redis_codec
from coord.store.redis_backend import (DEFAULT_SCRIPTS_DIR, partition_key, read_script,
                                       sha1_hex, store_script, unwatched_script)
from coord.store.types import (ChangesReply, Condition, Entry, ListReply, MeterReply,
                               MeterRequest, StoreUnavailable, WriteReply)

VECTORS = json.loads((DEFAULT_SCRIPTS_DIR / "vectors.json").read_text())


def unhex(text: Optional[str]) -> Optional[bytes]:
    return None if text is None else bytes.fromhex(text)


def condition(c: Optional[dict]) -> Optional[Condition]:
    if c is None:
        return None
    return Condition(c["kind"], c.get("revision", 0), unhex(c.get("value_hex")) or b"",
                     c.get("limit", 0))


def entry(e: Optional[dict]) -> Optional[Entry]:
    if e is None:
        return None
    return Entry(e["key"], unhex(e["value_hex"]), e["revision"], e["updated_at"], e["expires_at"])


def shown(arg: Any) -> dict:
    """An argument as the vectors show it: text, or bytes as hex."""
    if isinstance(arg, (bytes, bytearray)):
        return {"hex": bytes(arg).hex()}
    return {"text": str(arg)}


def reading(read) -> Any:
    """What a reader gives, or ``{"error": "unavailable"}`` when it refuses the bytes."""
    try:
        return read()
    except StoreUnavailable:
        return {"error": "unavailable"}


def test_keys_are_the_rust_backends():
    assert VECTORS["keys"]
    for v in VECTORS["keys"]:
        assert partition_key(v["prefix"], v["partition"], v["part"]) == v["key"]


@pytest.mark.parametrize("v", VECTORS["scripts"], ids=lambda v: f"cluster={v['cluster']}")
def test_scripts_load_behind_the_rust_backends_line_with_its_sha(v):
    publish = "SPUBLISH" if v["cluster"] else "PUBLISH"
    store = store_script(read_script(DEFAULT_SCRIPTS_DIR, "redis.lua"), v["history"],
                         v["retention_ms"], publish)
    assert store.split("\n")[0] == v["store_line"]
    assert sha1_hex(store) == v["store_sha"]
    unwatched = unwatched_script(read_script(DEFAULT_SCRIPTS_DIR, "unwatched.lua"),
                                 v["retention_ms"], publish, stream=not v["cluster"])
    assert unwatched.split("\n")[0] == v["unwatched_line"]
    assert sha1_hex(unwatched) == v["unwatched_sha"]
    assert sha1_hex(read_script(DEFAULT_SCRIPTS_DIR, "meter.lua")) == VECTORS["meter_sha"]


@pytest.mark.parametrize("v", VECTORS["calls"], ids=lambda v: f"{v['op']}@{v['partition']}")
def test_each_store_call_sends_the_rust_backends_arguments(v):
    inputs = dict(key=v["key"], value=unhex(v["value_hex"]), ttl_ms=v["ttl_ms"],
                  condition=condition(v["condition"]), after=v["after"])
    assert ("unwatched" if redis_codec.one_string(v["partition"]) else "store") == v["script"]
    if redis_codec.one_string(v["partition"]):
        for clock, args in ((-1.0, v["args"]), (1_750_000_000_000.0, v["args_at_clock_1750000000000"])):
            packed = redis_codec.packed_unwatched(v["op"], clock=clock, **inputs)
            assert args[0] == {"text": "1"}
            assert args[1] == {"text": partition_key(v["prefix"], v["partition"], "s")}
            assert args[2] == shown(packed)
    else:
        own = [shown(a) for a in redis_codec.script_args(v["op"], max=v["max"], **inputs)]
        keys = [partition_key(v["prefix"], v["partition"], part) for part in "exf"]
        wake = partition_key(v["prefix"], v["partition"], "w")
        for clock, args in (("", v["args"]), ("1750000000000", v["args_at_clock_1750000000000"])):
            assert args == [shown(a) for a in ["3", *keys, v["op"], clock, wake]] + own


@pytest.mark.parametrize("v", VECTORS["meter_requests"], ids=lambda v: v["algorithm"])
def test_a_meter_request_is_packed_as_the_rust_backend_packs_it(v):
    request = MeterRequest(v["algorithm"], v["limit"], v["window_ms"], v["cost"], v["mode"],
                           v["refund_at"] or 0)
    assert redis_codec.packed_meter(request, clock=v["clock"]).hex() == v["packed_hex"]


@pytest.mark.parametrize("v", VECTORS["write_replies"])
def test_write_replies_read_as_the_rust_codec_reads_them(v):
    sent = unhex(v["sent_hex"])
    if "packed_hex" in v:
        got = reading(lambda: redis_codec.applied_write(bytes.fromhex(v["packed_hex"]), v["key"], sent))
    else:
        reply = [a if isinstance(a, int) else bytes.fromhex(a["hex"]) for a in v["array"]]
        got = reading(lambda: redis_codec.write_reply(reply, v["key"], sent))
    r = v["reads_as"]
    assert got == (r if "error" in r else WriteReply(r["applied"], entry(r["entry"]), r["now"], r["revision"]))


@pytest.mark.parametrize("v", VECTORS["listings"])
def test_listings_read_as_the_rust_codec_reads_them(v):
    got = reading(lambda: redis_codec.listing(bytes.fromhex(v["packed_hex"])))
    r = v["reads_as"]
    want = r if "error" in r else ListReply([entry(e) for e in r["entries"]], r["revision"], r["now"])
    assert got == want


@pytest.mark.parametrize("v", VECTORS["pages"])
def test_pages_read_as_the_rust_codec_reads_them(v):
    got = reading(lambda: redis_codec.page(bytes.fromhex(v["packed_hex"])))
    r = v["reads_as"]
    if "error" in r:
        assert got == r
        return
    assert isinstance(got, ChangesReply)
    assert (got.revision, got.now) == (r["revision"], r["now"])
    assert [(c.kind, c.key, c.value, c.revision, c.at) for c in got.changes] == \
        [(c["kind"], c["key"], unhex(c["value_hex"]), c["revision"], c["at"]) for c in r["changes"]]


@pytest.mark.parametrize("v", VECTORS["meter_replies"])
def test_meter_replies_read_as_the_rust_codec_reads_them(v):
    got = reading(lambda: redis_codec.meter_reply(bytes.fromhex(v["packed_hex"])))
    r = v["reads_as"]
    want = r if "error" in r else MeterReply(r["allowed"], r["remaining"], r["reset_in_ms"],
                                             r["retry_after_ms"], r["now"])
    assert got == want
