"""Responses WebSocket transport: a ``GET`` on a Responses path upgraded with wsproto.

The HTTP/1.1 server parses the upgrade request like any other and asks its switches
(twserve/server/http1.py); `switch_for` returns the one that takes ``Upgrade: websocket`` on the
Responses paths (`WS_RESPONSES_PATHS`, twproto's, Codex's path included). Any other
upgrade target stays an ordinary HTTP request (and gets the gateway's 404).

The upgrade is checked by the gateway's own head check (`Gateway.check_head`, asked as of the
``POST`` its turns will be): the client address against ``allow_from`` (403), then the gateway
key (401). A refused upgrade is that check's HTTP answer, the error body in the Responses format;
nothing is upgraded.

Once open, each client ``response.create`` event is a turn of its own, carried out by the same
`Gateway.handle` the HTTP servers call: the event's fields become the JSON body of a synthesised
``POST`` to the upgrade's path with ``stream: true`` and the upgrade's headers (so its key), and
the handler answers through `TurnResponder` (twserve/server/ws_turn.py), which decodes the
Server-Sent Events it is given and sends each event's JSON as one text message. Routing, key
limits, the slot held only while the turn runs, failover before content, conversion from
Anthropic, Chat and Gemini upstreams and one row per turn are therefore those of an HTTP
request. A turn the handler refuses or fails before
its stream starts (an HTTP error status) is answered with a ``response.failed`` event carrying
that status and the error object of the HTTP body; the socket stays usable. What a client
message means and the events the gateway writes itself are twproto's
(twproto/sockets/responses.py); this module only carries them out.

Turns run one at a time per socket, in arrival order: a ``response.create`` sent while one runs
waits in a queue of `WebSocketLimits.max_queued_turns`; one more is refused with a
``response.failed`` event (``gw.ws.busy``, 429). A message's bytes draw on the server's body
budget while it arrives and while its turn waits and runs (one that does not fit is refused with
an ``error`` event, ``gw.request.bodies_busy``); a key may hold
`WebSocketLimits.max_sockets_per_key` sockets at once.

Every write has the server's write timeout: a client that stops reading is taken as gone, its
turn cancelled (which frees the upstream slot and the key's permit) and the socket dropped. The
socket is read no further ahead than one read, writes return while at most
`WebSocketLimits.output_buffer_bytes` wait, and a client owing more than `max_owed_pongs` pongs
while output waits is dropped (twserve/server/backpressure.py).

``response.steer`` is answered with ``response.steer.failed`` (``steering_not_supported``): the
gateway does not steer a running upstream call.

Close codes: 1000 after the client's close or an idle socket, 1001 when the server drains (the
running turn finishes first; queued turns get a ``response.failed`` event, ``gw.ws.closing``),
1008 when a turn is refused for its key or address (nothing more could succeed on this
socket), 1003 for a binary message (client events are JSON text), 1009 for a message over
`WebSocketLimits.max_message_bytes`, 1011 for a fault inside the gateway; protocol errors get
wsproto's code (1002, 1007). Once a close frame is out, the session stops and waits a bounded
time for the client's close before the TCP connection is closed. A client that goes away (close
frame or lost socket) cancels the running turn's scope: the upstream call is closed, its slot
freed and its row marked cancelled, as over HTTP.

A turn routed to an OpenAI Responses upstream configured with ``responses_transport: websocket``
reaches it over that upstream's own socket, kept for the client socket's later turns
(twserve/upstream/responses_socket.py); each turn's request carries the socket's `UpstreamSockets`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    TextMessage,
)
from wsproto.events import Request as WSRequest
from wsproto.utilities import RemoteProtocolError

from twproto import Dialect, ErrorCategory, GatewayError, error_body, error_headers
from twproto.formats.openai_responses.state import SocketMemory
from twproto.sockets import (
    WS_RESPONSES_PATHS,
    EventRejected,
    SteerRequested,
    TurnRequested,
    read_ws_client_event,
    ws_gateway_error_event,
    ws_gateway_failed_event,
    ws_steer_failed_event,
)
from twserve.server.backpressure import Intake, Outflow
from twserve.server.base import (
    LINGER_SECS,
    BodyBudget,
    ClientGone,
    Handler,
    Handoff,
    HeadCheck,
    Headers,
    HeadRefusal,
    Request,
    Switch,
)
from twserve.server.ws_turn import Turn, TurnResponder, failed_response
from twserve.upstream.responses_socket import UpstreamSockets

log = logging.getLogger("twserve.server.websocket")

__all__ = ["EVICTED_REASON", "WebSocketLimits", "limits_reader", "switch_for", "upgrade_refusal"]


# The most one read takes from the socket.
READ_SIZE = 65536
# The reason of the close (1001) that ends an idle session for a new client.
EVICTED_REASON = "gw.listen.idle_closed: idle, closed to make room for a new connection"

# Close codes (RFC 6455, "Defined Status Codes").
NORMAL = 1000
GOING_AWAY = 1001
UNSUPPORTED_DATA = 1003
POLICY = 1008
TOO_BIG = 1009
INTERNAL = 1011

# Upgrade headers that describe the socket, not a turn: left out of each turn's request.
_SOCKET_HEADERS = frozenset(
    {b"connection", b"upgrade", b"content-length", b"transfer-encoding", b"content-type"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSocketLimits:
    """What a Responses WebSocket allows (`output_buffer_bytes`, `max_owed_pongs` and
    `idle_timeout` hold for Realtime connections too).

    `max_message_bytes` bounds one client message, never above the server's
    `ServerLimits.max_body_bytes` (None: that bound itself); its bytes, while the message
    arrives and while its turn waits and runs, count against the server's body budget as an
    HTTP body's do. `idle_timeout` closes a socket that neither runs a turn nor hears from its
    client (a ping counts) for that long. `max_sockets_per_key` bounds the sockets open at once
    with one gateway key, on this process.

    `output_buffer_bytes` is how much may wait in the socket's buffer for a client that does
    not read before writes wait (a write that waits gets the server's `write_timeout`); past
    `max_owed_pongs` pongs the client has not taken while output waits, its pings are a flood
    and the connection is dropped.
    """

    max_message_bytes: int | None = 16 * 1024 * 1024
    idle_timeout: float = 300.0
    max_queued_turns: int = 8
    max_sockets_per_key: int = 32
    output_buffer_bytes: int = 64 * 1024
    max_owed_pongs: int = 1000


def limits_reader(
    limits: WebSocketLimits | Callable[[], WebSocketLimits] | None,
) -> Callable[[], WebSocketLimits]:
    """`limits` as a function read at each upgrade (fixed limits, or the defaults, as one)."""
    if callable(limits):
        return limits
    fixed = limits or WebSocketLimits()
    return lambda: fixed


def upgrade_refusal(check_head: HeadCheck, upgrade: Request) -> HeadRefusal | None:
    """The gateway's answer to an upgrade it refuses, or None to accept it: the head checks of
    an HTTP request (address, then key) made on the upgrade as on the ``POST`` its turns will
    be, so the socket is admitted exactly as one of its turns would be."""
    return check_head(dataclasses.replace(upgrade, method="POST", body=b""))


def _tokens(request: Request, name: bytes) -> set[bytes]:
    return {
        token.strip().lower()
        for key, value in request.headers
        if key == name
        for token in value.split(b",")
    }


# The gateway key's name for an upgrade request (None: no key).
KeyOf = Callable[[Request], str | None]


class SocketCount:
    """Responses sockets open per gateway key, for `WebSocketLimits.max_sockets_per_key`."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def take(self, key: str) -> bool:
        count = self.open.get(key, 0)
        if count >= self.limit:
            return False
        self.open[key] = count + 1
        return True

    def give_back(self, key: str) -> None:
        count = self.open.get(key, 0) - 1
        if count > 0:
            self.open[key] = count
        else:
            self.open.pop(key, None)


def switch_for(
    check_head: HeadCheck,
    limits: WebSocketLimits | Callable[[], WebSocketLimits] | None = None,
    *,
    key_of: KeyOf | None = None,
) -> Switch:
    """The HTTP/1.1 server's switch for Responses WebSocket upgrades; `check_head` is the
    gateway's (`Gateway.check_head`), read at each upgrade so a reload applies to the next;
    `limits` may be a function, read at each upgrade too (the config's listen.websocket);
    `key_of` names the key an upgrade presents, for the cap on sockets per key (without it,
    sockets are not counted)."""
    current = limits_reader(limits)
    counts = SocketCount(current().max_sockets_per_key)

    def switch(request: Request) -> Callable[[Handoff], Awaitable[None]] | None:
        if request.method != "GET" or b"websocket" not in _tokens(request, b"upgrade"):
            return None
        if request.path not in WS_RESPONSES_PATHS:
            return None
        lim = current()
        counts.limit = lim.max_sockets_per_key  # the sockets already open stay

        async def take(handoff: Handoff) -> None:
            await _Session(handoff, check_head, lim, key_of=key_of, counts=counts).run()

        return take

    return switch


class _Closed(Exception):
    """The socket is finished with (closed by either side, or lost)."""


class _Session:
    """One upgraded connection: a reader task (frames, pings, client events) and a turn task
    (one `Gateway.handle` at a time), sharing a lock for writes."""

    def __init__(
        self,
        handoff: Handoff,
        check_head: HeadCheck,
        limits: WebSocketLimits,
        *,
        key_of: KeyOf | None = None,
        counts: SocketCount | None = None,
    ) -> None:
        self.handoff = handoff
        self.stream: anyio.abc.SocketStream = handoff.stream
        self.handler: Handler = handoff.handler
        self.check_head = check_head
        self.limits = limits
        max_body = handoff.limits.max_body_bytes
        self.max_message = min(limits.max_message_bytes or max_body, max_body)
        self.write_timeout = handoff.limits.write_timeout
        self.ws = WSConnection(ConnectionType.SERVER)
        self.write_lock = anyio.Lock()
        self.lost = False  # the socket failed or was closed
        self.close_sent = False
        self.running: Turn | None = None
        self.turn_scope: anyio.CancelScope | None = None
        # The session's task group: cancelled once a close frame went out, after which only
        # the bounded wait for the client's close remains (`_end_socket`).
        self.session_scope: anyio.CancelScope | None = None
        self.queue_in, self.queue_out = anyio.create_memory_object_stream[Turn](
            limits.max_queued_turns
        )
        self.upgrade = handoff.request
        # The upstream sockets this client socket's turns keep (an OpenAI Responses upstream
        # configured with ``responses_transport: websocket``), closed with it.
        self.upstreams = UpstreamSockets()
        # Its turns' responses, for previous_response_id (bounded by the gateway's config).
        self.conversation = SocketMemory(0, 0)
        # Client messages, arriving and waiting in turns, draw on the bytes the server holds
        # for request bodies (HTTP/1.1's and HTTP/2's budget).
        self.budget = handoff.budget or BodyBudget(handoff.limits.body_budget_bytes)
        self.reserved = 0  # bytes of the budget this socket holds, in all
        self.intake = Intake(self.stream)
        self.outflow = Outflow(
            self.stream, buffered=limits.output_buffer_bytes, max_owed=limits.max_owed_pongs
        )
        self.key_of = key_of
        self.counts = counts
        self.counted_key: str | None = None  # the key this socket counts against

    # --- writing ----------------------------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        """One socket write. It returns once no more than `output_buffer_bytes` wait; one that
        has to wait longer than the server's `write_timeout` means the client stopped reading:
        it is taken as gone, as over HTTP (its turn is cancelled, which frees the upstream
        slot and the key's permit), and the socket is dropped."""
        if self.lost:
            raise ClientGone()
        try:
            with anyio.fail_after(self.write_timeout):
                self.outflow.wrote(len(data))
                await self.stream.send(data)
        except TimeoutError as exc:
            log.info(
                "gw.ws.stopped_reading: WebSocket client %s read nothing for %.0f s; "
                "dropping the connection",
                self.upgrade.client[0],
                self.write_timeout,
            )
            self._drop()
            raise ClientGone() from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.lost = True
            raise ClientGone() from exc

    def _drop(self) -> None:
        """End the socket without a close handshake (the client takes nothing we send)."""
        self.lost = True
        self._cancel_turn()
        if self.session_scope is not None:
            self.session_scope.cancel()

    async def send_text(self, text: str) -> None:
        """One text message; `ClientGone` when the client can no longer be written to (which
        the relay takes as the client leaving)."""
        await self.send_texts([text])

    async def send_texts(self, texts: list[str]) -> None:
        """Text messages, one each, in one socket write."""
        if not texts:
            return
        async with self.write_lock:
            if self.close_sent or self.ws.state is not ConnectionState.OPEN:
                raise ClientGone()
            send = self.ws.send
            await self._write(b"".join([send(TextMessage(data=text)) for text in texts]))

    async def close(self, code: int, reason: str = "") -> None:
        """Send the close frame once; the reader ends the socket when the client answers it."""
        async with self.write_lock:
            if self.close_sent or self.lost:
                return
            if self.ws.state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                return
            self.close_sent = True
            with suppress(ClientGone):
                await self._write(self.ws.send(CloseConnection(code=code, reason=reason)))
        if self.session_scope is not None:
            self.session_scope.cancel()

    # --- the handshake ----------------------------------------------------------------------

    async def _handshake(self) -> bool:
        req = self.upgrade
        head = b"GET " + req.target + b" HTTP/1.1\r\n"
        head += b"".join(name + b": " + value + b"\r\n" for name, value in req.headers)
        try:
            self.ws.receive_data(head + b"\r\n")
            events = list(self.ws.events())
        except RemoteProtocolError as exc:
            err = GatewayError(
                status=400,
                category=ErrorCategory.REQUEST,
                code="gw.request.bad_http",
                message=f"malformed WebSocket upgrade: {exc}",
            )
            body = error_body(Dialect.OPENAI_RESPONSES, err)
            await self._reject(HeadRefusal(status=400, headers=error_headers(err), body=body))
            return False
        if not events or not isinstance(events[0], WSRequest):
            return False
        refusal = upgrade_refusal(self.check_head, req)
        if refusal is not None:
            await self._reject(refusal)
            return False
        if not self._count_socket():
            err = GatewayError(
                status=429,
                category=ErrorCategory.RATE_LIMITED,
                code="gw.ws.too_many_sockets",
                message=(
                    f"this gateway key has {self.limits.max_sockets_per_key} Responses "
                    "WebSockets open; close one, or run more turns on each"
                ),
                retry_after=1,
            )
            body = error_body(Dialect.OPENAI_RESPONSES, err)
            await self._reject(HeadRefusal(status=429, headers=error_headers(err), body=body))
            return False
        # No extensions: permessage-deflate would let a small frame inflate past the message
        # limit before it could be counted, and turns are small next to their upstream time.
        with suppress(ClientGone):
            await self._write(self.ws.send(AcceptConnection()))
            if self.handoff.buffered:
                self.ws.receive_data(self.handoff.buffered)
            return True
        return False

    def _count_socket(self) -> bool:
        """Count this socket against its key's cap; False when the key is at it."""
        if self.key_of is None or self.counts is None:
            return True
        key = self.key_of(dataclasses.replace(self.upgrade, method="POST", body=b""))
        if key is None:
            return True
        if not self.counts.take(key):
            return False
        self.counted_key = key
        return True

    async def _reject(self, refusal: HeadRefusal) -> None:
        body = refusal.body
        headers = [
            *(h for h in refusal.headers if h[0] not in (b"content-length", b"connection")),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        data = self.ws.send(
            RejectConnection(status_code=refusal.status, headers=headers, has_body=True)
        )
        data += self.ws.send(RejectData(data=body, body_finished=True))
        with suppress(ClientGone):
            await self._write(data)

    # --- running ----------------------------------------------------------------------------

    async def run(self) -> None:
        idle = self.handoff.idle
        try:
            if not await self._handshake():
                return
            # Without a turn the session is idle: at its caps the server may close it for a
            # new client (by `draining`, with `idle.evicted` saying why).
            idle.idle(anyio.current_time())
            async with anyio.create_task_group() as tg:
                self.session_scope = tg.cancel_scope
                tg.start_soon(self._run_turns)
                tg.start_soon(self._watch_drain)
                try:
                    await self._read()
                except _Closed:
                    pass
                except Exception:
                    log.exception("WebSocket from %s failed", self.upgrade.client[0])
                    await self.close(INTERNAL, "internal gateway error")
                tg.cancel_scope.cancel()
        finally:
            idle.busy()
            self.queue_in.close()
            self.queue_out.close()
            # What the socket still holds of the body budget: a message cut off, queued turns.
            self.budget.release(self.reserved)
            self.reserved = 0
            if self.counted_key is not None and self.counts is not None:
                self.counts.give_back(self.counted_key)
                self.counted_key = None
            await self.upstreams.aclose()
            await self._end_socket()

    async def _end_socket(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.close_sent and not self.lost:
                # Our close went out: wait (bounded) for the client's, then let TCP close.
                with anyio.move_on_after(LINGER_SECS), suppress(Exception):
                    while self.ws.state is not ConnectionState.CLOSED:
                        data = await self.stream.receive(READ_SIZE)
                        self.ws.receive_data(data)
                        for _ in self.ws.events():
                            pass
            with suppress(Exception):
                await self.stream.aclose()

    async def _watch_drain(self) -> None:
        await self.handoff.draining.wait()
        # No new turn is taken; the running one finishes, the queued ones are refused
        # (`_run_turns`), and the socket closes when the queue is empty.
        self.queue_in.close()

    async def _refuse_closing(self, stream_id: str | None, model: str) -> None:
        err = GatewayError(
            status=503,
            category=ErrorCategory.UPSTREAM,
            code="gw.ws.closing",
            message="the gateway is shutting down; this turn was not started",
        )
        with suppress(ClientGone):
            await self.send_text(ws_gateway_failed_event(err, failed_response(model), stream_id))

    def _give_back(self, size: int) -> None:
        """Bytes of the body budget a message held, given back."""
        size = min(size, self.reserved)
        self.budget.release(size)
        self.reserved -= size

    async def _run_turns(self) -> None:
        async for turn in self.queue_out:
            if self.lost or self.close_sent:
                return
            if self.handoff.draining.is_set():
                self._give_back(turn.reserved)
                await self._refuse_closing(turn.stream_id, turn.model)
                continue
            responder = TurnResponder(self, turn.stream_id, turn.model)
            self.running = turn
            self.turn_scope = anyio.CancelScope()
            try:
                with self.turn_scope:
                    await self.handler(turn.request, responder)
                    if not responder.started:
                        await responder.start(500, [])
                    await responder.end()
            except ClientGone:
                pass
            except Exception:
                log.exception("turn failed on a WebSocket from %s", self.upgrade.client[0])
                if not self.lost and not self.close_sent:
                    await self.close(INTERNAL, "internal gateway error")
            finally:
                self.running = None
                self.turn_scope = None
                self._give_back(turn.reserved)
                if not self.queue_out.statistics().current_buffer_used:
                    self.handoff.idle.idle(anyio.current_time())
            refused = responder.refused
            if refused is not None and (
                refused.status == 401 or refused.code == "gw.auth.denied_address"
            ):
                # The key or address was good at the upgrade but no longer is (a reload):
                # nothing further can succeed here.
                await self.close(POLICY, "the gateway key or address is no longer allowed")
                return
        # The queue was closed by a drain and is empty.
        if self.handoff.idle.evicted:
            log.info("gw.listen.idle_closed: WebSocket of %s, idle", self.upgrade.client[0])
            await self.close(GOING_AWAY, EVICTED_REASON)
        else:
            await self.close(GOING_AWAY, "server draining")

    def _cancel_turn(self) -> None:
        if self.turn_scope is not None:
            self.turn_scope.cancel()

    async def _read(self) -> None:
        parts: list[str] = []
        size = 0  # bytes of the message arriving, held against the body budget
        dropped = False  # the message arriving did not fit in the budget: its rest is skipped
        while True:
            if self.lost:  # what the client sent before it went is not worth reading
                raise _Closed()
            try:
                with anyio.fail_after(self.limits.idle_timeout):
                    data = await self.intake.receive(READ_SIZE)
            except TimeoutError:
                if self.running is not None or self.queue_out.statistics().current_buffer_used:
                    continue
                await self.close(NORMAL, "idle timeout")
                raise _Closed() from None
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                OSError,
            ):
                self.lost = True
                self._cancel_turn()
                raise _Closed() from None
            self.ws.receive_data(data)
            pings: list[Ping] = []
            for event in self.ws.events():
                if isinstance(event, BytesMessage):
                    # Client events are JSON text (RFC 6455: 1003 for a kind of data
                    # the endpoint does not take).
                    self._cancel_turn()
                    await self.close(UNSUPPORTED_DATA, "client events are text messages")
                    raise _Closed()
                if isinstance(event, TextMessage):
                    piece = event.data
                    grown = len(piece.encode())
                    size += grown
                    if size > self.max_message:
                        self._cancel_turn()
                        await self.close(TOO_BIG, f"message over {self.max_message} bytes")
                        raise _Closed()
                    if not dropped:
                        if self.budget.reserve(grown):
                            self.reserved += grown
                            parts.append(piece)
                        else:
                            # Refused rather than waited for, as an HTTP body is: what
                            # arrived of it is given back, the rest is not kept.
                            dropped = True
                            self._give_back(size - grown)
                            parts = []
                    if event.message_finished:
                        text = "".join(parts)
                        held = 0 if dropped else size
                        busy = dropped
                        parts, size, dropped = [], 0, False
                        if self.close_sent:
                            self._give_back(held)
                        elif busy:
                            await self._refuse_busy_body()
                        else:
                            await self._on_message(text, held)
                elif isinstance(event, Ping):
                    pings.append(event)
                elif isinstance(event, CloseConnection):
                    # The client closes (or wsproto found a protocol error, whose code this
                    # carries): a turn still running has lost its reader.
                    self._cancel_turn()
                    if self.ws.state is ConnectionState.REMOTE_CLOSING:
                        async with self.write_lock:
                            with suppress(ClientGone):
                                await self._write(self.ws.send(event.response()))
                            self.close_sent = True
                    elif self.ws.state is ConnectionState.OPEN:
                        await self.close(event.code, event.reason or "")
                    raise _Closed()
            if pings:
                await self._answer_pings(pings)

    async def _answer_pings(self, pings: list[Ping]) -> None:
        """The pongs of one read, in one write. A client that keeps pinging without reading
        them (more than `max_owed_pongs` owed while output waits for it) is dropped."""
        if self.lost:
            raise _Closed()
        if self.ws.state is not ConnectionState.OPEN or self.close_sent:
            return
        self.outflow.owe(len(pings))
        if self.outflow.flooded():
            self._ping_flood()
        async with self.write_lock:
            if self.ws.state is ConnectionState.OPEN and not self.close_sent:
                send = self.ws.send
                with suppress(ClientGone):
                    await self._write(b"".join([send(ping.response()) for ping in pings]))
        if self.outflow.flooded():
            self._ping_flood()

    def _ping_flood(self) -> None:
        log.info(
            "gw.ws.ping_flood: WebSocket client %s owes %d pongs it does not read; "
            "dropping the connection",
            self.upgrade.client[0],
            self.outflow.owed(),
        )
        self._drop()
        raise _Closed()

    async def _refuse_busy_body(self) -> None:
        err = GatewayError(
            status=503,
            category=ErrorCategory.RATE_LIMITED,
            code="gw.request.bodies_busy",
            message=(
                "the gateway is holding as many request bodies as it may; this message was "
                "not read, send it again shortly"
            ),
            retry_after=1,
        )
        with suppress(ClientGone):
            await self.send_text(ws_gateway_error_event(err))

    async def _on_message(self, text: str, held: int) -> None:
        """One whole client message; `held` is the bytes of the budget it holds, which a turn
        keeps until it has run."""
        event = read_ws_client_event(text)
        if isinstance(event, TurnRequested):
            await self._queue_turn(event, held)
            return
        self._give_back(held)
        if isinstance(event, SteerRequested):
            answer = ws_steer_failed_event(event)
        else:
            answer = ws_gateway_error_event(_bad_event(event), event.stream_id)
        with suppress(ClientGone):
            await self.send_text(answer)

    async def _queue_turn(self, event: TurnRequested, held: int) -> None:
        headers: Headers = [
            (name, value)
            for name, value in self.upgrade.headers
            if name not in _SOCKET_HEADERS and not name.startswith(b"sec-websocket-")
        ]
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(event.body)).encode()),
        ]
        request = Request(
            method="POST",
            target=self.upgrade.target,
            path=self.upgrade.path,
            query=self.upgrade.query,
            headers=headers,
            body=event.body,
            client=self.upgrade.client,
            http_version=self.upgrade.http_version,
            upstream_sockets=self.upstreams,
            conversation=self.conversation,
            parsed=event.parsed,  # the body as the message was read: not parsed again
        )
        turn = Turn(request=request, stream_id=event.stream_id, model=event.model, reserved=held)
        try:
            self.queue_in.send_nowait(turn)
            self.handoff.idle.busy()
        except anyio.WouldBlock:
            self._give_back(held)
            err = GatewayError(
                status=429,
                category=ErrorCategory.RATE_LIMITED,
                code="gw.ws.busy",
                message=(
                    f"{self.limits.max_queued_turns} turns already wait on this socket; "
                    "wait for one to finish"
                ),
            )
            failed = ws_gateway_failed_event(err, failed_response(event.model), event.stream_id)
            with suppress(ClientGone):
                await self.send_text(failed)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._give_back(held)
            await self._refuse_closing(event.stream_id, event.model)


def _bad_event(event: EventRejected) -> GatewayError:
    return GatewayError(
        status=400, category=ErrorCategory.REQUEST, code="gw.ws.bad_event", message=event.message
    )
