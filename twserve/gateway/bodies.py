"""Optional body storage (``retention.store_bodies``): the request as received and the answer
as the client got it, each cut at ``retention.body_max_bytes``.

`BodyTap` stands between the handler and the real responder and keeps a bounded copy of what
is sent; it never holds more than the limit, whatever the answer's size. `BodyTaps` holds the
taps of the requests in progress until their rows are recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from twengine.config.model import Retention
from twserve.server.base import Headers, Responder
from twserve.store.sqlite import RequestRow, StoredBody

__all__ = ["BodyTap", "BodyTaps"]


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
