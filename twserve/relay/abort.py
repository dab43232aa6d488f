"""Aborting a running request by its id (the control plane's ``POST /requests/{id}/abort``).

Every generated request has a `Running` entry in the gateway's `Aborts` from its start to its
row: the id is the row's, the one the client got in ``x-request-id``. An abort reaches the
request where it is:

* waiting for its key's turn (`twserve.gateway.key_turn`): the wait's cancel scope is cancelled
  and the handler answers the abort's error;
* in the relay (`twserve.relay.loop`): the relay is told through its inbox, ends the attempts
  as a client that left ends them (`AttemptLedger.client_gone`: nothing counts against an
  upstream, no failure, no pause, no success-rate sample) and writes the error in the client's
  format — an HTTP error before the stream's head, the in-stream error event after it.

An abort that comes while the request only finishes (its answer written, its row on the way)
takes no effect: `Running.abort` says so, and the control plane answers that it finished.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.lowlevel

from twengine import attempt as act
from twproto.errors import ErrorCategory, GatewayError
from twproto.upstream_request import ClientCall

if TYPE_CHECKING:
    from twengine.attempt import AttemptLedger, LedgerAction
    from twserve.relay.client import ClientAnswer, RelayOutcome
    from twserve.relay.feed import AttemptFeed
    from twserve.relay.holds import SlotHolds

__all__ = [
    "ABORTED_CODE",
    "AbortPosted",
    "Aborts",
    "Running",
    "abort_error",
    "end_aborted",
    "settle_gone",
]

ABORTED_CODE = "gw.request.aborted"

# How many finished ids are remembered, so an abort that comes just after the end is told the
# request finished while its row is still on its way to the store.
_RECENT = 1024


def abort_error(reason: str | None = None) -> GatewayError:
    """The error an aborted request ends with: 503 that no SDK retries (``x-should-retry:
    false``), since an operator stopped it on purpose."""
    tail = f": {reason}" if reason else ""
    return GatewayError(
        status=503,
        category=ErrorCategory.DENIED,
        code=ABORTED_CODE,
        message=f"the request was aborted by the gateway's operator{tail}",
        should_retry=False,
    )


@dataclass(frozen=True, slots=True)
class AbortPosted:
    """The relay's inbox item for an abort (`Running.error` holds its error)."""


ABORT = AbortPosted()


class Running:
    """One running request: where an abort reaches it now (`wait_scope` while it waits for its
    key, `post` — its relay's inbox — while the relay carries it), and the abort's error once
    aborted."""

    __slots__ = ("__weakref__", "error", "id", "post", "wait_scope")

    def __init__(self, request_id: str = "") -> None:
        self.id = request_id  # the row's id, the client's x-request-id
        self.error: GatewayError | None = None
        self.wait_scope: anyio.CancelScope | None = None
        self.post: Callable[[AbortPosted], None] | None = None

    def attach(self, post: Callable[[AbortPosted], None]) -> Running:
        """The relay carries the request from now on; an abort posts to it with `post`."""
        self.post = post
        return self

    def abort(self, error: GatewayError) -> str | None:
        """Abort the request with `error`: where it was (``key_wait``, ``relay``), or None when
        it is past the point of being aborted (finishing) or was aborted already."""
        if self.error is not None:
            return None
        if self.post is not None:
            self.error = error
            try:
                self.post(ABORT)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # a full inbox: the relay sees `error` with the next item it takes
            return "relay"
        if self.wait_scope is not None:
            self.error = error
            self.wait_scope.cancel()
            return "key_wait"
        return None


class AbortedRelay(Protocol):
    """What `end_aborted` uses of the relay (`twserve.relay.loop`)."""

    ledger: AttemptLedger
    feed: AttemptFeed
    slots: SlotHolds
    client: ClientAnswer
    out: RelayOutcome
    call: ClientCall
    running: Running | None


def settle_gone(actions: Sequence[LedgerAction], slots: SlotHolds, feed: AttemptFeed) -> None:
    """Carry out the ledger's verbs for a request whose client is gone (or was aborted): the
    slots and health records are booked, the attempt in flight is stopped, nothing is
    written."""
    for action in actions:
        match action:
            case act.ReleaseSlot() | act.CancelWait() | act.RecordFailure() | act.RecordSuccess():
                slots.book(action)
            case act.CancelAttempt() | act.FinishRequest():
                feed.end_attempt()
            case _:
                pass


async def end_aborted(relay: AbortedRelay, now: float) -> None:
    """End `relay`'s request for its abort: the ledger cancels it as for a client that left
    (nothing counts against an upstream), then the client gets the error in its format — the
    in-stream error event once its stream's head is out, else an HTTP error."""
    assert relay.running is not None and relay.running.error is not None
    error, out, feed, client = relay.running.error, relay.out, relay.feed, relay.client
    live, resumed = feed.ending()
    writing = live is not None and live.stream.writing
    feed.client_left(out, client.started)  # the upstream and usage of what went out
    settle_gone(relay.ledger.client_gone(now), relay.slots, feed)
    out.cancelled, out.delivered = True, False
    if writing:
        # The reader was cut short inside a write: let its cancellation land first, so the
        # error event is not written beside it.
        await anyio.lowlevel.checkpoint()
    if relay.call.stream and (client.started or (live is not None and live.stream.committed)):
        await client.end_stream_with_error(error, live, resumed)
    else:
        await client.error(error)


class Aborts:
    """The running requests by id (held weakly: a request gone without a row leaves no entry),
    and the ids of those whose row was written lately (`ended`)."""

    def __init__(self) -> None:
        self._running: weakref.WeakValueDictionary[str, Running] = weakref.WeakValueDictionary()
        self._finished: OrderedDict[str, None] = OrderedDict()

    def begin(self, request_id: str) -> Running:
        entry = Running(request_id)
        self._running[request_id] = entry
        return entry

    def ended(self, request_id: str) -> None:
        """The request's row is written: it is finished from now on."""
        if self._running.pop(request_id, None) is not None:
            finished = self._finished
            finished[request_id] = None
            if len(finished) > _RECENT:
                finished.popitem(last=False)

    def running(self, request_id: str) -> bool:
        return request_id in self._running

    def finished_lately(self, request_id: str) -> bool:
        return request_id in self._finished

    def abort(self, request_id: str, error: GatewayError) -> str | None:
        """Abort `request_id`: where it was (`Running.abort`), ``""`` when it is finishing or
        was aborted already, None when no request of that id runs here."""
        entry = self._running.get(request_id)
        if entry is None:
            return None
        return entry.abort(error) or ""

    def __len__(self) -> int:
        return len(self._running)
