"""The few pieces of wasi:http the function needs: a request read whole, a
JSON reply written whole.

Every resource is dropped with `with`, children before their parent, as the
component model requires (a body's stream before the body, say).
"""

import json
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

from componentize_py_types import Err, Ok
from wit_world.imports import streams
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    Method_Other,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)

# Request bodies larger than this are refused with 413.
MAX_BODY_BYTES = 16 * 1024
# `blocking-write-and-flush` takes at most 4096 bytes a call.
WRITE_CHUNK = 4096


@dataclass
class Request:
    method: str
    segments: list
    query: dict
    headers: dict
    body: bytes


@dataclass
class Reply:
    status: int
    body: object
    headers: list = field(default_factory=list)


def error(status, field_name, reason, **extra):
    """A JSON error naming the field (or header, or resource) at fault."""
    return Reply(status, {"error": reason, "field": field_name, **extra})


class BadRequest(Exception):
    """Raised while reading a request; carries the reply to send instead."""

    def __init__(self, reply):
        super().__init__(reply.body["error"])
        self.reply = reply


def method_name(method):
    if isinstance(method, Method_Other):
        return method.value.upper()
    # The other cases are classes named `Method_Get`, `Method_Post`, ...
    return type(method).__name__.split("_", 1)[1].upper()


def read_request(incoming: IncomingRequest) -> Request:
    target = incoming.path_with_query() or "/"
    path, _, query = target.partition("?")
    segments = [unquote(s) for s in path.split("/") if s]
    with incoming.headers() as fields:
        headers = {}
        for name, value in fields.entries():
            headers.setdefault(name.lower(), value.decode("utf-8", "replace"))
    return Request(
        method=method_name(incoming.method()),
        segments=segments,
        query=dict(parse_qsl(query, keep_blank_values=True)),
        headers=headers,
        body=read_body(incoming),
    )


def read_body(incoming: IncomingRequest) -> bytes:
    chunks, size = [], 0
    with incoming.consume() as body, body.stream() as stream:
        while True:
            try:
                chunk = stream.blocking_read(MAX_BODY_BYTES + 1 - size)
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    break
                raise BadRequest(error(400, "body", "reading the body failed"))
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise BadRequest(
                    error(413, "body", f"larger than {MAX_BODY_BYTES} bytes")
                )
    return b"".join(chunks)


def send(reply: Reply, out: ResponseOutparam) -> None:
    data = (json.dumps(reply.body, separators=(",", ":")) + "\n").encode()
    entries = [
        ("content-type", b"application/json"),
        ("content-length", str(len(data)).encode()),
    ] + [(name, str(value).encode()) for name, value in reply.headers]
    response = OutgoingResponse(Fields.from_list(entries))
    response.set_status_code(reply.status)
    body = response.body()
    ResponseOutparam.set(out, Ok(response))
    with body.write() as stream:
        for start in range(0, len(data), WRITE_CHUNK):
            stream.blocking_write_and_flush(data[start : start + WRITE_CHUNK])
    OutgoingBody.finish(body, None)
