"""What a request handler sees, whatever the transport (HTTP/1.1 today, HTTP/2 next).

A handler is ``async def handler(request: Request, responder: Responder) -> None``. It calls
`Responder.start` once, `Responder.send` for each piece of the body as it becomes available,
and `Responder.end`. `Responder.abort` drops the connection mid-answer (used by the mock
upstream to play a broken stream, and by the gateway when the client's stream cannot be ended
cleanly any other way).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from twserve.upstream.responses_socket import UpstreamSockets

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True, kw_only=True)
class Request:
    method: str
    target: bytes
    path: str
    query: str
    headers: Headers  # names lower-cased, in arrival order
    body: bytes
    client: tuple[str, int] = ("", 0)
    http_version: str = "1.1"
    extra: dict[str, object] = field(default_factory=dict)
    # A turn of a client's Responses WebSocket: the upstream sockets that client socket keeps
    # (twserve/upstream/responses_socket.py). None for every other request.
    upstream_sockets: UpstreamSockets | None = None
    # The body already parsed where the server had to read it anyway (a Responses WebSocket
    # turn comes as a JSON message): admission takes it instead of parsing `body` again.
    parsed: dict[str, Any] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Responder(Protocol):
    async def start(self, status: int, headers: Headers) -> None: ...

    async def send(self, data: bytes) -> None: ...

    def ready(self) -> bool:
        """Whether `send_now` may write a piece of the answer at once: the connection takes it
        without waiting, after everything sent before (callable from the event loop's
        callbacks)."""
        ...

    def send_now(self, data: bytes) -> None:
        """Write `data` now, without waiting; only right after `ready` said so."""
        ...

    async def end(self) -> None: ...

    async def abort(self) -> None: ...

    @property
    def started(self) -> bool: ...


Handler = Callable[[Request, Responder], Awaitable[None]]
