"""Stateful Responses conversations on any upstream (docs/conversion.md, "Responses state").

Before a Responses request is admitted, `Conversations.open` expands its
``previous_response_id`` into the whole conversation (the named response's kept items, then its
own input) and drops the id, so whatever format the upstream speaks it gets the full history
(an Anthropic upstream its ``tool_use`` before the ``tool_result``). The answer passes through
`KeepingResponder`, which keeps the response's items before the client sees the closing event:
a client that sends its next turn at once finds them.

Where: a Responses WebSocket's turns in that socket's `SocketMemory` (every turn, whatever its
``store``); HTTP requests with ``store`` true (the Responses API's default) in the request
store (`twserve.store.responses`: SQLite, or PostgreSQL shared by every instance), under the
gateway key, for ``retention.responses_secs``, within ``retention.responses_per_key`` records
and ``retention.responses_key_bytes`` bytes per key. An id not found (unknown, expired, another
key's, or kept on another socket) gets the OpenAI API's own 400, ``previous_response_not_found``
(code ``gw.responses.previous_not_found``).

A socket's warm-up turn (``generate: false``) is answered here, with an empty completed response
whose id the next turn may name. Where some provider takes Responses WebSocket turns over its
own socket (``responses_transport: websocket``), a socket's turns go on as the client sent them
(``previous_response_id``, warm-up and all): that upstream's socket keeps the conversation.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from twengine.attempt import TurnAsSent
from twengine.config import Config
from twengine.destinations import Destination, Transport
from twproto import SSEDecoder, SSEError, json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_headers
from twproto.formats.openai_responses import state
from twproto.paths import Operation, PathRoute
from twserve.gateway.answers import respond_bytes
from twserve.observe.request_ids import IdentifiedResponder
from twserve.server.base import Headers, Request, Responder
from twserve.store.responses import ResponseRecords
from twserve.store.sqlite import RequestRow
from twserve.upstream.responses_socket import SocketTurn

__all__ = ["NOT_FOUND", "Conversations", "KeepingResponder", "socket_turn"]

log = logging.getLogger("twserve.gateway.conversations")

NOT_FOUND = "gw.responses.previous_not_found"
_MAX_EVENT = 256 * 1024 * 1024  # the gateway's own stream (see server/ws_turn.py)

Save = Callable[[dict[str, Any]], Awaitable[None]]


class Conversations:
    """Expands and keeps Responses conversations (`open`); `records` is the store's table,
    `record` what stores a finished request row (for the requests answered here)."""

    def __init__(
        self,
        records: ResponseRecords | None,
        wall: Callable[[], float],
        record: Callable[[RequestRow, IdentifiedResponder], None],
    ) -> None:
        self.records, self.wall, self.record = records, wall, record

    async def open(
        self, request: Request, responder: Responder, route: PathRoute, client: str, config: Config
    ) -> tuple[Request, Responder] | GatewayError | bytes:
        """`request` expanded and the responder that keeps its answer; the error for an id not
        found; or a warm-up turn's answer (SSE bytes) made here."""
        opened = await self._open(request, route, client, config)
        if not isinstance(opened, tuple):
            return opened
        request, save = opened
        return request, responder if save is None else KeepingResponder(responder, save)

    async def answer(
        self, answer: GatewayError | bytes, row: RequestRow, plain: Responder, request_id: str
    ) -> None:
        """Answer a request `open` or `destinations` did not let through: a warm-up turn or an
        id not found."""
        responder, record = IdentifiedResponder(plain, request_id), self.record
        if isinstance(answer, GatewayError):
            row.status, row.error_code = answer.status, answer.code
            record(row, responder)
            body = state.not_found_body(answer.message.split("'")[1])
            await respond_bytes(responder, 400, body, headers=(*error_headers(answer),))
            return
        row.status, row.local = 200, True
        record(row, responder)
        head = ((b"content-type", b"text/event-stream"),)
        await respond_bytes(responder, 200, answer, headers=head)

    async def _open(
        self, request: Request, route: PathRoute, client: str, config: Config
    ) -> tuple[Request, Save | None] | GatewayError | bytes:
        if (
            route.dialect is not Dialect.OPENAI_RESPONSES
            or route.operation is not Operation.GENERATE
        ):
            return request, None
        body = request.parsed
        if body is None:
            try:
                body = json_loads(request.body)
            except ValueError:
                return request, None  # admission answers it
        if not isinstance(body, dict):
            return request, None
        memory, retention = request.conversation, config.retention
        if memory is not None:  # a socket's: the key's caps apply to each socket
            memory.max_count = retention.responses_per_key
            memory.max_bytes = retention.responses_key_bytes
        kept = memory is not None or (
            body.get("store") is not False and retention.responses_secs > 0
        )
        # Some upstream may take this socket's turns over its own socket, which keeps the
        # conversation there: each attempt decides which form of the turn it sends.
        own_sockets = memory is not None and _has_socket(config)
        previous = state.previous_id(body)
        if previous is not None:
            record = await self._load(memory, client, previous, kept)
            if record is None:
                sockets = request.upstream_sockets
                if own_sockets and sockets is not None and sockets.holds_any(previous):
                    # Not kept here (larger than the cap) but held by an upstream's socket.
                    return request, self._saver(memory, client, body, config)
                return GatewayError(
                    status=400,
                    category=ErrorCategory.REQUEST,
                    code=NOT_FOUND,
                    message=f"Previous response with id '{previous}' not found.",
                )
            sent = TurnAsSent(body=request.body, parsed=body, previous=previous)
            body = state.expand_body(body, state.load_items(record))
            raw = json_dumps(body)
            request = dataclasses.replace(
                request,
                body=raw,
                parsed=body if request.parsed is not None else None,
                as_sent=sent if own_sockets else None,
            )
        save = self._saver(memory, client, body, config) if kept else None
        if memory is not None and state.is_warm_up(body) and not own_sockets:
            return await _warm_up(body, save)
        return request, save

    def destinations(
        self, request: Request, body: dict[str, Any], candidates: list[Destination]
    ) -> list[Destination] | bytes:
        """Where a socket's turn may go, after routing: a warm-up turn (``generate: false``)
        only to upstreams over their own socket, which answer it; with none among
        `candidates`, its answer, made here (`answer` writes it)."""
        if request.conversation is None or not state.is_warm_up(body):
            return candidates
        if request.upstream_sockets is not None:
            own = [c for c in candidates if c.transport is Transport.RESPONSES_SOCKET]
            if own:
                return own
        # Kept as it goes out: the responder `open` gave keeps every answer of a socket's turn.
        return state.warm_up(body, _gateway_id())[1]

    async def _load(
        self, memory: state.SocketMemory | None, client: str, previous: str, kept: bool
    ) -> bytes | None:
        if memory is not None:
            return memory.get(previous)
        if self.records is None or not kept:
            return None
        try:
            return await self.records.load(client, previous, now=self.wall())
        except Exception:
            log.exception("gw.responses: the stored response %s cannot be read", previous)
            return None

    def _saver(
        self, memory: state.SocketMemory | None, client: str, body: dict[str, Any], config: Config
    ) -> Save:
        retention = config.retention

        async def save(response: dict[str, Any]) -> None:
            response_id = response.get("id")
            if not isinstance(response_id, str) or not response_id:
                return
            record = state.record_items(body, response)
            if memory is not None:
                memory.keep(response_id, record)
                return
            if self.records is None or len(record) > retention.responses_key_bytes:
                return
            now = self.wall()
            try:
                await self.records.save(
                    client,
                    response_id,
                    record,
                    now=now,
                    expires=now + retention.responses_secs,
                    max_count=retention.responses_per_key,
                    max_bytes=retention.responses_key_bytes,
                )
            except Exception:  # the answer still goes out; the next turn gets not found
                log.exception("gw.responses: response %s cannot be kept", response_id)

        return save


def _has_socket(config: Config) -> bool:
    return any(p.responses_transport.value == "websocket" for p in config.providers)


def socket_turn(request: Request) -> SocketTurn | None:
    """What the relay needs of a client socket's turn: its upstream sockets, and the turn as
    the client sent it where `Conversations.open` expanded it."""
    sockets = request.upstream_sockets
    return None if sockets is None else SocketTurn(sockets, request.as_sent)


def _gateway_id() -> str:
    return f"resp_gw_{secrets.token_hex(12)}"


async def _warm_up(body: dict[str, Any], save: Save | None) -> bytes:
    """A warm-up turn's answer, its input kept for the next turn."""
    response, stream = state.warm_up(body, _gateway_id())
    if save is not None:
        await save(response)
    return stream


class KeepingResponder:
    """Passes the answer on, keeping the response (`save`) before its closing event or last
    byte reaches the client."""

    __slots__ = ("_body", "_decoder", "_inner", "_length", "_save", "_saved")

    def __init__(self, inner: Responder, save: Save) -> None:
        self._inner, self._save = inner, save
        self._decoder: SSEDecoder | None = None
        self._body: bytearray | None = None
        self._length = -1
        self._saved = False

    @property
    def started(self) -> bool:
        return bool(getattr(self._inner, "started", False))

    async def start(self, status: int, headers: Headers) -> None:
        if status < 300:
            for name, value in headers:
                if name == b"content-type" and value.startswith(b"text/event-stream"):
                    self._decoder = SSEDecoder(max_event_size=_MAX_EVENT)
                elif name == b"content-type" and value.startswith(b"application/json"):
                    self._body = bytearray()
                elif name == b"content-length" and value.isdigit():
                    self._length = int(value)
        await self._inner.start(status, headers)

    def ready(self) -> bool:
        return False  # every piece through `send`, so it is seen before it goes out

    def send_now(self, data: bytes) -> None:
        raise RuntimeError("KeepingResponder is never ready")

    async def send(self, data: bytes) -> None:
        if not self._saved:
            await self._look(data)
        await self._inner.send(data)

    async def _look(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                events = self._decoder.feed(data)
            except SSEError:
                self._decoder = None
                return
            for event in events:
                response = state.closing_response(event.event, event.data)
                if response is not None:
                    await self._keep(response)
            return
        if self._body is not None:
            self._body += data
            if self._length >= 0 and len(self._body) >= self._length:
                found = _json_object(bytes(self._body))
                if found is not None:
                    await self._keep(found)
                self._body = None

    async def _keep(self, response: dict[str, Any]) -> None:
        self._saved = True
        self._decoder = None
        await self._save(response)

    async def end(self) -> None:
        if not self._saved and self._body is not None:
            found = _json_object(bytes(self._body))
            if found is not None:
                await self._keep(found)
        await self._inner.end()

    async def abort(self) -> None:
        abort = getattr(self._inner, "abort", None)
        if abort is not None:
            await abort()


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        found = json_loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
