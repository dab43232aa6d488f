"""The write side of one HTTP/1.1 connection: the answer's bytes, from h11 to the socket.

While a handler runs, what it writes in one turn of the event loop goes to the socket in one
system call (`H1Output._gather`): the response head with the first piece of the body, the last
piece with the chunked terminator. A system call per piece cost more than the rest of a short
answer's work. Nothing waits for more to come: the bytes go out when the handler's task next
yields to the loop (a callback scheduled for the next turn), or at once past `FLUSH_BYTES`. The
answer's last bytes go when the handler returns (`handler_done`), so a client that has the
whole answer finds done what the handler records after writing it (health, effort memory, the
request row). While a handler writes a chunked answer, each piece is framed here rather than
by h11 (`write_data`): h11's state does not change with body data in chunked coding, and its
per-call bookkeeping cost as much as the rest of the write. A piece may also be written from
the event loop's callbacks, without a task (`ready`, `write_now`: the upstream read's callback
writes it, twserve/relay/).

The response head is h11's for what decides the framing (`Content-Length`,
`Transfer-Encoding`, `Connection`: h11 reads them to choose how the body goes and whether the
connection stays open) and ours for the rest (`split_head`). h11 checks every header of a head
it is given with two regular expressions, and again each time it sets a framing header of its
own (twice for a chunked answer): three passes over the whole head, more of a short answer's
CPU than its body's framing. The other headers are checked here once, by one expression over
their joined lines (h11's grammar: a token, a value of visible characters with inner spaces),
and put before the head's final blank line. A head that does not pass goes to h11 whole, which
refuses it as before.

Every write has a deadline (`ServerLimits.write_timeout`): a client that stops reading is taken
as gone (`on_gone`), exactly as one that closes, so its upstream call is cancelled and what it
held is freed. While a handler runs, a write only waits when the client has not read what it
was sent, and such a wait alone gets a timer; over a stream without a transport the
connection's watcher task keeps the deadline (`writing_since`). Outside a handler (refusals,
errors the transport answers itself) each write has its own deadline.

This is the lane anyio's socket stream is bypassed on: the transport and the watch on it come
from twserve/server/_anyio_fastpath.py, and with neither (another backend, TLS) every write is
anyio's ``send``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import h11
from anyio.lowlevel import cancel_shielded_checkpoint

from twserve.server._anyio_fastpath import ClientWatch, checkpoint_if_cancelled, frames_in_chunks
from twserve.server.base import ClientGone

log = logging.getLogger("twserve.server.http1")

__all__ = ["FLUSH_BYTES", "H1Output", "split_head"]

# Bytes gathered for one system call while a handler writes; past this they go at once.
FLUSH_BYTES = 65536

# The headers h11 reads to frame an answer (module docs): these go to h11, the rest are ours.
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
# RFC 9110's field line as h11 accepts it: a token, ": ", a value of visible characters (or
# obs-text) with inner spaces and tabs, CRLF; a block is any number of them.
_LINES = re.compile(rb"(?:[-!#$%&'*+.^_`|~0-9a-zA-Z]+: (?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?\r\n)*")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
# Header names found to be tokens: an answer's names are a few dozen, the same on every answer.
_NAMES: set[bytes] = set()
_MAX_NAMES = 4096


def split_head(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """`headers` as the framing headers for h11 and the other header lines, checked and
    written out (module docs); all of them for h11 when any line does not pass."""
    framing = []
    lines = []
    for name, value in headers:
        if name.lower() in _FRAMING:
            framing.append((name, value))
            continue
        if name not in _NAMES:
            if _TOKEN.fullmatch(name) is None:
                return headers, b""
            if len(_NAMES) < _MAX_NAMES:
                _NAMES.add(name)
        lines.append(b"%b: %b\r\n" % (name, value))
    block = b"".join(lines)
    # Names are tokens, so each line is one header when no value holds a line feed of its own.
    if block.count(b"\n") != len(lines) or _LINES.fullmatch(block) is None:
        return headers, b""
    return framing, block


class H1Output:
    """What one connection writes to its client, and whether it still can (`closed`).

    `on_gone` is the connection's: the client left or stopped reading, so whatever handler
    runs is cancelled. `watched` is true while a handler runs (its writes are gathered, and
    the client is watched meanwhile).
    """

    __slots__ = (
        "_chunked",
        "_flush_scheduled",
        "_h11",
        "_held_end",
        "_pending",
        "_pending_size",
        "_stream",
        "_transport",
        "_watch",
        "closed",
        "on_gone",
        "peer",
        "stream_closed",
        "watched",
        "write_timeout",
        "writing_since",
    )

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        conn: h11.Connection,
        *,
        transport: asyncio.Transport | None,
        watch: ClientWatch | None,
        write_timeout: float,
        peer: tuple[str, int],
        on_gone: Callable[[], None],
    ) -> None:
        self._stream = stream
        self._h11 = conn
        # The event loop's transport under anyio's asyncio socket stream, and the watch on it
        # (both or neither): a handler's writes are gathered and written to it once per turn.
        self._transport = transport
        self._watch = watch
        self.write_timeout = write_timeout
        self.peer = peer
        self.on_gone = on_gone
        self.closed = False  # the connection is finished with: nothing more is written
        self.stream_closed = False
        self.watched = False
        self.writing_since: float | None = None  # when the write in progress began
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._flush_scheduled = False
        self._held_end = False  # the answer has ended; its last bytes wait for the handler
        # The answer in progress goes in chunked transfer coding, framed here (`write_data`).
        self._chunked = False

    async def write(self, event: Any, lines: bytes = b"") -> None:
        """An h11 event of the answer (or of an answer the transport writes itself); `lines`:
        the head's header lines h11 was not given (`split_head`), for a `h11.Response`."""
        if self.closed:
            raise ClientGone()
        data = self._h11.send(event)
        kind = type(event)
        if kind is h11.Response:
            if lines and data is not None:
                data = data[:-2] + lines + b"\r\n"  # before the head's final blank line
            self._chunked = frames_in_chunks(self._h11)
        elif kind is h11.EndOfMessage:
            self._chunked = False
        if self.watched and self._transport is not None:
            if kind is h11.EndOfMessage:
                # The answer's last bytes go when the handler returns (`handler_done`): a client
                # that has the whole answer finds done what the handler records after it.
                self._held_end = True
            if data:
                await self._gather(data)
            return
        if not data:
            return
        self.flush()
        if self.watched:
            # While a handler runs, the client's watcher holds the deadline (the connection's
            # watcher task): a deadline scope per write costs about half as much again as the
            # write itself.
            self.writing_since = anyio.current_time()
            try:
                await self._stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self.gone()
                raise ClientGone() from exc
            finally:
                self.writing_since = None
        else:
            try:
                with anyio.fail_after(self.write_timeout):
                    await self._stream.send(data)
            except TimeoutError as exc:
                # The client stopped reading: as good as gone. Cancelling the handler stops the
                # upstream call and frees its slot and key permit (the relay's cleanup).
                log.info("client %s stopped reading; dropping the connection", self.peer[0])
                self.gone()
                await self.close_stream()
                raise ClientGone() from exc
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self.gone()
                raise ClientGone() from exc

    async def write_data(self, data: bytes) -> None:
        """A piece of the answer's body (not empty)."""
        if self._chunked and self.watched and self._transport is not None and not self.closed:
            await self._gather(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            await self.write(h11.Data(data=data))

    def ready(self) -> bool:
        """A piece of the chunked answer in progress can be written now, in order: the client's
        transport is open and not above its high-water mark."""
        transport, watch = self._transport, self._watch
        return (
            self._chunked
            and self.watched
            and transport is not None
            and watch is not None
            and not self.closed
            and not self._held_end
            and not watch.paused
            and not watch.failed
            and not transport.is_closing()
        )

    def write_now(self, data: bytes) -> None:
        """A piece of the answer written at once (after `ready`), behind what `_gather` kept."""
        self._pending.append(b"%x\r\n%b\r\n" % (len(data), data))
        self.flush()

    async def _gather(self, data: bytes) -> None:
        """A handler's write: kept with the others of this loop turn and written with them in
        one system call when the task yields, or past `FLUSH_BYTES`; once the answer has
        ended, when the handler returns. The transport does what anyio's ``send`` does with it
        (this is the same transport): a client that stopped reading leaves bytes in its
        buffer, and the next write waits for it to drain, under the write deadline."""
        transport, watch = self._transport, self._watch
        assert transport is not None and watch is not None
        if watch.failed or transport.is_closing():
            self.gone()
            raise ClientGone()
        if watch.paused:
            self.flush()
            # The client has not read what it was sent: this write waits at most write_timeout
            # (one timer, only for a write that has to wait).
            stall = asyncio.get_running_loop().call_later(self.write_timeout, self._write_stalled)
            try:
                await watch.drained()
            finally:
                stall.cancel()
            if self.closed or watch.failed or transport.is_closing():
                self.gone()
                raise ClientGone()
        else:
            # As anyio's send does: a cancelled handler stops at its next write.
            await checkpoint_if_cancelled()
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= FLUSH_BYTES:
            self.flush()
            # A handler that writes without ever waiting still lets the other connections run.
            await cancel_shielded_checkpoint()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        if self._held_end and self.watched:
            self._flush_scheduled = False  # the answer ended: its bytes wait for the handler
            return
        self.flush()

    def flush(self) -> None:
        """Write what `_gather` kept, in one call to the transport."""
        self._flush_scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_size = 0
        transport = self._transport
        if self.stream_closed or transport is None:
            return
        if transport.is_closing():
            self.gone()
            return
        try:
            transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        except (RuntimeError, OSError):
            self.gone()

    def handler_done(self) -> None:
        """The handler returned: the answer's last bytes go, and writes are no longer its."""
        self.flush()
        self._held_end = False
        self.watched = False

    def _write_stalled(self) -> None:
        # The client stopped reading: as good as gone. Cancelling the handler stops the
        # upstream call and frees its slot and key permit (the relay's cleanup); the connection
        # is closed when its task ends.
        log.info("client %s stopped reading; dropping the connection", self.peer[0])
        self.gone()

    def gone(self) -> None:
        """Nothing more reaches the client."""
        self.closed = True
        self.on_gone()

    async def close_stream(self) -> None:
        """Close the socket at once; what was written before goes out first."""
        self.closed = True
        if not self.stream_closed:
            self.flush()  # what the handler wrote before it dropped the connection goes out
            self.stream_closed = True
            if self._watch is not None:
                self._watch.release()
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
