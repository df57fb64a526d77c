"""An edge function in Python that coordinates through coord: the inventory
routes of examples/inventory-fn, over wasi:http with JSON bodies.

| Route | What it does |
|---|---|
| `GET /items/{item}` | the item's stock and newest fence |
| `POST /items/{item}/adjust?delta=N[&wait_ms=T]` | lock, write with the fence, release (409 when busy) |
| `POST /items/{item}/lock[?ttl_ms=T]` | hold the item's lock across requests; replies with the lock |
| `DELETE /items/{item}/lock` + lock body | release it |
| `POST /exports` (`x-user-id`) | every item, at most 10 per user per minute (429 + `retry-after`) |
| `PUT /items/{item}/editors/{session}[?ttl_ms=T]` + JSON body | announce an editor (default 30 s TTL) |
| `DELETE /items/{item}/editors/{session}` | leave |
| `GET /items/{item}/editors` | the editors present, with the tenant's revision |

Fences and revisions are JSON strings (64-bit). The stock records are the
Rust example's: the same store partition and JSON, so functions in either
language, on one Redis, share items, locks and limits.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import ephemeral, lock, ratelimit, store

from http_io import BadRequest, Reply, error, read_request, send

LOCK_ID = "inventory.stock"
LOCK_TTL_MS = 10_000
MAX_WAIT_MS = 30_000
MAX_ITEM_BYTES = 64
MAX_SESSION_BYTES = 128

# The stock table, as the Rust example keeps it: each item's record in a
# partition of its own (unwatched: `~`), under the key `record`, and every
# item named in an index partition before its first record.
RECORD_KEY = "record"
ITEMS = "inventory-items"


def record_partition(item):
    return f"~inventory-record:{item}"


INITIAL_STOCK = 100
MAX_RACES = 16

EXPORTS = ratelimit.Limiter(
    id="inventory.exports",
    limit=10,
    window_ms=60_000,
    algorithm=ratelimit.Algorithm.SLIDING_WINDOW,
)

EDITORS_ID = "inventory.editors"
EDITOR_TTL_MS = 30_000
MIN_EDITOR_TTL_MS, MAX_EDITOR_TTL_MS = 100, 300_000
MAX_EDITOR_BYTES = 4096
# The deepest JSON body accepted (see json_depth).
MAX_JSON_DEPTH = 64


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request, response_out):
        try:
            reply = route(read_request(request))
        except BadRequest as bad:
            reply = bad.reply
        except Err as e:
            reply = coord_error(e.value)
        send(reply, response_out)


def route(req):
    match (req.method, req.segments):
        case ("GET", ["items", item]):
            return show(checked_item(item))
        case ("POST", ["items", item, "adjust"]):
            return adjust(req, checked_item(item))
        case ("POST", ["items", item, "lock"]):
            return hold(req, checked_item(item))
        case ("DELETE", ["items", item, "lock"]):
            return release(req, checked_item(item))
        case ("POST", ["exports"]):
            return export(req)
        case ("GET", ["items", item, "editors"]):
            return editors(checked_item(item))
        case ("PUT", ["items", item, "editors", session]):
            return join(req, checked_item(item), checked_session(session))
        case ("DELETE", ["items", item, "editors", session]):
            return leave(checked_item(item), checked_session(session))
    return error(404, "path", f"no route for {req.method} /{'/'.join(req.segments)}")


# --- input --------------------------------------------------------------------


def checked_item(item):
    if not 1 <= len(item.encode()) <= MAX_ITEM_BYTES:
        raise BadRequest(error(400, "item", f"1 to {MAX_ITEM_BYTES} bytes"))
    return item


def checked_session(session):
    if not 1 <= len(session.encode()) <= MAX_SESSION_BYTES:
        raise BadRequest(error(400, "session", f"1 to {MAX_SESSION_BYTES} bytes"))
    return session


def int_param(req, name, *, low, high, default=None):
    """The query parameter `name` as a whole number in [low, high]."""
    text = req.query.get(name)
    if text is None:
        if default is None:
            raise BadRequest(error(400, name, "required"))
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(error(400, name, "not a whole number"))
    if not low <= value <= high:
        raise BadRequest(error(400, name, f"{low} to {high}"))
    return value


def json_body(req):
    if json_depth(req.body) > MAX_JSON_DEPTH:
        raise BadRequest(error(400, "body", f"nested deeper than {MAX_JSON_DEPTH}"))
    try:
        return json.loads(req.body)
    except (ValueError, RecursionError):
        raise BadRequest(error(400, "body", "not JSON"))


def json_depth(body):
    """How deep `body`'s arrays and objects nest, strings skipped.

    Checked before parsing: CPython's parser recurses once a level, and a
    16 KB body of `[` outruns the wasm stack before Python's own recursion
    limit, trapping the function instead of raising.
    """
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


# --- stock under a fenced lock -------------------------------------------------


def resource(item):
    return f"item:{item}"


def show(item):
    record, _ = read_record(item)
    return Reply(200, stock_json(item, record))


def adjust(req, item):
    delta = int_param(req, "delta", low=-(2**53), high=2**53)
    wait_ms = int_param(req, "wait_ms", low=0, high=MAX_WAIT_MS, default=0)
    wait = lock.WaitPolicy_Timeout(wait_ms) if wait_ms else lock.WaitPolicy_NoWait()
    outcome = lock.acquire(
        LOCK_ID, resource(item), lock.AcquireOptions(ttl_ms=LOCK_TTL_MS, wait=wait)
    )
    if isinstance(outcome, lock.AcquireOutcome_Busy):
        return busy(outcome.value)
    held = outcome.value
    try:
        return write(item, delta, held.fence)
    finally:
        # A failed release leaves the lock to its TTL: the write is decided.
        try:
            lock.release(held)
        except Err:
            pass


def write(item, delta, fence):
    """Add `delta` to the stock if `fence` is not older than the newest one
    written: a compare-and-set on the record's revision, so the check and the
    write are one step."""
    for _ in range(MAX_RACES):
        record, condition = read_record(item)
        if fence < record["fence"]:
            return error(409, "fence", "stale fence: a newer holder wrote",
                         fence=str(fence), newestFence=str(record["fence"]))
        stock = record["stock"] + delta
        if stock < 0:
            return error(409, "delta", "insufficient stock", stock=record["stock"])
        record.update(stock=stock, fence=fence)
        if isinstance(condition, store.Condition_Absent) and store.get(ITEMS, item).entry is None:
            # A conflict means another request named it first: as good.
            store.put(ITEMS, item, b"", None, store.Condition_Absent())
        reply = store.put(record_partition(item), RECORD_KEY, json.dumps(record).encode(), None,
                          condition)
        if isinstance(reply.outcome, store.Outcome_Applied):
            return Reply(200, stock_json(item, record))
        # Another write landed between the read and this one: read again.
    return error(503, "store", f"the record of {item} kept changing")


def read_record(item):
    """The item's record and the condition that it is still the one read."""
    entry = store.get(record_partition(item), RECORD_KEY).entry
    if entry is None:
        return {"stock": INITIAL_STOCK, "fence": 0}, store.Condition_Absent()
    return json.loads(entry.value), store.Condition_Revision(entry.revision)


def stock_json(item, record):
    return {"item": item, "stock": record["stock"], "fence": str(record["fence"])}


def busy(holder):
    return Reply(
        409,
        {
            "error": "busy: another request holds the item's lock",
            "holderFence": str(holder.fence),
            "retryAfterMs": holder.remaining_ms,
        },
        [("retry-after", max(1, -(-holder.remaining_ms // 1000)))],
    )


def hold(req, item):
    ttl_ms = int_param(req, "ttl_ms", low=1, high=86_400_000, default=LOCK_TTL_MS)
    outcome = lock.acquire(
        LOCK_ID, resource(item),
        lock.AcquireOptions(ttl_ms=ttl_ms, wait=lock.WaitPolicy_NoWait()),
    )
    if isinstance(outcome, lock.AcquireOutcome_Busy):
        return busy(outcome.value)
    held = outcome.value
    return Reply(200, {
        "id": held.id, "resource": held.resource, "owner": held.owner,
        "fence": str(held.fence), "ttlMs": held.ttl_ms, "expiresAt": held.expires_at,
    })


def release(req, item):
    body = json_body(req)
    owner = body.get("owner") if isinstance(body, dict) else None
    if not isinstance(owner, str) or not owner.isascii():
        # Owner tokens are hex; a JSON "\ud800" would not even lower to WIT.
        return error(400, "body.owner", "the held lock's owner token")
    fence = body.get("fence")
    try:
        # A decimal string (or a JSON integer): never a float, a bool or 1e400.
        fence = int(fence) if isinstance(fence, str) or type(fence) is int else 0
    except ValueError:
        fence = 0
    if not 1 <= fence < 2**64:
        return error(400, "body.fence", "the held lock's fence, a decimal string")
    held = lock.HeldLock(id=LOCK_ID, resource=resource(item), owner=body["owner"],
                         fence=fence, ttl_ms=LOCK_TTL_MS, expires_at=0)
    return Reply(200, {"released": lock.release(held)})


# --- rate-limited exports --------------------------------------------------------


def export(req):
    user = req.headers.get("x-user-id", "")
    if not user:
        raise BadRequest(error(400, "x-user-id", "the x-user-id header is required"))
    decision = ratelimit.check(EXPORTS, f"user:{user}", None)
    headers = [
        ("ratelimit-limit", decision.limit),
        ("ratelimit-remaining", decision.remaining),
        ("ratelimit-reset", -(-decision.reset_in_ms // 1000)),
    ]
    if not decision.allowed:
        seconds = max(1, -(-decision.retry_after_ms // 1000))
        return Reply(
            429,
            {"error": "too many exports", "retryAfterMs": decision.retry_after_ms},
            headers + [("retry-after", seconds)],
        )
    items = [
        stock_json(entry.key, read_record(entry.key)[0])
        for entry in store.list(ITEMS, "").entries
    ]
    return Reply(200, {"items": items, "remaining": decision.remaining}, headers)


# --- editors' presence -------------------------------------------------------------


def space(ttl_ms=EDITOR_TTL_MS):
    return ephemeral.Space(id=EDITORS_ID, ttl_ms=ttl_ms, max_value_bytes=MAX_EDITOR_BYTES)


def join(req, item, session):
    ttl_ms = int_param(req, "ttl_ms", low=MIN_EDITOR_TTL_MS, high=MAX_EDITOR_TTL_MS,
                       default=EDITOR_TTL_MS)
    json_body(req)  # any JSON the editor sends, kept as it came
    written = ephemeral.upsert(space(ttl_ms), item, session, req.body)
    return Reply(200, {"revision": str(written.revision), "updatedAt": written.updated_at})


def leave(item, session):
    return Reply(200, {"deleted": ephemeral.delete(space(), item, session)})


def editors(item):
    snapshot = ephemeral.snapshot(space(), item, None)
    return Reply(200, {
        "editors": [
            {
                "session": entry.key,
                "value": json.loads(entry.value),
                "revision": str(entry.revision),
                "updatedAt": entry.updated_at,
            }
            for entry in snapshot.entries
        ],
        "revision": str(snapshot.revision),
    })


# --- coord's errors ------------------------------------------------------------------


def coord_error(value):
    """A coord or store error as a reply: a rejected argument is the caller's
    400 naming coord's field; an unreachable store is 503."""
    kind = type(value).__name__  # `Error_InvalidArgument`, `Error_Unavailable`, ...
    if kind == "Error_InvalidArgument":
        return error(400, value.value.field, value.value.reason)
    if kind in ("Error_Unavailable", "Error_HistoryGone"):
        return error(503, "store", f"unavailable: {value.value}")
    return error(500, "store", f"{kind.removeprefix('Error_').lower()}: {getattr(value, 'value', value)}")
