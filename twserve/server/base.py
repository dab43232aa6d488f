"""The vocabulary every transport shares: what a handler sees, and what a server is told.

A handler is ``async def handler(request: Request, responder: Responder) -> None``. It calls
`Responder.start` once, `Responder.send` for each piece of the body as it becomes available,
and `Responder.end`. `Responder.abort` drops the connection mid-answer (used by the mock
upstream to play a broken stream, and by the gateway when the client's stream cannot be ended
cleanly any other way). A handler's write raises `ClientGone` once the client has left; the
relay takes that as the client leaving.

Around the handler, a server is given its bounds (`ServerLimits`), a check of each request's
head before its body is read (`HeadCheck`, answering with a `HeadRefusal`), a check of each new
connection's address (`Admit`), the bytes of bodies it may hold (`BodyBudget`), how to write the
errors it answers itself (`ErrorWriter`), and the protocols a connection may be handed to
(`Switch`, given a `Handoff`). HTTP/1.1 (twserve/server/http1.py), HTTP/2
(twserve/server/http2.py) and the WebSockets (twserve/server/websocket.py,
twserve/gateway/realtime.py) all speak it; nothing here knows one protocol from another.

**Tasks started by the thousand** — a connection's (twserve/server/listener.py, one per client
connection), an HTTP/2 stream's handler (twserve/server/http2.py) and an upstream attempt's
reader (twserve/relay/loop.py, one or two per request) — run in a `TaskSet`, not an anyio task
group. A group gives every task a task handle with a cancel scope and an event of its own, a
wrapper coroutine, a task state and a done callback, and enters two more scopes for itself:
measured, about three times the CPU of a plain asyncio task and 2–3 KiB more per task
(docs/benchmarks.md, "Tasks without a task group"). A `TaskSet` is what these need of a group:

* **Cancelling** is anyio's. Each task runs its work under an anyio cancel scope of its own,
  given to `TaskSet.start` (a reader's is its attempt's scope, an HTTP/2 stream's its
  `H2Stream.scope`; `TaskSet.start_scoped` makes one), and `TaskSet.join` with ``cancel``
  cancels those scopes. anyio delivers that as any other cancellation, so a shielded section
  in the task (a socket's close, the request row's write) still runs to its end. A cancel scope
  around the owner does not reach these tasks (tasks it did not start): the owner cancels them
  itself when it ends early.
* **Waiting.** `TaskSet.join` returns once every task has ended, as a task group's exit does:
  an owner cancelled while it waits cancels the tasks and still waits for them (shielded).
  ``async with`` a `TaskSet` joins it at the end of the block, as a task group's block does.
* **A task's failure** — an exception the task did not handle, a bug — is kept (the first
  one) and handed to the set's ``failed`` as it happens: the relay raises it
  (`TaskSet.check`), which fails the request as a task group would have; the listener logs it
  and serves on (a task group dropped every connection with it); an HTTP/2 connection logs it
  and ends, as it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from twproto import json_dumps

if TYPE_CHECKING:
    from twengine.attempt import TurnAsSent
    from twproto.formats.openai_responses.state import SocketMemory
    from twserve.upstream.responses_socket import UpstreamSockets

__all__ = [
    "LINGER_SECS",
    "Admit",
    "BodyBudget",
    "ClientGone",
    "ErrorWriter",
    "Handler",
    "Handoff",
    "HeadCheck",
    "HeadRefusal",
    "Headers",
    "IdleMark",
    "Request",
    "Responder",
    "ResponderBase",
    "ServerLimits",
    "Switch",
    "TaskSet",
    "plain_error",
]

Headers = list[tuple[bytes, bytes]]

# How long a closing connection waits for the client to close its side (so that what was
# written last reaches it rather than a reset).
LINGER_SECS = 2.0


@dataclass(slots=True, kw_only=True)
class Request:
    method: str
    target: bytes
    path: str
    query: str
    headers: Headers  # names lower-cased, in arrival order
    body: bytes
    client: tuple[str, int] = ("", 0)
    http_version: str = "1.1"
    extra: dict[str, object] = field(default_factory=dict)
    # A turn of a client's Responses WebSocket: the upstream sockets that client socket keeps
    # (twserve/upstream/responses_socket.py). None for every other request.
    upstream_sockets: UpstreamSockets | None = None
    # The same socket's kept responses, for its turns' previous_response_id
    # (twserve/gateway/conversations.py).
    conversation: SocketMemory | None = None
    # Such a turn as the client sent it, when the gateway expanded its previous_response_id:
    # what an upstream socket holding that response gets instead (gateway/conversations.py).
    as_sent: TurnAsSent | None = None
    # The body already parsed where the server had to read it anyway (a Responses WebSocket
    # turn comes as a JSON message): admission takes it instead of parsing `body` again.
    parsed: dict[str, Any] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Responder(Protocol):
    async def start(self, status: int, headers: Headers) -> None: ...

    async def send(self, data: bytes) -> None: ...

    def ready(self) -> bool:
        """Whether `send_now` may write a piece of the answer at once: the connection takes it
        without waiting, after everything sent before (callable from the event loop's
        callbacks)."""
        ...

    def send_now(self, data: bytes) -> None:
        """Write `data` now, without waiting; only right after `ready` said so."""
        ...

    async def end(self) -> None: ...

    async def abort(self) -> None: ...

    @property
    def started(self) -> bool: ...


Handler = Callable[[Request, Responder], Awaitable[None]]


class ClientGone(Exception):
    """The client closed the connection (or stopped reading) while its answer was written."""


class ResponderBase:
    """What every transport's `Responder` shares: the answer starts once (`_begin`), and it is
    written with `send` unless the transport says otherwise (`ready`, `send_now`)."""

    __slots__ = ("_ended", "_started")

    def __init__(self) -> None:
        self._started = False
        self._ended = False

    @property
    def started(self) -> bool:
        return self._started

    def _begin(self) -> None:
        """Mark the answer started; a second start is the handler's bug."""
        if self._started:
            raise RuntimeError("response already started")
        self._started = True

    def ready(self) -> bool:
        return False  # the transport frames and paces every piece itself, in `send`

    def send_now(self, data: bytes) -> None:
        raise RuntimeError("this transport writes an answer with send, not send_now")


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
class HeadRefusal:
    """An answer from a request's head alone, sent instead of reading its body; the connection
    then closes."""

    status: int
    headers: Headers
    body: bytes


# Called with a request whose head has arrived (body still unread): a refusal, or None to go on.
HeadCheck = Callable[[Request], HeadRefusal | None]
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


class IdleMark:
    """Whether a connection waits, idle, for its client's next request, and since when.

    At its connection caps a server closes the connection idle longest to make room for a new
    client (twserve/server/listener.py): an HTTP/1.1 connection kept alive between requests, an
    HTTP/2 connection without a stream, a Responses WebSocket without a turn. Whoever runs the
    connection marks it (`idle`, `busy`); closing it for a new client drains that one
    connection, as a server's drain would, and `evicted` says why.
    """

    __slots__ = ("evicted", "notify", "since")

    def __init__(self) -> None:
        self.since: float | None = None  # None: busy (or not yet between requests)
        self.evicted = False
        # Told when the connection goes idle: a server waiting at its cap may close it now.
        self.notify: Callable[[], None] | None = None

    def idle(self, now: float) -> None:
        self.since = now
        if self.notify is not None:
            self.notify()

    def busy(self) -> None:
        self.since = None


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
    # The taker marks the connection idle while it has nothing to do, so that the server may
    # close it (by `draining`) for a new client at its connection caps.
    idle: IdleMark = field(default_factory=IdleMark)


# Asked with each request before it is dispatched: a coroutine function that takes the
# connection over (twserve/server/http2.py for h2c; a WebSocket upgrade the same way), or None.
Switch = Callable[[Request], Callable[[Handoff], Awaitable[None]] | None]


class TaskSet:
    """Plain asyncio tasks started and waited for together (see the module docstring,
    "Tasks started by the thousand")."""

    __slots__ = ("_cancel_at_end", "_empty", "_failed", "_tasks", "failure")

    def __init__(
        self,
        failed: Callable[[BaseException], None],
        cancel_at_end: Callable[[], bool] = lambda: False,
    ) -> None:
        self._tasks: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._failed = failed
        self._cancel_at_end = cancel_at_end
        self._empty: asyncio.Future[None] | None = None  # the owner, waiting for the last task
        self.failure: BaseException | None = None  # the first task's unhandled exception

    async def __aenter__(self) -> TaskSet:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        """The owner's body has ended: as a task group's exit, wait for the tasks — cancelled
        when the body raised, or when `cancel_at_end` says so — and raise a task's failure."""
        if exc is None:
            await self.join(cancel=self._cancel_at_end())
            self.check()
        else:
            await self.join(cancel=True)
            self.check(exc)

    def start(self, work: Coroutine[Any, Any, None], scope: anyio.CancelScope) -> None:
        """Run `work`, which does all it does under `scope`, in a task of its own from the next
        loop turn on. A scope cancelled before the task enters it cancels the task there."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[task] = scope
        task.add_done_callback(self._ended)

    def start_scoped(self, work: Coroutine[Any, Any, None]) -> None:
        """`start` for `work` that enters no scope of its own: it runs under a new one."""
        scope = anyio.CancelScope()
        self.start(_under(scope, work), scope)

    def _ended(self, task: asyncio.Task[None]) -> None:
        del self._tasks[task]
        empty = self._empty
        if not self._tasks and empty is not None and not empty.done():
            empty.set_result(None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self.failure is None:
                self.failure = exc
            self._failed(exc)

    @property
    def running(self) -> int:
        """How many of the tasks have not ended yet."""
        return len(self._tasks)

    def check(self, raising: BaseException | None = None) -> None:
        """Raise the first task's failure, if there was one (from `raising`, the exception the
        owner is raising, when that is not the failure itself): as a task group's exit does,
        a failure comes before the owner's own cancellation."""
        failure = self.failure
        if failure is not None and failure is not raising:
            raise failure from raising

    async def join(self, *, cancel: bool) -> None:
        """Return once every task has ended, as a task group's exit does. With `cancel`, the
        tasks' scopes are cancelled first; without, the tasks end on their own, unless the
        owner is cancelled while it waits: then they are cancelled too, and that cancellation
        goes on once they have ended. Waiting after a cancel is shielded."""
        if not cancel:
            try:
                await self._ended_all()
                return
            except BaseException:
                await self.join(cancel=True)
                raise
        for scope in list(self._tasks.values()):
            scope.cancel()
        if not self._tasks:
            return
        with anyio.CancelScope(shield=True):
            await self._ended_all()

    async def _ended_all(self) -> None:
        # One future for the set, not asyncio.wait's callback on every task.
        while self._tasks:  # a task may start another as it ends
            empty = self._empty = asyncio.get_running_loop().create_future()
            try:
                await empty
            finally:
                self._empty = None


async def _under(scope: anyio.CancelScope, work: Coroutine[Any, Any, None]) -> None:
    with scope:
        await work
