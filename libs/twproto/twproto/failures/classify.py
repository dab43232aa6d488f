"""Classification: a response, an in-stream error or a transport fault becomes a `Failure`."""

from __future__ import annotations

from collections.abc import Sequence

from twproto import _json
from twproto.dialect import Dialect
from twproto.failures.evidence import (
    _codex_windows,
    _header_map,
    _id,
    _Info,
    _quota_reset,
    _read_payload,
    _retry_after,
    _window_reset,
)
from twproto.failures.kinds import (
    _MAX_MESSAGE,
    KIND_POLICY,
    MAX_BODY_BYTES,
    Evidence,
    Failure,
    FailureKind,
    PauseRule,
    TransportFault,
)
from twproto.failures.rules import RULES, TEMPORARY_STATUSES, FailureRule

__all__ = (
    "classify_response",
    "classify_stream_error",
    "classify_transport",
    "idle_timeout",
    "stream_ended_early",
)


def _matches(
    rule: FailureRule, status: int | None, ids: Sequence[str], text: str, facts: set[Evidence]
) -> bool:
    if rule.statuses is not None and status not in rule.statuses:
        return False
    if not rule.needs <= facts:
        return False
    if not rule.codes and rule.pattern is None:
        return True
    if rule.codes and any(i in rule.codes for i in ids):
        return True
    return rule.pattern is not None and rule.pattern.search(text) is not None


def _classify(
    status: int | None,
    headers: dict[str, str],
    payload: object,
    body_text: str,
    now: float,
) -> Failure:
    info = _Info()
    _read_payload(payload, info)
    for k, v in info.headers.items():
        headers.setdefault(k, v)
    # Header-declared AWS exception names (x-amzn-ErrorType, or an event-stream frame header).
    for name in ("x-amzn-errortype", ":exception-type", ":error-code"):
        ident = _id(headers.get(name))
        if ident is not None:
            info.ids.append(ident)
    if status is None:
        status = info.status
    if info.message:
        message = info.message[:_MAX_MESSAGE]
        text = " ".join([info.message, *info.extra_text]).lower()
    else:
        # Not JSON, or JSON without a message field: search the whole (bounded) body.
        message = " ".join(body_text[: _MAX_MESSAGE * 4].split())[:_MAX_MESSAGE]
        text = " ".join([body_text, *info.extra_text]).lower()

    retry_after = _retry_after(headers, info, text, now)
    codex_full, codex_reset = _codex_windows(headers, now)
    facts: set[Evidence] = set()
    if retry_after is not None:
        facts.add(Evidence.RETRY_HINT)
    if info.daily_quota:
        facts.add(Evidence.DAILY_QUOTA)
    if codex_full:
        facts.add(Evidence.QUOTA_HEADERS_FULL)

    rule = next(r for r in RULES if _matches(r, status, info.ids, text, facts))
    policy = KIND_POLICY[rule.kind]
    pause = policy.pause
    pause_secs: float | None = None
    reset_at: float | None = None
    if rule.kind is FailureKind.QUOTA_USED_UP:
        reset_at = _quota_reset(info, headers, codex_reset, now)
        pause_secs = max(0.0, reset_at - now) if reset_at is not None else retry_after
    elif rule.kind is FailureKind.RATE_LIMITED:
        reset_at = _window_reset(headers, now)
        if retry_after is not None:
            pause_secs = retry_after
        elif reset_at is not None:
            pause_secs = max(0.0, reset_at - now)
        else:
            pause = PauseRule.UNEXPLAINED  # a rate limit without a named pause
    temporary = policy.temporary
    if status is not None and status >= 500 and status not in TEMPORARY_STATUSES:
        temporary = False
    return Failure(
        kind=rule.kind,
        failover=policy.failover,
        temporary=temporary,
        pause=pause,
        pause_secs=pause_secs,
        reset_at=reset_at,
        retry_after_secs=retry_after,
        status=status,
        message=message,
        error_type=info.error_type or (info.ids[0] if info.ids else None),
        rule=rule.name,
    )


def classify_response(
    status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes, *, now: float
) -> Failure:
    """Classify an HTTP error response. Reads at most `MAX_BODY_BYTES` of `body`; never raises."""
    raw = bytes(body[:MAX_BODY_BYTES])
    payload: object = None
    try:
        payload = _json.loads(raw)
    except ValueError:  # JSONDecodeError: HTML, plain text, truncated JSON
        payload = None
    return _classify(status, _header_map(headers), payload, raw.decode("utf-8", "replace"), now)


def classify_stream_error(dialect: Dialect, payload: object, *, now: float) -> Failure:
    """Classify an error event received inside a stream (before or after content).

    `payload` is the event's parsed JSON (or its raw text when it did not parse): an Anthropic
    ``error`` event, a Responses ``response.failed`` / ``error`` event (a Codex one may carry its
    ``status_code`` and ``headers``), a Chat chunk with ``error``, or a Gemini error object. An
    error code that is an HTTP status (Gemini, relays) is read as the status. Never raises.
    """
    del dialect  # every dialect's error shape is recognised by its own fields
    if isinstance(payload, bytes | bytearray):
        payload = bytes(payload[:MAX_BODY_BYTES]).decode("utf-8", "replace")
    if isinstance(payload, str):
        text = payload[:MAX_BODY_BYTES]
        try:
            parsed: object = _json.loads(text)
        except ValueError:
            parsed = None
        return _classify(None, {}, parsed, text, now)
    return _classify(None, {}, payload, "", now)


def _fixed(kind: FailureKind, *, message: str, rule: str) -> Failure:
    policy = KIND_POLICY[kind]
    return Failure(
        kind=kind,
        failover=policy.failover,
        temporary=policy.temporary,
        pause=policy.pause,
        message=message,
        rule=rule,
    )


#: The Retry-After (seconds) of a request that ends on the gateway's own shortage: the shortage
#: is of the moment (connections handed back, descriptors closed), as load shedding's is.
GATEWAY_BUSY_RETRY_SECS = 1.0

# Transport faults that are the gateway's own shortage, with the message the client reads.
_GATEWAY_BUSY: dict[TransportFault, str] = {
    TransportFault.POOL_FULL: (
        "the gateway is overloaded: every upstream connection of the gateway is in use"
        " (pool.max_connections)"
    ),
    TransportFault.LOCAL_RESOURCES: (
        "the gateway is overloaded: its host could not open a connection to the upstream"
        " (out of file descriptors or local ports)"
    ),
}


def classify_transport(fault: TransportFault) -> Failure:
    """Classify a fault below HTTP: a connect failure, or a body that broke before content."""
    if fault is TransportFault.BODY_BROKEN:
        return _fixed(
            FailureKind.STREAM_ENDED_EARLY,
            message="the upstream connection broke before any content",
            rule=f"transport_{fault.value}",
        )
    if fault in _GATEWAY_BUSY:
        policy = KIND_POLICY[FailureKind.GATEWAY_BUSY]
        return Failure(
            kind=FailureKind.GATEWAY_BUSY,
            failover=policy.failover,
            temporary=policy.temporary,
            pause=policy.pause,
            retry_after_secs=GATEWAY_BUSY_RETRY_SECS,
            message=_GATEWAY_BUSY[fault],
            rule=f"transport_{fault.value}",
        )
    return _fixed(
        FailureKind.CONNECT,
        message=f"could not reach the upstream ({fault.value})",
        rule=f"transport_{fault.value}",
    )


def stream_ended_early() -> Failure:
    """The stream broke or ended before its first content (temporary, fails over)."""
    return _fixed(
        FailureKind.STREAM_ENDED_EARLY,
        message="the upstream stream ended before any content",
        rule="stream_ended_early",
    )


def idle_timeout() -> Failure:
    """No content within the idle timeout (fails over, not retried on the same upstream)."""
    return _fixed(
        FailureKind.IDLE_TIMEOUT,
        message="the upstream sent nothing within the idle timeout",
        rule="idle_timeout",
    )
