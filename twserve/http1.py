"""HTTP/1.1 transport: anyio sockets driving h11's state machine.

One task per connection. For each request the task reads the head and the whole body (bounded),
then runs the handler with a `Responder` that streams the answer as chunked transfer coding.
While the handler runs, a watcher task keeps reading the socket: end of file or a reset means the
client has gone, and the handler's cancel scope is cancelled so that the upstream call it makes
is torn down with it (anyio cancel scopes, never a bare task cancel — see docs/operations.md, "What
a client may send").

Limits guard against bad or slow clients:

* h11's ``max_incomplete_event_size`` only bounds a head that has not fully arrived, so a 100 KB
  head that arrives in one read slips past it. The head's size is therefore counted here from the
  parsed event too, and anything over `ServerLimits.max_header_bytes` is answered with 431.
* The body is bounded by `ServerLimits.max_body_bytes` (413), checked against Content-Length up
  front and against the bytes actually received for chunked bodies.
* Reading a head or body is bounded in time (408), and so is an idle keep-alive connection.

Errors the transport itself answers (bad HTTP, limits, timeouts) are written by an
`ErrorWriter` supplied by the application so they come out in the client's API format.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import h11

from twproto import json_dumps
from twproto.paths import split_target
from twserve.httptypes import Handler, Headers, Request

log = logging.getLogger("twserve.http1")

__all__ = [
    "ClientGone",
    "ErrorWriter",
    "Handoff",
    "Server",
    "ServerLimits",
    "Switch",
    "serve",
    "serve_listener",
]

READ_SIZE = 65536
# How long a closing connection waits for the client to close its side.
LINGER_SECS = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 200
    max_body_bytes: int = 32 * 1024 * 1024
    head_timeout: float = 30.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 75.0


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


# Asked with each request before it is dispatched: a coroutine function that takes the
# connection over (twserve/http2.py for h2c; a WebSocket upgrade the same way), or None.
Switch = Callable[[Request], Callable[[Handoff], Awaitable[None]] | None]


class ClientGone(Exception):
    """The client closed the connection while its answer was being written."""


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.path = path


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
        await self._conn.write(h11.Response(status_code=status, headers=headers))

    async def send(self, data: bytes) -> None:
        if data:
            await self._conn.write(h11.Data(data=data))

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
    ) -> None:
        self.stream = stream
        self.switches = switches
        self.draining = anyio.Event()
        self.handler = handler
        self.limits = limits
        self.errors = errors
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.closed = False
        self.client_gone = anyio.Event()
        # Draining: finish the request in progress, take no further one on this connection.
        self.closing = False
        self.idle_scope: anyio.CancelScope | None = None
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
        if data:
            try:
                await self.stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self.closed = True
                self.client_gone.set()
                raise ClientGone() from exc

    async def close(self) -> None:
        """Drop the connection at once (a broken exchange, a client that left)."""
        if not self.closed:
            self.closed = True
            self.client_gone.set()
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
            return await self.stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            return b""
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return b""

    async def _next_event(self, timeout: float) -> Any:
        """The next h11 event, reading from the socket as needed, within `timeout` seconds."""
        with anyio.fail_after(timeout):
            while True:
                event = self.h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                data = await self._receive()
                self.h11.receive_data(data)

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
        timeout = self.limits.keepalive_timeout if first else self.limits.head_timeout
        if self.closing and first:
            return False
        try:
            try:
                if first:
                    # Waiting for the next request on a kept-alive connection: a drain may
                    # end this wait at once.
                    self.idle_scope = anyio.CancelScope()
                    with self.idle_scope:
                        event = await self._next_event(timeout)
                    self.idle_scope = None
                    if self.closing and self.h11.their_state is h11.IDLE:
                        return False
                else:
                    event = await self._next_event(timeout)
            except TimeoutError:
                if self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]:
                    return False  # idle keep-alive connection: close quietly
                raise _Reject(
                    408, "gw.request.timeout", "request head not received in time"
                ) from None
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                if status == 431 or "too long" in str(exc).lower():
                    raise _Reject(
                        431, "gw.request.headers_too_large", "request headers too large"
                    ) from None
                raise _Reject(
                    status, "gw.request.bad_http", f"malformed HTTP request: {exc}"
                ) from None
            if isinstance(event, h11.ConnectionClosed):
                return False
            if not isinstance(event, h11.Request):
                return False
            request = self._check_head(event)
            request.body = await self._read_body(request)
        except _Reject as rej:
            await self._send_rejection(rej)
            return False
        for switch in self.switches:
            take = switch(request)
            if take is not None:
                await take(self._handoff(request))
                return False
        return await self._dispatch(request)

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
        )

    def _check_head(self, event: h11.Request) -> Request:
        path, query = split_target(event.target)
        headers = list(event.headers)
        size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.limits.max_header_bytes or len(headers) > self.limits.max_headers:
            raise _Reject(431, "gw.request.headers_too_large", "request headers too large", path)
        length: int | None = None
        for name, value in headers:
            if name == b"content-length":
                length = int(value)
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
        while True:
            try:
                event = await self._next_event(self.limits.body_timeout)
            except TimeoutError:
                raise _Reject(
                    408, "gw.request.timeout", "request body not received in time", request.path
                ) from None
            except h11.RemoteProtocolError as exc:
                raise _Reject(
                    400, "gw.request.bad_http", f"malformed request body: {exc}", request.path
                ) from None
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_body_bytes:
                    raise _Reject(
                        413,
                        "gw.request.body_too_large",
                        f"request body larger than {self.limits.max_body_bytes} bytes",
                        request.path,
                    )
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:  # ConnectionClosed mid-body
                raise _Reject(400, "gw.request.bad_http", "request body truncated", request.path)

    async def _send_rejection(self, rej: _Reject) -> None:
        headers, body = self.errors(rej.path, rej.status, rej.code, rej.message)
        length = str(len(body)).encode()
        headers = [*headers, (b"content-length", length), (b"connection", b"close")]
        try:
            if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self.write(h11.Response(status_code=rej.status, headers=headers))
                await self.write(h11.Data(data=body))
                await self.write(h11.EndOfMessage())
        except (ClientGone, h11.LocalProtocolError):
            pass

    async def _watch_client(self, scope: anyio.CancelScope) -> None:
        """Read while the handler runs; end of file means the client left."""
        while True:
            data = await self._receive()
            if not data:
                self.client_gone.set()
                scope.cancel()
                return
            # Pipelined bytes of the next request: keep them for h11, bounded.
            if len(self.h11.trailing_data[0]) + len(data) > self.limits.max_header_bytes * 2:
                await anyio.sleep_forever()
            self.h11.receive_data(data)

    async def _dispatch(self, request: Request) -> bool:
        responder = _Responder(self)
        async with anyio.create_task_group() as tg:
            handler_scope = anyio.CancelScope()

            async def watch() -> None:
                await self._watch_client(handler_scope)

            tg.start_soon(watch)
            try:
                with handler_scope:
                    await self.handler(request, responder)
            except ClientGone:
                pass
            except Exception:
                log.exception("handler failed for %s %s", request.method, request.path)
                if not responder.started and not self.closed:
                    await self._send_rejection(
                        _Reject(500, "gw.internal", "internal gateway error", request.path)
                    )
                    tg.cancel_scope.cancel()
                    return False
            tg.cancel_scope.cancel()
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
    ) -> None:
        self.handler = handler
        self.limits = limits or ServerLimits()
        self.errors = errors
        self.switches = switches
        self.connections: set[_Connection] = set()
        # Made on the event loop, in serve_listener (anyio objects need a running loop).
        self._accepting: anyio.CancelScope | None = None
        self._all: anyio.CancelScope | None = None
        self._idle: anyio.Event | None = None  # set when the last connection ends
        self._draining = False

    async def serve_listener(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        if self._draining:
            return
        self._accepting = anyio.CancelScope()
        self._all = anyio.CancelScope()
        with self._all:
            async with anyio.create_task_group() as tg:
                with self._accepting:
                    await listener.serve(lambda stream: self._run(stream), task_group=tg)
                # Accepting stopped (drain): close the listening socket so new clients are
                # refused at once; the connections finish in this task group.
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

    async def _run(self, stream: anyio.abc.SocketStream) -> None:
        conn = _Connection(stream, self.handler, self.limits, self.errors, self.switches)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            if not self.connections and self._idle is not None:
                self._idle.set()

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
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    async with listener:
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started(int(bound))
        await srv.serve_listener(listener)
