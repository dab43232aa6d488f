"""Carrying one request to its upstreams and the answer back: the attempt ledger's verbs.

`twengine.attempt.ledger.AttemptLedger` (the attempt machine with its slot and health
bookkeeping) decides everything — which upstream next, when to wait, when the client's 200 goes
out, which slot to take or give back, what to record, how the request ends. This module carries
its actions out, one `match` arm per verb, and feeds it what happened:

* Each `Send` starts a reader task (`twserve.relay.reader`) that posts what the upstream sends
  into the request's inbox. The loop takes one inbox item at a time, or wakes at the ledger's
  `next_deadline()` (a timer, `twserve.relay.wait`) and calls `on_timer`.
* A stream is held by `twproto.stream.upstream.UpstreamStream` until first content; its verdict
  becomes `first_content` or `failed`, and its translator writes the rest to the client.
* The bookkeeping verbs (slots, slot waits, health records) go to
  `twserve.relay.holds.SlotHolds`; a slot grant comes back through the inbox.

A client that leaves cancels the handler's scope; the `finally` tells the ledger (`client_gone`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, assert_never

from twengine import AttemptRequests, Destination
from twengine import attempt as act
from twengine.attempt import (
    AcquireSlot,
    AttemptLedger,
    CancelWait,
    LedgerAction,
    RecordFailure,
    RecordSuccess,
    ReleaseSlot,
)
from twproto.paths import Operation
from twproto.sse import encode_comment
from twproto.stream import keepalive_comments
from twproto.upstream_request import ClientCall
from twserve.relay.abort import AbortPosted, Running, end_aborted, settle_gone
from twserve.relay.client import ClientAnswer, RelayOutcome
from twserve.relay.feed import AttemptFeed
from twserve.relay.holds import Granted, RelayHooks, SlotHolds, grant_poster, snapshot_of
from twserve.relay.reader import Attempt, AttemptItem, Built, read_attempt
from twserve.relay.wait import DeadlineWake, Inbox, Wake, next_item
from twserve.server.base import ClientGone, Responder, TaskSet
from twserve.upstream.client import Upstream

if TYPE_CHECKING:
    from twserve.upstream.responses_socket import SocketTurn

__all__ = ["RelayOutcome", "RelayRequest", "relay"]

log = logging.getLogger("twserve.relay.loop")

INBOX_SIZE = 8
KEEPALIVE = encode_comment("keep-alive")


@dataclass(slots=True, kw_only=True)
class RelayRequest:
    """The client's request: what it called, its body, the model it named, its id."""

    call: ClientCall
    body: bytes
    model: str
    parsed: dict[str, Any] | None = None  # the body as admission parsed it, never parsed again
    # When the request arrived (the caller's clock): wait_secs and the keep-alive clock run from
    # there, not from the end of a wait in the key's queue (docs/operations.md). None: now.
    arrival: float | None = None
    # sent while it waited for its key (twserve.gateway.key_turn)
    last_keepalive: float | None = None
    # A Responses WebSocket turn: its client socket's own upstream sockets, which attempts to
    # a `Transport.RESPONSES_SOCKET` destination use, and the turn as the client sent it.
    sockets: SocketTurn | None = None
    running: Running | None = None  # its id; where an abort reaches it (twserve.relay.abort)

    @property
    def owner(self) -> str:  # request id, for slot bookkeeping
        return self.running.id if self.running is not None else ""


_Taken = AttemptItem | Granted | AbortPosted
_Item = _Taken | Wake


class _Relay:
    def __init__(
        self,
        up: Upstream,
        hooks: RelayHooks,
        destinations: list[Destination],
        req: RelayRequest,
        responder: Responder,
        settings: act.AttemptSettings,
        clock: Callable[[], float],
        wall: Callable[[], float],
        rng: Callable[[], float],
        out: RelayOutcome,
        observer: Callable[[act.Action], None] | None,
    ) -> None:
        call = req.call
        self.up, self.hooks, self.clock, self.wall, self.out = up, hooks, clock, wall, out
        self.call, self.model, self.observer = call, req.model, observer
        self.sockets = req.sockets  # and with traces on, the request's span (observe.traces):
        self.trace = None if hooks.tracing is None else hooks.tracing.begin(req, out)
        self.dests = {d.name: d for d in destinations}
        self.names = list(self.dests)
        self.ledger = AttemptLedger(
            candidates=[d.candidate() for d in destinations],
            client_stream=call.stream,
            keepalive_comments=keepalive_comments(call.dialect),
            arrival=clock() if req.arrival is None else req.arrival,
            settings=settings,
            rng=rng,
            # Token counts take no slot (docs/operations.md, "What goes upstream").
            takes_slots=call.operation is not Operation.COUNT_TOKENS,
            last_keepalive=req.last_keepalive,
        )
        self.requests = AttemptRequests(call, req.body, req.model, req.parsed, settings.resume)
        self.client = ClientAnswer(
            responder, call, req.model, out, wall, req.last_keepalive, self.dests
        )
        self.inbox: Inbox[_Item] = Inbox(INBOX_SIZE)  # twserve.relay.wait
        # Callbacks that are not bound methods of this relay: no reference cycle through it.
        deliver = grant_poster(self.inbox.send_nowait)
        self.slots = SlotHolds(hooks, req.owner, deliver=deliver, clock=clock)
        self._snapshot = snapshot_of(hooks, self.names)
        self.feed = AttemptFeed(
            self.ledger, responder, self.dests, self._snapshot, clock=clock, wall=wall
        )
        self.started: list[Attempt] = []  # every attempt whose reader was started
        started = self.started
        # The ledger's deadline wakes the loop through the inbox (twserve.relay.wait).
        self.wake = wake = DeadlineWake(self.inbox.send_nowait, clock)
        # The readers (twserve.server.base): a bug of one wakes the loop, which raises it.
        self.readers = TaskSet(
            lambda _exc: wake.fire(), cancel_at_end=lambda: any(a.running() for a in started)
        )
        self.waited = False  # a backoff or slot wait is in progress (for the observer)
        self.running = req.running.attach(self.inbox.send_nowait) if req.running else None

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> RelayOutcome:
        try:
            async with self.readers:
                await self._loop()
                # The answer (or its error) is written and ended: a client that leaves from here
                # on had all of it.
                self.out.delivered = not self.out.cancelled
        except* ClientGone:
            pass  # the client left mid-answer; _cleanup records it
        finally:
            self._cleanup()
        return self.out

    async def _loop(self) -> None:
        ledger, readers = self.ledger, self.readers
        now = self.clock()
        await self._do(ledger.start(now, **self._snapshot(now)))
        while not ledger.done:
            item: _Taken | None = await next_item(self.inbox, self.wake, ledger.next_deadline)
            readers.check()  # a reader's bug fails the request
            now = self.clock()
            if isinstance(item, AbortPosted) or (self.running and self.running.error):
                await end_aborted(self, now)  # the control plane's abort
                return
            if isinstance(item, Granted):
                self.slots.granted(item.permit)
                await self._do(ledger.slot_granted(item.permit.name, now))
            elif item is not None:
                await self._do(await self.feed.on_item(item, now))
            else:
                await self._do(self.feed.report_content())
                if not ledger.done:
                    await self._do(self.feed.on_timer(now))
            del item  # a chunk is not kept while the next item is awaited

    def _cleanup(self) -> None:
        out = self.out
        out.ttfb_ms = self.feed.ttfb_ms
        if not self.ledger.done:
            now = self.clock()
            # A client that leaves once it has the whole answer ends a delivered stream: the
            # attempt succeeded (its sample and success are booked), only the upstream's own
            # end is not waited for.
            if self.feed.client_left(out, self.client.started):
                actions = self.ledger.ended(now, clean=True)
            else:
                actions = self.ledger.client_gone(now)
            settle_gone(actions, self.slots, self.feed)  # nothing more is written
        elif not out.cancelled and not out.delivered:
            # The ledger was done and its last verbs were being carried out when the client
            # left (the stream's end, the row's wait): its answer was delivered if every byte
            # of the final event had been written.
            out.delivered = self.feed.delivered()
        out.attempts = self.ledger.attempts
        out.effort_resent = self.requests.resent_levels()
        out.attempt_usage = dict(self.feed.attempt_usage)
        if self.sockets is not None:
            out.over_socket = {a.index for a in self.started if a.reader.over_socket}
        self.slots.close()  # a grant posted but never read, a wait cut short
        if self.running is not None:
            self.running.post = None
        self.wake.cancel()
        self.inbox.close()

    # -- the verbs -------------------------------------------------------------------------

    async def _do(self, actions: list[LedgerAction]) -> None:
        for action in actions:
            match action:
                case AcquireSlot() | ReleaseSlot() | act.WaitForSlot() | CancelWait():
                    self.slots.book(action)
                case RecordFailure() | RecordSuccess():
                    self.slots.book(action)
                case act.Send(provider=provider, index=index):
                    if self.waited or action.queued_ms:
                        self._note(action)  # the end of a backoff or slot wait
                    self.waited = False
                    await self._send(provider, index)
                case act.Resend(provider=provider, index=index, reason=reason, failure=failure):
                    refusal = failure.message if failure else ""
                    self.requests.rewrite(self.dests[provider], reason, refusal)
                    await self._send(provider, index)
                case act.Backoff():
                    self.waited = True  # the ledger's deadline wakes the loop
                    self._note(action)
                case act.Commit(provider=provider, send_headers=send_headers):
                    await self.client.commit(self.feed.live if provider else None, send_headers)
                case act.SendKeepAlive():
                    await self.client.responder.send(KEEPALIVE)
                case act.CancelAttempt(index=index):
                    self.feed.cancel(index, self.out)
                case act.RespondError(error=error, provider=who):
                    await self.client.error(error, who)
                case act.EndStreamWithError(error=error, provider=who):
                    await self.client.end_stream_with_error(error, *self.feed.ending(), who)
                    self.feed.end_attempt()
                case act.PassThroughUpstreamError(provider=who, index=index, failure=failure):
                    await self.client.pass_through(self.feed.errors.get(index), failure, who)
                case act.FinishRequest(cancelled=cancelled):
                    live = self.feed.live
                    if not cancelled and live is not None:
                        translated = self.requests.translated.get(live.provider)
                        await self.client.finish(live, self.dests[live.provider], translated)
                        self.feed.end_attempt()
                case _:
                    assert_never(action)

    def _note(self, action: act.Action) -> None:
        if self.observer is not None:
            try:
                self.observer(action)
            except Exception:  # an observer's bug must not fail the request
                log.exception("relay observer failed")

    async def _send(self, provider: str, index: int) -> None:
        live = self.feed.begin(index, provider)
        self.started.append(live)
        await self._do(self.ledger.attempt_sent(live.sent_at))
        dest, up, post = self.dests[provider], self.up, self.inbox.send
        build = partial(self._build, dest)
        work = read_attempt(live, up, build, post, dest, self.sockets, self.trace)
        self.readers.start(work, live.scope)  # the reader runs under its attempt's scope

    def _build(self, dest: Destination, as_sent: act.TurnAsSent | None) -> Built:
        built = self.requests.build(dest, self.feed.answer, now=self.wall(), as_sent=as_sent)
        self.out.dropped = list(self.requests.dropped)
        return built


def relay(
    up: Upstream,
    hooks: RelayHooks,
    destinations: list[Destination],
    req: RelayRequest,
    responder: Responder,
    *,
    settings: act.AttemptSettings,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    rng: Callable[[], float],
    out: RelayOutcome | None = None,
    observer: Callable[[act.Action], None] | None = None,
) -> Coroutine[Any, Any, RelayOutcome]:
    """Carry `req` to `destinations` under the attempt ledger; write the answer or an error.

    `out` is filled in as the request goes, so a caller whose scope is cancelled (the client
    left) still has the attempts made so far. `observer` sees the `Backoff` actions and the
    `Send` that ends a wait (for the retry events). To be awaited: the relay's own coroutine,
    with no frame of this function's above it on every resume.
    """
    out = out if out is not None else RelayOutcome()
    r = _Relay(up, hooks, destinations, req, responder, settings, clock, wall, rng, out, observer)
    return r.run()
