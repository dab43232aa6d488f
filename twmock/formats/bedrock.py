"""Bedrock's InvokeModel answers for Anthropic models, written from the Anthropic answer.

The mock plans a Bedrock request as the Anthropic request it wraps (`twmock.plan`), then
`bedrock_plan` rewrites that plan's bytes the way Bedrock frames them, keeping every pause,
cut and stall of the script:

* a streamed answer is ``application/vnd.amazon.eventstream``: each Anthropic SSE event becomes
  a ``chunk`` event whose payload is ``{"bytes": "<base64 of the event's JSON>"}``; an in-stream
  ``error`` event becomes the ``:message-type exception`` frame Bedrock sends instead
  (``throttlingException``, ``serviceUnavailableException``…), before or after content;
* a whole answer is the Anthropic Messages JSON unchanged (Bedrock returns the model's body);
* an error status carries Bedrock's body, ``{"message": ...}``, with the exception's name in
  ``x-amzn-ErrorType`` (529 is Bedrock's 503 ``ServiceUnavailableException``); the headers
  that hint a retry (``retry-after``) stay.
"""

from __future__ import annotations

import base64
from typing import Any

from twmock.formats._wire import compact
from twmock.plan import Break, Chunk, End, Head, Plan, ResetBeforeHead, Silence, Step
from twproto import json_loads
from twproto.eventstream import EVENTSTREAM_CONTENT_TYPE, eventstream_event, eventstream_exception

__all__ = [
    "STATUS_EXCEPTIONS",
    "STREAM_EXCEPTIONS",
    "bedrock_error",
    "bedrock_plan",
    "chunk_frame",
    "count_plan",
]

# Bedrock's exception for each HTTP status it answers with (bedrock-runtime's service model).
STATUS_EXCEPTIONS: dict[int, tuple[int, str]] = {
    400: (400, "ValidationException"),
    401: (403, "AccessDeniedException"),
    403: (403, "AccessDeniedException"),
    404: (404, "ResourceNotFoundException"),
    408: (408, "ModelTimeoutException"),
    413: (400, "ValidationException"),
    424: (424, "ModelErrorException"),
    429: (429, "ThrottlingException"),
    500: (500, "InternalServerException"),
    502: (500, "InternalServerException"),
    503: (503, "ServiceUnavailableException"),
    529: (503, "ServiceUnavailableException"),
}

# The exception frame for each Anthropic in-stream error type.
STREAM_EXCEPTIONS: dict[str, str] = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "api_error": "internalServerException",
    "invalid_request_error": "validationException",
    "permission_error": "accessDeniedException",
    "authentication_error": "accessDeniedException",
}

_KEPT_HEADERS = frozenset({b"retry-after", b"retry-after-ms"})


def chunk_frame(event_json: bytes) -> bytes:
    """One ``chunk`` event carrying the Anthropic event `event_json`."""
    payload = b'{"bytes":"' + base64.b64encode(event_json) + b'"}'
    return eventstream_event("chunk", payload)


def _message(body: bytes) -> str:
    try:
        obj: Any = json_loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return body.decode("utf-8", "replace")


def bedrock_error(status: int, message: str) -> tuple[int, str, bytes]:
    """Bedrock's status, exception name and body for an error of HTTP `status`."""
    code, name = STATUS_EXCEPTIONS.get(status, (500, "InternalServerException"))
    return code, name, compact({"message": message})


def _frames(sse: bytes) -> bytes:
    out: list[bytes] = []
    for block in sse.split(b"\n\n"):
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            continue
        obj = json_loads(data)
        if obj.get("type") == "error":
            error = obj.get("error") or {}
            name = STREAM_EXCEPTIONS.get(error.get("type", ""), "modelStreamErrorException")
            out.append(eventstream_exception(name, compact({"message": error.get("message", "")})))
        else:
            out.append(chunk_frame(data))
    return b"".join(out)


def bedrock_plan(plan: Plan, *, stream: bool) -> Plan:
    """The Anthropic `plan` as Bedrock frames it (see the module docstring)."""
    head = plan.head
    if head is None:
        return plan
    if head.status != 200:
        status, name, body = bedrock_error(head.status, _message(plan.body))
        headers = (
            (b"content-type", b"application/json"),
            (
                b"x-amzn-errortype",
                f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/".encode(),
            ),
            (b"content-length", str(len(body)).encode()),
            *((k, v) for k, v in head.headers if k in _KEPT_HEADERS),
        )
        tail = [s for s in plan.steps if isinstance(s, (End, Break, Silence, ResetBeforeHead))]
        new_head = Head(status=status, headers=headers, delay=head.delay)
        return Plan(steps=(new_head, Chunk(data=body), *tail[:1]), outcome=plan.outcome)
    if not stream:
        return plan
    steps: list[Step] = []
    for step in plan.steps:
        if isinstance(step, Head):
            headers = (
                (b"content-type", EVENTSTREAM_CONTENT_TYPE.encode()),
                (b"x-amzn-bedrock-content-type", b"application/json"),
            )
            steps.append(Head(status=200, headers=headers, delay=step.delay))
        elif isinstance(step, Chunk):
            steps.append(Chunk(data=_frames(step.data), delay=step.delay))
        else:
            steps.append(step)
    return Plan(steps=tuple(steps), outcome=plan.outcome)


def count_plan(plan: Plan) -> Plan:
    """The Anthropic token count `plan` as CountTokens answers: ``{"inputTokens": N}``, or
    Bedrock's error (`bedrock_plan`)."""
    head = plan.head
    if head is None or head.status != 200:
        return bedrock_plan(plan, stream=False)
    counted = json_loads(plan.body)
    body = compact({"inputTokens": counted["input_tokens"]})
    headers = (
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    )
    tail = [s for s in plan.steps if isinstance(s, (End, Break, Silence))]
    return Plan(
        steps=(Head(status=200, headers=headers, delay=head.delay), Chunk(data=body), *tail[:1]),
        outcome=plan.outcome,
    )
