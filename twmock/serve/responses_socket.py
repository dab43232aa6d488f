"""The mock upstream's Responses WebSocket: ``GET <profile>/v1/responses`` upgraded (wsproto).

What an OpenAI Responses upstream offers as its WebSocket mode, enough for the gateway's
``responses_transport: websocket`` to be tried against it. Each client ``response.create`` event
is played as the ``POST /v1/responses`` with ``stream: true`` it stands for (its fields as the
body, the upgrade's headers): the same script, profile, counters and request log as over HTTP
(`MockHandler.plan_for`), the answer written by the same ``openai-responses`` writer. What differs
is how the answer travels:

* each Server-Sent Event of a streamed answer is sent as one text message (its data);
* an error answer (any status ≥ 400) is one ``error`` event carrying that ``status`` and the
  body's error object, with the answer's headers as ``error.headers`` (a ``Retry-After``), and
  the socket stays open, as the API does for a turn it refuses;
* a broken or reset answer drops the TCP connection without a close frame.

A ``previous_response_id`` is held as the API holds it on its socket: the response this socket
completed last (its connection-local state, whatever the turn's ``store``) or, for a turn that
does not say ``store: false``, any response this socket completed (the API's store would find
it); any other id gets the API's ``error`` event, 400 ``previous_response_not_found``
("Previous response with id '…' not found."), without the turn being played.

Turns on one socket run one after another. ``{"type": "mock.close", "code": N}`` makes the mock
close the socket with code N. Pings are answered. The handler's `SocketLog` (twmock.serve.handler)
keeps what tests assert on: each upgrade (its headers) and how many turns each socket carried;
and three knobs tests set: an HTTP status to refuse upgrades with, a close code to end each
socket with after a turn, and one to end a socket with when its next turn arrives.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import AcceptConnection, CloseConnection, Ping, TextMessage
from wsproto.events import Request as WSRequest

from twmock.serve.handler import MockHandler, carry_out
from twmock.serve.upgrade import refuse_upgrade
from twproto import SSEDecoder, SSEError
from twproto.dialect import Dialect
from twproto.paths import Operation, match_path
from twserve.server.base import Handoff, Headers, Request, Switch

__all__ = ["responses_socket_switch"]

# The most one read takes from a socket.
READ_SIZE = 65536

_MAX_EVENT = 256 * 1024 * 1024
_DROPPED = frozenset({b"connection", b"upgrade", b"content-length", b"content-type"})
_BODY_HEADERS = frozenset({b"content-length", b"content-type", b"connection"})


def responses_socket_switch(handler: MockHandler) -> Switch:
    """The mock server's switch for Responses WebSocket upgrades (any profile's path)."""

    def switch(request: Request) -> Callable[[Handoff], Awaitable[None]] | None:
        if request.method != "GET":
            return None
        if not any(k == b"upgrade" and b"websocket" in v.lower() for k, v in request.headers):
            return None
        _, _, path = handler.profile_of(request.path)
        route = match_path("POST", path, "")
        if route is None or route.dialect is not Dialect.OPENAI_RESPONSES:
            return None
        if route.operation is not Operation.GENERATE:
            return None

        async def take(handoff: Handoff) -> None:
            if handler.sockets.refuse_status is not None:
                await refuse_upgrade(handoff, handler.sockets.refuse_status, "no socket")
                return
            await _Socket(handoff, handler).run()

        return take

    return switch


class _Dropped(Exception):
    """The answer asked for the connection to be dropped."""


class _TurnResponder:
    """A handler's answer as socket messages."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]]) -> None:
        self._send = send
        self._status = 0
        self._decoder: SSEDecoder | None = None
        self._body = bytearray()
        self._headers: Headers = []
        self._started = False
        self.completed: str | None = None  # the response a closing event completed

    @property
    def started(self) -> bool:
        return self._started

    async def start(self, status: int, headers: Headers) -> None:
        self._started = True
        self._status = status
        self._headers = headers
        kind = next((v for k, v in headers if k == b"content-type"), b"")
        if status < 400 and kind.startswith(b"text/event-stream"):
            self._decoder = SSEDecoder(max_event_size=_MAX_EVENT)

    async def send(self, data: bytes) -> None:
        if self._decoder is None:
            self._body += data
            return
        try:
            events = self._decoder.feed(data)
        except SSEError as exc:
            raise _Dropped() from exc
        await self._send(self._note([e.data for e in events if e.data]))

    def _note(self, texts: list[str]) -> list[str]:
        for text in texts:
            with suppress(ValueError, AttributeError):
                event = json.loads(text)
                if event.get("type") in ("response.completed", "response.incomplete"):
                    self.completed = event["response"]["id"]
        return texts

    def ready(self) -> bool:
        return False  # events go out as messages, through `send`

    def send_now(self, data: bytes) -> None:
        raise RuntimeError("a turn is written with send")

    async def end(self) -> None:
        if self._decoder is not None:
            await self._send(self._note([e.data for e in self._decoder.end() if e.data]))
            return
        await self._send([_error_event(self._status, self._headers, bytes(self._body))])

    async def abort(self) -> None:
        raise _Dropped()


def _error_event(status: int, headers: Headers, body: bytes) -> str:
    error: Any = None
    with suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            error = parsed.get("error")
    if not isinstance(error, dict):
        error = {"type": "server_error", "code": None, "message": body.decode(errors="replace")}
    # The answer's own headers (a Retry-After, rate-limit windows) ride along, as the API's
    # error event carries them.
    kept = {k.decode(): v.decode() for k, v in headers if k not in _BODY_HEADERS}
    if kept:
        error = {**error, "headers": kept}
    return json.dumps({"type": "error", "status": status if status >= 400 else 500, "error": error})


class _Socket:
    def __init__(self, handoff: Handoff, handler: MockHandler) -> None:
        self.handoff = handoff
        self.handler = handler
        self.log = handler.sockets
        self.stream: anyio.abc.SocketStream = handoff.stream
        self.ws = WSConnection(ConnectionType.SERVER)
        self.upgrade = handoff.request
        self.last: str | None = None  # the response this socket completed last
        self.answered: set[str] = set()  # every response it completed

    async def _send(self, texts: list[str]) -> None:
        if texts:
            await self.stream.send(b"".join(self.ws.send(TextMessage(data=t)) for t in texts))

    async def run(self) -> None:
        req = self.upgrade
        head = b"GET " + req.target + b" HTTP/1.1\r\n"
        head += b"".join(k + b": " + v + b"\r\n" for k, v in req.headers)
        self.ws.receive_data(head + b"\r\n")
        if not any(isinstance(e, WSRequest) for e in self.ws.events()):
            return
        self.log.upgrades.append(req)
        self.log.turns.append(0)
        number = len(self.log.turns) - 1
        self.log.open += 1
        try:
            await self.stream.send(self.ws.send(AcceptConnection()))
            if self.handoff.buffered:
                self.ws.receive_data(self.handoff.buffered)
            parts: list[str] = []
            while self.ws.state is ConnectionState.OPEN:
                for event in self.ws.events():
                    if isinstance(event, Ping):
                        await self.stream.send(self.ws.send(event.response()))
                    elif isinstance(event, TextMessage):
                        parts.append(event.data)
                        if event.message_finished:
                            text, parts = "".join(parts), []
                            idle_close = self.log.close_before_next_turn
                            if idle_close is not None and self.log.turns[number] > 0:
                                close = CloseConnection(code=idle_close, reason="mock closed")
                                await self.stream.send(self.ws.send(close))
                                return
                            self.log.turns[number] += 1
                            if not await self._turn(text):
                                return
                            code = self.log.close_after_turn
                            if code is not None:
                                close = CloseConnection(code=code, reason="mock closes")
                                await self.stream.send(self.ws.send(close))
                                return
                    elif isinstance(event, CloseConnection):
                        with suppress(Exception):
                            await self.stream.send(self.ws.send(event.response()))
                        return
                data = await self.stream.receive(READ_SIZE)
                self.ws.receive_data(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self.log.open -= 1
            with suppress(Exception):
                await self.stream.aclose()

    async def _turn(self, text: str) -> bool:
        """Play one client event; False when the socket is to end."""
        try:
            event = json.loads(text)
        except ValueError:
            event = None
        kind = event.get("type") if isinstance(event, dict) else None
        if not isinstance(event, dict) or kind not in ("response.create", "mock.close"):
            error = {"type": "invalid_request_error", "code": None, "message": "unknown event"}
            await self._send([json.dumps({"type": "error", "status": 400, "error": error})])
            return True
        if kind == "mock.close":
            code = int(event.get("code") or 1000)
            await self.stream.send(self.ws.send(CloseConnection(code=code, reason="mock closes")))
            return False
        fields = {k: v for k, v in event.items() if k != "type"}
        previous = fields.get("previous_response_id")
        stored = fields.get("store") is not False and previous in self.answered
        if previous is not None and previous != self.last and not stored:
            await self._send([_not_found(previous)])
            return True
        body = json.dumps({**fields, "stream": True}).encode()
        headers = [
            (k, v)
            for k, v in self.upgrade.headers
            if k not in _DROPPED and not k.startswith(b"sec-websocket-")
        ]
        request = dataclasses.replace(
            self.upgrade,
            method="POST",
            headers=[*headers, (b"content-type", b"application/json")],
            body=body,
        )
        responder = _TurnResponder(self._send)
        try:
            await carry_out(
                self.handler.plan_for(request),
                responder,
                silence_limit=self.handler.settings.silence_limit,
            )
        except _Dropped:
            return False
        self.last = responder.completed
        if responder.completed is not None:
            self.answered.add(responder.completed)
        return True


def _not_found(previous: object) -> str:
    """The API's error event for a ``previous_response_id`` the socket does not hold."""
    error = {
        "type": "invalid_request_error",
        "code": "previous_response_not_found",
        "message": f"Previous response with id '{previous}' not found.",
        "param": "previous_response_id",
    }
    return json.dumps({"type": "error", "status": 400, "error": error})
