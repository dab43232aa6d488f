"""Listening and accepting: the gateway's (and the mock upstream's) server loop.

`listen` binds, with one line and a code when it cannot (`ListenError`). `Server` serves one
listener: each connection accepted runs an HTTP/1.1 connection (twserve/server/http1.py), which
may hand itself to HTTP/2 or a WebSocket (its switches), in the server's task group.

Accepting is the server's own loop (`Server.serve_listener`), not anyio's ``serve``: running
out of file descriptors (EMFILE/ENFILE) makes ``accept`` fail, which would end anyio's loop and
the process with it; here it backs off and tries again. At `ServerLimits.max_connections` the
loop stops accepting until a connection ends; once a client waits in the backlog, the
connection idle longest is closed for it (oldest idle first: an HTTP/1.1 connection between
requests, an HTTP/2 connection without a stream, a Responses WebSocket without a turn; see
`IdleMark`), so kept-alive connections cannot hold every place. An `Admit` predicate
(``allow_from``) closes a connection from a refused address before anything is read from it,
and past `ServerLimits.max_connections_per_address` one address's own idle connection makes
room, or with none idle the new one is answered 503 (``gw.listen.address_busy``) before
anything is read.

A `DoorHook` (the gateway's door, twserve/app/door.py) runs around the accept loops with the
listening sockets and the count of clients accepted from them (`Server.accepted`, which with the
accept queue's length tells how long new clients wait there): it may take new connections from
them on a thread of its own (while the loop is behind), and it has stopped before the sockets
close.

`Server.drain` stops accepting, lets what runs finish within a grace, and cancels the rest.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import anyio
import anyio.abc

from twserve.server._anyio_fastpath import accepted_stream
from twserve.server.base import (
    Admit,
    BodyBudget,
    ErrorWriter,
    Handler,
    HeadCheck,
    ServerLimits,
    Switch,
    TaskSet,
    plain_error,
)
from twserve.server.http1 import Connection

log = logging.getLogger("twserve.server.listener")

__all__ = ["DoorHook", "DoorState", "ListenError", "Server", "listen", "serve", "serve_listener"]


class DoorState(Protocol):
    """What the accept loops read of a running door: whether it takes the new clients now."""

    @property
    def taking(self) -> bool: ...


# Entered around the accept loops with the listening sockets and the count of clients accepted
# from them (module docs).
DoorHook = Callable[[Sequence[socket.socket], Callable[[], int]], AbstractContextManager[DoorState]]
# While the door takes the new clients, how long an accept loop waits before it looks again.
DOOR_WAIT = 0.01

# Read and dropped while a refused connection lingers.
READ_SIZE = 65536
# How long a connection refused at accept (its address is at its cap) waits for the client to
# close: short, since it holds a place under max_connections meanwhile.
REFUSED_LINGER_SECS = 0.5
# accept() failing for want of descriptors or memory: wait, doubling, up to the last value.
ACCEPT_BACKOFF = (0.01, 1.0)
# Connections taken from the backlog in one loop turn, beyond the one `accept` returned.
ACCEPT_BATCH = 64
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class ListenError(Exception):
    """The server cannot listen where it was told: the address does not resolve
    (``gw.listen.bind_unresolved``) or cannot be bound (``gw.listen.cannot_bind``)."""

    def __init__(self, code: str, host: str, port: int, detail: str) -> None:
        super().__init__(f"{code}: cannot listen on {host}:{port}: {detail}")
        self.code = code
        self.host = host
        self.port = port
        self.detail = detail


async def listen(
    host: str, port: int, *, reuse_port: bool = False
) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    """A TCP listener on `host:port`; `ListenError` (one line, with a code) when there is none.
    `reuse_port`: shared with other processes that bind it so (``serve --workers``)."""
    try:
        return await anyio.create_tcp_listener(
            local_host=host, local_port=port, reuse_port=reuse_port
        )
    except socket.gaierror as exc:
        raise ListenError(
            "gw.listen.bind_unresolved", host, port, f"{host!r} does not resolve ({exc.strerror})"
        ) from None
    except OSError as exc:
        raise ListenError("gw.listen.cannot_bind", host, port, exc.strerror or str(exc)) from None


def _connection_failed(exc: BaseException) -> None:
    """A connection's task raised: a bug, logged; the server serves on."""
    log.error("connection failed", exc_info=exc)


class Server:
    """Serves one listener; `drain` stops accepting and lets requests in progress finish.

    Connections run in tasks of their own (`TaskSet`), apart from the accept loop, so that the
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
        door: DoorHook | None = None,
    ) -> None:
        self.handler = handler
        self.door = door
        self.limits = limits or ServerLimits()
        self.errors = errors
        self.switches = switches
        self.check_head = check_head
        self.admit = admit
        # Shared with the process's other servers when given (the gateway and its control
        # plane hold one budget between them).
        self.budget = budget or BodyBudget(self.limits.body_budget_bytes)
        self.connections: set[Connection] = set()
        # Connections accepted and not yet ended (counted at accept, before their task runs).
        self.open_count = 0
        # Clients taken from the listening sockets so far (the door reads it, module docs).
        self.accepted = 0
        # Connections open per client address, with max_connections_per_address.
        self.per_address: dict[str, int] = {}
        # Made on the event loop, in serve_listener (anyio objects need a running loop).
        self._accepting: anyio.CancelScope | None = None
        self._all: anyio.CancelScope | None = None
        self._idle: anyio.Event | None = None  # set when the last connection ends
        self._room: anyio.Event | None = None  # set when a connection ends
        self._draining = False
        # Each connection's task, under its own cancel scope (twserve.server.base).
        self._tasks = TaskSet(_connection_failed)

    async def serve_listener(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        if self._draining:
            return
        self._accepting = anyio.CancelScope()
        self._all = anyio.CancelScope()
        # anyio's TCP listener is one listener per address family (a MultiListener).
        listeners: list[anyio.abc.SocketListener] = list(
            getattr(listener, "listeners", None) or [listener]
        )
        raw = [
            sock
            for one in listeners
            if (sock := one.extra(anyio.abc.SocketAttribute.raw_socket, None)) is not None
        ]
        with self._all:
            async with self._tasks:  # the connections
                door = self.door(raw, self._accepted) if self.door else nullcontext(None)
                with self._accepting, door as at_door:
                    async with anyio.create_task_group() as loops:
                        for one in listeners:
                            loops.start_soon(self._accept_loop, one, at_door)
                # Accepting stopped (drain): close the listening socket so new clients are
                # refused at once; the connections finish (`_all` cancelled cancels them).
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a connection's `work` in a task of its own (twserve.server.base), under a cancel
        scope made now: a stop that comes before the task runs cancels it too."""
        self._tasks.start_scoped(work)

    async def _accept_loop(
        self, listener: anyio.abc.SocketListener, door: DoorState | None = None
    ) -> None:
        backoff = 0.0
        cap = self.limits.max_connections
        raw: socket.socket | None = listener.extra(anyio.abc.SocketAttribute.raw_socket, None)
        while True:
            if cap is not None and self.open_count >= cap:
                await self._make_room(listener, cap)
                continue
            try:
                if raw is not None:
                    sock = await _accept_beside(raw, door)
                    if sock is None:
                        continue  # the door (or another worker) took that client
                    self.accepted += 1
                    stream = await _stream_of(sock)
                    if stream is None:
                        continue  # it reset while it waited
                else:
                    stream = await listener.accept()
                    self.accepted += 1
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
            self._start(self._run(stream))
            if door is None or not door.taking:
                self._accept_waiting(listener, cap)

    def _accept_waiting(self, listener: anyio.abc.SocketListener, cap: int | None) -> None:
        """Take the connections already waiting in the backlog in this same loop turn, up to
        `ACCEPT_BATCH` (and the cap): one ``accept`` per loop turn lets clients time out in the
        backlog when a turn carries thousands of streams. Each is wrapped in its own task; an
        error here is left for the next ``accept`` to meet."""
        raw: socket.socket | None = listener.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if raw is None:
            return
        for _ in range(ACCEPT_BATCH):
            if cap is not None and self.open_count >= cap:
                return
            try:
                sock, _addr = raw.accept()
            except OSError:  # nothing waiting (BlockingIOError), or an error accept will see
                return
            self.accepted += 1
            sock.setblocking(False)
            self.open_count += 1
            self._start(self._run_accepted(sock))

    def _accepted(self) -> int:
        return self.accepted

    async def _run_accepted(self, sock: socket.socket) -> None:
        try:
            stream = await _stream_of(sock)
        except BaseException:
            self.open_count -= 1
            raise
        if stream is None:
            self.open_count -= 1
            return
        await self._run(stream)

    async def _make_room(self, listener: anyio.abc.SocketListener, cap: int) -> None:
        """At the connection cap. New clients stay in the kernel's backlog; once one waits
        there, the connection idle longest is closed to make room for it (idle connections
        must not hold every place while a request waits). With none idle, this waits until a
        connection ends or goes idle."""
        await _client_waiting(listener)
        # Made once a client waits, not before: a connection that went idle while none waited
        # must not count as room made for this one.
        room = self._room
        if room is None or room.is_set():
            # One event for every accept loop (a listener per address family) that waits.
            room = self._room = anyio.Event()
        if self.open_count < cap:
            return  # one ended meanwhile
        # One closed for the waiting client is enough: it may take a moment to end (its last
        # frames linger for the client's close), and meanwhile no other is closed for it.
        closing = any(conn.idle.evicted for conn in self.connections)
        victim = None if closing else self._longest_idle(None)
        if victim is not None:
            log.debug(
                "at max_connections (%d): closing an idle connection of %s", cap, victim.peer[0]
            )
            victim.evict()
        await room.wait()  # the evicted connection ends; or another ends or goes idle

    def _longest_idle(self, host: str | None) -> Connection | None:
        """The connection (of client address `host`, or of any) that has waited longest for
        its next request, not yet being closed."""
        best: Connection | None = None
        best_since = math.inf
        for conn in self.connections:
            since = conn.idle.since
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
            conn = Connection(
                stream,
                self.handler,
                self.limits,
                self.errors,
                self.switches,
                check_head=self.check_head,
                budget=self.budget,
            )
            conn.idle.notify = self._went_idle
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
            conn.drain()
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


async def _accept_beside(raw: socket.socket, door: DoorState | None) -> socket.socket | None:
    """The next client of `raw` (non-blocking), for `accepted_stream`'s lighter stream: the loop
    waits for one to arrive and, beside a door, leaves it to the door while the door takes
    clients (the loop is behind; it would only make the client wait). None when another took it
    first; OSError as ``accept`` raises it."""
    while True:
        await anyio.wait_readable(raw)
        if door is None or not door.taking:
            break
        await anyio.sleep(DOOR_WAIT)
    try:
        sock, _addr = raw.accept()
    except BlockingIOError:
        return None
    sock.setblocking(False)
    return sock


async def _stream_of(sock: socket.socket) -> anyio.abc.SocketStream | None:
    """Accepted `sock` (non-blocking) as an anyio stream, with TCP_NODELAY; None, closed, when
    the client reset it while it waited (that one client's trouble)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return await accepted_stream(sock)
    except OSError:
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise


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
