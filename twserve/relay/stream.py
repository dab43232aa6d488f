"""One attempt's stream toward the client, and which of three paths writes it: the one owner.

Theory of operation
-------------------

An attempt's chunks reach the client by one of three paths. Each is there for its measured cost
(docs/benchmarks.md); `AttemptStream` decides which one carries the next chunk, and is the only
code that writes what decides it.

1. **Through the loop** (`WriteMode.QUEUED`). The reader posts the chunk into the request's inbox
   (`queue`) and the relay's loop takes it (`take`, or `take_held` while the opening hold has
   it). Every attempt starts here, and every chunk before first content takes this path: the
   opening hold and the attempt ledger live in the loop.
2. **Written by the reader** (`WriteMode.DIRECT`). Once the answer is committed and none of this
   attempt's chunks waits in the inbox, the reader translates and writes each chunk itself
   (`write`): no hop through the loop.
3. **Written from the upstream read's callback** (`WriteMode.DIVERTED`). After its first write
   the reader offers the upstream connection a sink (`UpstreamAnswer.divert`, `sink`). Where the
   connection is an asyncio protocol (twserve.upstream.h1_connection) it hands each read to the
   sink in ``data_received``: translated and written to the client there and then, with no task
   woken. The sink declines (returns False) while the client is behind or a write is under way;
   the connection keeps that piece for the reader, which writes it as in path 2, in order.

`WriteMode.CLOSED`: the attempt is over for the client (it failed, was cancelled, ended, or broke
off and the answer moved to another upstream). The reader then posts what it still reads (the
loop drops it) and the sink declines; only the held bytes of a commit still go out.

The mode moves only forward, and only on these inputs::

    mode       input    leads to
    QUEUED     commit   DIRECT when `direct_due`, else QUEUED
               take     DIRECT when `direct_due`, else QUEUED
    DIRECT     divert   DIVERTED when the connection took the sink, else DIRECT (offered again
                        after the next write)
    CLOSED     commit   CLOSED (the held bytes go out all the same)
    any        close    CLOSED

**`direct_due`** is the one rule for path 2: the answer is committed to this attempt, a
translator writes it (a stream, not a whole answer), and nothing of it is queued. It is asked
only *after* the loop's own write of a queued chunk, so that one writer writes at a time: while
the loop writes, the reader's next chunk is queued behind it.

The writes themselves (`write`, `sink`) and `queue` only read the mode: the reader chose its path
from it, and nothing but the loop's inputs above changes it. An input that is not valid in the
current mode (a chunk taken while the reader writes, a second commit) raises `StreamStateError`
and changes nothing: a bug in the relay. The pairs and the modes each may lead to are the table
`TRANSITIONS`, and each input checks that the mode it chose is in it (a `RuntimeError` otherwise:
a bug in this module), as twengine.attempt does for the attempt machine.

**Content the ledger has not heard of.** The loop tells the ledger of content it writes itself.
What the reader and the sink write goes by without the loop, so they note when (`content_at`);
the loop asks `unreported` when it next wakes at its deadline, which keeps the ledger (and its
idle clock) off the per-chunk path. A closed stream reports nothing more.

**Delivered.** `writing` is set before every write of translated chunks and cleared only once
the write returned, so a write cut short (the client left) leaves it set; `pending` holds the
bytes held back until the commit, and the closing bytes until the end, and is cleared only once
they were written. `delivered` reads both (docs/operations.md, "A client that leaves").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum

from twproto.stream import StreamTranslator
from twserve.server.base import Responder
from twserve.upstream.client import UpstreamAnswer

__all__ = [
    "READER_WRITES",
    "TRANSITIONS",
    "AttemptStream",
    "StreamInput",
    "StreamStateError",
    "WriteMode",
]


class StreamStateError(Exception):
    """An input the stream's current mode does not take: a bug in the relay, not the client."""


class WriteMode(StrEnum):
    QUEUED = "queued"  # path 1: the reader posts each chunk, the loop writes it
    DIRECT = "direct"  # path 2: the reader writes each chunk itself
    DIVERTED = "diverted"  # path 3: the connection's callback writes; the reader what it leaves
    CLOSED = "closed"  # over for the client: nobody writes its chunks any more


class StreamInput(StrEnum):
    COMMIT = "commit"  # the answer is committed to this attempt
    TAKE = "take"  # the loop took one of the chunks the reader queued
    DIVERT = "divert"  # the reader offered the upstream connection the sink
    CLOSE = "close"  # the attempt is over for the client


_Q, _D, _V, _C = WriteMode.QUEUED, WriteMode.DIRECT, WriteMode.DIVERTED, WriteMode.CLOSED

#: ``(mode, input) → modes it may lead to``. A pair missing here raises `StreamStateError`.
TRANSITIONS: Mapping[tuple[WriteMode, StreamInput], frozenset[WriteMode]] = {
    (_Q, StreamInput.COMMIT): frozenset({_Q, _D}),
    (_Q, StreamInput.TAKE): frozenset({_Q, _D}),
    (_D, StreamInput.DIVERT): frozenset({_D, _V}),
    (_C, StreamInput.COMMIT): frozenset({_C}),
    **{(mode, StreamInput.CLOSE): frozenset({_C}) for mode in WriteMode},
}

#: The modes in which the reader writes what it reads (paths 2 and 3); in the others it queues.
READER_WRITES = frozenset({_D, _V})


class AttemptStream:
    """How one attempt's chunks reach the client (see the module docstring): its `mode`, the
    count of its chunks in the inbox, and the bytes and times the three paths share."""

    __slots__ = (
        "_clock",
        "committed",
        "content_at",
        "mode",
        "pending",
        "queued",
        "reported_at",
        "responder",
        "translator",
        "writing",
    )

    def __init__(self, responder: Responder, clock: Callable[[], float]) -> None:
        self.responder = responder
        self._clock = clock
        self.mode = _Q
        self.queued = 0  # chunks of this attempt in the inbox
        self.committed = False
        self.translator: StreamTranslator | None = None  # from first content on
        self.pending = b""  # the client's bytes held back until the commit (and the end)
        self.writing = False  # a write of translated chunks is under way (or was cut short)
        self.content_at = 0.0  # when the reader or the sink last wrote content
        self.reported_at = 0.0  # the latest content time the attempt ledger has heard

    # -- the mode ------------------------------------------------------------------------

    def direct_due(self) -> bool:
        """Path 2's rule: committed, translated, and nothing of it queued."""
        return self.committed and self.queued == 0 and self.translator is not None

    def _allowed(self, event: StreamInput) -> frozenset[WriteMode]:
        allowed = TRANSITIONS.get((self.mode, event))
        if allowed is None:
            raise StreamStateError(f"{event.value} is not valid in mode {self.mode.value}")
        return allowed

    def _move(self, allowed: frozenset[WriteMode], event: StreamInput, to: WriteMode) -> None:
        if to not in allowed:  # a bug in this module, not in the caller
            raise RuntimeError(f"{self.mode.value} --{event.value}--> {to.value}")
        self.mode = to

    def _settle(self, allowed: frozenset[WriteMode], event: StreamInput) -> None:
        """After a commit or a take: path 2 when it is due, else the mode stays."""
        mode = self.mode
        self._move(allowed, event, _D if mode is _Q and self.direct_due() else mode)

    # -- the loop's side -----------------------------------------------------------------

    def hold(self, translator: StreamTranslator, data: bytes) -> None:
        """First content: `translator` writes the rest; `data`, the client's bytes for what
        the opening held, goes out at the commit."""
        self.translator, self.pending = translator, data

    def hold_tail(self, tail: bytes) -> None:
        """The stream's closing bytes, which go out with what is pending (the commit or the
        end)."""
        self.pending += tail

    async def commit(self) -> None:
        """The answer is committed to this attempt: the held bytes go out; then path 2 when
        it is due."""
        allowed = self._allowed(StreamInput.COMMIT)
        self.committed = True
        await self.flush()
        self._settle(allowed, StreamInput.COMMIT)

    async def flush(self) -> None:
        """Write what is pending; given up only once written (a write cut short has not
        delivered it)."""
        if self.pending:
            await self.responder.send(self.pending)
            self.pending = b""

    def take_held(self) -> None:
        """The loop took a queued chunk for the opening hold (no translator yet)."""
        allowed = self._allowed(StreamInput.TAKE)
        self.queued -= 1
        self._settle(allowed, StreamInput.TAKE)

    async def take(self, data: bytes, now: float) -> bool:
        """The loop took a queued chunk of the translated answer: write it; True when content
        went out (the loop tells the ledger). Path 2 only after this write returned."""
        allowed = self._allowed(StreamInput.TAKE)
        self.queued -= 1
        translator = self.translator
        assert translator is not None
        sent = translator.feed(data)
        if sent:
            self.writing = True
            await self.responder.send(sent)
            self.writing = False
            self.reported_at = now
        self._settle(allowed, StreamInput.TAKE)
        return bool(sent)

    def close(self) -> None:
        """The attempt is over for the client: the reader's chunks go nowhere, the sink
        declines, and no more content is reported."""
        self._move(self._allowed(StreamInput.CLOSE), StreamInput.CLOSE, _C)

    def unreported(self) -> float | None:
        """When the reader or the sink last wrote content, if the ledger has not heard of it
        yet (from then on it has)."""
        at = self.content_at
        if at <= self.reported_at or self.mode is _C:
            return None
        self.reported_at = at
        return at

    def delivered(self) -> bool:
        """The client has the whole answer: the final event was translated and every byte of
        it handed to the connection (nothing held, no write cut short)."""
        translator = self.translator
        return (
            self.committed
            and translator is not None
            and translator.finished
            and not self.pending
            and not self.writing
        )

    # -- the reader's side ---------------------------------------------------------------

    def queue(self) -> None:
        """The reader posts a chunk to the loop (path 1)."""
        self.queued += 1

    async def write(self, chunk: bytes, answer: UpstreamAnswer) -> None:
        """The reader's own write of `chunk` (path 2, or what the sink left in path 3); after
        it, `answer`'s connection is offered the sink until it takes it."""
        translator = self.translator
        assert translator is not None
        data = translator.feed(chunk)
        if data:
            # The sink leaves what arrives meanwhile for this reader. Not cleared when the write
            # is cut short: the answer's last bytes did not go out (`delivered`).
            self.writing = True
            await self.responder.send(data)
            self.writing = False
            self.content_at = self._clock()
        if self.mode is _D:
            self.divert(answer)

    def divert(self, answer: UpstreamAnswer) -> None:
        """Offer `answer`'s connection the sink (path 3); it may refuse (HTTP/2, a socket, an
        answer that has ended)."""
        allowed = self._allowed(StreamInput.DIVERT)
        # The sink runs only in a later read callback: by then the mode below is set.
        took = answer.divert(self.sink)
        self._move(allowed, StreamInput.DIVERT, _V if took else _D)

    def sink(self, chunk: bytes) -> bool:
        """What `write` does, done in the upstream connection's callback (path 3): True once
        `chunk` is translated and written; False (nothing done) when it has to wait (the client
        is behind, a write is under way, the stream was closed) and is left for the reader."""
        if self.mode is not _V or self.writing:
            return False
        responder = self.responder
        if not responder.ready():
            return False
        translator = self.translator
        assert translator is not None
        data = translator.feed(chunk)
        if data:
            responder.send_now(data)
            self.content_at = self._clock()
        return True
