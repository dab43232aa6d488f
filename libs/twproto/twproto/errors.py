"""Errors written in the client's own format.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from twproto import _json
from twproto.dialect import Dialect

__all__ = [
    "ERROR_HEADER",
    "MAX_RETRY_SLEEP_SECS",
    "ErrorCategory",
    "GatewayError",
    "error_body",
    "error_headers",
    "stream_error_event",
]

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
        return {
            "error": {
                "code": err.status,
                "message": err.message,
                "status": _gemini_status(err.status),
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
                "error": {"code": _openai_type(err), "message": err.message},
                "incomplete_details": None,
                "usage": None,
            },
        }
        return b"event: response.failed\ndata: " + _json.dumps(failed) + b"\n\n"
    return b"data: " + _json.dumps(_error_object(dialect, err)) + b"\n\n"
