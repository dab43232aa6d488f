"""HTTP/1.1 transport: one client connection driving h11's state machine.

One task per connection (started by the accept loop, twserve/server/listener.py). For each
request the task reads the head and the whole body (bounded), then runs the handler with a
`Responder` that streams the answer as chunked transfer coding (the write side is
twserve/server/h1_output.py). While the handler runs, the socket is still read: end of file or a
reset means the client has gone, and the handler's cancel scope is cancelled so that the
upstream call it makes is torn down with it (anyio cancel scopes, never a bare task cancel — see
docs/operations.md, "What a client may send"). Over anyio's asyncio socket stream that watch is
kept from the event loop's callbacks (`ClientWatch`, twserve/server/_anyio_fastpath.py), with no
task of its own; over any other stream a watcher task per request reads.

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
  reading is taken as gone, exactly as one that closes (twserve/server/h1_output.py).
* A request with both ``Content-Length`` and ``Transfer-Encoding`` is refused (400) and the
  connection closed: two framings are how requests get smuggled past a proxy.

A connection waiting for its next request is marked idle (`IdleMark`): at its caps the server
closes the one idle longest for a new client (`evict`). Errors the transport itself answers
(bad HTTP, limits, timeouts) are written by an `ErrorWriter` supplied by the application so
they come out in the client's API format.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import anyio
import anyio.abc
import h11

from twproto.paths import split_target
from twserve.server._anyio_fastpath import ClientWatch, cancel_scope, current_time, raw_socket
from twserve.server.base import (
    LINGER_SECS,
    BodyBudget,
    ClientGone,
    ErrorWriter,
    Handler,
    Handoff,
    HeadCheck,
    Headers,
    HeadRefusal,
    IdleMark,
    Request,
    ResponderBase,
    ServerLimits,
    Switch,
)
from twserve.server.h1_output import H1Output, split_head

log = logging.getLogger("twserve.server.http1")

__all__ = ["Connection", "Responder"]

# The most one read takes from the socket.
READ_SIZE = 65536


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
    def __init__(self, refusal: HeadRefusal) -> None:
        super().__init__(refusal.status)
        self.refusal = refusal


class Responder(ResponderBase):
    """The answer to one request: its head, then chunked pieces, through the connection's
    output."""

    __slots__ = ("_conn", "_out")

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn
        self._out = conn.out

    async def start(self, status: int, headers: Headers) -> None:
        self._begin()
        if self._conn.closing:
            # Draining: tell the client this connection ends with this answer.
            headers = [*headers, (b"connection", b"close")]
        framing, lines = split_head(headers)  # h11 frames the answer (twserve/server/h1_output.py)
        response = h11.Response(status_code=status, headers=framing, reason=_reason(status))
        await self._out.write(response, lines)

    async def send(self, data: bytes) -> None:
        if data:
            await self._out.write_data(data)

    def ready(self) -> bool:
        return self._out.ready()

    def send_now(self, data: bytes) -> None:
        if data:
            self._out.write_now(data)

    async def end(self) -> None:
        if not self._ended:
            self._ended = True
            await self._out.write(h11.EndOfMessage())

    async def abort(self) -> None:
        self._ended = True
        await self._conn.close()


class Connection:
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
        # Made only when the connection is handed to another protocol (`_handoff`), which
        # waits on it: an event (and its waiter queue) per connection is most of a kilobyte.
        self._draining: anyio.Event | None = None
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
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.client_gone = False  # the client closed, reset or stopped reading
        # Draining: finish the request in progress, take no further one on this connection.
        self.closing = False
        self.idle_scope: anyio.CancelScope | None = None
        # Since when the connection (or the protocol it was handed to) has waited for its
        # next request; the server closes the longest idle at its caps (`evict`).
        self.idle = IdleMark()
        try:
            peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
            self.peer: tuple[str, int] = (
                (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else (str(peer), 0)
            )
        except Exception:
            self.peer = ("", 0)
        # Over anyio's asyncio socket stream, the client is watched from the event loop's
        # callbacks while a handler runs, and a handler's writes go to the transport once per
        # loop turn; over any other stream, a reader task watches (`_watch_client`).
        self._transport: Any = None
        self._watch: ClientWatch | None = None
        raw = raw_socket(stream)
        if raw is not None:
            self._transport, protocol = raw
            # A new connection's transport reads from the start, before the connection's first
            # read: nothing is taken in until that read asks (see `_receive`).
            self._transport.pause_reading()
            self._watch = ClientWatch(
                self._transport,
                protocol,
                limit=limits.max_header_bytes * 2,
                on_gone=self._client_left,
            )
        self.out = H1Output(
            stream,
            self.h11,
            transport=self._transport,
            watch=self._watch,
            write_timeout=limits.write_timeout,
            peer=self.peer,
            on_gone=self._client_left,
        )

    @property
    def closed(self) -> bool:
        """The connection is finished with: nothing more is written or read."""
        return self.out.closed

    def _client_left(self) -> None:
        """The client closed or reset the connection (or stopped reading) while its handler
        ran."""
        self.client_gone = True
        if self.handler_scope is not None:
            self.handler_scope.cancel()

    async def close(self) -> None:
        """Drop the connection at once (a broken exchange, a client that left)."""
        self.client_gone = True
        await self.out.close_stream()

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
        if transport is not None and not self.out.watched and transport.is_reading():
            transport.pause_reading()
        return data

    async def _receive_by(self, deadline: float) -> bytes:
        """Read from the socket before `deadline` (loop time); TimeoutError after it."""
        with cancel_scope(deadline=deadline):
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
        now = current_time()
        if fresh:
            wait = self.limits.head_timeout
        else:
            wait = self.limits.keepalive_timeout
            self.idle.idle(now)  # a server at its cap may close this one for a new client
        scope = cancel_scope(deadline=now + wait)
        self.idle_scope = scope
        data = b""
        try:
            with scope:
                data = await self._receive()
                self.h11.receive_data(data)
        finally:
            self.idle_scope = None
            self.idle.busy()
        return bool(data)

    def drain(self) -> None:
        """Finish the request in progress and take no further one; the protocol the connection
        was handed to, if any, drains as well."""
        self.closing = True
        if self._draining is not None:
            self._draining.set()
        if self.idle_scope is not None:
            self.idle_scope.cancel()

    def evict(self) -> None:
        """Close this connection, idle, to make room for a new client."""
        self.idle.evicted = True
        self.drain()

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
                deadline = current_time() + self.limits.head_timeout
                if first:
                    # Waiting for a request to begin: a drain may end this wait at once.
                    if not await self._await_request(fresh):
                        return False
                    if not fresh:
                        deadline = current_time() + self.limits.head_timeout
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
        draining = self._draining = anyio.Event()
        if self.closing:
            draining.set()
        return Handoff(
            request=request,
            stream=self.stream,
            buffered=bytes(buffered),
            handler=self.handler,
            limits=self.limits,
            errors=self.errors,
            draining=draining,
            check_head=self.check_head,
            budget=self.budget,
            idle=self.idle,
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
        deadline = current_time() + self.limits.body_timeout
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
        await self._send_refusal(HeadRefusal(status=rej.status, headers=headers, body=body))

    async def _send_refusal(self, refusal: HeadRefusal) -> None:
        headers, body = refusal.headers, refusal.body
        length = str(len(body)).encode()
        headers = [*headers, (b"content-length", length), (b"connection", b"close")]
        out = self.out
        try:
            if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                response = h11.Response(
                    status_code=refusal.status, headers=headers, reason=_reason(refusal.status)
                )
                await out.write(response)
                await out.write(h11.Data(data=body))
                await out.write(h11.EndOfMessage())
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
                        self.client_gone = True
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
            since = self.out.writing_since
            if since is not None and anyio.current_time() - since >= timeout:
                # The client stopped reading: as good as gone. Cancelling the handler stops the
                # upstream call and frees its slot and key permit (the relay's cleanup).
                log.info("client %s stopped reading; dropping the connection", self.peer[0])
                self.out.gone()
                await self.close()
                return

    async def _dispatch(self, request: Request) -> bool:
        responder = Responder(self)
        watch = self._watch
        if watch is None:
            return await self._dispatch_with_reader(request, responder)
        handler_scope = cancel_scope()
        self.handler_scope = handler_scope
        self.out.watched = True
        watch.start()
        try:
            kept = await self._run_handler(request, responder, handler_scope)
        finally:
            watch.stop()
            self._handler_done()
        return kept and await self._after_answer(request, responder)

    async def _dispatch_with_reader(self, request: Request, responder: Responder) -> bool:
        """`_dispatch` over a stream without a transport to watch: a reader task watches."""
        async with anyio.create_task_group() as tg:
            handler_scope = anyio.CancelScope()

            async def watch() -> None:
                await self._watch_client(handler_scope)

            tg.start_soon(watch)
            self.handler_scope = handler_scope
            self.out.watched = True
            try:
                kept = await self._run_handler(request, responder, handler_scope)
            finally:
                self._handler_done()
            tg.cancel_scope.cancel()
        return kept and await self._after_answer(request, responder)

    async def _run_handler(
        self, request: Request, responder: Responder, scope: anyio.CancelScope
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

    async def _handler_failed(self, request: Request, responder: Responder) -> bool:
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
        self.out.handler_done()
        self.handler_scope = None

    async def _after_answer(self, request: Request, responder: Responder) -> bool:
        """After the handler: whether the connection takes another request."""
        if self.closed or self.client_gone:
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


# The status line's reason phrase (RFC 9112 lets it be empty; people and some tools read it).
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"")
