"""An OpenAI Responses upstream called over its own WebSocket (``responses_transport: websocket``).

Only turns of a client's Responses WebSocket go this way (docs/transports.md, "An upstream's own
socket"): each turn's request carries its client socket's `UpstreamSockets`
(`Request.upstream_sockets`, set by twserve/server/websocket.py), the gateway hands them to the
relay, and an attempt of such a turn whose destination's transport is `Transport.RESPONSES_SOCKET`
(a provider configured for the socket) is opened here by its reader (twserve/relay/reader.py), when
the request is a streamed Responses create (`twproto.ws_upstream_create`). Everything else — plain
HTTP requests, token counts, a turn routed to another provider — goes over HTTP as before.

`UpstreamSockets.open` works as `Upstream.open` does: it sends the turn as a
``response.create`` event on the socket it keeps for that upstream (URL and credentials) and
yields an answer the relay reads exactly like an HTTP one, so routing, failover before content,
slots, health samples, limits and rows are those of an HTTP attempt:

* the socket opens with the request's headers (the provider key, its configured headers and the
  client's protocol headers); an upgrade the upstream refuses is that HTTP answer (a 401, 429,
  503 …), and one that cannot be opened is `UpstreamUnreachable` with its fault;
* an ``error`` event that ends the turn before anything else is the HTTP error it stands for
  (its ``status``, ``{"error": …}``), so a 429 or 5xx fails over and a 400 is the client's;
* otherwise the answer is a 200 event stream: each upstream message framed as the Server-Sent
  Event it would have been over HTTP, until the event that ends the response
  (``completed``/``failed``/``incomplete``), or an ``error`` event, ends the answer.

A socket is kept, per client socket, for the next turn to the same upstream once a response
was read to its end; one the turn left mid-response (cancelled, broken, an error event after the
response began) is closed, since what it would send next belongs to no turn. A kept socket that
the upstream closed in the meantime is found out when the next turn is sent: that turn is sent
again once on a new socket. All of a client socket's upstream sockets close with it.

Upstream messages are bounded (`MAX_MESSAGE`, over which the socket is closed with 1009 and the
attempt breaks); pings are answered while a turn reads.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import anyio
import anyio.abc
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import RemoteProtocolError

from twengine.attempt import TurnAsSent
from twproto.failures import TransportFault
from twproto.sockets import (
    read_ws_upstream_event,
    ws_upstream_create,
    ws_upstream_error_answer,
    ws_upstream_url,
)
from twproto.sse import encode
from twproto.upstream_request import UpstreamRequest
from twserve.upstream.client import UpstreamAnswer, UpstreamBroken, UpstreamUnreachable
from twserve.upstream.ws_dial import Dialed, DialFailed, Refused, dial

log = logging.getLogger("twserve.upstream.responses_socket")

__all__ = ["CONNECT_TIMEOUT", "MAX_MESSAGE", "SocketTurn", "UpstreamSockets"]

# The most one read takes from the socket.
READ_SIZE = 65536

Headers = list[tuple[bytes, bytes]]

# One upstream message: a response's closing event repeats the whole answer, so this is the
# bound an HTTP answer read whole has (twserve/relay/reader.py).
MAX_MESSAGE = 64 * 1024 * 1024
TOO_BIG = 1009
NORMAL = 1000
GOING_AWAY = 1001
_CLOSE_WAIT = 1.0
# Opening a socket, when its provider gives no time of its own (as the HTTP pools' default).
CONNECT_TIMEOUT = 10.0

_STREAM_HEAD: Headers = [(b"content-type", b"text/event-stream")]
_ERROR_HEAD: Headers = [(b"content-type", b"application/json")]


class _Gone(Exception):
    """The upstream socket closed or broke."""


class _Socket:
    """One open upstream socket."""

    def __init__(self, dialed: Dialed, max_message: int) -> None:
        self.stream = dialed.stream
        self.ws = dialed.ws
        self.max_message = max_message
        self.lost = False
        # The response the upstream keeps for this socket's next turn: the last one it
        # completed here (its connection-local state behind ``previous_response_id``).
        self.last: str | None = None
        self.parts: list[str] = []  # the message being received, fragment by fragment
        self.size = 0

    async def _write(self, data: bytes) -> None:
        try:
            await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.lost = True
            raise _Gone(str(exc) or type(exc).__name__) from exc

    async def send_text(self, text: str) -> None:
        if self.lost or self.ws.state is not ConnectionState.OPEN:
            raise _Gone("the socket is closed")
        await self._write(self.ws.send(TextMessage(data=text)))

    async def read(self) -> list[str]:
        """The upstream's next text messages: those the next socket read completes."""
        if self.lost:
            raise _Gone("the upstream closed the socket")
        while True:
            done: list[str] = []
            try:
                for event in self.ws.events():
                    if isinstance(event, BytesMessage):
                        raise _Gone("the upstream sent a binary message")
                    if isinstance(event, TextMessage):
                        self.size += len(event.data)
                        if self.size > self.max_message:
                            await self.close(TOO_BIG, "message too big")
                            raise _Gone(f"an upstream message over {self.max_message} bytes")
                        self.parts.append(event.data)
                        if event.message_finished:
                            done.append("".join(self.parts))
                            self.parts, self.size = [], 0
                    elif isinstance(event, Ping):
                        await self._write(self.ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        self.lost = True
                        with suppress(_Gone, RemoteProtocolError):
                            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                                await self._write(self.ws.send(event.response()))
                        if done:
                            # What came before the close (a response's last events, when the
                            # upstream closes right after it) is the turn's; the next read
                            # finds the socket gone.
                            return done
                        raise _Gone(f"the upstream closed the socket ({event.code})")
            except RemoteProtocolError as exc:
                self.lost = True
                raise _Gone(f"the upstream broke the WebSocket protocol: {exc}") from exc
            if done:
                return done
            try:
                data = await self.stream.receive(READ_SIZE)
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                OSError,
            ) as exc:
                self.lost = True
                raise _Gone("the upstream socket was lost") from exc
            self.ws.receive_data(data)

    async def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Close the socket (shielded, bounded): a close frame if one can go, then TCP."""
        with anyio.CancelScope(shield=True):
            if not self.lost and self.ws.state is ConnectionState.OPEN:
                with anyio.move_on_after(_CLOSE_WAIT), suppress(Exception):
                    await self.stream.send(self.ws.send(CloseConnection(code=code, reason=reason)))
            self.lost = True
            with suppress(Exception):
                await self.stream.aclose()


@dataclass(slots=True)
class _Whole:
    """An answer known whole when the turn opens: a refused upgrade, an ``error`` event."""

    status: int
    headers: Headers
    body: bytes

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.body:
            yield self.body

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        return False


class _Stream:
    """A 200 event stream read off the socket: `first` and what follows up to the end."""

    def __init__(self, sock: _Socket, first: list[str]) -> None:
        self.status = 200
        self.headers = list(_STREAM_HEAD)
        self.sock = sock
        self.first = first
        self.ended = False  # the response was read to its end (the socket may be kept)

    def _frame(self, texts: list[str]) -> bytes:
        out: list[bytes] = []
        for text in texts:
            if self.ended:
                # Nothing belongs to the turn after its end: a socket that sends more is not
                # reused.
                self.sock.lost = True
                break
            info = read_ws_upstream_event(text)
            out.append(encode(text, event=info.type or None))
            if info.ends:
                self.ended = True
                self.sock.last = info.kept
                if info.error:
                    # An error once the response began: what follows (a closing event, or
                    # nothing) cannot be told apart from the next turn's, so the socket goes.
                    self.sock.lost = True
        return b"".join(out)

    async def chunks(self) -> AsyncIterator[bytes]:
        chunk = self._frame(self.first)
        if chunk:
            yield chunk
        if self.ended:
            return
        try:
            while not self.ended:
                chunk = self._frame(await self.sock.read())
                if chunk:
                    yield chunk
        except _Gone as exc:
            raise UpstreamBroken(str(exc)) from exc

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        return False  # messages are read and framed by `chunks`


class UpstreamSockets:
    """The upstream sockets one client socket keeps, by upstream URL and credentials."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._kept: dict[tuple[str, tuple[tuple[bytes, bytes], ...]], _Socket] = {}
        self.closed = False

    def takes(self, request: UpstreamRequest) -> str | None:
        """The ``response.create`` event for `request`, when it goes over a socket."""
        if self.closed:
            return None
        return ws_upstream_create(request.url, request.body, request.fields)

    def holds(self, request: UpstreamRequest, response_id: str) -> bool:
        """Whether the socket `request` would be sent on is kept and its upstream answered its
        last turn with `response_id`: a turn naming it as ``previous_response_id`` may go as
        the client sent it (twserve/gateway/conversations.py)."""
        sock = self._kept.get((ws_upstream_url(request.url), tuple(request.headers)))
        return sock is not None and not sock.lost and sock.last == response_id

    def holds_any(self, response_id: str) -> bool:
        """Whether some kept socket's upstream answered its last turn with `response_id`."""
        return any(s.last == response_id and not s.lost for s in self._kept.values())

    async def aclose(self) -> None:
        """Close every kept socket (the client socket ended)."""
        self.closed = True
        kept, self._kept = list(self._kept.values()), {}
        for sock in kept:
            await sock.close(GOING_AWAY, "client gone")

    @asynccontextmanager
    async def open(
        self,
        request: UpstreamRequest,
        event: str,
        *,
        connect_timeout: float | None = None,
        anew: Callable[[], str | None] | None = None,
    ) -> AsyncIterator[UpstreamAnswer]:
        """Carry one attempt over the upstream's socket (see the module docstring); `event` is
        `takes(request)`. `anew` makes the event a new socket gets instead, where `event`
        continues a response only the kept socket held and that socket is found closed."""
        url = ws_upstream_url(request.url)
        key = (url, tuple(request.headers))
        connect_timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        sock = self._kept.pop(key, None)
        answer: UpstreamAnswer | None = None
        first: list[str] = []
        try:
            while answer is None:
                reused = sock is not None
                if sock is None:
                    opened = await _open(url, request.headers, connect_timeout, self.max_message)
                    if isinstance(opened, Refused):
                        answer = _Whole(opened.status, opened.headers, opened.body)
                        break
                    sock = opened
                try:
                    await sock.send_text(event)
                    first = await sock.read()
                except _Gone as exc:
                    await sock.close(GOING_AWAY)
                    sock = None
                    if reused:
                        # A kept socket the upstream had closed: once more, anew, the turn
                        # whole if the closed socket held its conversation.
                        event = (anew() if anew is not None else None) or event
                        continue
                    raise UpstreamUnreachable(TransportFault.RESET_BEFORE_HEAD, str(exc)) from exc
                head = read_ws_upstream_event(first[0])
                if head.error:
                    err = ws_upstream_error_answer(first[0])
                    answer = _Whole(err.status, [*_ERROR_HEAD, *err.headers], err.body)
                    if len(first) > 1:
                        sock.lost = True  # more than the turn's end in one read
                else:
                    answer = _Stream(sock, first)
            yield answer
        finally:
            await self._settle(key, sock, answer)

    async def _settle(
        self,
        key: tuple[str, tuple[tuple[bytes, bytes], ...]],
        sock: _Socket | None,
        answer: UpstreamAnswer | None,
    ) -> None:
        if sock is None:
            return
        complete = isinstance(answer, _Whole) or (isinstance(answer, _Stream) and answer.ended)
        if complete and not sock.lost and not self.closed and key not in self._kept:
            self._kept[key] = sock
            return
        await sock.close(GOING_AWAY, "turn abandoned")


async def _open(url: str, headers: Headers, timeout: float, max_message: int) -> _Socket | Refused:
    try:
        dialed = await dial(url, headers, timeout)
    except DialFailed as exc:
        raise UpstreamUnreachable(exc.fault, exc.detail) from exc
    if isinstance(dialed, Refused):
        return dialed
    return _Socket(dialed, max_message)


@dataclass(frozen=True, slots=True)
class SocketTurn:
    """One turn of a client's Responses socket, as the relay carries it: the upstream sockets
    that client socket keeps, and the turn as the client sent it when the gateway expanded its
    ``previous_response_id`` (twserve/gateway/conversations.py)."""

    sockets: UpstreamSockets
    as_sent: TurnAsSent | None = None
