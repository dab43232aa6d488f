"""An answer's end held until its request row is committed (``store.commit_before_end``).

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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from twengine.config import Store as StoreConfig
from twserve.server.base import Headers, Responder
from twserve.store.sqlite import Commit, RequestRow, Store

__all__ = ["EndAfterCommit", "EndsAfterCommit"]


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
