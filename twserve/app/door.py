"""The door: new clients turned away from a thread of its own while the event loop is behind.

A loop that is behind cannot refuse quickly: reading a new client's head and writing 503 take a
task's several turns of the loop, and each turn waits behind every stream's chunks (with uvloop,
up to 48 polls of 1,024 socket events before any task runs: about a second at 2,500 streams on
one core). Shedding decided on the loop (twengine.shedding) therefore answers late, just when it
matters. The door does not wait for the loop: a thread watches the loop's lag as it stands
(`twengine.shedding.LoadGauge.at_door`, read every `TICK`), and how long the oldest client in
the listening sockets' accept queues has waited (`twengine.shedding.BacklogWait`, from the
queue's length, `queued`, and the loop's count of accepts, the `accepted` it is given). Once two
looks in a row find either at ``listen.gateway.shed_loop_lag_ms`` or over (the lag only on a
loop already lagging: one look right after a pause of the whole process would see the loop late
just as it catches up), and for as long as it stays so, the door takes
the new connections from the listening sockets itself, reads each head (up to `HEAD_MAX` bytes,
for at most `HEAD_WAIT`), and answers it: the caller checks' refusal when the head earns one
(401 for a wrong key, as the loop would say), else 503 ``gw.overloaded`` with
``Retry-After: 1``, in the client's format (twserve.gateway.callers.door_refusal). An HTTP/2
client (its preface) is sent GOAWAY with no stream processed instead, which its client retries.
The answer goes out, the thread stops writing, reads what the client still sends for up to
`LINGER` seconds (so that closing does not reset the answer away), and closes.

While the loop keeps up the door takes nothing: the loop's own accept serves every client, and
the thread only wakes when the loop could be behind by the bound at the soonest
(`LoadGauge.door_wakes`: the lag sampler's sleep due plus the bound, a quarter of the bound
at the latest), every `TICK` while clients wait in the queue, or every `TICK` without that
hint.
While the door takes (`Door.taking`), the loop's accept leaves the waiting clients to it
(twserve/server/listener.py): otherwise the loop would accept them the moment they arrive and
only get to them a second later. The loop reads nothing of the thread's but `Door.taking` and
the count of refusals (`LoadGauge.shed_at_door`); the thread stops, with its clients closed,
before the listening sockets close (`Server` enters it around its accept loops).
docs/operations.md, "Shedding load", has the operator's view.
"""

from __future__ import annotations

import contextlib
import errno
import http
import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h11

from twengine.shedding import BacklogWait
from twproto.errors import GatewayError
from twserve.server.base import Admit, HeadRefusal, Request

__all__ = [
    "ACCEPT_BATCH",
    "HEAD_MAX",
    "HEAD_WAIT",
    "LINGER",
    "MAX_HELD",
    "TICK",
    "Door",
    "door",
    "http1_answer",
    "parse_head",
    "queued",
]

log = logging.getLogger("twserve")

#: Seconds between the thread's looks at the loop's lag while the loop keeps up.
TICK = 0.01
#: Seconds a turned-away client's head is waited for; after that it is answered in the default
#: format (OpenAI's).
HEAD_WAIT = 0.05
#: Bytes of a turned-away client's head read at most.
HEAD_MAX = 16384
#: Seconds the thread reads (and drops) what a client still sends after its answer.
LINGER = 0.5
#: Connections taken from one listening socket per look.
ACCEPT_BATCH = 64
#: Connections the door holds at most (heads being read, answers lingering); more wait in the
#: kernel's backlog for the next look.
MAX_HELD = 1024

_WAKE = object()  # the selector's mark for the stop socket
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# The loop's lag as it stands, at monotonic now, and how long (seconds) the oldest client in
# the accept queue has waited: the refusal every new client gets now, or None (loop keeps up).
Behind = Callable[[float, float], GatewayError | None]
# While the loop keeps up: when the door need look again at the soonest (monotonic), from the
# same two.
Wakes = Callable[[float, float], float]
# The answer to a turned-away client: its head (None when none could be read) and the refusal.
Answer = Callable[[Request | None, GatewayError], HeadRefusal]


@dataclass(slots=True)
class _Client:
    """A connection the door took: its head being read, then its answer's linger."""

    sock: socket.socket
    refusal: GatewayError
    deadline: float  # monotonic: head wait, then linger
    data: bytearray = field(default_factory=bytearray)
    answered: bool = False


class Door:
    """The thread that turns new clients away while the loop is behind (module docs)."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        *,
        behind: Behind,
        answer: Answer,
        admit: Admit | None = None,
        wakes: Wakes | None = None,
        accepted: Callable[[], int] | None = None,
        queue: Callable[[socket.socket], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sockets = list(sockets)
        self.behind = behind
        self.wakes = wakes
        # The loop's count of clients it accepted from `sockets` (read from this thread), and
        # how many wait in one socket's accept queue (None: not known on this platform). Both
        # are needed for the queue's wait; without `accepted` only the lag counts.
        self.accepted = accepted
        self.queue = queue or queued
        self.answer = answer
        self.admit = admit
        self.clock = clock
        self.turned_away = 0  # connections answered at the door
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="twserve-door", daemon=True)
        self._clients: dict[int, _Client] = {}
        self._selector = selectors.DefaultSelector()
        # Written by `stop`, so that a thread asleep until its next look wakes at once.
        self._wake, self._waker = socket.socketpair()
        self._selector.register(self._wake, selectors.EVENT_READ, _WAKE)
        self._taking = False  # the door takes the new clients (the loop is behind)
        self._watching = False  # the listening sockets are in the selector
        self._seen_behind = False  # the last look found the loop behind
        self._taken = 0  # clients this thread accepted (the queue empties by them too)
        self._waits = BacklogWait()
        self.waited = 0.0  # the last look's: seconds the oldest queued client has waited
        self._queued = False  # the last look found clients in the accept queue

    @property
    def taking(self) -> bool:
        """Whether the door takes the new clients now (the accept loops leave them to it)."""
        return self._taking

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the connections it holds."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._waker.send(b"\0")
        if self._thread.is_alive():
            self._thread.join(1.0)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                now = self.clock()
                self.waited = self._queue_wait(now)
                refusal = self.behind(now, self.waited)
                # Behind on two looks in a row, a `TICK` apart: one look just after the GIL
                # came back (a collection, another thread's long step) may find the lag
                # sampler late while the loop is about to catch up at once.
                behind, seen = refusal is not None, self._seen_behind
                self._seen_behind = behind
                if not (behind and (seen or self._taking)):
                    refusal = None
                self._taking = refusal is not None
                # Holding `MAX_HELD`, the door leaves the rest in the backlog (still its own:
                # the loop's accept keeps off while it takes) until some are done.
                self._watch(self._taking and len(self._clients) < MAX_HELD)
                for key, _ in self._selector.select(self._timeout(now)):
                    if key.data is _WAKE:
                        continue  # stopping
                    if key.data is None:
                        if refusal is not None:
                            self._take(key.fileobj, refusal)  # type: ignore[arg-type]
                    else:
                        self._progress(key.data)
                self._expire(self.clock())
        except Exception:  # the door must never take the gateway down: the loop still accepts
            log.exception("gw.listen.door_failed: the door thread stopped")
        finally:
            for client in list(self._clients.values()):
                self._close(client)
            self._selector.close()
            self._wake.close()
            self._waker.close()

    def _queue_wait(self, now: float) -> float:
        """Seconds the oldest client in the accept queues has waited at least (0: none waits,
        or it is not known)."""
        if self.accepted is None:
            return 0.0
        taken = self.accepted() + self._taken  # the count first (`BacklogWait`)
        total = 0
        for sock in self.sockets:
            waiting = self.queue(sock)
            if waiting is None:
                return 0.0
            total += waiting
        self._queued = total > 0
        return self._waits.look(now, taken, total)

    def _timeout(self, now: float) -> float:
        if not self._clients:
            # Clients queued: looked at every `TICK` until the loop has taken them, so that one
            # who waits is seen waiting the bound within a look of it.
            if self._taking or self._seen_behind or self._queued or self.wakes is None:
                return TICK
            # The loop keeps up: no look is needed before it could be behind by the bound.
            return max(TICK, self.wakes(now, self.waited) - now)
        soonest = min(c.deadline for c in self._clients.values())
        return max(0.0, min(TICK, soonest - now))

    def _watch(self, on: bool) -> None:
        if on == self._watching:
            return
        for sock in self.sockets:
            if on:
                self._selector.register(sock, selectors.EVENT_READ, None)
            else:
                self._selector.unregister(sock)
        self._watching = on

    def _take(self, listening: socket.socket, refusal: GatewayError) -> None:
        for _ in range(min(ACCEPT_BATCH, MAX_HELD - len(self._clients))):
            try:
                sock, addr = listening.accept()
            except OSError:  # none waiting (the loop took it), or an error its accept will see
                return
            self._taken += 1
            host = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            if self.admit is not None and not self.admit(host):
                sock.close()  # refused by address, as the loop would: nothing is read
                continue
            sock.setblocking(False)
            client = _Client(sock, refusal, self.clock() + HEAD_WAIT)
            self._clients[sock.fileno()] = client
            self._selector.register(sock, selectors.EVENT_READ, client)
            self.turned_away += 1

    def _progress(self, client: _Client) -> None:
        try:
            data = client.sock.recv(HEAD_MAX)
        except BlockingIOError:
            return
        except OSError:
            self._close(client)
            return
        if client.answered:
            if not data:
                self._close(client)
            return  # lingering: what it still sends is dropped
        client.data += data
        if not data or _head_complete(client.data):
            self._send_answer(client)

    def _expire(self, now: float) -> None:
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            if client.answered:
                self._close(client)
            else:
                self._send_answer(client)  # no whole head in time: answered from what came

    def _send_answer(self, client: _Client) -> None:
        data = bytes(client.data)
        if data.startswith(_H2_PREFACE[:16]):  # "PRI * HTTP/2.0\r\n": an HTTP/2 client
            out = _goaway(client.refusal)
        else:
            try:
                out = http1_answer(
                    self.answer(parse_head(data, _peer(client.sock)), client.refusal)
                )
            except Exception:  # that one client's answer: the door goes on for the others
                log.exception("gw.listen.door_failed: no answer for a client at the door")
                self._close(client)
                return
        client.answered = True
        client.deadline = self.clock() + LINGER
        try:
            client.sock.send(out)  # a few hundred bytes into a fresh socket's buffer
            client.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                log.debug("door: answer not sent: %s", exc)
            self._close(client)

    def _close(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd >= 0 and self._clients.pop(fd, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(client.sock)
        client.sock.close()


@contextlib.contextmanager
def door(
    sockets: Sequence[socket.socket],
    *,
    behind: Behind,
    answer: Answer,
    admit: Admit | None,
    wakes: Wakes | None = None,
    accepted: Callable[[], int] | None = None,
) -> Iterator[Door]:
    """A running `Door` on `sockets` for the block's length (stopped, its clients closed, at its
    end, before the sockets close)."""
    keeper = Door(
        sockets, behind=behind, answer=answer, admit=admit, wakes=wakes, accepted=accepted
    )
    keeper.start()
    try:
        yield keeper
    finally:
        keeper.stop()


# struct tcp_info's head on Linux: eight one-byte fields, then rto, ato, snd_mss, rcv_mss and
# unacked, which for a listening socket is the length of its accept queue.
_TCP_INFO_HEAD = struct.Struct("=8B5I")
_TCP_LISTEN = 10  # tcpi_state of a listening socket


def queued(sock: socket.socket) -> int | None:
    """How many clients wait in listening `sock`'s accept queue (Linux's ``TCP_INFO``); None
    where that cannot be read (another platform, a socket that is not listening)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_HEAD.size)
    except OSError:
        return None
    if len(info) < _TCP_INFO_HEAD.size:
        return None
    fields = _TCP_INFO_HEAD.unpack(info)
    return int(fields[12]) if fields[0] == _TCP_LISTEN else None


def _head_complete(data: bytearray) -> bool:
    if data.startswith(_H2_PREFACE):
        return True
    return b"\r\n\r\n" in data or len(data) >= HEAD_MAX


def _peer(sock: socket.socket) -> tuple[str, int]:
    try:
        peer = sock.getpeername()
    except OSError:
        return ("", 0)
    return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else ("", 0)


def parse_head(data: bytes, peer: tuple[str, int]) -> Request | None:
    """The request `data` begins with, for the answer's checks and format; None when it is no
    whole HTTP/1.1 request head (cut short, or not HTTP). Any bytes: it never raises."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_MAX)
    try:
        conn.receive_data(data)
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    target = bytes(event.target)
    path, _, query = target.decode("latin-1").partition("?")
    return Request(
        method=event.method.decode("latin-1"),
        target=target,
        path=path,
        query=query,
        headers=[(bytes(k), bytes(v)) for k, v in event.headers],
        body=b"",
        client=peer,
        http_version=event.http_version.decode("latin-1"),
    )


def http1_answer(refusal: HeadRefusal) -> bytes:
    """`refusal` as a whole HTTP/1.1 response that closes its connection."""
    try:
        phrase = http.HTTPStatus(refusal.status).phrase
    except ValueError:
        phrase = ""
    head = [f"HTTP/1.1 {refusal.status} {phrase}".encode("ascii")]
    head += [name + b": " + value for name, value in refusal.headers]
    head.append(b"content-length: " + str(len(refusal.body)).encode())
    head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + refusal.body


def _goaway(refusal: GatewayError) -> bytes:
    """The server preface and GOAWAY (no stream processed: the client may retry every one)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn.close_connection(
        error_code=h2.errors.ErrorCodes.NO_ERROR,
        last_stream_id=0,
        additional_data=f"{refusal.code}: {refusal.message}".encode()[:256],
    )
    return conn.data_to_send()
