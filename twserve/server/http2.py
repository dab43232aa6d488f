"""HTTP/2 transport (cleartext h2c): anyio sockets driving h2's state machine.

A connection becomes HTTP/2 in one of two ways, both seen by the HTTP/1.1 server first
(twserve/server/http1.py parses the start of every connection and asks its switches):

* prior knowledge: the client opens with the HTTP/2 preface, ``PRI * HTTP/2.0\\r\\n\\r\\nSM...``.
  Its first line parses as an HTTP/1.1-shaped request (method ``PRI``, version 2.0), which
  `switch` recognises; the rest of the preface and the frames behind it are handed over as they
  were read.
* ``Upgrade: h2c`` with one ``HTTP2-Settings`` header on an ordinary HTTP/1.1 request: the
  answer is ``101 Switching Protocols`` and the request itself becomes stream 1.

Any other ``Upgrade`` (``websocket``) is left to its own switch; without one it is an ordinary
HTTP/1.1 request.

One task reads the socket and feeds h2; each request stream, once its body is complete, runs the
same handler HTTP/1.1 runs, with the same `Request` and a `Responder` that writes to its stream,
in a task of its own in the connection's task group, inside its own cancel scope.

* Flow control, sending: `Responder.send` writes no more than the stream's and the connection's
  send windows allow and waits for WINDOW_UPDATE for the rest, so an answer never piles up here
  beyond the window: the relay reads its upstream only as fast as the client reads.
* Flow control, receiving: a request body is taken whole before the handler runs (as over
  HTTP/1.1), bounded by `ServerLimits.max_body_bytes`; each DATA frame is acknowledged as it is
  added to that bounded body. Its bytes count against the server's `BodyBudget` as they arrive,
  the same budget HTTP/1.1 bodies draw on (503 ``gw.request.bodies_busy`` when it is spent),
  and are given back when the stream ends, however it ends.
* The server's `HeadCheck` (the gateway's address and key check) runs as soon as a stream's
  headers arrive, before any of its body is read, as over HTTP/1.1: a refused stream is answered
  at once and the rest of its body is not wanted.
* Every write has a deadline (`ServerLimits.write_timeout`): a stream whose flow-control window
  (or the connection's) stays shut that long is a client that stopped reading it. The stream is
  reset (CANCEL) and its handler cancelled, which frees its upstream call, slot and key permit;
  the connection's other streams carry on. A socket write that cannot go out in that time
  means the whole connection stopped reading: every stream goes. An answer's waits for its
  windows also count together against `Http2Limits.max_blocked_secs`, so a window opened a
  byte at a time buys no more time than one left shut.
* Reading and writing in step (twserve/server/backpressure.py): the socket is read no further ahead
  than one read, and a write returns while at most `Http2Limits.output_buffer_bytes` wait for
  the client; past it writers wait, and so does the reader, whose PING and SETTINGS
  acknowledgements are writes. A client owing more than `max_owed_control_frames` of those
  while output waits (it sends them and reads nothing) is dropped.
* RST_STREAM from the client is the client leaving: that stream's scope is cancelled, which tears
  down its upstream call and frees its slot, as the HTTP/1.1 watcher does for a closed socket.
  The other streams carry on. A socket that closes ends every stream.
* Drain: GOAWAY carrying the last stream taken; those streams finish, later ones are refused
  (REFUSED_STREAM, safe for the client to retry elsewhere), and the connection closes when the
  last one ends.
* Limits: `Http2Limits` (concurrent streams, frame size, header list size, windows) are sent as
  SETTINGS; h2 enforces them and answers a breach with GOAWAY (too many streams, an oversized
  frame, a CONTINUATION flood are connection errors in h2). Headers over
  `ServerLimits.max_header_bytes` but under the hard cap get 431 on their stream; bodies get 413
  and 408 like HTTP/1.1; a connection with no stream is closed after
  `ServerLimits.keepalive_timeout`. Error bodies come from the server's `ErrorWriter`, in the
  client's API format.

What the connection keeps per stream (its request as it arrives, its window waits, the client's
resets, the frame-size guard) is twserve/server/h2_streams.py.

h2's own GOAWAY (``close_connection``) puts its state machine in CLOSED, after which it sends
nothing more, not even the data of streams still running; the drain's GOAWAY is therefore
written as a frame of its own (hyperframe, h2's framing layer), and h2's is sent only at the end.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from twserve.server.backpressure import Intake, Outflow
from twserve.server.base import (
    LINGER_SECS,
    BodyBudget,
    ClientGone,
    Handoff,
    Headers,
    Request,
    ResponderBase,
    TaskSet,
)
from twserve.server.h2_streams import FrameGuard, H2Stream, ResetCount

log = logging.getLogger("twserve.server.http2")


__all__ = ["EVICTED_GOAWAY", "PREFACE", "Http2Limits", "switch"]

# The most one read takes from the socket.
READ_SIZE = 65536

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# The debug data of the GOAWAY (NO_ERROR) that closes an idle connection for a new client.
EVICTED_GOAWAY = b"gw.listen.idle_closed: idle, closed to make room for a new connection"
# What HTTP/1.1 parsing has consumed of the preface when the handoff happens.
_PREFACE_LINE = b"PRI * HTTP/2.0\r\n\r\n"

# Headers that mean something for one HTTP/1.1 connection only; HTTP/2 forbids them.
_CONNECTION_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)

_SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Http2Limits:
    """What an HTTP/2 connection allows, beyond the `ServerLimits` it shares with HTTP/1.1.

    `max_header_list_size` is advertised; a header block over it but under
    `hard_header_list_size` is answered 431 on its stream, one over the hard cap ends the
    connection (h2 will not decode it).
    """

    max_concurrent_streams: int = 100
    max_frame_size: int = 16384  # inbound; the protocol's minimum and h2's default
    max_header_list_size: int = 64 * 1024
    hard_header_list_size: int = 256 * 1024
    initial_window_size: int = 1024 * 1024  # per stream, for request bodies
    # Streams the client may reset within `reset_window_secs` before the connection is ended
    # (ENHANCE_YOUR_CALM): a reset stream no longer counts against the concurrent-stream limit,
    # so opening and resetting streams at once ("rapid reset") would start handlers unbounded.
    max_resets: int = 200
    reset_window_secs: float = 10.0
    # Output waiting for a client that does not read it: past this many bytes in the socket's
    # buffer, writes wait, and so does the reader (whose PING and SETTINGS acknowledgements are
    # writes): it stops reading until the client takes some.
    output_buffer_bytes: int = 64 * 1024
    # PING and SETTINGS acknowledgements the client has not taken off the socket: past this
    # many the connection is ended (GOAWAY ENHANCE_YOUR_CALM), a flood of control frames.
    max_owed_control_frames: int = 1000
    # The total time one answer may wait for the client's flow-control windows, over its whole
    # life: a client that opens its window by a byte now and then gets no more time than one
    # that never opens it (each wait is also bounded by `ServerLimits.write_timeout`).
    max_blocked_secs: float = 60.0


def switch(
    request: Request, limits: Http2Limits | None = None
) -> Callable[[Handoff], Awaitable[None]] | None:
    """The HTTP/1.1 server's switch to HTTP/2: a takeover for the preface or an h2c upgrade,
    None for any other request."""
    lim = limits or Http2Limits()
    if request.method == "PRI" and request.target == b"*" and request.http_version == "2.0":

        async def prior_knowledge(handoff: Handoff) -> None:
            rest = await _preface_rest(handoff)
            if rest is not None:
                conn = Connection(handoff, lim)
                await conn.run(_PREFACE_LINE + rest, upgraded=None)

        return prior_knowledge
    settings = _upgrade_settings(request)
    if settings is None:
        return None

    async def upgraded(handoff: Handoff) -> None:
        conn = Connection(handoff, lim)
        conn.h2.initiate_upgrade_connection(settings)
        await conn.run(handoff.buffered, upgraded=request)

    return upgraded


async def _preface_rest(handoff: Handoff) -> bytes | None:
    """What follows the preface's first line, once it is seen to be the preface's ``SM`` part;
    None when it is not. Until then nothing HTTP/2 is written: a stray ``PRI`` request gets a
    400 over HTTP/1.1, a client that stops short gets nothing."""
    tail = PREFACE[len(_PREFACE_LINE) :]
    buffered = handoff.buffered
    with anyio.move_on_after(handoff.limits.head_timeout):
        while len(buffered) < len(tail) and tail.startswith(buffered):
            try:
                data = await handoff.stream.receive(READ_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return None
            buffered += data
    if buffered.startswith(tail):
        return buffered
    if len(buffered) >= len(tail) or not tail.startswith(buffered):
        headers, body = handoff.errors(None, 400, "gw.request.bad_http", "malformed HTTP/2 preface")
        head = b"HTTP/1.1 400 Bad Request\r\n" + b"".join(
            k + b": " + v + b"\r\n"
            for k, v in [*headers, (b"content-length", str(len(body)).encode())]
        )
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await handoff.stream.send(head + b"connection: close\r\n\r\n" + body)
    return None


def _tokens(request: Request, name: bytes) -> set[bytes]:
    return {
        token.strip().lower()
        for key, value in request.headers
        if key == name
        for token in value.split(b",")
    }


def _upgrade_settings(request: Request) -> bytes | None:
    """The decodable ``HTTP2-Settings`` of an ``Upgrade: h2c`` request, padded for base64;
    None when the request is not one (RFC 9113 leaves such upgrades unanswered)."""
    if b"h2c" not in _tokens(request, b"upgrade"):
        return None
    if not {b"upgrade", b"http2-settings"} <= _tokens(request, b"connection"):
        return None
    values = [v for k, v in request.headers if k == b"http2-settings"]
    if len(values) != 1:
        return None
    value = values[0].strip()
    value += b"=" * (-len(value) % 4)
    try:
        base64.urlsafe_b64decode(value)
    except (binascii.Error, ValueError):
        return None
    return value


class _Responder(ResponderBase):
    """The answer on one stream; its pieces wait for the stream's and the connection's send
    windows (flow control and frames are the connection's to manage, so nothing is written
    from the event loop's callbacks: `ready` stays false)."""

    __slots__ = ("_conn", "_stream")

    def __init__(self, conn: Connection, stream: H2Stream) -> None:
        super().__init__()
        self._conn = conn
        self._stream = stream

    @property
    def ended(self) -> bool:
        return self._ended

    async def start(self, status: int, headers: Headers) -> None:
        self._begin()
        fields = [(b":status", str(status).encode())]
        fields += [
            (name.lower(), value)
            for name, value in headers
            if name.lower() not in _CONNECTION_HEADERS
        ]
        conn = self._conn
        conn.act(self._stream, partial(conn.h2.send_headers, self._stream.id, fields))
        await self._conn.flush()

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            window = await self._conn.wait_window(self._stream)
            size = min(window, self._conn.h2.max_outbound_frame_size, len(view))
            piece = bytes(view[:size])
            conn = self._conn
            conn.act(self._stream, partial(conn.h2.send_data, self._stream.id, piece))
            view = view[size:]
            # Written out before the next piece is taken: nothing waits here but the socket.
            await self._conn.flush()

    async def end(self) -> None:
        if not self._ended:
            self._ended = True
            # The body's share of the budget goes back before the client can see the end: a
            # client with the whole answer may send its next body at once, while the handler
            # still closes its upstream call and records the request.
            self._stream.release(self._conn.budget)
            self._conn.act(self._stream, partial(self._conn.h2.end_stream, self._stream.id))
            await self._conn.flush()

    async def abort(self) -> None:
        # One broken answer over HTTP/2 is one reset stream; the connection's others carry on.
        self._ended = True
        await self._conn.reset(self._stream, h2.errors.ErrorCodes.INTERNAL_ERROR)


class Connection:
    """One HTTP/2 connection: the h2 state machine, the socket, and a task per stream."""

    def __init__(self, handoff: Handoff, limits: Http2Limits) -> None:
        self.socket = handoff.stream
        self.handler = handoff.handler
        self.server_limits = handoff.limits
        self.limits = limits
        self.errors = handoff.errors
        self.draining = handoff.draining
        # Without a stream the connection is idle: at its caps the server may close it for a
        # new client (by `draining`, with `idle_mark.evicted` saying why).
        self.idle_mark = handoff.idle
        self.check_head = handoff.check_head
        self.budget = handoff.budget or BodyBudget(handoff.limits.body_budget_bytes)
        self.peer = handoff.request.client
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        codes = h2.settings.SettingCodes
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                codes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                codes.MAX_FRAME_SIZE: limits.max_frame_size,
                codes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
                codes.INITIAL_WINDOW_SIZE: limits.initial_window_size,
                codes.ENABLE_PUSH: 0,
            },
        )
        self.h2.max_inbound_frame_size = limits.max_frame_size
        self.h2.decoder.max_header_list_size = limits.hard_header_list_size
        self.guard = FrameGuard(limits.max_frame_size, len(PREFACE))
        self.intake = Intake(self.socket)
        self.outflow = Outflow(
            self.socket,
            buffered=limits.output_buffer_bytes,
            max_owed=limits.max_owed_control_frames,
        )
        self.resets = ResetCount(limits.max_resets, limits.reset_window_secs)
        self.ready: list[tuple[H2Stream, Request]] = []  # complete requests of the current read
        self.streams: dict[int, H2Stream] = {}
        self.send_lock = anyio.Lock()
        self.dead = False  # the socket failed or closed: nothing more can be written
        self.goaway_sent = False
        self.last_stream_id = 0
        self.peer_goaway = False
        self.last_activity = anyio.current_time()
        self.read_scope: anyio.CancelScope | None = None
        # The streams' handlers and the drain's watch, each under its own scope (`TaskSet`).
        self.tasks = TaskSet(self._task_failed)

    # --- writing --------------------------------------------------------------------------

    def act(self, stream: H2Stream, step: Callable[[], None]) -> None:
        """Apply one of h2's send methods to `stream`; a stream or connection h2 considers
        closed means the client is gone as far as this answer goes."""
        if stream.gone or self.dead:
            raise ClientGone()
        try:
            step()
        except h2.exceptions.ProtocolError as exc:
            stream.gone = True
            raise ClientGone() from exc

    async def flush(self) -> None:
        """Write whatever h2 has queued (frames of any stream, acknowledgements, settings)."""
        async with self.send_lock:
            data = self.h2.data_to_send()
            if not data or self.dead:
                return
            await self._send(data)

    async def _write_raw(self, *, before: bytes = b"", after: bytes = b"") -> None:
        """Write bytes h2 did not make, `before` or `after` what it has queued."""
        async with self.send_lock:
            data = before + self.h2.data_to_send() + after
            if self.dead:
                return
            await self._send(data)

    async def _send(self, data: bytes) -> None:
        """One socket write (the send lock held), bounded by `ServerLimits.write_timeout`: a
        connection whose client reads nothing at all is gone, every stream with it. It returns
        once no more than `Http2Limits.output_buffer_bytes` wait unsent.

        The write is shielded: h2 already counts `data` as sent (frames of every stream, not
        only the caller's), so a cancelled stream must not cut it short or drop it — that would
        tear a frame and desynchronise the whole connection. The deadline still bounds it."""
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(self.server_limits.write_timeout):
                self.outflow.wrote(len(data))
                await self.socket.send(data)
        except TimeoutError:
            log.info("HTTP/2 client %s stopped reading; dropping the connection", self.peer[0])
            self._lost()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self._lost()

    def _task_failed(self, exc: BaseException) -> None:
        """A stream's task raised past its own handling: a bug. Logged, and the connection
        ends with every stream on it, as the stream's own answer may be half written."""
        log.error("HTTP/2 connection from %s failed", self.peer[0], exc_info=exc)
        self._lost()

    def _lost(self) -> None:
        self.dead = True
        for stream in self.streams.values():
            stream.gone = True
            stream.scope.cancel()
            stream.window.set()
        self._wake_reader()

    def _window(self, stream: H2Stream) -> int:
        if stream.gone or self.dead:
            raise ClientGone()
        try:
            return self.h2.local_flow_control_window(stream.id)
        except h2.exceptions.ProtocolError as exc:
            stream.gone = True
            raise ClientGone() from exc

    async def wait_window(self, stream: H2Stream) -> int:
        """How much may be sent on `stream` now, waiting for WINDOW_UPDATE while it is none —
        each wait at most `ServerLimits.write_timeout`, and all of the answer's waits together
        at most `Http2Limits.max_blocked_secs`; past either the client is taken as gone."""
        window = self._window(stream)
        if window > 0:
            return window
        window = await stream.wait_window(
            self._window,
            write_timeout=self.server_limits.write_timeout,
            max_blocked=self.limits.max_blocked_secs,
        )
        if window > 0:
            return window
        # The window stayed shut, or opened too little too seldom: the client stopped reading
        # this stream. Resetting it and cancelling its handler stops the upstream call and
        # frees what it held.
        if stream.blocked >= self.limits.max_blocked_secs:
            log.info(
                "gw.http2.stalled: HTTP/2 client %s kept stream %d waiting %.0f s in all; "
                "resetting it",
                self.peer[0],
                stream.id,
                stream.blocked,
            )
        else:
            log.info(
                "HTTP/2 client %s stopped reading stream %d; resetting it",
                self.peer[0],
                stream.id,
            )
        await self.reset(stream, h2.errors.ErrorCodes.CANCEL)
        stream.scope.cancel()
        raise ClientGone()

    async def reset(self, stream: H2Stream, code: h2.errors.ErrorCodes) -> None:
        if stream.gone or self.dead:
            return
        stream.gone = True
        try:
            self.h2.reset_stream(stream.id, code)
        except h2.exceptions.ProtocolError:
            return
        await self.flush()

    # --- the connection -------------------------------------------------------------------

    async def run(self, received: bytes, *, upgraded: Request | None) -> None:
        graceful = False
        try:
            try:
                tasks = self.tasks
                tasks.start_scoped(self._watch_drain())
                if upgraded is not None:
                    await self._write_raw(before=_SWITCHING)  # h2's SETTINGS follow it
                    stream = H2Stream(1, upgraded.headers, anyio.current_time())
                    stream.ended = stream.running = True
                    self.streams[1] = stream
                    tasks.start(self._serve(stream, upgraded), stream.scope)
                else:
                    self.h2.initiate_connection()
                    await self.flush()
                healthy = await self._feed(received) if received else True
                if not self.streams:
                    self.idle_mark.idle(anyio.current_time())
                # A connection error's GOAWAY is worth lingering for as well.
                graceful = await self._read_loop() if healthy else True
            finally:
                await self.tasks.join(cancel=True)
        except Exception:  # a bug: keep the server up, drop the connection
            log.exception("HTTP/2 connection from %s failed", self.peer[0])
            graceful = False
        finally:
            self.idle_mark.busy()
            # Bodies of streams the connection ended before they were answered.
            for stream in self.streams.values():
                stream.release(self.budget)
        if graceful and not self.dead:
            await self._linger()

    async def _linger(self) -> None:
        """Let the last frames (GOAWAY) reach the client before the socket closes: half-close,
        then read and discard until the client closes too, bounded in time."""
        with anyio.CancelScope(shield=True):
            try:
                await self.socket.send_eof()
                with anyio.move_on_after(LINGER_SECS):
                    while await self._receive():
                        pass
            except Exception:
                pass

    async def _receive(self) -> bytes:
        try:
            return await self.intake.receive(READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return b""

    def _wake_reader(self) -> None:
        if self.read_scope is not None:
            self.read_scope.cancel()

    def _deadline(self) -> float:
        if not self.streams:
            return self.last_activity + self.server_limits.keepalive_timeout
        receiving = [s.opened for s in self.streams.values() if not s.ended and not s.rejected]
        if receiving:
            return min(receiving) + self.server_limits.body_timeout
        return math.inf

    async def _read_loop(self) -> bool:
        """Read and feed h2 until the connection ends; True when it ended in good order (so
        what was written last is worth waiting for)."""
        while True:
            if self.dead:
                return False
            if (self.goaway_sent or self.peer_goaway) and not self.streams:
                await self._close(h2.errors.ErrorCodes.NO_ERROR)
                return True
            now = anyio.current_time()
            deadline = self._deadline()
            if now >= deadline:
                if not self.streams:  # idle: say goodbye
                    await self._close(h2.errors.ErrorCodes.NO_ERROR)
                    return True
                await self._expire(now)
                continue
            data: bytes | None = None
            self.read_scope = anyio.CancelScope(deadline=deadline)
            with self.read_scope:
                data = await self._receive()
            self.read_scope = None
            if data is None:
                continue  # woken up (drain, last stream done) or a deadline: look again
            if not data:
                self._lost()  # the client closed the connection: every stream's client left
                return False
            self.last_activity = anyio.current_time()
            if not await self._feed(data):
                return True

    async def _close(self, code: h2.errors.ErrorCodes) -> None:
        evicted = self.idle_mark.evicted and code == h2.errors.ErrorCodes.NO_ERROR
        try:
            self.h2.close_connection(code, additional_data=EVICTED_GOAWAY if evicted else None)
        except h2.exceptions.ProtocolError:
            return
        await self.flush()

    async def _expire(self, now: float) -> None:
        for stream in list(self.streams.values()):
            if stream.ended or stream.rejected:
                continue
            if now >= stream.opened + self.server_limits.body_timeout:
                self._reject(stream, 408, "gw.request.timeout", "request body not received in time")

    async def _watch_drain(self) -> None:
        await self.draining.wait()
        if self.goaway_sent or self.dead:
            return
        self.goaway_sent = True
        self.last_stream_id = self.h2.highest_inbound_stream_id
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.last_stream_id
        frame.error_code = h2.errors.ErrorCodes.NO_ERROR
        if self.idle_mark.evicted:
            # Closed while idle to make room for a new client: the debug data says so.
            log.info("gw.listen.idle_closed: HTTP/2 connection of %s, idle", self.peer[0])
            frame.additional_data = EVICTED_GOAWAY
        await self._write_raw(after=frame.serialize())
        self._wake_reader()

    async def _feed(self, data: bytes) -> bool:
        """Feed h2; False when it found a connection error (its GOAWAY is written out)."""
        try:
            if not self.guard.passes(data):
                self.h2.close_connection(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
                raise h2.exceptions.FrameTooLargeError("frame larger than SETTINGS_MAX_FRAME_SIZE")
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("HTTP/2 connection error from %s: %s", self.peer[0], exc)
            await self.flush()
            self._lost_streams()
            return False
        for event in events:
            self._on_event(event)
            if self.resets.too_many():
                log.info("HTTP/2 client %s resets too many streams", self.peer[0])
                self.ready.clear()
                await self._close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                self._lost_streams()
                return False
        # Handlers start once the whole read is taken in: a stream reset in the same read
        # never starts one.
        for stream, request in self.ready:
            if stream.gone:
                self._done(stream)
            else:
                stream.running = True
                self.tasks.start(self._serve(stream, request), stream.scope)
        self.ready.clear()
        # Looked at before the write as well as after: a write that has to wait for the client
        # would hold the reader until the write deadline.
        if self.outflow.flooded():
            self._end_flood()
            return False
        await self.flush()
        if self.outflow.flooded():
            self._end_flood()
            return False
        return True

    def _end_flood(self) -> None:
        """The client owes more control-frame replies than it may: PINGs or SETTINGS sent
        without reading their acknowledgements. Replies are owed only while the socket's
        buffers are full, so a GOAWAY could not reach the client either: the connection is
        dropped, every stream with it."""
        log.info(
            "gw.http2.control_flood: HTTP/2 client %s owes %d PING/SETTINGS acknowledgements "
            "it does not read; dropping the connection",
            self.peer[0],
            self.outflow.owed(),
        )
        self.ready.clear()
        self._lost()

    def _lost_streams(self) -> None:
        for stream in self.streams.values():
            stream.gone = True
            stream.scope.cancel()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_end(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None:
                # The client left this stream: its handler, and the upstream call, go too.
                self.resets.add(anyio.current_time())
                stream.gone = True
                stream.scope.cancel()
                stream.window.set()
                if not stream.running and not stream.ended:
                    self._done(stream)  # reset while its request was still arriving
        elif isinstance(event, h2.events.WindowUpdated):
            if not event.stream_id:
                for stream in self.streams.values():
                    stream.window.set()
            elif (stream := self.streams.get(event.stream_id)) is not None:
                stream.window.set()
        elif isinstance(event, h2.events.PingReceived):
            self.outflow.owe(1)  # h2 queued its acknowledgement
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.outflow.owe(1)  # h2 queued its acknowledgement
            for stream in self.streams.values():
                stream.window.set()  # the initial window may have grown
        elif isinstance(event, h2.events.SettingsAcknowledged):
            # h2 lowers its decoder's cap to the advertised size once acknowledged; the hard
            # cap stays above it so that a moderately large block gets 431, not GOAWAY.
            self.h2.decoder.max_header_list_size = self.limits.hard_header_list_size
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.peer_goaway = True

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id or 0
        if self.goaway_sent and stream_id > self.last_stream_id:
            # Opened after the drain's GOAWAY: never started here, safe to retry elsewhere.
            try:
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            except h2.exceptions.ProtocolError:
                pass
            return
        headers = [(bytes(k), bytes(v)) for k, v in event.headers or ()]
        stream = H2Stream(stream_id, headers, anyio.current_time())
        self.streams[stream_id] = stream
        self.idle_mark.busy()
        lim = self.server_limits
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > lim.max_header_bytes or len(headers) > lim.max_headers:
            self._reject(stream, 431, "gw.request.headers_too_large", "request headers too large")
            return
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > lim.max_body_bytes:
                self._reject(
                    stream,
                    413,
                    "gw.request.body_too_large",
                    f"request body larger than {lim.max_body_bytes} bytes",
                )
                return
        if self.check_head is not None:
            # Address and key from the headers alone, before a byte of body is taken in.
            head = stream.request(self.peer)
            refusal = self.check_head(head) if head is not None else None
            if refusal is not None:
                self._answer_soon(stream, refusal.status, refusal.headers, refusal.body)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id or 0
        # Acknowledged at once: the bytes are either added to a body bounded by the limit or
        # dropped, so the window can open again.
        self.h2.acknowledge_received_data(event.flow_controlled_length or 0, stream_id)
        stream = self.streams.get(stream_id)
        if stream is None or stream.rejected or stream.gone:
            return
        max_body = self.server_limits.max_body_bytes
        refused = stream.take(event.data or b"", max_body=max_body, budget=self.budget)
        if refused == 413:
            message = f"request body larger than {max_body} bytes"
            self._reject(stream, 413, "gw.request.body_too_large", message)
        elif refused == 503:
            self._reject(
                stream,
                503,
                "gw.request.bodies_busy",
                "the gateway is holding as many request bodies as it may; try again shortly",
                retry_after=1,
            )

    def _on_end(self, stream_id: int | None) -> None:
        stream = self.streams.get(stream_id or 0)
        if stream is None or stream.ended:
            return
        stream.ended = True
        if stream.rejected or stream.gone:
            return
        request = stream.request(self.peer)
        if request is None:
            self._reject(stream, 400, "gw.request.bad_http", "request without :path")
            return
        self.ready.append((stream, request))

    def _reject(
        self,
        stream: H2Stream,
        status: int,
        code: str,
        message: str,
        *,
        retry_after: int | None = None,
    ) -> None:
        """Answer `stream` with an error of the transport's own (it never reaches the
        handler), in the client's format."""
        headers, body = self.errors(stream.path(), status, code, message)
        if retry_after is not None:
            headers = [*headers, (b"retry-after", str(retry_after).encode())]
        self._answer_soon(stream, status, headers, body)

    def _answer_soon(self, stream: H2Stream, status: int, headers: Headers, body: bytes) -> None:
        """Answer `stream` with a whole response instead of its handler's, written by a task
        since even an error waits for the send window; its body is not kept."""
        stream.rejected = True
        stream.running = True
        stream.body = []
        stream.release(self.budget)
        self.tasks.start(self._answer_whole(stream, status, headers, body), stream.scope)

    async def _answer_whole(
        self, stream: H2Stream, status: int, headers: Headers, body: bytes
    ) -> None:
        try:
            with stream.scope:
                headers = [*headers, (b"content-length", str(len(body)).encode())]
                responder = _Responder(self, stream)
                await responder.start(status, headers)
                await responder.send(body)
                await responder.end()
                if not stream.ended:
                    # Answered before the request was all sent: the rest is not wanted.
                    await self.reset(stream, h2.errors.ErrorCodes.NO_ERROR)
        except ClientGone:
            pass
        finally:
            self._done(stream)

    async def _serve(self, stream: H2Stream, request: Request) -> None:
        responder = _Responder(self, stream)
        try:
            with stream.scope:
                try:
                    await self.handler(request, responder)
                except ClientGone:
                    return
                except Exception:
                    log.exception("handler failed for %s %s", request.method, request.path)
                    if not responder.started:
                        await self._fail(stream, request, "internal gateway error")
                    else:
                        await self.reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    return
                if not responder.started:
                    await self._fail(stream, request, "handler wrote no response")
                elif not responder.ended:
                    # The handler stopped without ending its answer: the client must not take
                    # it for a whole one.
                    await self.reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
        except ClientGone:
            pass
        finally:
            self._done(stream)

    async def _fail(self, stream: H2Stream, request: Request, message: str) -> None:
        headers, body = self.errors(request.path, 500, "gw.internal", message)
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        responder = _Responder(self, stream)
        await responder.start(500, headers)
        await responder.send(body)
        await responder.end()

    def _done(self, stream: H2Stream) -> None:
        self.streams.pop(stream.id, None)
        stream.release(self.budget)
        self.last_activity = anyio.current_time()
        if not self.streams:
            self.idle_mark.idle(self.last_activity)
            self._wake_reader()  # an idle or draining connection has a decision to make
