"""Realtime WebSocket proxy: ``GET /v1/realtime?model=...`` upgraded, relayed frame by frame.

The HTTP/1.1 server hands the upgrade to `switch_for`'s taker (as for the Responses WebSocket,
twserve/server/websocket.py). Before anything is upgraded:

* the upgrade is checked like a Responses request's head (`Gateway.check_head`: address 403,
  key 401), its refusal sent in OpenAI's error shape;
* the model comes from the query (400 ``gw.realtime.model_required`` without one); the gateway's
  routing orders the candidates, of which those with ``realtime: true`` and an OpenAI protocol
  (``openai-responses``, ``openai-chat``) whose credentials resolve are kept (404
  ``gw.realtime.no_upstream`` when none is);
* the key's turn is taken (its ``max_concurrent`` permit and usage limits, as for a request);
* the first candidate with a free slot whose socket opens is the upstream: a WebSocket client over
  anyio and wsproto (``wss`` with TLS for an ``https`` base URL), ``Authorization: Bearer`` with
  the provider's key, to ``<base_url>/realtime?model=<the model it is sent>``. A candidate that
  refuses or cannot be reached is passed over; with none left the client gets 502
  ``gw.realtime.upstream_failed`` (429 ``gw.realtime.busy`` when every one was full).

Then the client's upgrade is accepted and every text and binary message is passed on as it came,
in both directions, fragment by fragment; there is no failover once the upstream socket is open.
Pings are answered on the hop they arrive on. A close from either side is passed on with its code
(1005, "no code", goes on as 1000). A client that vanishes closes the upstream with 1001, an
upstream that vanishes closes the client with 1011, and a server that drains closes both with
1001. A frame that breaks the protocol closes its hop with wsproto's code and the other with
1001; a client message over the server's ``max_body_bytes`` closes the client with 1009 and the
upstream with 1001; an upstream message over it is told to the client as an ``error`` event
(``gw.realtime.upstream_too_big``) and both sides close with 1009. A connection on which neither
side sends anything (pings included) for the idle timeout (the Responses socket's, 300 s) is
closed on both sides with 1000.

Every upstream socket opened (a success) or not (its refusal classified as an HTTP answer, or
its transport fault) is a health sample of that upstream, as an HTTP attempt is. The socket is
opened by twserve/upstream/ws_dial.py.

The connection is one row (path ``/v1/realtime``, status 101, the upstream as provider) carrying
the summed usage of the upstream's ``response.done`` events (`twproto.realtime_usage`),
priced like any row. Each ``response.done`` is booked against the key's limits as it arrives
(`UsageKeeper.book_part`); once a token or cost limit is spent, a client ``response.create`` is
answered with an ``error`` event carrying the limit's refusal instead of being passed on, and a
response the upstream starts on its own (server voice detection) is cancelled
(``response.cancel``), until the limit has room again. The connection counts as one request,
settled when it closes. The key permit and the upstream slot are held for the connection's life.

Both hops are read no further ahead than one read and written with the server's write deadline
(`twserve.server.backpressure`): a client or upstream that stops reading for `write_timeout` is
taken as gone, which ends the connection and frees the permit and the slot; one that sends pings
without reading the pongs (more than `WebSocketLimits.max_owed_pongs` owed) is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    TextMessage,
)
from wsproto.events import Request as WSRequest
from wsproto.utilities import RemoteProtocolError

from twengine.admission import model_name_refusal, shown_model
from twengine.attempt import AttemptRecord, Outcome
from twengine.destinations import Destination, destinations
from twengine.router import RoutePlan
from twengine.rules import RequestFacts
from twengine.slots import Permit
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_body, error_headers
from twproto.failures import Failure, classify_response, classify_transport
from twproto.ir import Usage
from twproto.sockets import (
    REALTIME_CHECKED_AS,
    REALTIME_PATH,
    add_usage,
    read_realtime_event,
    realtime_cancel_event,
    realtime_error_event,
    realtime_started_response,
    realtime_upstream_url,
    realtime_usage,
)
from twserve.gateway.key_turn import KeyTurn, key_turn
from twserve.gateway.row import fill_row
from twserve.relay.client import RelayOutcome
from twserve.server.backpressure import Intake, Outflow
from twserve.server.base import LINGER_SECS, ClientGone, Handoff, HeadRefusal, Request, Switch
from twserve.server.websocket import WebSocketLimits, limits_reader
from twserve.store.sqlite import RequestRow
from twserve.upstream.ws_dial import DialFailed, Refused, dial

if TYPE_CHECKING:
    from twserve.gateway.handler import Gateway

log = logging.getLogger("twserve.gateway.realtime")

__all__ = ["switch_for"]

# The most one read takes from a socket.
READ_SIZE = 65536

UPSTREAM_TOO_BIG = "gw.realtime.upstream_too_big"
NORMAL = 1000
GOING_AWAY = 1001
TOO_BIG = 1009
INTERNAL = 1011
# Codes a close frame may not carry (RFC 6455, 7.4.1): what they report goes on as a normal
# close.
_NOT_SENT = frozenset({1005, 1006, 1015})
_REALTIME_PROTOCOLS = frozenset({Dialect.OPENAI_RESPONSES, Dialect.OPENAI_CHAT})
# A response.done repeats its whole output; one larger than this is passed on unread (no usage).
_MAX_READ_MESSAGE = 16 * 1024 * 1024


def switch_for(
    gateway: Gateway, limits: WebSocketLimits | Callable[[], WebSocketLimits] | None = None
) -> Switch:
    """The HTTP/1.1 server's switch for Realtime upgrades (``GET /v1/realtime``). Of `limits`
    (the Responses socket's; a function is read at each upgrade), a connection on which
    neither side sends anything (pings included) for `idle_timeout` seconds is closed, and
    `output_buffer_bytes` and `max_owed_pongs` hold for both hops."""
    current = limits_reader(limits)

    def switch(request: Request) -> Callable[[Handoff], Awaitable[None]] | None:
        if request.method != "GET" or request.path != REALTIME_PATH:
            return None
        if not any(
            name == b"upgrade" and b"websocket" in value.lower() for name, value in request.headers
        ):
            return None

        lim = current()

        async def take(handoff: Handoff) -> None:
            await _Proxy(handoff, gateway, lim).run()

        return take

    return switch


class _Lost(Exception):
    """A hop's TCP connection failed or ended."""


class _Hop:
    """One side of the proxy: a socket and its wsproto connection, writes serialised, each
    bounded by `write_timeout`; reads no further ahead than one read."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        ws: WSConnection,
        *,
        name: str,
        write_timeout: float,
        limits: WebSocketLimits,
    ) -> None:
        self.stream = stream
        self.ws = ws
        self.name = name  # "client" or "upstream", for the log
        self.write_timeout = write_timeout
        self.lock = anyio.Lock()
        self.lost = False
        self.close_sent = False
        self.intake = Intake(stream)
        self.outflow = Outflow(
            stream, buffered=limits.output_buffer_bytes, max_owed=limits.max_owed_pongs
        )

    async def write(self, data: bytes) -> None:
        if self.lost:
            raise _Lost()
        try:
            with anyio.fail_after(self.write_timeout):
                self.outflow.wrote(len(data))
                await self.stream.send(data)
        except TimeoutError as exc:
            # It stopped reading: as good as gone (the connection ends, its permit and slot
            # are freed), as an HTTP client that reads nothing for the write timeout.
            log.info(
                "gw.ws.stopped_reading: the Realtime %s read nothing for %.0f s; "
                "ending the connection",
                self.name,
                self.write_timeout,
            )
            self.lost = True
            raise _Lost() from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.lost = True
            raise _Lost() from exc

    async def send(self, event: Event) -> None:
        await self.send_all([event])

    async def send_all(self, events: list[Event]) -> None:
        """`events` in one socket write (what one read of the other hop brought)."""
        if not events:
            return
        async with self.lock:
            if self.ws.state is not ConnectionState.OPEN:
                return
            send = self.ws.send
            await self.write(b"".join([send(event) for event in events]))

    async def answer_pings(self, pings: list[Ping]) -> None:
        """The pongs of one read, in one write; a peer that keeps pinging without reading
        them (more than `max_owed_pongs` owed while output waits for it) is dropped."""
        if self.ws.state is not ConnectionState.OPEN:
            return
        self.outflow.owe(len(pings))
        if not self.outflow.flooded():
            await self.send_all([ping.response() for ping in pings])
        if self.outflow.flooded():
            log.info(
                "gw.ws.ping_flood: the Realtime %s owes %d pongs it does not read; dropping it",
                self.name,
                self.outflow.owed(),
            )
            self.lost = True
            raise _Lost()

    async def close(self, code: int, reason: str = "") -> None:
        """Send a close frame once (or answer the peer's), if the socket can still take one."""
        async with self.lock:
            if self.close_sent or self.lost:
                return
            state = self.ws.state
            if state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                return
            self.close_sent = True
            code = NORMAL if code in _NOT_SENT else code
            with suppress(_Lost):
                await self.write(self.ws.send(CloseConnection(code=code, reason=reason)))

    async def receive(self) -> bytes:
        try:
            data = await self.intake.receive(READ_SIZE)
        except (
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            OSError,
        ) as exc:
            self.lost = True
            raise _Lost() from exc
        self.ws.receive_data(data)
        return data

    async def finish(self) -> None:
        """Wait (bounded) for the peer's answer to our close, then close the TCP connection."""
        with anyio.CancelScope(shield=True):
            if self.close_sent and not self.lost:
                with anyio.move_on_after(LINGER_SECS), suppress(Exception):
                    while self.ws.state is not ConnectionState.CLOSED:
                        await self.receive()
                        for _ in self.ws.events():
                            pass
            with suppress(Exception):
                await self.stream.aclose()


class _Refused(Exception):
    def __init__(self, err: GatewayError) -> None:
        super().__init__(err.message)
        self.err = err


class _Proxy:
    """One Realtime connection: the checks, the upstream socket, the two pumps, the row."""

    def __init__(self, handoff: Handoff, gateway: Gateway, limits: WebSocketLimits) -> None:
        self.handoff = handoff
        self.gateway = gateway
        self.limits = limits
        self.idle_timeout = limits.idle_timeout
        self.active_at = anyio.current_time()  # when either side last sent anything
        self.upgrade = handoff.request
        self.client = self._hop(handoff.stream, WSConnection(ConnectionType.SERVER), "client")
        self.max_message = handoff.limits.max_body_bytes
        self.usage: Usage | None = None
        # The key's turn, and the upstream and model the responses are priced at.
        self.turn: KeyTurn | None = None
        self.priced_at: tuple[str, str] | None = None
        # The key's refusal once one of its token or cost limits is spent: no further response.
        self.spent: GatewayError | None = None

    def _hop(self, stream: anyio.abc.ByteStream, ws: WSConnection, name: str) -> _Hop:
        return _Hop(
            stream,
            ws,
            name=name,
            write_timeout=self.handoff.limits.write_timeout,
            limits=self.limits,
        )

    async def run(self) -> None:
        try:
            if await self._client_handshake():
                await self._connect()
        finally:
            with anyio.CancelScope(shield=True), suppress(Exception):
                await self.client.stream.aclose()

    # --- before the upgrade -------------------------------------------------------------------

    async def _client_handshake(self) -> bool:
        req = self.upgrade
        head = b"GET " + req.target + b" HTTP/1.1\r\n"
        head += b"".join(name + b": " + value + b"\r\n" for name, value in req.headers)
        try:
            self.client.ws.receive_data(head + b"\r\n")
            events = list(self.client.ws.events())
        except RemoteProtocolError as exc:
            await self._reject_error(
                _error(400, ErrorCategory.REQUEST, "gw.request.bad_http", f"bad upgrade: {exc}")
            )
            return False
        return bool(events) and isinstance(events[0], WSRequest)

    def _as_responses(self) -> Request:
        # The head checks know the Responses path, not this one: the socket is admitted as a
        # Responses request from the same address with the same key would be.
        return dataclasses.replace(
            self.upgrade,
            method="POST",
            path=REALTIME_CHECKED_AS,
            target=REALTIME_CHECKED_AS.encode(),
            body=b"",
        )

    async def _connect(self) -> None:
        gw = self.gateway
        as_responses = self._as_responses()
        refusal = gw.check_head(as_responses)
        if refusal is not None:
            await self._reject(refusal)
            return
        _, client_name, _ = gw.callers.check(as_responses, now=gw.wall())
        if client_name is None:  # not expected once the head check passed
            await self._reject_error(_error(401, ErrorCategory.AUTH, "gw.auth.bad_key", "no key"))
            return
        started = gw.clock()
        row = RequestRow(
            id=gw.next_request_id(),
            ts=gw.wall(),
            path=REALTIME_PATH,
            key_name=client_name,
            format=Dialect.OPENAI_RESPONSES.value,
        )
        if gw.events is not None:
            gw.events.request_started(row)
        try:
            model = _model_of(self.upgrade.query)
            limit = gw.config.listen.gateway.max_model_name_chars
            row.model = shown_model(model, limit)
            too_long = model_name_refusal(model, limit)
            if too_long is not None:
                raise _Refused(too_long)
            plan, usable = self._candidates(model, client_name)
        except _Refused as refused:
            await self._refuse(row, refused.err)
            return
        turn = await key_turn(
            gw.hooks,
            gw.usage,
            gw.config,
            client_name,
            row.id,
            deadline=started + gw.config.failover.wait_secs,
            estimate=(0, [(d.name, d.target.model) for d in usable]),
            counted=True,
            plan=plan,  # its load-balance turn, taken with the limit's (twserve.shared.admission)
        )
        if isinstance(turn, GatewayError):
            await self._refuse(row, turn)
            return
        usable = turn.ordered(usable)  # the deployment's pick first
        self.turn = turn
        outcome = RelayOutcome()
        models = {d.name: d.target.model for d in usable}
        permit: Permit | None = None
        upstream: _Hop | None = None
        try:
            try:
                permit, upstream, dest = await self._open_upstream(usable, row.id)
            except _Refused as refused:
                outcome.status, outcome.error_code = refused.err.status, refused.err.code
                await self._reject_error(refused.err)
                return
            sent_at = gw.clock()
            self.priced_at = (dest.name, models[dest.name])
            outcome.provider = dest.name
            outcome.status = 101
            if not await self._accept():
                outcome.cancelled = True
                return
            await self._relay(upstream)
            outcome.usage = self.usage
            outcome.attempts = (
                AttemptRecord(
                    provider=dest.name,
                    outcome=Outcome.OK,
                    status=101,
                    sent_at=sent_at,
                    ended_at=gw.clock(),
                ),
            )
        finally:
            with anyio.CancelScope(shield=True):
                if upstream is not None:
                    await upstream.finish()
                if permit is not None:
                    gw.hooks.release(permit)
                row.duration_ms = int((gw.clock() - started) * 1000)
                outcome.usage = self.usage
                fill_row(row, outcome, models)
                turn.end(row, outcome, models)
                gw.record_row(row)

    def _candidates(self, model: str, client_name: str) -> tuple[RoutePlan, list[Destination]]:
        """The socket's plan (its turn taken by the deployment later, `key_turn`) and the
        Realtime upstreams among its candidates."""
        gw = self.gateway
        config = gw.config
        plan = gw.router.plan(
            RequestFacts(model=model, dialect=Dialect.OPENAI_RESPONSES, client=client_name),
            now=gw.clock(),
        )
        capable = [
            c
            for c in plan.candidates
            if config.provider(c.provider).realtime
            and config.provider(c.provider).protocol in _REALTIME_PROTOCOLS
        ]
        usable, _ = destinations(config, capable, plan.sticky, gw.env, gw.catalog)
        if not usable:
            raise _Refused(
                _error(
                    404,
                    ErrorCategory.REQUEST,
                    "gw.realtime.no_upstream",
                    f"no Realtime upstream serves the model {model!r}",
                )
            )
        return plan, usable

    async def _open_upstream(
        self, usable: list[Destination], owner: str
    ) -> tuple[Permit, _Hop, Destination]:
        gw = self.gateway
        hooks = gw.hooks
        # Slots shared across instances: a lease for each limited upstream first (one round trip).
        await hooks.ready([dest.name for dest in usable], owner)
        full = 0
        for dest in usable:
            permit = hooks.acquire(dest.name, owner)
            if permit is None:
                full += 1
                continue
            # Each socket opened or not is a health sample of the upstream, as an HTTP attempt
            # is: a refusal is classified as its HTTP answer, a connection that fails as its
            # transport fault.
            try:
                hop = await self._dial(dest, dest.connect_timeout or 10.0)
            except _NotOpened as exc:
                log.info("Realtime upstream %s not opened: %s", dest.name, exc)
                hooks.release(permit)
                hooks.failed(dest.name, exc.failure(gw.wall()), gw.clock())
                continue
            hooks.succeeded(dest.name, gw.clock(), None)
            return permit, hop, dest
        if full == len(usable):
            raise _Refused(
                _error(
                    429,
                    ErrorCategory.RATE_LIMITED,
                    "gw.realtime.busy",
                    "every Realtime upstream for this model is busy; try again",
                )
            )
        raise _Refused(
            _error(
                502,
                ErrorCategory.UPSTREAM,
                "gw.realtime.upstream_failed",
                "no Realtime upstream accepted the connection",
            )
        )

    async def _dial(self, dest: Destination, timeout: float) -> _Hop:
        """Open the upstream's Realtime socket; raises `_NotOpened` when it cannot be opened
        or refuses."""
        target = dest.target
        headers = list(target.headers)
        if target.key:
            headers.append((b"authorization", b"Bearer " + target.key.encode()))
        url = realtime_upstream_url(target.base_url, target.model)
        try:
            opened = await dial(url, headers, timeout)
        except DialFailed as exc:
            raise _NotOpened(None, exc) from exc
        if isinstance(opened, Refused):
            raise _NotOpened(opened, None)
        return self._hop(opened.stream, opened.ws, "upstream")

    async def _refuse(self, row: RequestRow, err: GatewayError) -> None:
        row.status, row.error_code = err.status, err.code
        self.gateway.record_row(row)
        await self._reject_error(err)

    async def _reject_error(self, err: GatewayError) -> None:
        body = error_body(Dialect.OPENAI_RESPONSES, err)
        await self._reject(HeadRefusal(status=err.status, headers=error_headers(err), body=body))

    async def _reject(self, refusal: HeadRefusal) -> None:
        ws = self.client.ws
        if ws.state is not ConnectionState.CONNECTING:
            return
        body = refusal.body
        headers = [
            *(h for h in refusal.headers if h[0] not in (b"content-length", b"connection")),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        data = ws.send(RejectConnection(status_code=refusal.status, headers=headers, has_body=True))
        data += ws.send(RejectData(data=body, body_finished=True))
        with suppress(_Lost):
            await self.client.write(data)

    async def _accept(self) -> bool:
        # No extensions, as on the Responses socket: a compressed frame could inflate past the
        # message limit before it is counted.
        try:
            await self.client.write(self.client.ws.send(AcceptConnection()))
        except _Lost:
            return False
        if self.handoff.buffered:
            self.client.ws.receive_data(self.handoff.buffered)
        return True

    # --- the open connection ------------------------------------------------------------------

    async def _relay(self, upstream: _Hop) -> None:
        async with anyio.create_task_group() as tg:

            async def client_side() -> None:
                await self._pump(self.client, upstream, from_upstream=False)
                tg.cancel_scope.cancel()

            async def upstream_side() -> None:
                await self._pump(upstream, self.client, from_upstream=True)
                tg.cancel_scope.cancel()

            async def drain() -> None:
                # The server stops: both sides are told, and the pumps end on their answers.
                await self.handoff.draining.wait()
                await self.client.close(GOING_AWAY, "server draining")
                await upstream.close(GOING_AWAY, "server draining")

            async def idle() -> None:
                # Nothing either way for idle_timeout: both sides are closed; the pumps end on
                # their answers, or after a bounded wait for them.
                while (left := self.active_at + self.idle_timeout - anyio.current_time()) > 0:
                    await anyio.sleep(left)
                await self.client.close(NORMAL, "idle timeout")
                await upstream.close(NORMAL, "idle timeout")
                await anyio.sleep(LINGER_SECS)
                tg.cancel_scope.cancel()

            tg.start_soon(client_side)
            tg.start_soon(upstream_side)
            tg.start_soon(drain)
            tg.start_soon(idle)
        with anyio.CancelScope(shield=True):
            await self.client.finish()

    async def _pump(self, src: _Hop, dst: _Hop, *, from_upstream: bool) -> None:
        """Pass `src`'s messages to `dst` until `src` closes or is lost."""
        parts: list[str] = []
        size = 0
        reading = True  # the message is small enough to be read for its usage
        # While the key's limits are spent, a client text message is held until it is whole,
        # to see whether it asks for a response (None: passed on as it comes).
        held: list[TextMessage] | None = None
        out: list[Event] = []  # what one read brought, passed on in one write
        try:
            while True:
                pings: list[Ping] = []
                for event in src.ws.events():
                    if isinstance(event, TextMessage | BytesMessage):
                        begun = size > 0  # pieces of this message have been passed on
                        size += len(event.data)
                        if size > self.max_message:
                            await dst.send_all(out)
                            if from_upstream:
                                await self._upstream_too_big(src, dst, event, begun)
                                return
                            await src.close(TOO_BIG, f"message over {self.max_message} bytes")
                            await dst.close(GOING_AWAY, "the client's message was too big")
                            return
                        if (
                            not begun
                            and not from_upstream
                            and isinstance(event, TextMessage)
                            and self.spent is not None
                        ):
                            held = []
                        if held is not None and isinstance(event, TextMessage):
                            held.append(event)
                            parts.append(event.data)
                        else:
                            # Passed on as it came: a fragment stays a fragment.
                            out.append(event)
                            if isinstance(event, TextMessage) and from_upstream and reading:
                                parts.append(event.data)
                                reading = size <= _MAX_READ_MESSAGE
                        if event.message_finished:
                            text = "".join(parts)
                            if held is not None:
                                if await self._may_pass(text):
                                    out.extend(held)
                                held = None
                            elif parts and reading:
                                await self._on_upstream_message(src, text)
                            parts, size, reading = [], 0, True
                    elif isinstance(event, Ping):
                        pings.append(event)
                    elif isinstance(event, CloseConnection):
                        await dst.send_all(out)
                        out = []
                        if src.ws.state is ConnectionState.OPEN:
                            # Not a close from the peer but wsproto's verdict on a frame that
                            # broke the protocol: that hop is closed with its code, the other
                            # one goes away.
                            await src.close(event.code, event.reason or "")
                            await dst.close(GOING_AWAY, "the other side broke the protocol")
                            return
                        # Answer the close on its own hop, then pass its code on.
                        async with src.lock:
                            if src.ws.state is ConnectionState.REMOTE_CLOSING:
                                src.close_sent = True
                                with suppress(_Lost):
                                    await src.write(src.ws.send(event.response()))
                        await dst.close(event.code, event.reason or "")
                        return
                await dst.send_all(out)
                out = []
                if pings:
                    await src.answer_pings(pings)
                await src.receive()
                self.active_at = anyio.current_time()
        except _Lost:
            if src.lost:
                # The side we read from went away without a close frame (or stopped reading).
                code = INTERNAL if from_upstream else GOING_AWAY
                await dst.close(code, "upstream lost" if from_upstream else "client gone")
            else:
                await src.close(GOING_AWAY, "the other side is gone")
        except RemoteProtocolError as exc:
            # wsproto answers a protocol error with its close code: pass that on both ways.
            code = exc.event_hint.code if isinstance(exc.event_hint, CloseConnection) else 1002
            await src.close(code, "protocol error")
            await dst.close(code if from_upstream else GOING_AWAY, "protocol error")
        except ClientGone:
            await src.close(GOING_AWAY, "the other side is gone")

    async def _may_pass(self, text: str) -> bool:
        """Whether a whole client message, held while the key's limits were spent, goes on: a
        ``response.create`` does only once the limits have room again; refused, the client
        gets an ``error`` event with the limit's refusal."""
        if read_realtime_event(text).type != "response.create":
            return True
        self.spent = await self._limits_spent()
        if self.spent is None:
            return True
        await self.client.send(
            TextMessage(data=realtime_error_event(self.spent.code, self.spent.message))
        )
        return False

    async def _limits_spent(self) -> GatewayError | None:
        turn = self.turn
        if turn is None or not turn.admission.counts:
            return None
        return await self.gateway.usage.used_up(turn.admission.reservation.key)

    async def _on_upstream_message(self, upstream: _Hop, text: str) -> None:
        """A whole upstream text message small enough to read: a ``response.done`` adds its
        usage to the connection's and is booked against the key's limits at once; while they
        are spent, a response the upstream starts by itself is cancelled."""
        usage = realtime_usage(text)
        if usage is not None:
            self.usage = add_usage(self.usage, usage)
            turn = self.turn
            if turn is not None:
                provider, model = self.priced_at or (None, None)
                self.gateway.usage.book_part(turn.admission, usage, provider, model)
                self.spent = await self._limits_spent()
            return
        if self.spent is None:
            return
        started = realtime_started_response(text)
        if not started:
            return
        self.spent = await self._limits_spent()
        if self.spent is not None:
            await upstream.send(TextMessage(data=realtime_cancel_event(started)))

    async def _upstream_too_big(
        self, upstream: _Hop, client: _Hop, event: TextMessage | BytesMessage, begun: bool
    ) -> None:
        """An upstream message over the limit: the client is told why, both sides close 1009.
        The part of the message already passed on is ended where it was cut, so the error
        event that follows is a message of its own."""
        if begun:
            end: TextMessage | BytesMessage = (
                TextMessage(data="", message_finished=True)
                if isinstance(event, TextMessage)
                else BytesMessage(data=b"", message_finished=True)
            )
            await client.send(end)
        message = f"the upstream sent a message over {self.max_message} bytes"
        await client.send(TextMessage(data=realtime_error_event(UPSTREAM_TOO_BIG, message)))
        await client.close(TOO_BIG, "upstream message too big")
        await upstream.close(TOO_BIG, f"message over {self.max_message} bytes")


class _NotOpened(Exception):
    """The upstream's socket did not open: it refused the upgrade, or could not be reached."""

    def __init__(self, refused: Refused | None, failed: DialFailed | None) -> None:
        super().__init__(
            f"refused the upgrade with {refused.status}" if refused else str(failed or "")
        )
        self.refused = refused
        self.failed = failed

    def failure(self, wall_now: float) -> Failure:
        if self.refused is not None:
            r = self.refused
            return classify_response(r.status, r.headers, r.body, now=wall_now)
        assert self.failed is not None
        return classify_transport(self.failed.fault)


def _model_of(query: str) -> str:
    models = parse_qs(query).get("model") or []
    model = models[0].strip() if models else ""
    if not model:
        raise _Refused(
            _error(
                400,
                ErrorCategory.REQUEST,
                "gw.realtime.model_required",
                "a Realtime connection names its model: /v1/realtime?model=...",
            )
        )
    return model


def _error(status: int, category: ErrorCategory, code: str, message: str) -> GatewayError:
    return GatewayError(status=status, category=category, code=code, message=message)
