"""The wrappers the gateway puts around a request's `Responder`: each passes the answer on and
changes one thing about it.

**Bodies kept** (``retention.store_bodies``): the request as received and the answer as the
client got it, each cut at ``retention.body_max_bytes``.

`BodyTap` stands between the handler and the real responder and keeps a bounded copy of what
is sent; it never holds more than the limit, whatever the answer's size. `BodyTaps` holds the
taps of the requests in progress until their rows are recorded.

**The end after the commit** (``store.commit_before_end``): an answer's end held until its
request row is committed.

With the option on, the gateway answers each request through an `EndAfterCommit`: everything
goes out as it comes except the end the client reads as "the answer is complete" — a streamed
answer's end (HTTP/1.1's last chunk, HTTP/2's END_STREAM) and a whole answer's last body byte
(its Content-Length is then not met until that byte arrives). The end waits until the store
says the request's row is durable (`twserve.store.sqlite.Commit`), and at most
``store.commit_wait_secs``; after that the answer ends anyway and the store counts a late
commit (``commit_waits_late`` in ``/status``, ``gw.store.commit_late`` in the log).

The row is built after the relay returned, so an end asked for before the row was recorded is
deferred: `EndsAfterCommit.record` gives the holder its row's commit and `release` (called by
the gateway once the request is handled) sends the end. An end asked for after the row was
recorded (a refusal, an answer made here) waits for the commit at once. The store's writer
batches rows, so requests that end together share one commit.

**Token counts answered here** when the upstream of the client's format cannot count
(docs/operations.md).

A token count goes to one upstream of the client's own format, never retried and never failed
over to another format. When that upstream answers 404 or 405 — a relay without the counting
endpoint — the count is estimated locally instead of handing the client an error for a call
that the gateway can answer. `LocalFallbackResponder` sits between the relay and the client:
it passes every other answer on untouched and holds back a 404/405, which `answer_held` then
replaces with the local estimate (`answer_locally`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from twengine.config import Retention
from twengine.config import Store as StoreConfig
from twproto.dialect import Dialect
from twproto.summary import count_tokens_body
from twserve.server.base import Headers, Responder
from twserve.store.sqlite import Commit, RequestRow, Store, StoredBody

__all__ = [
    "UNSUPPORTED_STATUSES",
    "BodyTap",
    "BodyTaps",
    "EndAfterCommit",
    "EndsAfterCommit",
    "LocalFallbackResponder",
    "answer_locally",
]


# -- bodies kept -----------------------------------------------------------------------------------


class BodyTaps:
    """The body copies of the requests in progress, by request id."""

    def __init__(self) -> None:
        self._taps: dict[str, BodyTap] = {}

    @contextmanager
    def keep(
        self, request_id: str, responder: Responder, retention: Retention, request: bytes
    ) -> Iterator[Responder]:
        """The responder to answer request `request_id` through: with ``store_bodies`` on, one
        that keeps a bounded copy for its row (`take`). A request that ends without storing its
        row leaves no copy behind."""
        if not retention.store_bodies:
            yield responder
            return
        tap = BodyTap(responder, retention.body_max_bytes, request)
        self._taps[request_id] = tap
        try:
            yield tap
        finally:
            self._taps.pop(request_id, None)

    def take(self, row: RequestRow) -> None:
        """Give `row` the copy of its request and answer, if one was kept."""
        tap = self._taps.pop(row.id, None) if self._taps else None
        if tap is not None:
            row.body = tap.stored()


class BodyTap:
    """A `Responder` that passes everything on and keeps the first `limit` bytes sent."""

    def __init__(self, inner: Responder, limit: int, request: bytes) -> None:
        self._inner = inner
        self._request = request
        self._limit = limit
        self._parts: list[bytes] = []
        self._kept = 0
        self.truncated = False

    async def start(self, status: int, headers: Headers) -> None:
        await self._inner.start(status, headers)

    async def send(self, data: bytes) -> None:
        self._keep(data)
        await self._inner.send(data)

    def ready(self) -> bool:
        return self._inner.ready()

    def send_now(self, data: bytes) -> None:
        self._keep(data)
        self._inner.send_now(data)

    def _keep(self, data: bytes) -> None:
        room = self._limit - self._kept
        if room > 0:
            piece = data[:room]
            self._parts.append(piece)
            self._kept += len(piece)
        if len(data) > max(room, 0):
            self.truncated = True

    async def end(self) -> None:
        await self._inner.end()

    async def abort(self) -> None:
        await self._inner.abort()

    @property
    def started(self) -> bool:
        return self._inner.started

    def stored(self) -> StoredBody:
        """What to keep of this request and its answer (so far)."""
        request = self._request
        cut = request[: self._limit]
        return StoredBody(
            request=cut,
            answer=b"".join(self._parts),
            truncated=self.truncated or len(request) > self._limit,
        )


# -- the end after the commit ----------------------------------------------------------------------


class EndAfterCommit:
    """A `Responder` whose answer's end waits for `commit` (see the module docs)."""

    def __init__(self, inner: Responder, wait_secs: float) -> None:
        self._inner = inner
        self._wait_secs = wait_secs
        self._whole = False  # a Content-Length body: its last byte is held
        self._tail = b""
        self._end_due = False
        self.commit: Commit | None = None

    @property
    def started(self) -> bool:
        return self._inner.started

    async def start(self, status: int, headers: Headers) -> None:
        self._whole = any(name == b"content-length" for name, _ in headers)
        await self._inner.start(status, headers)

    async def send(self, data: bytes) -> None:
        if not self._whole or not data:
            await self._inner.send(data)
            return
        out, self._tail = self._tail + data[:-1], data[-1:]
        if out:
            await self._inner.send(out)

    def ready(self) -> bool:
        return not self._whole and self._inner.ready()

    def send_now(self, data: bytes) -> None:
        self._inner.send_now(data)

    async def end(self) -> None:
        if self.commit is None:
            self._end_due = True  # the row is not recorded yet: `release` ends
            return
        await self._finish()

    async def abort(self) -> None:
        self._end_due = False
        await self._inner.abort()

    async def release(self) -> None:
        """Send an end that waited for the row to be recorded."""
        if self._end_due:
            await self._finish()

    async def _finish(self) -> None:
        self._end_due = False
        if self.commit is not None:
            await self.commit.wait(self._wait_secs)
        if self._tail:
            tail, self._tail = self._tail, b""
            await self._inner.send(tail)
        await self._inner.end()


class EndsAfterCommit:
    """The gateway's requests whose answer's end waits for their row, by request id."""

    def __init__(self) -> None:
        self._held: dict[str, EndAfterCommit] = {}

    @asynccontextmanager
    async def hold(
        self, request_id: str, responder: Responder, config: StoreConfig | None
    ) -> AsyncIterator[Responder]:
        """The responder to answer request `request_id` through; with the option on, one
        whose end waits for the row, sent at the latest when the block ends normally."""
        if config is None or not config.commit_before_end:
            yield responder
            return
        held = EndAfterCommit(responder, config.commit_wait_secs)
        self._held[request_id] = held
        try:
            yield held
        finally:
            self._held.pop(request_id, None)
        await held.release()

    def record(self, store: Store, row: RequestRow) -> None:
        """Hand `row` to `store`; a request whose end waits for it gets its commit."""
        held = self._held.pop(row.id, None) if self._held else None
        if held is None:
            store.record(row)
        else:
            held.commit = store.record_committed(row)


# -- token counts answered here --------------------------------------------------------------------

#: Statuses by which an upstream says it has no token-count endpoint.
UNSUPPORTED_STATUSES = frozenset({404, 405})


class LocalFallbackResponder:
    """A `Responder` that holds back an answer whose status is in `UNSUPPORTED_STATUSES`."""

    def __init__(self, inner: Responder, dialect: Dialect, input_tokens: int) -> None:
        self.inner = inner
        self.dialect = dialect
        self.input_tokens = input_tokens  # the local estimate, answered in place of a 404/405
        self.held_status: int | None = None

    @property
    def held(self) -> bool:
        return self.held_status is not None

    @property
    def started(self) -> bool:
        return self.inner.started

    async def start(self, status: int, headers: Headers) -> None:
        if status in UNSUPPORTED_STATUSES:
            self.held_status = status
            return
        await self.inner.start(status, headers)

    async def send(self, data: bytes) -> None:
        if not self.held:
            await self.inner.send(data)

    def ready(self) -> bool:
        return not self.held and self.inner.ready()

    def send_now(self, data: bytes) -> None:
        self.inner.send_now(data)

    async def end(self) -> None:
        if not self.held:
            await self.inner.end()

    async def abort(self) -> None:
        await self.inner.abort()

    async def answer_held(self) -> None:
        """After the relay: the local estimate in place of an answer held back."""
        if self.held:
            await answer_locally(self.inner, self.dialect, self.input_tokens)


async def answer_locally(responder: Responder, dialect: Dialect, input_tokens: int) -> None:
    """The estimated count in `dialect`'s shape, marked ``x-thinkwatch-local: 1``."""
    body = count_tokens_body(dialect, input_tokens)
    await responder.start(
        200,
        [
            (b"content-type", b"application/json"),
            (b"x-thinkwatch-local", b"1"),
            (b"content-length", str(len(body)).encode()),
        ],
    )
    await responder.send(body)
    await responder.end()
