"""The request row and the retry events of a relayed request, from what the relay reports.

`new_row` starts a generation's row, `note_admission` records what admission saw of the
request, `note_local` a request answered here, `note_credential_skips` the upstreams skipped for
their credentials; `fill_row` copies a `RelayOutcome` into its `RequestRow` (docs/operations.md,
"The request row");
`retry_observer` publishes ``RequestRetrying`` / ``RequestDequeued`` for the relay's backoffs
and slot waits (docs/control-plane.md, "Events").
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any, assert_never

from twengine.admission import LocalAnswer, Refusal, Routed
from twengine.attempt import Action, AttemptRecord, Backoff, ResendReason, Send, attempt_view
from twengine.config import CredentialFault
from twproto.dialect import Dialect
from twserve.events import EventBus
from twserve.observe.request_ids import client_ids
from twserve.relay.client import RelayOutcome
from twserve.server.base import Request
from twserve.store.sqlite import RequestRow

__all__ = [
    "credential_skip_view",
    "fill_row",
    "new_row",
    "note_admission",
    "note_credential_skips",
    "note_local",
    "request_ids",
    "retry_observer",
]


def request_ids() -> Callable[[], str]:
    """A source of request ids, the rows' keys: a random prefix per process and a counter (one
    urandom call in all)."""
    prefix, counter = uuid.uuid4().hex[:12], itertools.count(1)
    return lambda: f"{prefix}{next(counter):012x}"


def new_row(
    request_id: str, ts: float, request: Request, client: str, dialect: Dialect
) -> RequestRow:
    """The row of a generation `request` by `client` in `dialect`'s format, started at `ts`
    (the wall clock), with the client's own request id if it sent a valid one."""
    correlation, traceparent = client_ids(request.headers)
    return RequestRow(
        id=request_id,
        ts=ts,
        path=request.path,
        key_name=client,
        format=dialect.value,
        correlation_id=correlation,
        traceparent=traceparent,
        request_bytes=len(request.body),
    )


def note_admission(row: RequestRow, verdict: Refusal | LocalAnswer | Routed) -> None:
    """What admission saw of the request (model, stream, session, routing) and, for a request
    it refused or answered itself, how it ended."""
    view = verdict.view
    row.model, row.stream, row.session = view.model, view.stream, view.session
    row.routing = dict(view.routing) if view.routing is not None else None
    match verdict:
        case Refusal(error=err):
            row.status, row.error_code = err.status, err.code
        case LocalAnswer(status=status, input_tokens=tokens):
            note_local(row, tokens, status=status)
        case Routed():
            pass
        case _:
            assert_never(verdict)


def note_local(row: RequestRow, input_tokens: int, *, status: int = 200) -> None:
    """A request the gateway answered itself: no upstream, no cost."""
    row.local, row.status, row.provider = True, status, None
    row.cost_micros, row.cost_state = 0, "local"
    row.input_tokens = input_tokens


def note_credential_skips(row: RequestRow, faults: list[CredentialFault]) -> None:
    """The upstreams skipped for their credentials, as the first entries of the attempts."""
    if faults:
        routing = row.routing if row.routing is not None else {}
        routing["attempts"] = [credential_skip_view(f) for f in faults]
        row.routing = routing


def fill_row(
    row: RequestRow,
    outcome: RelayOutcome,
    models: dict[str, str],
    efforts: dict[str, dict[str, Any]] | None = None,
) -> None:
    """`outcome` into `row`; `models` names the model sent to each upstream, `efforts` what
    became of each one's reasoning level (twengine.reasoning.Efforts)."""
    row.status = outcome.status
    row.provider = outcome.provider
    row.ttfb_ms = outcome.ttfb_ms
    row.error_code = outcome.error_code
    row.translated = outcome.dropped
    routing = row.routing or {}
    routing["attempts"] = [
        *routing.get("attempts", ()),  # upstreams skipped for their credentials
        *(
            attempt_view(a, models.get(a.provider), _effort_view(a, outcome, efforts or {}))
            for a in outcome.attempts
        ),
    ]
    _note_transport(routing, outcome)
    row.routing = routing
    usage = outcome.usage
    if usage is not None:
        row.input_tokens = usage.input_tokens
        row.output_tokens = usage.output_tokens
        row.cache_read_tokens = usage.cache_read_tokens
        row.cache_write_tokens = usage.cache_write_tokens
        row.reasoning_tokens = usage.reasoning_tokens


def _note_transport(routing: dict[str, Any], outcome: RelayOutcome) -> None:
    """On a client WebSocket's turn: which upstream transport each attempt and the answer used
    (an upstream's own Responses socket, twserve.upstream.responses_socket, or HTTP)."""
    over_socket = outcome.over_socket
    if over_socket is None:
        return
    views = routing["attempts"]
    first = len(views) - len(outcome.attempts)  # after the upstreams skipped for credentials
    for index in over_socket:
        if 0 <= first + index < len(views):
            views[first + index]["transport"] = "websocket"
    if outcome.provider is not None:
        answered = [i for i, a in enumerate(outcome.attempts) if a.provider == outcome.provider]
        used = bool(answered) and answered[-1] in over_socket
        routing["upstream_transport"] = "websocket" if used else "http"


def retry_observer(
    events: EventBus | None, request_id: str, clock: Callable[[], float]
) -> Callable[[Action], None] | None:
    """The relay's observer for `request_id`: retry and dequeue events on `events`."""
    if events is None:
        return None

    def observe(action: Action) -> None:
        if isinstance(action, Backoff):
            backoff_ms = int(max(0.0, action.until - clock()) * 1000)
            events.request_retrying(request_id, retry=action.retry_round, backoff_ms=backoff_ms)
        elif isinstance(action, Send):
            events.request_dequeued(
                request_id,
                provider=action.provider,
                retry=action.retry_round,
                queued_ms=action.backoff_ms or action.queued_ms,
            )

    return observe


def _effort_view(
    record: AttemptRecord, outcome: RelayOutcome, efforts: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """``{asked, sent, reason}`` of an attempt (docs/operations.md), None when unchanged."""
    base = efforts.get(record.provider)
    if record.resend is ResendReason.EFFORT_REFUSED:
        sent = outcome.effort_resent.get(record.provider)
        asked = base["asked"] if base else None
        return {"asked": asked, "sent": sent, "reason": "rejected"}
    return base if base is not None and base["reason"] is not None else None


def credential_skip_view(fault: CredentialFault) -> dict[str, Any]:
    """An upstream skipped for its credentials, in the shape of `attempt_view`."""
    return {
        "provider": fault.provider,
        "model": None,
        "outcome": "skipped",
        "status": None,
        "error": fault.code,
        "ms": None,
        "queued_ms": 0,
        "skipped": fault.code.rsplit(".", 1)[-1],
        "retry": 0,
        "backoff_ms": None,
        "resend": None,
        "effort": None,
        "resumed_from": None,
    }


def _span_ms(start: float | None, end: float | None) -> int | None:
    if start is None or end is None:
        return None
    return int((end - start) * 1000)
