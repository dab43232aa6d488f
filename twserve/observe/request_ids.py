"""The request id a client sees: the stored row's id, in ``x-request-id``.

Every generated answer carries ``x-request-id: <row id>`` so a client's report ("request
4f1c…0003 failed") finds its row in ``/requests?id=`` and its access line. The upstream's own id
of that name is renamed by twproto (``x-upstream-request-id``). A client that sends an
``x-request-id`` of its own (its tracing or a proxy in front) keeps it as the row's correlation
id when it is a plain token (`correlation_id`): anything else is ignored rather than stored,
since it would end up in logs and the console.

`IdentifiedResponder` adds the header and counts the answer's bytes; everything else it passes
on, so a chunk costs one more call and an addition.
"""

from __future__ import annotations

import re

from twserve.server.base import Headers, Responder

__all__ = (
    "MAX_CORRELATION_CHARS",
    "REQUEST_ID_HEADER",
    "TRACEPARENT_HEADER",
    "IdentifiedResponder",
    "client_ids",
    "correlation_id",
)

REQUEST_ID_HEADER = b"x-request-id"
TRACEPARENT_HEADER = b"traceparent"
# Longer ids are not ids (a UUID is 36 characters, a W3C trace id 32, AWS's X-Amzn-Trace-Id 40).
MAX_CORRELATION_CHARS = 128
_TOKEN = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,%d}" % (MAX_CORRELATION_CHARS - 1))


def correlation_id(headers: Headers) -> str | None:
    """The client's own ``x-request-id`` when it is a token of letters, digits and
    ``._:@/+=-`` of at most `MAX_CORRELATION_CHARS`; None for none or anything else."""
    return client_ids(headers)[0]


def client_ids(headers: Headers) -> tuple[str | None, bytes | None]:
    """The client's `correlation_id` and its ``traceparent`` as sent (read by the tracer,
    twserve.observe.traces, when traces are on), in one pass over the headers."""
    found: str | None = None
    parent: bytes | None = None
    for name, value in headers:
        if name == REQUEST_ID_HEADER and found is None:
            found = value.decode("ascii") if _TOKEN.fullmatch(value) else ""
        elif name == TRACEPARENT_HEADER and parent is None:
            parent = value
    return found or None, parent


class IdentifiedResponder:
    """A `Responder` whose answer carries ``x-request-id``, counting the bytes it writes."""

    __slots__ = ("_head", "_inner", "sent")

    def __init__(self, inner: Responder, request_id: str) -> None:
        self._inner = inner
        self._head = (REQUEST_ID_HEADER, request_id.encode("ascii"))
        self.sent = 0

    @property
    def started(self) -> bool:
        return self._inner.started

    async def start(self, status: int, headers: Headers) -> None:
        await self._inner.start(status, [*headers, self._head])

    async def send(self, data: bytes) -> None:
        self.sent += len(data)
        await self._inner.send(data)

    def send_now(self, data: bytes) -> None:
        self.sent += len(data)
        self._inner.send_now(data)

    def ready(self) -> bool:
        return self._inner.ready()

    async def end(self) -> None:
        await self._inner.end()

    async def abort(self) -> None:
        await self._inner.abort()
