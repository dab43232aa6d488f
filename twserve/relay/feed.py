"""What an attempt's news means for the request: inbox items → attempt ledger inputs.

The relay's loop hands each item a reader posted (`twserve.relay.reader`) to `AttemptFeed`,
which turns it into the ledger's input — a response head, a failure classified by
`twproto.failures`, the opening hold's verdict (`twproto.stream.upstream`), content, the end —
and returns the actions that input led to, for the relay to carry out. Items of an attempt that
was already given up are dropped. Each attempt's `AttemptStream` (twserve.relay.stream) writes
its chunks to the client, by whichever of its three paths; this module gives it the loop's
inputs (the commit, each chunk the loop takes, the end of the attempt) and tells the ledger of
content the reader or the upstream connection's callback wrote when the loop next wakes
(`report_content`), which keeps it off the per-chunk path. The `Attempt` record is written here
and nowhere else.

With resuming on (docs/failover.md, "Resuming a broken stream") the committed answer is a
`twproto.ResumableStream` (`answer`): at a break or an idle timeout the ledger hears how
much text the client has (`resume_point`), and when it resumes, the next attempt's opening is
handed that same stream to continue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import assert_never

import anyio

from twengine.attempt import AttemptLedger, LedgerAction
from twengine.destinations import Destination
from twproto import ir
from twproto.dialect import Dialect
from twproto.failures import Failure, classify_response, stream_ended_early
from twproto.headers import client_response_headers
from twproto.stream import (
    FailedBeforeContent,
    FirstContent,
    Holding,
    OpeningOutcome,
    ResumableStream,
    reported_usage,
)
from twserve.relay.client import RelayOutcome
from twserve.relay.reader import (
    Attempt,
    AttemptFailed,
    AttemptItem,
    Broken,
    Chunk,
    End,
    ErrorBody,
    Head,
    Whole,
)
from twserve.relay.stream import AttemptStream
from twserve.server.base import Headers, Responder

__all__ = ["AttemptFeed"]

Snapshot = Callable[[float], dict[str, set[str]]]
# The items a reader posts last: after them it only closes its upstream request.
_LAST = frozenset({ErrorBody, Whole, End, Broken, AttemptFailed})


class AttemptFeed:
    """The attempt in flight (`live`) and what its items mean for `ledger`."""

    def __init__(
        self,
        ledger: AttemptLedger,
        responder: Responder,
        dests: Mapping[str, Destination],
        snapshot: Snapshot,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.responder = responder
        self.dests = dests
        self.snapshot = snapshot
        self.clock = clock
        self.wall = wall
        self.live: Attempt | None = None
        self.ttfb_ms: int | None = None  # send to first content, of the attempt that answered
        # Usage each ended attempt's upstream reported (by attempt index): tokens it may bill
        # although its attempt failed or was cancelled.
        self.attempt_usage: dict[int, ir.Usage] = {}
        # Attempt index → its error response (status, headers, body, format), to pass through.
        self.errors: dict[int, tuple[int, Headers, bytes, Dialect]] = {}
        # The client's answer when it can be resumed (twproto.stream.resume), and the upstream whose
        # stream it last came from.
        self.answer: ResumableStream | None = None
        self.answered_by: str | None = None

    def begin(self, index: int, provider: str) -> Attempt:
        """Attempt `index` to `provider` is sent now: it is the one in flight from here on (the
        stream of any before it is closed)."""
        if self.live is not None:
            self.live.stream.close()
        live = Attempt(
            index=index,
            provider=provider,
            scope=anyio.CancelScope(),
            sent_at=self.clock(),
            stream=AttemptStream(self.responder, self.clock),
        )
        self.live = live
        return live

    def ending(self) -> tuple[Attempt | None, tuple[ResumableStream, str | None] | None]:
        """What an error ending writes after: the attempt in flight, and the answer being
        resumed while no upstream carries it."""
        live = self.live
        if self.answer is None or (live is not None and live.stream.translator is not None):
            return live, None
        return live, (self.answer, self.answered_by)

    def resume_point(self) -> int | None:
        """Text characters the client has, when the committed answer may be continued."""
        live = self.live
        if self.answer is None or live is None or live.stream.translator is not self.answer:
            return None
        return self.answer.resume_point

    def on_timer(self, now: float) -> list[LedgerAction]:
        """The ledger's timer (an idle answer may be resumed)."""
        return self.ledger.on_timer(now, resume_from=self.resume_point(), **self.snapshot(now))

    def report_content(self) -> list[LedgerAction]:
        """Tell the ledger about content the reader wrote itself since it last heard."""
        live = self.live
        at = live.stream.unreported() if live is not None else None
        return [] if at is None else self.ledger.content(at)

    async def on_item(self, item: AttemptItem, now: float) -> list[LedgerAction]:
        """What `item` means for the ledger: its input for this attempt's news."""
        live = self.live
        if live is None or item.index != live.index:
            return []  # from an attempt already given up
        live.last_taken = type(item) in _LAST
        match item:
            case Head(status=status, headers=headers):
                live.status, live.headers = status, headers
                return self.ledger.response_head(now, status=status)
            case ErrorBody(body=body):
                failure = classify_response(live.status, live.headers, body, now=self.wall())
                dialect = self.dests[live.provider].target.dialect
                self.errors[live.index] = (
                    live.status,
                    client_response_headers(live.headers),
                    body,
                    dialect,
                )
                return self._failed(failure, now)
            case AttemptFailed(failure=failure):
                return self._failed(failure, now)
            case Whole(body=body):
                live.whole = body
                self.ttfb_ms = int((now - live.sent_at) * 1000)
                return self.ledger.first_content(now) + self.ledger.ended(now, clean=True)
            case Chunk(data=data):
                stream = live.stream
                if stream.translator is not None:
                    return self.ledger.content(now) if await stream.take(data, now) else []
                stream.take_held()
                opening = live.reader.opening
                assert opening is not None
                live.opening_bytes.append(data)
                return self._opening(live, opening.feed(data, now=self.wall()), now)
            case End():
                if live.stream.translator is not None:
                    return self._ended(live, now)
                opening = live.reader.opening
                assert opening is not None
                opened = self._opening(live, opening.end(now=self.wall()), now)
                if live.stream.translator is None:
                    return opened
                return opened + self._ended(live, now)
            case Broken():
                if live.stream.translator is None:
                    return self._failed(stream_ended_early(), now)
                return self._broke(now)
            case _:
                assert_never(item)

    def _opening(self, live: Attempt, outcome: OpeningOutcome, now: float) -> list[LedgerAction]:
        match outcome:
            case Holding():
                return []
            case FailedBeforeContent(failure=failure):
                return self._failed(failure, now)
            case FirstContent(data=data, translator=translator):
                live.stream.hold(translator, data)
                # The translator reports the usage from now on (`_billed_usage`): the opening's
                # raw bytes would only be carried to the stream's end.
                live.opening_bytes.clear()
                if self.answer is None:  # a resumed answer keeps its first leg's
                    self.ttfb_ms = int((now - live.sent_at) * 1000)
                if isinstance(translator, ResumableStream):
                    self.answer, self.answered_by = translator, live.provider
                return self.ledger.first_content(now)
            case _:
                assert_never(outcome)

    def _failed(self, failure: Failure, now: float) -> list[LedgerAction]:
        self.end_attempt()
        return self.ledger.failed(failure, now, **self.snapshot(now))

    def _ended(self, live: Attempt, now: float) -> list[LedgerAction]:
        translator = live.stream.translator
        assert translator is not None
        # end() flushes a last event that came without its blank line, so `finished` is only
        # known after it. The closing bytes go out with what is pending (the commit or the end).
        tail = translator.end()
        clean = translator.finished
        if tail and clean:
            live.stream.hold_tail(tail)
        return self.ledger.ended(now, clean=True) if clean else self._broke(now)

    def _broke(self, now: float) -> list[LedgerAction]:
        """The committed answer broke off: the ledger ends it, or resumes it elsewhere."""
        live = self.live
        translator = live.stream.translator if live is not None else None
        actions = self.ledger.ended(
            now,
            clean=False,
            resume_from=self.resume_point(),
            too_large=translator is not None and translator.too_large,
            **self.snapshot(now),
        )
        if not self.ledger.done and live is not None:
            # Resumed: this upstream's part is over. It stays `live` until the next attempt
            # replaces it, so that a commit among `actions` still writes what it held; its
            # stream is closed, so the ledger hears of no more content from it.
            self._close(live)
        return actions

    def end_attempt(self) -> None:
        """The attempt in flight is over: stop its reader (which closes the upstream request)."""
        live = self.live
        if live is not None:
            self._close(live)
            self.live = None

    def _close(self, live: Attempt) -> None:
        live.stream.close()
        if live.running():  # (a cancel costs something even when it has nothing to stop)
            live.scope.cancel()
        usage = self._billed_usage(live)
        if usage is not None:
            self.attempt_usage[live.index] = usage

    def cancel(self, index: int, out: RelayOutcome) -> None:
        """The ledger cancelled attempt `index` (if it is still the one in flight)."""
        live = self.live
        if live is None or live.index != index:
            return
        stream = live.stream
        if stream.committed:
            # It answered before it went quiet (idle timeout after content): the row names it,
            # with the usage seen so far.
            out.provider = live.provider
            if stream.translator is not None:
                out.usage = stream.translator.usage
        self.end_attempt()

    def client_left(self, out: RelayOutcome, answer_started: bool) -> bool:
        """The client left before the ledger was done: whether it had the whole answer
        (returned), and which upstream what it had came from."""
        live = self.live
        # A client that leaves right after the answer's final event (its SDK is done) has the
        # whole answer: that is not a cancelled request, even if the upstream's own end had not
        # arrived yet.
        delivered = live is not None and live.stream.delivered()
        out.cancelled, out.delivered = not delivered, delivered
        if live is not None:
            # What the client had already received came from this upstream.
            stream = live.stream
            if stream.committed:
                out.provider = live.provider
                out.status = 200 if answer_started else None
            if stream.translator is not None:
                out.usage = stream.translator.usage
                if delivered:
                    out.dropped.extend(stream.translator.dropped)
        return delivered

    def delivered(self) -> bool:
        """The attempt in flight (if any) has written the whole answer to the client."""
        live = self.live
        return live is not None and live.stream.delivered()

    def _billed_usage(self, live: Attempt) -> ir.Usage | None:
        if live.stream.translator is not None:
            return live.stream.translator.usage
        if not live.opening_bytes:
            return None
        dialect = self.dests[live.provider].target.dialect
        return reported_usage(
            dialect,
            b"".join(live.opening_bytes),
            sse=live.reader.upstream_sse,
            eventstream=live.reader.upstream_eventstream,
        )
