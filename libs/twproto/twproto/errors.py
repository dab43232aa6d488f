"""Errors a client gets: which one, and how it is written in the client's own format.

Whatever goes wrong — a bad key, a body that is not JSON, every upstream failing — the client
reads it with its own SDK, so the body has the shape that SDK parses:

* Anthropic: ``{"type": "error", "error": {"type": ..., "message": ...}}``
* OpenAI (Chat and Responses): ``{"error": {"message", "type", "param", "code"}}``
* Gemini: ``{"error": {"code", "message", "status"}}``

Every gateway error also carries the header ``x-thinkwatch-error`` with one of the
`ErrorCategory` values, so scripts can tell a gateway refusal from an upstream's own answer
without parsing the body.

Mid-stream, after the 200 has gone out, the same error becomes an event the client's SDK
understands (`stream_error_event`).

Which error a client gets for what went wrong upstream is one mapping, from an upstream
`Failure` (or an in-stream error event) to a `GatewayError` (docs/failover.md, "Which failures
fail over, retry, pause"). Three situations, one table:

* **The request ends on a failure** (`error_for_failure`): the status, category and code come
  from `_BY_KIND`. The upstream's own status is kept where it says more (529 over 503, a 400 the
  client must fix); never for credentials, where an upstream's 401 must not read as the client's
  own gateway key being wrong. A failure without a status that is not a transport fault is an
  error event that opened the stream (``gw.upstream.stream_opening_error``) — unless content had
  already gone out. A rate limit carries the upstream's retry hint as ``Retry-After``.
* **The upstream's own 4xx, re-said** (`error_for_failure(..., passed_on=True)`): the last
  upstream's 4xx other than 429 reaches the client as it came; where the upstream speaks
  another format, or its body is gone, the gateway writes the same status in the client's format
  (``gw.upstream.error``).
* **An error event inside a committed stream** (`error_for_stream_event`): re-encoded for the
  client as the status it stands for (``gw.upstream.stream_error``).

`request_failure` is the other direction: a request that cannot be written for an upstream is
the client's to fix, a `Failure` that neither fails over nor counts against the upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from twproto import _json, ir
from twproto.dialect import Dialect
from twproto.failures import Failure, FailureKind, PauseRule, classify_stream_error

__all__ = (
    "ANTHROPIC_ERROR_TYPES",
    "ERROR_HEADER",
    "MAX_RETRY_SLEEP_SECS",
    "RESPONSES_ERROR_CODES",
    "ErrorCategory",
    "GatewayError",
    "anthropic_stream_type",
    "error_body",
    "error_for_failure",
    "error_for_stream_event",
    "error_for_unreadable_answer",
    "error_headers",
    "passes_through",
    "request_failure",
    "stream_error_event",
)

ERROR_HEADER = b"x-thinkwatch-error"

#: The longest ``Retry-After`` (seconds) a client is left to sleep through. A longer one goes
#: with ``x-should-retry: false``: the Anthropic SDK sleeps for whatever Retry-After says
#: (an hour for an hourly limit) before its retry, the OpenAI SDK follows it up to 120 s; told
#: not to retry, both raise at once and the caller decides when to come back.
MAX_RETRY_SLEEP_SECS = 60


class ErrorCategory(StrEnum):
    AUTH = "auth"
    CONFIG = "config"
    UPSTREAM = "upstream"
    REQUEST = "request"
    RATE_LIMITED = "rate_limited"
    DENIED = "denied"
    TIMEOUT = "timeout"
    NOT_SUPPORTED = "not_supported"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayError:
    """An error the gateway itself answers with.

    `code` is the stable message code (``gw.auth.bad_key``…) listed in docs/codes.md.
    `retry_after` (seconds) becomes a ``Retry-After`` header; beyond `MAX_RETRY_SLEEP_SECS`,
    `should_retry` left None becomes False (``x-should-retry: false``). `openai_type` overrides the
    OpenAI ``type`` field where the status alone is not enough (``insufficient_quota``).
    """

    status: int
    category: ErrorCategory
    code: str
    message: str
    retry_after: float | None = None
    openai_type: str | None = None
    should_retry: bool | None = None
    extra_headers: tuple[tuple[bytes, bytes], ...] = field(default=())

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 599:
            raise ValueError(f"error status must be 4xx or 5xx, not {self.status}")


# Status → the error type each SDK expects. Anthropic's and OpenAI's names differ only a little.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_GEMINI_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    529: "UNAVAILABLE",
}


# The error types Anthropic documents (the API's errors page; the SDKs' `ErrorType`): an Anthropic
# client is never shown another, whatever the upstream called its error.
ANTHROPIC_ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "billing_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "overloaded_error",
    }
)
# The codes of a Responses `response.failed` error (the API reference's `ResponseError.code`), plus
# `insufficient_quota`, which the real API sends there too (fixture
# openai-responses-failed-insufficient-quota.sse) and Codex reads as "quota exceeded".
RESPONSES_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
        "insufficient_quota",
    }
)
# Gemini's error `code` is the HTTP status of its canonical `status`; 529 is not one of them.
_GEMINI_CODES = {"UNAVAILABLE": 503}


def anthropic_stream_type(err: GatewayError, upstream_type: str | None) -> str:
    """The `error.type` of an Anthropic ``event: error`` for `err`: the upstream's own type when
    it is one of Anthropic's (an Anthropic upstream's `overloaded_error`), else the status's."""
    if upstream_type in ANTHROPIC_ERROR_TYPES:
        return upstream_type
    return _anthropic_type(err.status)


def _responses_code(err: GatewayError) -> str:
    if err.openai_type in RESPONSES_ERROR_CODES:
        return err.openai_type
    return "rate_limit_exceeded" if err.status == 429 else "server_error"


def _anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def _openai_type(err: GatewayError) -> str:
    if err.openai_type:
        return err.openai_type
    return _OPENAI_TYPES.get(
        err.status, "server_error" if err.status >= 500 else "invalid_request_error"
    )


def _gemini_status(status: int) -> str:
    return _GEMINI_STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def _error_object(dialect: Dialect, err: GatewayError) -> dict[str, object]:
    if dialect is Dialect.ANTHROPIC:
        return {
            "type": "error",
            "error": {"type": _anthropic_type(err.status), "message": err.message},
        }
    if dialect is Dialect.GEMINI:
        status = _gemini_status(err.status)
        return {
            "error": {
                "code": _GEMINI_CODES.get(status, err.status),
                "message": err.message,
                "status": status,
            }
        }
    return {
        "error": {
            "message": err.message,
            "type": _openai_type(err),
            "param": None,
            "code": err.openai_type or err.code,
        }
    }


def error_body(dialect: Dialect, err: GatewayError) -> bytes:
    """The JSON body of an error response in `dialect`'s shape."""
    return _json.dumps(_error_object(dialect, err))


def error_headers(err: GatewayError) -> list[tuple[bytes, bytes]]:
    """Response headers for an error response (content type, category, retry hints)."""
    headers = [
        (b"content-type", b"application/json"),
        (ERROR_HEADER, err.category.value.encode()),
    ]
    should_retry = err.should_retry
    if err.retry_after is not None:
        # Retry-After takes whole seconds; round up so a client never retries too early.
        seconds = max(0, int(-(-err.retry_after // 1)))
        headers.append((b"retry-after", str(seconds).encode()))
        if should_retry is None and seconds > MAX_RETRY_SLEEP_SECS:
            should_retry = False
    if should_retry is not None:
        headers.append((b"x-should-retry", b"true" if should_retry else b"false"))
    headers.extend(err.extra_headers)
    return headers


def stream_error_event(
    dialect: Dialect,
    err: GatewayError,
    *,
    response_id: str = "resp_gateway_error",
    model: str = "",
    sequence_number: int = 0,
    created_at: int = 0,
) -> bytes:
    """The SSE event (already framed) that ends a stream with `err` in `dialect`.

    Anthropic: ``event: error``. Chat: a chunk carrying ``error``, which the OpenAI SDK raises.
    Responses: ``response.failed`` with the response's id and model. Gemini: an error object.
    """
    if dialect is Dialect.ANTHROPIC:
        return b"event: error\ndata: " + _json.dumps(_error_object(dialect, err)) + b"\n\n"
    if dialect is Dialect.OPENAI_RESPONSES:
        failed = {
            "type": "response.failed",
            "sequence_number": sequence_number,
            "response": {
                "id": response_id,
                "object": "response",
                "created_at": created_at,
                "status": "failed",
                "model": model,
                "output": [],
                "error": {"code": _responses_code(err), "message": err.message},
                "incomplete_details": None,
                "usage": None,
            },
        }
        return b"event: response.failed\ndata: " + _json.dumps(failed) + b"\n\n"
    return b"data: " + _json.dumps(_error_object(dialect, err)) + b"\n\n"


# Which error a client gets for what went wrong upstream.
_K = FailureKind
_C = ErrorCategory

_BY_KIND: Mapping[FailureKind, tuple[int, ErrorCategory, str]] = {
    _K.NO_BALANCE: (402, _C.UPSTREAM, "gw.upstream.error"),
    _K.QUOTA_USED_UP: (429, _C.RATE_LIMITED, "gw.upstream.error"),
    _K.RATE_LIMITED: (429, _C.RATE_LIMITED, "gw.upstream.error"),
    # Never the upstream's own status or words: its 401 would read as the client's key being
    # wrong, and an upstream that echoes the key it was sent would hand the secret to the client.
    _K.AUTH_REJECTED: (502, _C.UPSTREAM, "gw.upstream.auth_rejected"),
    _K.MODEL_UNAVAILABLE: (404, _C.UPSTREAM, "gw.upstream.error"),
    # 529 is the status an overloaded upstream answers with (Anthropic's overloaded_error); an
    # in-stream overload carries no status of its own and keeps its meaning this way.
    _K.OVERLOADED: (529, _C.UPSTREAM, "gw.upstream.error"),
    _K.SERVER: (502, _C.UPSTREAM, "gw.upstream.error"),
    _K.CONNECT: (502, _C.UPSTREAM, "gw.upstream.connect"),
    _K.STREAM_ENDED_EARLY: (502, _C.UPSTREAM, "gw.upstream.stream_ended_early"),
    _K.IDLE_TIMEOUT: (504, _C.TIMEOUT, "gw.upstream.idle_timeout"),
    _K.EFFORT_REFUSED: (400, _C.REQUEST, "gw.upstream.error"),
    _K.SEALED_REASONING: (400, _C.REQUEST, "gw.upstream.error"),
    _K.CONTEXT_OVERFLOW: (400, _C.REQUEST, "gw.upstream.error"),
    _K.CLIENT_ERROR: (400, _C.REQUEST, "gw.upstream.error"),
    # The gateway's own shortage, said as load shedding says it: 503, Retry-After, and a
    # category that does not name the upstream.
    _K.GATEWAY_BUSY: (503, _C.RATE_LIMITED, "gw.overloaded"),
}
_KEEP_UPSTREAM_STATUS = frozenset(
    {
        _K.OVERLOADED,
        _K.SERVER,
        _K.EFFORT_REFUSED,
        _K.SEALED_REASONING,
        _K.CONTEXT_OVERFLOW,
        _K.CLIENT_ERROR,
    }
)
_INSUFFICIENT_QUOTA = frozenset({_K.NO_BALANCE, _K.QUOTA_USED_UP})
# Kinds whose code says more than "an error event opened the stream".
_OWN_CODE = frozenset({_K.AUTH_REJECTED})
# Kinds that arise without any response from the upstream; they keep their own codes.
_NO_RESPONSE = frozenset({_K.CONNECT, _K.STREAM_ENDED_EARLY, _K.IDLE_TIMEOUT, _K.GATEWAY_BUSY})
# In-stream error types that OpenAI clients tell apart by their ``type``.
_OPENAI_STREAM_TYPES = frozenset({"insufficient_quota", "server_error", "rate_limit_exceeded"})


def passes_through(failure: Failure) -> bool:
    """Whether the upstream's own response reaches the client unchanged when `failure` ends the
    request: a 4xx other than 429. An in-stream error has no response of its own to pass on."""
    status = failure.status
    # An upstream's refusal of the gateway's credentials is never passed on (see _BY_KIND).
    return (
        status is not None
        and 400 <= status < 500
        and status != 429
        and failure.kind is not FailureKind.AUTH_REJECTED
    )


def error_for_failure(
    failure: Failure,
    *,
    after_content: bool = False,
    passed_on: bool = False,
    tried: Sequence[str] = (),
) -> GatewayError:
    """The error that ends a request on `failure` (see the module notes).

    `after_content`: the client already has part of the answer. `passed_on`: the upstream's own
    4xx, written again in the client's format. `tried` lists the upstreams asked, in order; with
    more than one the message ends ``(tried: a → b)``.
    """
    message = failure.message or failure.kind.value.replace("_", " ")
    if passed_on:
        status = failure.status if failure.status and 400 <= failure.status < 600 else 502
        return GatewayError(
            status=status,
            category=_C.UPSTREAM,
            code="gw.upstream.error",
            message=failure.message or failure.kind.value,
        )
    status, category, code = _BY_KIND[failure.kind]
    if (
        failure.status is None
        and failure.kind not in _OWN_CODE
        and failure.kind not in _NO_RESPONSE
        and not after_content
    ):
        code = "gw.upstream.stream_opening_error"
    if (
        failure.kind in _KEEP_UPSTREAM_STATUS
        and failure.status is not None
        and 400 <= failure.status <= 599
    ):
        status = failure.status
    retry_after: float | None = None
    if category is _C.RATE_LIMITED:
        retry_after = failure.retry_after_secs or failure.pause_secs
    if failure.kind is FailureKind.AUTH_REJECTED:
        answered = f"HTTP {failure.status}" if failure.status else "an error event"
        message = (
            f"the upstream refused the gateway's credentials for it ({answered}); "
            "check the upstream's key in the gateway's config"
        )
    suffix = f" (tried: {' → '.join(tried)})" if len(tried) > 1 else ""
    return GatewayError(
        status=status,
        category=category,
        code=code,
        message=message + suffix,
        retry_after=retry_after,
        openai_type="insufficient_quota" if failure.kind in _INSUFFICIENT_QUOTA else None,
    )


def error_for_stream_event(event: ir.StreamErrorEvent) -> GatewayError:
    """An upstream's error event inside a committed stream, as the client's format reports it.

    An overload keeps its meaning across formats: a Chat `server_error` saying "overloaded", or a
    Gemini `UNAVAILABLE`, is status 529 (Anthropic's `overloaded_error`), recognised by the same
    rules that classify failures (`twproto.failures`)."""
    status = event.status if 400 <= event.status <= 599 else 500
    if status >= 500 and status != 529:
        payload = {"error": {"type": event.type, "message": event.message}}
        if (
            classify_stream_error(Dialect.ANTHROPIC, payload, now=0.0).kind
            is FailureKind.OVERLOADED
        ):
            status = 529
    return GatewayError(
        status=status,
        category=_C.UPSTREAM,
        code="gw.upstream.stream_error",
        message=event.message,
        openai_type=event.type if event.type in _OPENAI_STREAM_TYPES else None,
    )


def request_failure(message: str, *, status: int) -> Failure:
    """A request that cannot be written for an upstream: the client's to fix."""
    return Failure(
        kind=FailureKind.CLIENT_ERROR,
        failover=False,
        temporary=False,
        pause=PauseRule.NONE,
        status=status,
        message=message,
    )


def error_for_unreadable_answer(provider: str, detail: str) -> GatewayError:
    """A whole answer from another format that could not be read for the client."""
    return GatewayError(
        status=502,
        category=_C.UPSTREAM,
        code="gw.upstream.error",
        message=f"the answer from {provider} could not be read: {detail}",
    )
