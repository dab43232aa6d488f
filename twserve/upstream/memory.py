"""An `Upstream` in memory: scripted answers, no sockets (httpcore's mock backend, one level up).

`MemoryUpstream(script)` calls `script(request)` for every request the relay opens and plays
the `MemoryAnswer` it returns: a status line and headers, then the body chunks (with an optional
pause before each), then a clean end, a break (`UpstreamBroken`), or silence until the attempt
is cancelled. An answer with `unreachable` set never gets a head (`UpstreamUnreachable`). Every
request is kept in `requests` (and the transport it was to go over in `transports`); `open_now`
counts the requests not yet closed, so a test can check that a cancelled attempt closed its
upstream request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from twengine.destinations import Transport
from twproto.failures import TransportFault
from twproto.upstream_request import UpstreamRequest
from twserve.upstream.client import (
    Headers,
    UpstreamAnswer,
    UpstreamBroken,
    UpstreamUnreachable,
)

__all__ = ["MemoryAnswer", "MemoryUpstream"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAnswer:
    """One scripted upstream answer."""

    status: int = 200
    headers: tuple[tuple[bytes, bytes], ...] = ()
    chunks: tuple[bytes, ...] = ()
    gap: float = 0.0  # seconds before each chunk
    breaks: bool = False  # the body breaks off after the chunks
    stalls: bool = False  # after the chunks, nothing more until the attempt is cancelled
    unreachable: TransportFault | None = None


@dataclass(slots=True)
class _Playing:
    status: int
    headers: Headers
    _answer: MemoryAnswer

    async def chunks(self) -> AsyncIterator[bytes]:
        answer = self._answer
        for chunk in answer.chunks:
            if answer.gap:
                await anyio.sleep(answer.gap)
            yield chunk
        if answer.stalls:
            await anyio.sleep_forever()
        if answer.breaks:
            raise UpstreamBroken("the scripted answer breaks off")

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        return False  # everything goes through `chunks`


class MemoryUpstream:
    """Answers every request with what `script` says (see the module notes)."""

    def __init__(self, script: Callable[[UpstreamRequest], MemoryAnswer]) -> None:
        self.script = script
        self.requests: list[UpstreamRequest] = []
        self.transports: list[Transport] = []
        self.open_now = 0

    @asynccontextmanager
    async def open(
        self,
        request: UpstreamRequest,
        *,
        connect_timeout: float | None = None,
        transport: Transport = Transport.HTTP1,
    ) -> AsyncIterator[UpstreamAnswer]:
        """Play the scripted answer for `request`."""
        self.requests.append(request)
        self.transports.append(transport)
        answer = self.script(request)
        if answer.unreachable is not None:
            raise UpstreamUnreachable(answer.unreachable, "scripted: unreachable")
        self.open_now += 1
        try:
            yield _Playing(status=answer.status, headers=list(answer.headers), _answer=answer)
        finally:
            self.open_now -= 1
