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

from collections import OrderedDict
from collections.abc import Callable

import anyio

from twproto.errors import ErrorCategory, GatewayError

__all__ = ["ABORTED_CODE", "Aborts", "Running", "abort_error"]

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


class Running:
    """One running request: where an abort reaches it now (`wait_scope` while it waits for its
    key, `on_abort` while the relay carries it), and the abort's error once aborted."""

    __slots__ = ("error", "on_abort", "wait_scope")

    def __init__(self) -> None:
        self.error: GatewayError | None = None
        self.wait_scope: anyio.CancelScope | None = None
        self.on_abort: Callable[[GatewayError], None] | None = None

    def abort(self, error: GatewayError) -> str | None:
        """Abort the request with `error`: where it was (``key_wait``, ``relay``), or None when
        it is past the point of being aborted (finishing) or was aborted already."""
        if self.error is not None:
            return None
        if self.on_abort is not None:
            self.error = error
            self.on_abort(error)
            return "relay"
        if self.wait_scope is not None:
            self.error = error
            self.wait_scope.cancel()
            return "key_wait"
        return None


class Aborts:
    """The running requests by id, and the ids of those that finished lately."""

    def __init__(self) -> None:
        self._running: dict[str, Running] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()

    def begin(self, request_id: str) -> Running:
        entry = Running()
        self._running[request_id] = entry
        return entry

    def end(self, request_id: str) -> None:
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
