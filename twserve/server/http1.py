"""HTTP/1.1 transport: anyio sockets driving h11's state machine.

One task per connection. For each request the task reads the head and the whole body (bounded),
then runs the handler with a `Responder` that streams the answer as chunked transfer coding.
While the handler runs, the socket is still read: end of file or a reset means the client has
gone, and the handler's cancel scope is cancelled so that the upstream call it makes is torn
down with it (anyio cancel scopes, never a bare task cancel — see docs/operations.md, "What a
client may send"). Over anyio's asyncio socket stream that watch is kept from the event loop's
callbacks (`twserve.server.client_watch`), with no task of its own; over any other stream a watcher
task per request reads.

Limits guard against bad or slow clients:

* h11's ``max_incomplete_event_size`` only bounds a head that has not fully arrived, so a 100 KB
  head that arrives in one read slips past it. The head's size is therefore counted here from the
  parsed event too, and anything over `ServerLimits.max_header_bytes` is answered with 431.
* The body is bounded by `ServerLimits.max_body_bytes` (413), checked against Content-Length up
  front and against the bytes actually received for chunked bodies.
* Reading a head or body is bounded in time as a whole, not per read (408): a client that
  sends one byte every few seconds gets no more time than one that sends nothing. An idle
  keep-alive connection is closed after its own, longer, wait. A head or body already read
  whole (the usual case: it came with the request's first bytes) is parsed without a wait.
* Before the body is read, an application hook (`HeadCheck`) may refuse the request from its
  head alone (the gateway checks the address and the key there), so nobody without a key gets
  the gateway to buffer a body.
* Bodies waiting in memory share one budget per server (`BodyBudget`); a body that would
  overdraw it is answered 503 with ``Retry-After`` at once rather than waited for. Whatever
  ends a request — its answer, a refusal, a body cut off, late, too large or badly chunked, a
  handoff — gives its bytes back (`_one_request`'s ``finally``).
* Every write to a client has a deadline (`ServerLimits.write_timeout`): a client that stops
  reading is taken as gone, exactly as one that closes, so its upstream call is cancelled and
  what it held is freed. While a handler runs, a write only waits when the client has not
  read what it was sent; such a wait alone gets a timer (over a stream without a transport, the
  watcher task checks every quarter of the deadline).
* While a handler runs, what it writes in one turn of the event loop goes to the socket in one
  system call (`_Connection.write`): the response head with the first piece of the body, the
  last piece with the chunked terminator. A system call per piece cost more than the rest of
  a short answer's work. Nothing waits for more to come: the bytes go out when the handler's
  task next yields to the loop. The answer's last bytes go when the handler returns, so a
  client that has the whole answer finds done what the handler records after writing it
  (health, effort memory, the request row).
* A request with both ``Content-Length`` and ``Transfer-Encoding`` is refused (400) and the
  connection closed: two framings are how requests get smuggled past a proxy.

Accepting is the server's own loop (`Server.serve_listener`), not anyio's ``serve``: running
out of file descriptors (EMFILE/ENFILE) makes ``accept`` fail, which would end anyio's loop and
the process with it; here it backs off and tries again. At `ServerLimits.max_connections` the
loop stops accepting until a connection ends; once a client waits in the backlog, the
connection idle longest between requests is closed for it, so kept-alive connections cannot
hold every place. An `Admit` predicate (``allow_from``) closes a connection from a refused
address before anything is read from it, and past `ServerLimits.max_connections_per_address`
one address's own idle connection makes room, or with none idle the new one is answered 503
(``gw.listen.address_busy``) before anything is read.

Errors the transport itself answers (bad HTTP, limits, timeouts) are written by an
`ErrorWriter` supplied by the application so they come out in the client's API format.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import anyio
import anyio.abc
import h11
from anyio._backends._asyncio import AsyncIOBackend
from anyio.lowlevel import cancel_shielded_checkpoint

from twproto import json_dumps
from twproto.paths import split_target
from twserve.server.base import Handler, Headers, Request
from twserve.server.client_watch import ClientWatch

log = logging.getLogger("twserve.server.http1")

__all__ = [
    "Admit",
    "BodyBudget",
    "ClientGone",
    "ErrorWriter",
    "Handoff",
    "HeadCheck",
    "ListenError",
    "Refusal",
    "Server",
    "ServerLimits",
    "Switch",
    "listen",
    "serve",
    "serve_listener",
]

READ_SIZE = 65536
# Bytes gathered for one system call while a handler writes; past this they go at once.
FLUSH_BYTES = 65536
# How long a closing connection waits for the client to close its side.
LINGER_SECS = 2.0
# The same for a connection refused at accept (its address is at its cap): short, since it
# holds a place under max_connections meanwhile.
REFUSED_LINGER_SECS = 0.5
# accept() failing for want of descriptors or memory: wait, doubling, up to the last value.
ACCEPT_BACKOFF = (0.01, 1.0)
_checkpoint_if_cancelled = AsyncIOBackend.checkpoint_if_cancelled
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 200
    max_body_bytes: int = 32 * 1024 * 1024
    # The whole head of a request, from the connection's start (or, on a kept-alive connection,
    # from its first byte); the whole body, from the end of the head.
    head_timeout: float = 30.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 75.0
    # One write to the client (a piece of an answer) that cannot go out in this long means the
    # client stopped reading: it is taken as gone.
    write_timeout: float = 60.0
    # Client connections open at once (None: no cap of the server's own). At the cap, once a
    # new client waits, the connection idle longest between requests is closed for it.
    max_connections: int | None = None
    # Of those, from one client address (None: no cap): past it, that address's connection idle
    # longest between requests is closed, or with none idle the new one answered 503.
    max_connections_per_address: int | None = None
    # Request bodies held in memory at once, over every connection of the server.
    body_budget_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A whole answer to send instead of reading a request's body; the connection then closes."""

    status: int
    headers: Headers
    body: bytes


# Called with a request whose head has arrived (body still unread): a Refusal, or None to go on.
HeadCheck = Callable[[Request], Refusal | None]
# Called with a new connection's peer address: False closes it before anything is read.
Admit = Callable[[str], bool]


class BodyBudget:
    """Bytes of request bodies held in memory, bounded over a whole server."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used = max(0, self.used - size)


# (request path or None, status, message code, message) -> (headers, body)
ErrorWriter = Callable[[str | None, int, str, str], tuple[Headers, bytes]]


def plain_error(path: str | None, status: int, code: str, message: str) -> tuple[Headers, bytes]:
    """The default error writer: an OpenAI-shaped JSON error (servers other than the gateway's
    own, such as the mock upstream, use it)."""
    body = json_dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    )
    return [(b"content-type", b"application/json")], body


@dataclass(slots=True, kw_only=True)
class Handoff:
    """A connection handed from HTTP/1.1 to another protocol once `request` was read whole:
    the HTTP/2 preface (``PRI * HTTP/2.0``) or an ``Upgrade`` request. The taker writes its
    own ``101`` if it needs one, runs the connection to its end and may close it gracefully;
    the socket is closed after it returns."""

    request: Request
    stream: anyio.abc.SocketStream
    buffered: bytes  # bytes the client sent past the request
    handler: Handler
    limits: ServerLimits
    errors: ErrorWriter
    draining: anyio.Event  # set when the server drains: finish what runs, take nothing new
    # The server's head check and body budget, for the requests the taker reads itself.
    check_head: HeadCheck | None = None
    budget: BodyBudget | None = None


# Asked with each request before it is dispatched: a coroutine function that takes the
# connection over (twserve/server/http2.py for h2c; a WebSocket upgrade the same way), or None.
Switch = Callable[[Request], Callable[[Handoff], Awaitable[None]] | None]


class ListenError(Exception):
    """The server cannot listen where it was told: the address does not resolve
    (``gw.listen.bind_unresolved``) or cannot be bound (``gw.listen.cannot_bind``)."""

    def __init__(self, code: str, host: str, port: int, detail: str) -> None:
        super().__init__(f"{code}: cannot listen on {host}:{port}: {detail}")
        self.code = code
        self.host = host
        self.port = port
        self.detail = detail


async def listen(host: str, port: int) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    """A TCP listener on `host:port`; `ListenError` (one line, with a code) when there is none."""
    try:
        return await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    except socket.gaierror as exc:
        raise ListenError(
            "gw.listen.bind_unresolved", host, port, f"{host!r} does not resolve ({exc.strerror})"
        ) from None
    except OSError as exc:
        raise ListenError("gw.listen.cannot_bind", host, port, exc.strerror or str(exc)) from None


class ClientGone(Exception):
    """The client closed the connection while its answer was being written."""


class _Reject(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        path: str | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.path = path
        self.retry_after = retry_after


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.status)
        self.refusal = refusal


class _Responder:
    __slots__ = ("_conn", "_ended", "_started")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._started = False
        self._ended = False

    @property
    def started(self) -> bool:
        return self._started

    async def start(self, status: int, headers: Headers) -> None:
        if self._started:
            raise RuntimeError("response already started")
        self._started = True
        if self._conn.closing:
            # Draining: tell the client this connection ends with this answer.
            headers = [*headers, (b"connection", b"close")]
        await self._conn.write(
            h11.Response(status_code=status, headers=headers, reason=_reason(status))
        )

    async def send(self, data: bytes) -> None:
        if data:
            await self._conn.write_data(data)

    def ready(self) -> bool:
        return self._conn.ready()

    def send_now(self, data: bytes) -> None:
        if data:
            self._conn.write_now(data)

    async def end(self) -> None:
        if not self._ended:
            self._ended = True
            await self._conn.write(h11.EndOfMessage())

    async def abort(self) -> None:
        self._ended = True
        await self._conn.close()


class _Connection:
    """One client connection; owns the h11 state machine and the socket."""

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        handler: Handler,
        limits: ServerLimits,
        errors: ErrorWriter,
        switches: Sequence[Switch] = (),
        *,
        check_head: HeadCheck | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.stream = stream
        self.switches = switches
        self.draining = anyio.Event()
        self.handler = handler
        self.limits = limits
        self.errors = errors
        self.check_head = check_head
        self.budget = budget or BodyBudget(limits.body_budget_bytes)
        # Bytes of the budget the request in progress holds (its body).
        self.reserved = 0
        self.requests = 0
        # The scope of the handler running now: a client that stops reading cancels it.
        self.handler_scope: anyio.CancelScope | None = None
        # A watcher keeps the write deadline (while a handler runs) and when the write in
        # progress began.
        self.watched = False
        self.writing_since: float | None = None
        # The event loop's transport under the socket stream, when it is anyio's asyncio one:
        # a handler's writes are gathered and written to it once per loop turn (`_gather`).
        self._transport, self._protocol = _raw_transport(stream)
        # Over such a transport the client is watched from the loop's callbacks while a handler runs
        # (twserve.server.client_watch); over any other stream, by a reader task (`_watch_client`).
        self._watch: ClientWatch | None = None
        if self._transport is not None:
            # A new connection's transport reads from the start, before the connection's first
            # read: nothing is taken in until that read asks (see `_receive`).
            self._transport.pause_reading()
            self._watch = ClientWatch(
                self._transport,
                self._protocol,
                limit=limits.max_header_bytes * 2,
                on_gone=self._client_left,
            )
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._flush_scheduled = False
        self._held_end = False  # the answer has ended; its last bytes wait for the handler
        # The answer in progress goes in chunked transfer coding, framed here (`write_data`).
        self._chunked = False
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.closed = False
        self._stream_closed = False
        self.client_gone = anyio.Event()
        # Draining: finish the request in progress, take no further one on this connection.
        self.closing = False
        self.idle_scope: anyio.CancelScope | None = None
        # Since when a kept-alive connection has waited for its next request (None: it is not
        # waiting between requests); the server closes the longest idle at its caps (`evict`).
        self.idle_since: float | None = None
        self.on_idle: Callable[[], None] | None = None
        try:
            peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
            self.peer: tuple[str, int] = (
                (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else (str(peer), 0)
            )
        except Exception:
            self.peer = ("", 0)

    async def write(self, event: Any) -> None:
        if self.closed:
            raise ClientGone()
        data = self.h11.send(event)
        kind = type(event)
        if kind is h11.Response:
            self._chunked = _frames_in_chunks(self.h11)
        elif kind is h11.EndOfMessage:
            self._chunked = False
        if self.watched and self._transport is not None:
            if kind is h11.EndOfMessage:
                # The answer's last bytes go when the handler returns (`_dispatch`): a client
                # that has the whole answer finds done what the handler records after it.
                self._held_end = True
            if data:
                await self._gather(data)
            return
        if not data:
            return
        self._flush()
        if self.watched:
            # While a handler runs, the client's watcher holds the deadline (`_watch_client`):
            # a deadline scope per write costs about half as much again as the write itself.
            self.writing_since = anyio.current_time()
            try:
                await self.stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._gone()
                raise ClientGone() from exc
            finally:
                self.writing_since = None
        else:
            try:
                with anyio.fail_after(self.limits.write_timeout):
                    await self.stream.send(data)
            except TimeoutError as exc:
                # The client stopped reading: as good as gone. Cancelling the handler stops the
                # upstream call and frees its slot and key permit (the relay's cleanup).
                log.info("client %s stopped reading; dropping the connection", self.peer[0])
                self._gone()
                await self.close()
                raise ClientGone() from exc
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._gone()
                raise ClientGone() from exc

    async def write_data(self, data: bytes) -> None:
        """A piece of the answer's body (not empty). While a handler writes a chunked answer
        it is framed here rather than by h11: h11's state does not change with body data in
        chunked coding, and its per-call bookkeeping cost as much as the rest of the write."""
        if self._chunked and self.watched and self._transport is not None and not self.closed:
            await self._gather(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            await self.write(h11.Data(data=data))

    def ready(self) -> bool:
        """A piece of the chunked answer in progress can be written now, in order: the client's
        transport is open and not above its high-water mark."""
        transport, protocol = self._transport, self._protocol
        return (
            self._chunked
            and self.watched
            and transport is not None
            and protocol is not None
            and not self.closed
            and not self._held_end
            and protocol.write_event.is_set()
            and protocol.exception is None
            and not transport.is_closing()
        )

    def write_now(self, data: bytes) -> None:
        """A piece of the answer written at once (after `ready`), behind what `_gather` kept."""
        self._pending.append(b"%x\r\n%b\r\n" % (len(data), data))
        self._flush()

    async def _gather(self, data: bytes) -> None:
        """A handler's write: kept with the others of this loop turn and written with them in
        one system call when the task yields (a callback scheduled for the next turn), or past
        `FLUSH_BYTES`; once the answer has ended, when the handler returns. The transport does
        what anyio's ``send`` does with it (this is the same transport): a client that stopped
        reading leaves bytes in its buffer, and the next write waits for it to drain, under the
        watcher's deadline."""
        transport, protocol = self._transport, self._protocol
        assert transport is not None and protocol is not None
        if transport.is_closing() or protocol.exception is not None:
            self._gone()
            raise ClientGone()
        if not protocol.write_event.is_set():
            self._flush()
            # The client has not read what it was sent: this write waits at most write_timeout
            # (one timer, only for a write that has to wait).
            stall = asyncio.get_running_loop().call_later(
                self.limits.write_timeout, self._write_stalled
            )
            try:
                # Replaced by the protocol on each pause: read it again for every wait.
                await protocol.write_event.wait()
            finally:
                stall.cancel()
            if self.closed or transport.is_closing() or protocol.exception is not None:
                self._gone()
                raise ClientGone()
        else:
            # As anyio's send does: a cancelled handler stops at its next write. (The asyncio
            # backend's own, called directly: the transport is that backend's.)
            await _checkpoint_if_cancelled()
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= FLUSH_BYTES:
            self._flush()
            # A handler that writes without ever waiting still lets the other connections run.
            await cancel_shielded_checkpoint()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        if self._held_end and self.watched:
            self._flush_scheduled = False  # the answer ended: its bytes wait for the handler
            return
        self._flush()

    def _flush(self) -> None:
        """Write what `_gather` kept, in one call to the transport."""
        self._flush_scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_size = 0
        transport = self._transport
        if self._stream_closed or transport is None:
            return
        if transport.is_closing():
            self._gone()
            return
        try:
            transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        except (RuntimeError, OSError):
            self._gone()

    def _write_stalled(self) -> None:
        # The client stopped reading: as good as gone. Cancelling the handler stops the
        # upstream call and frees its slot and key permit (the relay's cleanup); the connection
        # is closed when its task ends.
        log.info("client %s stopped reading; dropping the connection", self.peer[0])
        self._gone()

    def _client_left(self) -> None:
        """The client closed or reset the connection while its handler ran."""
        self.client_gone.set()
        if self.handler_scope is not None:
            self.handler_scope.cancel()

    def _gone(self) -> None:
        self.closed = True
        self.client_gone.set()
        if self.handler_scope is not None:
            self.handler_scope.cancel()

    async def close(self) -> None:
        """Drop the connection at once (a broken exchange, a client that left)."""
        self.closed = True
        self.client_gone.set()
        if not self._stream_closed:
            self._flush()  # what the handler wrote before it dropped the connection goes out
            self._stream_closed = True
            if self._watch is not None:
                self._watch.release()
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()

    async def close_gracefully(self) -> None:
        """End a healthy connection without losing what was written.

        anyio's aclose aborts the transport, which drops unsent bytes and, with unread input,
        makes the kernel answer with a reset. So: half-close first (the write buffer drains
        before the FIN), read and discard until the client closes too, bounded in time.
        """
        if self.closed:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.send_eof()
                with anyio.move_on_after(LINGER_SECS):
                    while await self._receive():
                        pass
            except Exception:
                pass
            await self.close()

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            return b""
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return b""
        # anyio pauses the transport only after a read that waited: one that found bytes
        # queued leaves it reading, without bound for a client that sends faster than it is
        # read (twserve.server.backpressure). The next read that waits resumes it.
        transport = self._transport
        if transport is not None and not self.watched and transport.is_reading():
            transport.pause_reading()
        return data

    async def _receive_by(self, deadline: float) -> bytes:
        """Read from the socket before `deadline` (loop time); TimeoutError after it."""
        with anyio.CancelScope(deadline=deadline):
            return await self._receive()
        raise TimeoutError

    async def _next_event_by(self, deadline: float) -> Any:
        """The next h11 event, reading from the socket as needed before `deadline`. An event
        already in h11's buffer (a head and body that came in one read) needs no wait, and so
        no deadline scope."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self._receive_by(deadline))

    async def _await_request(self, fresh: bool) -> bool:
        """Wait for the next request to begin: a new connection `head_timeout` (its whole head
        has that long, counted from the connection's start), a kept-alive one
        `keepalive_timeout`. A drain ends the wait (`idle_scope`). False: nothing came (or the
        client closed)."""
        if self.h11.trailing_data[0]:
            return True
        now = anyio.current_time()
        if fresh:
            wait = self.limits.head_timeout
        else:
            wait = self.limits.keepalive_timeout
            self.idle_since = now
            if self.on_idle is not None:
                self.on_idle()  # a server at its cap may close this one for a new client
        scope = anyio.CancelScope(deadline=now + wait)
        self.idle_scope = scope
        data = b""
        try:
            with scope:
                data = await self._receive()
                self.h11.receive_data(data)
        finally:
            self.idle_scope = None
            self.idle_since = None
        return bool(data)

    def evict(self) -> None:
        """Close this connection, idle between requests, to make room for a new client."""
        self.closing = True
        if self.idle_scope is not None:
            self.idle_scope.cancel()

    async def run(self) -> None:
        graceful = False
        try:
            while not self.closed:
                keep_going = await self._one_request()
                if not keep_going:
                    # An answer just ended and the connection goes with it: let it reach the
                    # client. (Idle timeouts, broken exchanges and cancellation close at once.)
                    graceful = self.h11.our_state in (h11.DONE, h11.MUST_CLOSE)
                    break
        except Exception:  # a bug: keep the server up, drop the connection
            log.exception("connection from %s failed", self.peer[0])
        finally:
            if graceful:
                await self.close_gracefully()
            else:
                await self.close()

    async def _one_request(self) -> bool:
        first = self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]
        if self.closing and first:
            return False
        fresh = self.requests == 0
        self.requests += 1
        try:
            try:
                # The head's deadline: a new connection has head_timeout for its whole head from
                # its start (docs/operations.md, 30 s); a kept-alive one may idle for
                # keepalive_timeout first, and has head_timeout from the head's first byte.
                deadline = anyio.current_time() + self.limits.head_timeout
                if first:
                    # Waiting for a request to begin: a drain may end this wait at once.
                    if not await self._await_request(fresh):
                        return False
                    if not fresh:
                        deadline = anyio.current_time() + self.limits.head_timeout
                    if self.closing and self.h11.their_state is h11.IDLE:
                        return False
                event = await self._next_event_by(deadline)
            except TimeoutError:
                if self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]:
                    return False  # a connection that never sent anything: close quietly
                raise _Reject(
                    408, "gw.request.timeout", "request head not received in time"
                ) from None
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                if status == 431 or "too long" in str(exc).lower():
                    raise _Reject(
                        431, "gw.request.headers_too_large", "request headers too large"
                    ) from None
                # h11's message quotes the offending line: it is not echoed back.
                raise _Reject(status, "gw.request.bad_http", "malformed HTTP request") from None
            if not isinstance(event, h11.Request):  # ConnectionClosed, or nothing to answer
                return False
            request = self._check_head(event)
            if self.check_head is not None:
                refusal = self.check_head(request)
                if refusal is not None:
                    raise _Refused(refusal)
            request.body = await self._read_body(request)
            for switch in self.switches:
                take = switch(request)
                if take is not None:
                    await take(self._handoff(request))
                    return False
            return await self._dispatch(request)
        except _Reject as rej:  # raised only while the head and body are read
            await self._send_rejection(rej)
            return False
        except _Refused as ref:
            await self._send_refusal(ref.refusal)
            return False
        finally:
            # Whatever ended the request — its answer, a refusal, a body cut off, late, over the
            # limit or malformed, a handoff — the bytes its body held go back to the budget.
            if self.reserved:
                self.budget.release(self.reserved)
                self.reserved = 0

    def _reserve(self, size: int, path: str) -> None:
        if not self.budget.reserve(size):
            raise _Reject(
                503,
                "gw.request.bodies_busy",
                "the gateway is holding as many request bodies as it may; try again shortly",
                path,
                retry_after=1,
            )
        self.reserved += size

    def _handoff(self, request: Request) -> Handoff:
        buffered, _ = self.h11.trailing_data
        return Handoff(
            request=request,
            stream=self.stream,
            buffered=bytes(buffered),
            handler=self.handler,
            limits=self.limits,
            errors=self.errors,
            draining=self.draining,
            check_head=self.check_head,
            budget=self.budget,
        )

    def _check_head(self, event: h11.Request) -> Request:
        path, query = split_target(event.target)
        headers = list(event.headers)
        size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.limits.max_header_bytes or len(headers) > self.limits.max_headers:
            raise _Reject(431, "gw.request.headers_too_large", "request headers too large", path)
        length: int | None = None
        chunked = False
        for name, value in headers:
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
        if length is not None and chunked:
            # h11 would follow Transfer-Encoding and ignore the length; a proxy in front may
            # have done the opposite. Refuse rather than guess where the request ends.
            raise _Reject(
                400,
                "gw.request.bad_http",
                "a request may not carry both Content-Length and Transfer-Encoding",
                path,
            )
        if length is not None and length > self.limits.max_body_bytes:
            raise _Reject(
                413,
                "gw.request.body_too_large",
                f"request body larger than {self.limits.max_body_bytes} bytes",
                path,
            )
        return Request(
            method=event.method.decode("ascii", "replace"),
            target=event.target,
            path=path,
            query=query,
            headers=headers,
            body=b"",
            client=self.peer,
            http_version=event.http_version.decode("ascii", "replace"),
        )

    async def _read_body(self, request: Request) -> bytes:
        parts: list[bytes] = []
        size = 0
        # One deadline for the whole body: progress does not buy more time.
        deadline = anyio.current_time() + self.limits.body_timeout
        try:
            while True:
                event = await self._next_event_by(deadline)
                if isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > self.limits.max_body_bytes:
                        raise _Reject(
                            413,
                            "gw.request.body_too_large",
                            f"request body larger than {self.limits.max_body_bytes} bytes",
                            request.path,
                        )
                    # Bytes count against the budget as they arrive: a length announced
                    # and never sent holds nothing back from anyone else.
                    self._reserve(len(event.data), request.path)
                    parts.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    return b"".join(parts)
                else:  # ConnectionClosed mid-body
                    raise _Reject(
                        400, "gw.request.bad_http", "request body truncated", request.path
                    )
        except TimeoutError:
            raise _Reject(
                408, "gw.request.timeout", "request body not received in time", request.path
            ) from None
        except h11.RemoteProtocolError:
            raise _Reject(
                400, "gw.request.bad_http", "malformed request body", request.path
            ) from None

    async def _send_rejection(self, rej: _Reject) -> None:
        headers, body = self.errors(rej.path, rej.status, rej.code, rej.message)
        if rej.retry_after is not None:
            headers = [*headers, (b"retry-after", str(rej.retry_after).encode())]
        await self._send_refusal(Refusal(status=rej.status, headers=headers, body=body))

    async def _send_refusal(self, refusal: Refusal) -> None:
        headers, body = refusal.headers, refusal.body
        length = str(len(body)).encode()
        headers = [*headers, (b"content-length", length), (b"connection", b"close")]
        try:
            if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                response = h11.Response(
                    status_code=refusal.status, headers=headers, reason=_reason(refusal.status)
                )
                await self.write(response)
                await self.write(h11.Data(data=body))
                await self.write(h11.EndOfMessage())
        except (ClientGone, h11.LocalProtocolError):
            pass

    async def _watch_client(self, scope: anyio.CancelScope) -> None:
        """Read while the handler runs; end of file means the client left.

        It also keeps the write deadline of the handler's writes: every quarter of
        `write_timeout` it looks whether a write has been waiting longer than that, and if so
        takes the client as gone. A write is thus given up between one and one and a quarter
        `write_timeout` after it began, for the cost of one timer per quarter rather than one
        per write.
        """
        timeout = self.limits.write_timeout
        tick = timeout / 4
        reading = True
        while True:
            if reading:
                data: bytes | None = None
                with anyio.move_on_after(tick):
                    data = await self._receive()
                if data is not None:
                    if not data:
                        self.client_gone.set()
                        scope.cancel()
                        return
                    # Pipelined bytes of the next request: keep them for h11, bounded.
                    trailing = len(self.h11.trailing_data[0])
                    if trailing + len(data) > self.limits.max_header_bytes * 2:
                        reading = False
                    else:
                        self.h11.receive_data(data)
                # Checked after a read too: a client that trickles bytes in while it reads
                # nothing must not keep the check from running.
            else:
                await anyio.sleep(tick)
            since = self.writing_since
            if since is not None and anyio.current_time() - since >= timeout:
                # The client stopped reading: as good as gone. Cancelling the handler stops the
                # upstream call and frees its slot and key permit (the relay's cleanup).
                log.info("client %s stopped reading; dropping the connection", self.peer[0])
                self._gone()
                await self.close()
                return

    async def _dispatch(self, request: Request) -> bool:
        responder = _Responder(self)
        watch = self._watch
        if watch is None:
            return await self._dispatch_with_reader(request, responder)
        handler_scope = anyio.CancelScope()
        self.handler_scope = handler_scope
        self.watched = True
        watch.start()
        try:
            kept = await self._run_handler(request, responder, handler_scope)
        finally:
            watch.stop()
            self._handler_done()
        return kept and await self._after_answer(request, responder)

    async def _dispatch_with_reader(self, request: Request, responder: _Responder) -> bool:
        """`_dispatch` over a stream without a transport to watch: a reader task watches."""
        async with anyio.create_task_group() as tg:
            handler_scope = anyio.CancelScope()

            async def watch() -> None:
                await self._watch_client(handler_scope)

            tg.start_soon(watch)
            self.handler_scope = handler_scope
            self.watched = True
            try:
                kept = await self._run_handler(request, responder, handler_scope)
            finally:
                self._handler_done()
            tg.cancel_scope.cancel()
        return kept and await self._after_answer(request, responder)

    async def _run_handler(
        self, request: Request, responder: _Responder, scope: anyio.CancelScope
    ) -> bool:
        """The handler, under `scope`; False when its failure ends the connection."""
        try:
            with scope:
                await self.handler(request, responder)
        except ClientGone:
            pass
        except Exception:
            return await self._handler_failed(request, responder)
        return True

    async def _handler_failed(self, request: Request, responder: _Responder) -> bool:
        """Log the handler's failure; answer 500 if nothing was written yet (False: the
        connection is done)."""
        log.exception("handler failed for %s %s", request.method, request.path)
        if not responder.started and not self.closed:
            await self._send_rejection(
                _Reject(500, "gw.internal", "internal gateway error", request.path)
            )
            return False
        return True

    def _handler_done(self) -> None:
        self._flush()
        self._held_end = False
        self.handler_scope = None
        self.watched = False

    async def _after_answer(self, request: Request, responder: _Responder) -> bool:
        """After the handler: whether the connection takes another request."""
        if self.closed or self.client_gone.is_set():
            return False
        if not responder.started:
            await self._send_rejection(
                _Reject(500, "gw.internal", "handler wrote no response", request.path)
            )
            return False
        if self.h11.our_state is h11.SEND_BODY:
            # The handler stopped without ending its answer: the connection cannot be reused.
            return False
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            if self.closing:
                return False
            try:
                self.h11.start_next_cycle()
            except h11.LocalProtocolError:
                return False
            return True
        return False


class Server:
    """Serves one listener; `drain` stops accepting and lets requests in progress finish.

    Connections run in the server's own task group, apart from the accept loop, so that the
    accept loop can stop while answers already streaming carry on.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        limits: ServerLimits | None = None,
        errors: ErrorWriter = plain_error,
        switches: Sequence[Switch] = (),
        check_head: HeadCheck | None = None,
        admit: Admit | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits or ServerLimits()
        self.errors = errors
        self.switches = switches
        self.check_head = check_head
        self.admit = admit
        # Shared with the process's other servers when given (the gateway and its control
        # plane hold one budget between them).
        self.budget = budget or BodyBudget(self.limits.body_budget_bytes)
        self.connections: set[_Connection] = set()
        # Connections accepted and not yet ended (counted at accept, before their task runs).
        self.open_count = 0
        # Connections open per client address, with max_connections_per_address.
        self.per_address: dict[str, int] = {}
        # Made on the event loop, in serve_listener (anyio objects need a running loop).
        self._accepting: anyio.CancelScope | None = None
        self._all: anyio.CancelScope | None = None
        self._idle: anyio.Event | None = None  # set when the last connection ends
        self._room: anyio.Event | None = None  # set when a connection ends
        self._draining = False

    async def serve_listener(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        if self._draining:
            return
        self._accepting = anyio.CancelScope()
        self._all = anyio.CancelScope()
        # anyio's TCP listener is one listener per address family (a MultiListener).
        listeners: list[anyio.abc.SocketListener] = list(
            getattr(listener, "listeners", None) or [listener]
        )
        with self._all:
            async with anyio.create_task_group() as tg:
                with self._accepting:
                    async with anyio.create_task_group() as loops:
                        for one in listeners:
                            loops.start_soon(self._accept_loop, one, tg)
                # Accepting stopped (drain): close the listening socket so new clients are
                # refused at once; the connections finish in this task group.
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

    async def _accept_loop(
        self, listener: anyio.abc.SocketListener, tg: anyio.abc.TaskGroup
    ) -> None:
        backoff = 0.0
        cap = self.limits.max_connections
        while True:
            if cap is not None and self.open_count >= cap:
                await self._make_room(listener, cap)
                continue
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                        continue  # that one client's trouble, not the listener's
                    raise
                # Out of descriptors (or memory): the pending client stays in the backlog.
                # Back off, doubling, so the loop does not spin on a socket that stays readable.
                if backoff == 0.0:
                    log.warning(
                        "gw.listen.fd_exhausted: cannot accept connections (%s); %d open; retrying",
                        errno.errorcode.get(exc.errno or 0, exc.errno),
                        self.open_count,
                    )
                backoff = min(max(backoff * 2, ACCEPT_BACKOFF[0]), ACCEPT_BACKOFF[1])
                await anyio.sleep(backoff)
                continue
            backoff = 0.0
            self.open_count += 1
            tg.start_soon(self._run, stream)

    async def _make_room(self, listener: anyio.abc.SocketListener, cap: int) -> None:
        """At the connection cap. New clients stay in the kernel's backlog; once one waits
        there, the connection idle longest between requests is closed to make room for it
        (idle keep-alive connections must not hold every place while a request waits). With
        none idle, this waits until a connection ends or goes idle."""
        room = self._room
        if room is None or room.is_set():
            # One event for every accept loop (a listener per address family) that waits.
            room = self._room = anyio.Event()
        await _client_waiting(listener)
        if self.open_count < cap:
            return  # one ended meanwhile
        victim = self._longest_idle(None)
        if victim is not None:
            log.debug(
                "at max_connections (%d): closing an idle connection of %s", cap, victim.peer[0]
            )
            victim.evict()
        await room.wait()  # the evicted connection ends; or another ends or goes idle

    def _longest_idle(self, host: str | None) -> _Connection | None:
        """The connection (of client address `host`, or of any) that has waited longest for
        its next request, not yet being closed."""
        best: _Connection | None = None
        best_since = math.inf
        for conn in self.connections:
            since = conn.idle_since
            if since is None or conn.closing or (host is not None and conn.peer[0] != host):
                continue
            if since < best_since:
                best, best_since = conn, since
        return best

    def _went_idle(self) -> None:
        # A connection waits for its next request: an accept loop at the cap may close it.
        if self._room is not None:
            self._room.set()

    async def _run(self, stream: anyio.abc.SocketStream) -> None:
        host: str | None = None
        try:
            address = _peer_host(stream)
            if self.admit is not None and not self.admit(address):
                # Refused by address: closed before a byte is read (nothing is buffered).
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                return
            per_cap = self.limits.max_connections_per_address
            if per_cap is not None:
                held = self.per_address.get(address, 0)
                if held >= per_cap:
                    victim = self._longest_idle(address)
                    if victim is None:
                        await self._refuse_address(stream, per_cap)
                        return
                    victim.evict()  # this address's own idle connection makes the room
                self.per_address[address] = held + 1
                host = address
            conn = _Connection(
                stream,
                self.handler,
                self.limits,
                self.errors,
                self.switches,
                check_head=self.check_head,
                budget=self.budget,
            )
            conn.on_idle = self._went_idle
            self.connections.add(conn)
            try:
                await conn.run()
            finally:
                self.connections.discard(conn)
                if not self.connections and self._idle is not None:
                    self._idle.set()
        finally:
            self.open_count -= 1
            if host is not None:
                left = self.per_address[host] - 1
                if left:
                    self.per_address[host] = left
                else:
                    del self.per_address[host]
            if self._room is not None:
                self._room.set()

    async def _refuse_address(self, stream: anyio.abc.SocketStream, cap: int) -> None:
        """Answer a client whose address holds `cap` connections, none idle: 503 at once, in
        the default format (nothing is read, so neither path nor headers are known); then the
        connection closes after a short linger, so the answer is not lost to a reset."""
        headers, body = self.errors(
            None,
            503,
            "gw.listen.address_busy",
            f"this address has {cap} connections open already; try again shortly",
        )
        head = [
            b"HTTP/1.1 503 Service Unavailable",
            *(name + b": " + value for name, value in headers),
            b"retry-after: 1",
            b"content-length: " + str(len(body)).encode(),
            b"connection: close",
        ]
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(REFUSED_LINGER_SECS):
                    await stream.send(b"\r\n".join(head) + b"\r\n\r\n" + body)
                    await stream.send_eof()
                    while await stream.receive(READ_SIZE):
                        pass
            except Exception:
                pass  # the client left, or reset: nothing more to do
            await stream.aclose()

    async def drain(self, grace: float) -> bool:
        """Stop accepting, close idle connections, wait up to `grace` seconds for requests in
        progress; then cancel what is left. True when everything finished in time."""
        self._draining = True
        if self._accepting is not None:
            self._accepting.cancel()
        for conn in list(self.connections):
            conn.closing = True
            conn.draining.set()
            if conn.idle_scope is not None:
                conn.idle_scope.cancel()
        finished = True
        with anyio.move_on_after(grace) as waited:
            while self.connections:
                self._idle = anyio.Event()
                await self._idle.wait()
        if waited.cancelled_caught:
            finished = False
        if self._all is not None:
            self._all.cancel()
        return finished


# The status line's reason phrase (RFC 9112 lets it be empty; people and some tools read it).
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"")


def _raw_transport(stream: Any) -> tuple[Any, Any]:
    """The asyncio transport and protocol under anyio's asyncio socket stream, or (None, None)
    for any other stream (another backend, TLS), which is written through ``send``."""
    kind = type(stream)
    if kind.__name__ != "SocketStream" or kind.__module__ != "anyio._backends._asyncio":
        return None, None
    transport = getattr(stream, "_transport", None)
    protocol = getattr(stream, "_protocol", None)
    if transport is None or not hasattr(protocol, "write_event"):
        return None, None
    return transport, protocol


def _frames_in_chunks(conn: h11.Connection) -> bool:
    """Whether h11 writes the response it was just given in chunked transfer coding (not a
    HEAD answer, an HTTP/1.0 client or a Content-Length). Asked of h11's body writer; should
    h11 ever name it otherwise, every piece simply goes through h11."""
    return type(getattr(conn, "_writer", None)).__name__ == "ChunkedWriter"


async def _client_waiting(listener: anyio.abc.SocketListener) -> None:
    """Return once a client waits in `listener`'s backlog (its socket reads ready); at once for
    a listener without a socket to watch."""
    try:
        sock = listener.extra(anyio.abc.SocketAttribute.raw_socket)
    except anyio.TypedAttributeLookupError:
        return
    await anyio.wait_readable(sock)


def _peer_host(stream: anyio.abc.SocketStream) -> str:
    try:
        peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except Exception:
        return ""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


async def serve_listener(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    handler: Handler,
    *,
    limits: ServerLimits | None = None,
    errors: ErrorWriter = plain_error,
) -> None:
    """Serve HTTP/1.1 on an already bound listener until cancelled."""
    await Server(handler, limits=limits, errors=errors).serve_listener(listener)


async def serve(
    handler: Handler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ServerLimits | None = None,
    errors: ErrorWriter = plain_error,
    server: Server | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Bind `host:port` and serve until cancelled (or drained through `server`);
    `task_status.started(port)` reports the bound port."""
    srv = server or Server(handler, limits=limits, errors=errors)
    listener = await listen(host, port)
    async with listener:
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started(int(bound))
        await srv.serve_listener(listener)
