"""One HTTP/1.1 upstream connection as an asyncio protocol, and the answer read from it.

The pool (twserve/upstream/h1_pool.py) makes the connection with ``loop.create_connection``. The
request is written by `request_bytes`; the answer is parsed by httptools (llhttp, the parser
of Node.js, in C). h11, which the server side uses, made a Python event and went through its
state machine for every chunk of a chunked body: about 5 µs per SSE event, half the gateway's
CPU per streamed chunk; llhttp takes about 0.1 µs. The event loop calls the protocol as bytes
arrive:

* **Parsed as it arrives.** ``data_received`` feeds the parser at once and keeps the answer's
  head and body pieces; the reader awaits (one future per wait) only when nothing is there, and
  then takes everything that came since as *one* piece, so the relay writes once for what a
  read brought (several SSE events often arrive together). Reading stays on while an answer is read
  (unless the loop is behind, below): no per-read ``resume_reading``/``pause_reading`` (each an
  ``epoll_ctl`` on uvloop) and no cancellation checkpoint per read.
* **Handed on in the callback.** Once the reader has nothing unread and the answer may go
  straight to the client, it hands the connection a `Sink` (`H1Answer.divert`): what a read
  brings is then given to the sink inside ``data_received`` — for a committed passthrough
  stream, translated and written to the client's transport there and then, with no task
  woken and no loop turn in between. A sink that cannot take a piece now (the client's buffer
  is full) returns False; the piece is kept for the reader as before, and so is everything
  after it until the reader has taken it, so the order never changes. A sink that raises
  leaves its error for the reader (`__anext__` raises it).
* **Bounded.** When more than `PAUSE_BYTES` of body is kept unread (a reader slower than its
  upstream, a slow client behind it), reading pauses, and resumes once the reader has taken
  it: the connection holds at most that plus one socket read.
* **One read a turn while the loop is behind.** uvloop's poll reads ready sockets again and
  again (up to 48 rounds of 1,024 events) before it runs a task or a timer; with thousands of
  streams on a full core that is a second and more in which no request moves. Given
  `ReadTurns` (while the loop lags), a connection that reads more than `ReadTurns.behind`
  seconds after the turn's first read pauses its reading after that read, and every paused one
  resumes in the loop's next turn (one ``call_soon``): a busy turn then reads each socket about
  once, and what waits in the kernel comes together in the next read.
* **Written directly.** A request goes out with one ``transport.write``; only when the
  transport's buffer is above its high-water mark (``pause_writing``) does the writer wait for
  it to drain, under the write timeout.
* **Liveness known, not polled.** An idle connection (between answers) that the upstream closes
  (``eof_received``, ``connection_lost``) or sends anything unasked for is marked unfit and
  closed there and then; the pool drops it instead of using it (`H1Connection.fit`).
* **Outcomes.** A connection that breaks or is closed wakes the reader: before the answer's
  head it is `UpstreamUnreachable` (``RESET_BEFORE_HEAD``, the pool's mapping), after it
  `UpstreamBroken`, always after the body that came before the break. So is an answer the
  parser refuses, a head over `MAX_HEAD_BYTES`, a switch of protocols, and a body cut short of
  its ``Content-Length`` or last chunk; a body with neither ends at the end of file.
* **Reuse.** The connection may carry another request once the answer was read to its end,
  the parser says the upstream keeps it alive (HTTP/1.1 without ``Connection: close``, a
  framed body) and nothing came after the answer. Informational (1xx) heads are skipped;
  after one the connection is not reused.

Futures are only ever given a result (never an exception), so a reader cancelled while it waits
leaves nothing unretrieved; a cancelled reader's connection is closed by the pool, never reused.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import cast

import anyio
import httptools

from twserve.upstream.errors import UpstreamBroken

__all__ = [
    "MAX_HEAD_BYTES",
    "PAUSE_BYTES",
    "WRITE_TIMEOUT",
    "H1Answer",
    "H1Connection",
    "ReadTurns",
    "RequestHeadError",
    "Sink",
    "request_bytes",
]

# Unread body kept past this pauses reading until the reader has taken it.
PAUSE_BYTES = 64 * 1024
WRITE_TIMEOUT = 60.0
# The largest response head kept before it is complete (httpcore's figure).
MAX_HEAD_BYTES = 100 * 1024

Origin = tuple[str, str, int]

_CLOSED = "the upstream closed the connection"
_TOO_LARGE = "the response head is too large"

# Takes a piece of the body in the event loop's callback (True), or leaves it for the reader.
Sink = Callable[[bytes], bool]
Headers = list[tuple[bytes, bytes]]

# RFC 9110: a field name is a token; a value has no control characters but tab.
_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class RequestHeadError(ValueError):
    """A request whose head cannot be written (a name, value or target HTTP/1.1 forbids)."""


def request_bytes(
    method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """The request as it goes on the wire: head, then `body` (`headers` carry its framing).
    Raises `RequestHeadError` for what would split or corrupt the head."""
    if _TARGET.fullmatch(target) is None or _NAME.fullmatch(method) is None:
        raise RequestHeadError(f"request line {method!r} {target!r} cannot be sent")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        if _NAME.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise RequestHeadError(f"header {name!r} cannot be sent")
        parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


class WriteTimeout(Exception):
    """The request could not be handed to the transport within `WRITE_TIMEOUT`."""


class ReadTurns:
    """Upstream reads paced to one per loop turn while the loop is behind (module docs).

    While `engaged` (the loop-lag sampler's last sample was at least half of `behind`), or while
    a read comes more than `behind` seconds past `due` (when the sampler's sleep under way
    should end: the poll under way has run that long), the first read of a turn schedules the
    turn's end (one ``call_soon``: it runs when the loop next runs its ready callbacks, after
    this poll). A read that comes more than `behind` seconds after that first one, while the
    poll still has not ended, pauses its connection until then.
    """

    __slots__ = ("_due", "_held", "_since", "behind", "clock", "engaged", "held_total")

    def __init__(
        self,
        due: Callable[[], float | None] = lambda: None,
        *,
        behind: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._due = due
        self.behind = behind
        self.clock = clock
        # Set by the loop-lag sampler (twserve/app/loop_lag.py).
        self.engaged = False
        self._since: float | None = None  # the turn's first read, while its end is pending
        self._held: list[H1Connection] = []
        self.held_total = 0  # reads paused to the next turn since start

    def read(self, conn: H1Connection, loop: asyncio.AbstractEventLoop) -> bool:
        """`conn` has read: True if it is to pause until the loop's next turn (`turn_over`)."""
        now = self.clock()
        if not self.engaged:
            due = self._due()
            if due is None or now - due <= self.behind:
                return False  # a loop that keeps up: nothing to pace
        since = self._since
        if since is None:
            self._since = now
            loop.call_soon(self._turn_ends)
            return False
        if now - since <= self.behind:
            return False
        self._held.append(conn)
        self.held_total += 1
        return True

    def _turn_ends(self) -> None:
        self._since = None
        held, self._held = self._held, []
        for conn in held:
            conn.turn_over()


class H1Connection(asyncio.Protocol):
    """One upstream connection: its transport, its parser, and what has arrived."""

    __slots__ = (
        "_active",
        "_arrived",
        "_drain",
        "_framed",
        "_head_seen",
        "_head_size",
        "_headers",
        "_parser",
        "_pieces",
        "_read_paused",
        "_reusable",
        "_turn_held",
        "_turns",
        "_unread",
        "_waiter",
        "_write_paused",
        "done",
        "failure",
        "fit",
        "head",
        "idle_until",
        "loop",
        "lost",
        "origin",
        "sink",
        "sink_error",
        "transport",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, turns: ReadTurns | None = None
    ) -> None:
        self.loop = loop
        self.origin = origin
        self._turns = turns
        self._turn_held = False  # reading paused until the loop's next turn (`ReadTurns`)
        self.idle_until = 0.0
        self.transport: asyncio.Transport | None = None
        # False once the connection is closed, or broke or was sent something while idle.
        self.fit = True
        # An answer is being read: what arrives is parsed.
        self._active = False
        self._parser: httptools.HttpResponseParser | None = None
        self.head: tuple[int, Headers] | None = None  # status and headers, once complete
        self._headers: Headers = []
        self._head_seen = 0  # bytes fed before the head was complete
        self._head_size = 0  # the head's headers, as counted on the wire
        self._framed = False  # the head gave a Content-Length or Transfer-Encoding
        self._reusable = False  # the parser said keep-alive when the answer ended
        self._pieces: list[bytes] = []
        self._arrived = 0  # body bytes the read being parsed brought
        self._unread = 0
        self.done = False  # the answer's end has arrived
        self.failure: str | None = None  # why the answer broke off, after `_pieces`
        self.lost = False  # connection_lost was called
        self._read_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        # Given the body as it arrives while the reader has nothing unread (`H1Answer.divert`).
        self.sink: Sink | None = None
        self.sink_error: Exception | None = None

    # -- the event loop's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._active:
            # Idle (or the answer ended): nothing was asked for.
            self.fit = False
            if self.transport is not None:
                self.transport.abort()
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        self.fit = False
        if self._active:
            self._end_of_file()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.fit = False
        self.lost = True
        if self._active:
            if exc is not None:
                self._fail(str(exc) or type(exc).__name__)
            else:
                self._end_of_file()
            if not self.done:
                self._fail(_CLOSED)
        self._wake()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- the parser's calls (httptools)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head is None:
            self._headers.append((name, value))
            self._head_size += len(name) + len(value) + 4
            if name.lower() in _FRAMING:
                self._framed = True

    def on_headers_complete(self) -> None:
        if self.head is not None:
            return  # a second answer in the same read: `on_message_begin` marked it
        assert self._parser is not None
        status = self._parser.get_status_code()
        if status < 200:
            # Informational: the answer's own head follows.
            self._headers = []
            self._framed = False
            return
        if self._head_size > MAX_HEAD_BYTES:
            self._fail(_TOO_LARGE)
            return
        self.head = (status, self._headers)

    def on_body(self, body: bytes) -> None:
        if body and self.head is not None and not self.done:
            self._pieces.append(body)
            self._arrived += len(body)

    def on_message_begin(self) -> None:
        if self.done:
            self.fit = False  # something after the answer: the connection is not reused

    def on_message_complete(self) -> None:
        if self.done or self.head is None:
            return
        assert self._parser is not None
        self.done = True
        self._reusable = self._parser.should_keep_alive()
        self._active = False  # anything after it is unasked for

    # -- parsing

    def _feed(self, data: bytes) -> None:
        parser = self._parser
        assert parser is not None
        self._arrived = 0
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the upstream switched protocols")
        except httptools.HttpParserError as exc:
            if self.done:
                self.fit = False  # garbage after the answer
            else:
                self._fail(str(exc) or type(exc).__name__)
        if self.head is None and self.failure is None:
            # A head not complete after this much is refused before it is all kept (its
            # headers' total is checked when it is complete, `on_headers_complete`).
            self._head_seen += len(data)
            if self._head_seen > MAX_HEAD_BYTES:
                self._fail(_TOO_LARGE)
        size = self._arrived
        if size and (self.sink is None or self._unread or not self._hand_on(self._pieces)):
            self._unread += size
            if self._unread > PAUSE_BYTES and not self._read_paused and self.transport:
                self._read_paused = True
                self.transport.pause_reading()
        # With a sink, the reader is woken only for what it has to do: a piece the sink left,
        # the end, a break, the sink's error.
        if self.sink is None or self._unread or self.done or self.failure is not None:
            self._wake()
        turns = self._turns
        if (
            turns is not None
            and self._active
            and not self._read_paused
            and not self._turn_held
            and self.transport is not None
            and turns.read(self, self.loop)
        ):
            self._turn_held = True
            self.transport.pause_reading()

    def turn_over(self) -> None:
        """The loop's next turn after `ReadTurns.read` held this connection: read again, unless
        paused for unread body (`take` resumes that) or gone."""
        self._turn_held = False
        if not self._read_paused and not self.lost and self.transport is not None:
            self.transport.resume_reading()

    def _hand_on(self, pieces: list[bytes]) -> bool:
        """Give what this read brought (all of `pieces`: nothing older is unread) to the sink;
        False if it left them for the reader."""
        sink = self.sink
        assert sink is not None
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        try:
            taken = sink(data)
        except Exception as exc:  # the reader raises it; the piece is not offered again
            self.sink = None  # (which also wakes the reader)
            self.sink_error = exc
            taken = True
        if taken:
            pieces.clear()
        return taken

    def _end_of_file(self) -> None:
        """The upstream closed its side: the end of a body framed by nothing else, else a cut."""
        if self.done or self.failure is not None:
            return
        if self.head is not None and not self._framed:
            self.done = True
            self._reusable = False
            self._active = False
        else:
            self._fail(_CLOSED)

    def _fail(self, why: str) -> None:
        if self.failure is None and not self.done:
            self.failure = why
        self._active = False
        self.fit = False

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the pool's and the reader's calls

    def start(self, data: bytes) -> None:
        """Start an exchange: write the request `data` and read what comes back. A connection
        that is closed or breaks is left for the read to report (an upstream may answer before
        reading all of the request)."""
        self._parser = httptools.HttpResponseParser(self)
        self.head = None
        self._headers = []
        self._head_seen = 0
        self._head_size = 0
        self._framed = False
        self._reusable = False
        self.done = False
        self.failure = None
        self.sink = None
        self.sink_error = None
        self._pieces = []
        self._unread = 0
        self._active = True
        transport = self.transport
        if transport is None or self.lost or not self.fit:
            self._fail(_CLOSED)
            return
        try:
            transport.write(data)
        except (OSError, RuntimeError) as exc:  # uvloop raises on a transport that just closed
            self._fail(str(exc) or type(exc).__name__)

    async def send(self, data: bytes) -> None:
        """`start`, then wait for the transport to take the request if its buffer is full;
        raises `WriteTimeout` if it does not drain in time."""
        self.start(data)
        if self._write_paused and not self.lost and self.failure is None:
            drain = self._drain = self.loop.create_future()
            try:
                with anyio.fail_after(WRITE_TIMEOUT):
                    await drain
            except TimeoutError as exc:
                raise WriteTimeout from exc
            finally:
                self._drain = None

    async def wait(self) -> None:
        """Until something arrives (or the connection ends)."""
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """The body pieces that arrived since the last call, joined; resumes a paused read."""
        pieces = self._pieces
        if not pieces:
            return b""
        self._pieces = []
        self._unread = 0
        if self._read_paused:
            self._read_paused = False
            if self.transport is not None and not self.lost and not self._turn_held:
                self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def next_cycle(self) -> bool:
        """Ready the connection for another request if the last exchange ended cleanly, the
        upstream keeps the connection alive and nothing came after the answer."""
        if not self.fit or self._active or not self.done or not self._reusable:
            return False
        self.take()  # drop what the reader left, and read again if that was paused
        self.head = None
        self.sink = None
        self._parser = None
        return True

    def close(self) -> None:
        """Close the connection now (no clean-up to wait for)."""
        self.fit = False
        self._active = False
        self.sink = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.abort()


class H1Answer:
    """An answer whose head has arrived; `chunks` reads the body, one piece per arrival."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: H1Connection, head: tuple[int, Headers]) -> None:
        self.status, self.headers = head
        self._conn = conn

    def chunks(self) -> H1Answer:
        """The body as it arrives; raises `UpstreamBroken` if it breaks off."""
        return self

    def __aiter__(self) -> H1Answer:
        return self

    def divert(self, sink: Sink) -> bool:
        """From now on, give `sink` what arrives while nothing is left unread (see the module
        docs); what it does not take, `chunks` reads as before."""
        conn = self._conn
        if not conn._active:
            return False  # the answer has ended or broken off: nothing more arrives
        conn.sink = sink
        return True

    async def __anext__(self) -> bytes:
        conn = self._conn
        while True:
            if conn.sink_error is not None:  # before what arrived after it
                error, conn.sink_error = conn.sink_error, None
                raise error
            piece = conn.take()
            if piece:
                return piece
            if conn.failure is not None:
                raise UpstreamBroken(conn.failure)
            if conn.done:
                raise StopAsyncIteration
            await conn.wait()
