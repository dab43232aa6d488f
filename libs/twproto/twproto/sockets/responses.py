"""The Responses WebSocket's messages: what a client's text means, and the events the gateway
writes itself on that socket (docs/transports.md, "Responses WebSocket").

A client sends JSON text events. `read_ws_client_event` turns one into a value named for what the
client asked: `TurnRequested` (a ``response.create``, with the Responses request body it stands
for), `SteerRequested` (``response.steer``) or `EventRejected` (anything else, with the reason).

The answer to a turn is the Responses stream's own events, one per message; the transport only
adds the turn's ``stream_id`` to each (`ws_tag_stream_id`). What the gateway writes besides them:

* `ws_failed_event` — the ``response.failed`` event a turn refused before its stream started
  (an HTTP error answer: a limit, a rule, an unknown model, the socket's queue full) is answered
  with: a failed response carrying the HTTP answer's error object and status, after which the
  socket stays usable; `ws_answer_failed_event` makes it from an HTTP error answer's status and
  body, `ws_gateway_failed_event` from a refusal of the transport's own;
* `ws_error_event` — the ``error`` event the openai SDK reads on this transport
  (``ResponseWsError``): ``{"type": "error", "status": <HTTP status>, "error": {...}}``, for a
  message that is no turn at all (not JSON, an unknown event type) and for a turn whose stream
  broke; `ws_answer_error_event` makes it from an HTTP error answer's status and body;
* `ws_steer_failed_event` — ``response.steer.failed`` with ``steering_not_supported``.

The gateway is also a client of this socket, towards an OpenAI Responses upstream configured with
``responses_transport: websocket``. `ws_upstream_url` is where that socket is opened (the HTTP
request's URL with a ``ws``/``wss`` scheme); `ws_upstream_create` turns a streamed Responses
create (the HTTP request the relay built) into the ``response.create`` event sent for a turn;
`read_ws_upstream_event` says what one upstream message is to the turn (does it end it, is it an
error); `ws_upstream_error_answer` makes the HTTP error answer an ``error`` event stands for, so
the failover rules read it exactly as they read an HTTP error.

Text in, values and text out: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twproto._json import dumps, loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_body

__all__ = (
    "WS_MAX_ERROR_BODY",
    "WS_RESPONSES_PATHS",
    "AnswerError",
    "EventRejected",
    "FailedResponse",
    "SteerRequested",
    "TurnRequested",
    "UpstreamErrorAnswer",
    "UpstreamSocketEvent",
    "WsClientEvent",
    "read_ws_client_event",
    "read_ws_upstream_event",
    "ws_answer_error_event",
    "ws_answer_failed_event",
    "ws_completed_event",
    "ws_error_event",
    "ws_failed_event",
    "ws_gateway_error_event",
    "ws_gateway_failed_event",
    "ws_steer_failed_event",
    "ws_stream_message",
    "ws_tag_stream_id",
    "ws_upstream_create",
    "ws_upstream_error_answer",
    "ws_upstream_url",
)

# Where a Responses socket is opened (``GET`` with ``Upgrade: websocket``): the Responses API's
# paths, Codex's included.
WS_RESPONSES_PATHS = frozenset({"/v1/responses", "/responses", "/backend-api/codex/responses"})

# Envelope fields of ``response.create`` that are not part of the request body.
_ENVELOPE = ("type", "stream_id")
# An error body bigger than this was not written as an error body.
WS_MAX_ERROR_BODY = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRequested:
    """A ``response.create``: `body` is the JSON body of the Responses request it stands for
    (``stream`` set to true: answers on this socket are always streamed); `stream_id` is the
    lane the client named, echoed on every event of the turn; `model` the model it asks for
    (empty when it names none), which a refusal's failed response names. `parsed` is `body`
    as read from the message, so that the gateway need not parse the body it was written from
    again (it is read, never changed)."""

    body: bytes
    stream_id: str | None = None
    model: str = ""
    parsed: dict[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class SteerRequested:
    """A ``response.steer``: input for a response already running."""

    input: object
    previous_response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRejected:
    """A message that is not a client event this socket takes; `message` says why."""

    message: str
    stream_id: str | None = None


WsClientEvent = TurnRequested | SteerRequested | EventRejected


def read_ws_client_event(text: str | bytes) -> WsClientEvent:
    """What one client message asks for."""
    try:
        event = loads(text)
    except ValueError:
        return EventRejected(message="the message is not valid JSON")
    if not isinstance(event, dict):
        return EventRejected(message="the message is not a JSON object")
    kind = event.get("type")
    stream_id = event.get("stream_id")
    lane = stream_id if isinstance(stream_id, str) else None
    if kind == "response.create":
        if event.get("background"):
            # As the API: a background response has no socket to stream on.
            return EventRejected(
                message="background is not supported over WebSocket", stream_id=lane
            )
        body = {k: v for k, v in event.items() if k not in _ENVELOPE}
        body["stream"] = True
        model = body.get("model")
        return TurnRequested(
            body=dumps(body),
            stream_id=lane,
            model=model if isinstance(model, str) else "",
            parsed=body,
        )
    if kind == "response.steer":
        previous = event.get("previous_response_id")
        return SteerRequested(
            input=event.get("input", ""),
            previous_response_id=previous if isinstance(previous, str) else "",
        )
    return EventRejected(
        message=f"unknown client event type {kind!r}; expected response.create", stream_id=lane
    )


def ws_error_event(error: Mapping[str, Any], *, status: int, stream_id: str | None = None) -> str:
    """An ``error`` event carrying `error` (``type``, ``code``, ``message``, ``param``) and the
    HTTP status the same failure has over HTTP."""
    event: dict[str, Any] = {"type": "error", "status": status, "error": dict(error)}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return dumps(event).decode()


def _error_object(err: GatewayError) -> dict[str, Any]:
    obj = loads(error_body(Dialect.OPENAI_RESPONSES, err))
    inner: dict[str, Any] = obj["error"]
    return inner


def ws_gateway_error_event(err: GatewayError, stream_id: str | None = None) -> str:
    """`err` as an ``error`` event, its error object as an HTTP answer's body would hold it."""
    return ws_error_event(_error_object(err), status=err.status, stream_id=stream_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerError:
    """The ``error`` event (`event`, JSON text) standing for an HTTP error answer, with the
    answer's status and error code (None when it had none)."""

    event: str
    status: int
    code: str | None


def _answer_error(status: int, body: bytes) -> dict[str, Any]:
    """The error object of an HTTP error answer (`status` ≥ 400) with `body`: the body's own
    when it has one, else a ``gw.internal`` one naming the status."""
    error: object = None
    if len(body) <= WS_MAX_ERROR_BODY:
        try:
            parsed = loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            error = parsed.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        error = _error_object(
            GatewayError(
                status=status,
                category=ErrorCategory.UPSTREAM,
                code="gw.internal",
                message=f"the turn failed with HTTP status {status}",
            )
        )
    return error


def _answer(event: str, status: int, error: Mapping[str, Any]) -> AnswerError:
    code = error.get("code")
    return AnswerError(event=event, status=status, code=code if isinstance(code, str) else None)


def ws_answer_error_event(status: int, body: bytes, stream_id: str | None = None) -> AnswerError:
    """The ``error`` event for an HTTP error answer (`status` ≥ 400) with `body`: the body's own
    error object when it has one, else a ``gw.internal`` one naming the status."""
    error = _answer_error(status, body)
    return _answer(ws_error_event(error, status=status, stream_id=stream_id), status, error)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedResponse:
    """What a refused turn's failed response says of itself: its `id` (the transport makes
    one: the turn never reached an upstream that would have), when it was made (`created_at`,
    Unix seconds) and the `model` the turn asked for."""

    id: str
    created_at: int
    model: str = ""


def ws_failed_event(
    error: Mapping[str, Any],
    *,
    status: int,
    response: FailedResponse,
    stream_id: str | None = None,
) -> str:
    """A ``response.failed`` event for a turn refused before its stream started: a response
    in status ``failed`` with no output, whose ``error`` is `error` (``code``, ``message``, and
    the ``type`` and ``param`` an HTTP error body has) and which carries the HTTP `status` the
    refusal has over HTTP. It is the only event of the turn."""
    event: dict[str, Any] = {
        "type": "response.failed",
        "sequence_number": 0,
        "response": {
            "id": response.id,
            "object": "response",
            "created_at": response.created_at,
            "status": "failed",
            "model": response.model,
            "output": [],
            "error": dict(error),
            "incomplete_details": None,
            "usage": None,
        },
        "status": status,
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return dumps(event).decode()


def ws_answer_failed_event(
    status: int, body: bytes, response: FailedResponse, stream_id: str | None = None
) -> AnswerError:
    """The ``response.failed`` event for a turn answered with an HTTP error (`status` ≥ 400,
    `body`), carrying the body's error object (a ``gw.internal`` one when it has none)."""
    error = _answer_error(status, body)
    event = ws_failed_event(error, status=status, response=response, stream_id=stream_id)
    return _answer(event, status, error)


def ws_gateway_failed_event(
    err: GatewayError, response: FailedResponse, stream_id: str | None = None
) -> str:
    """`err` as the ``response.failed`` event of a turn the transport refused itself."""
    return ws_failed_event(
        _error_object(err), status=err.status, response=response, stream_id=stream_id
    )


def ws_completed_event(answer: bytes) -> str | None:
    """A whole (non-streamed) Responses answer as the ``response.completed`` event that ends a
    streamed one; None when `answer` is not a JSON object."""
    try:
        response = loads(answer)
    except ValueError:
        return None
    if not isinstance(response, dict):
        return None
    return dumps({"type": "response.completed", "response": response}).decode()


def ws_steer_failed_event(steer: SteerRequested) -> str:
    """``response.steer.failed`` for `steer`: the gateway cannot add input to an upstream call
    already running; the client sends the input with its next ``response.create``."""
    return dumps(
        {
            "type": "response.steer.failed",
            "sequence_number": 0,
            "error": {
                "type": "invalid_request_error",
                "code": "steering_not_supported",
                "message": "the gateway does not steer a running response; "
                "send the input with the next response.create",
            },
            "steer": {"input": steer.input, "previous_response_id": steer.previous_response_id},
        }
    ).decode()


def ws_stream_message(data: str, stream_id: str | None = None) -> str | None:
    """The message that carries one event (its SSE data) of a turn's Responses stream, tagged
    with the turn's lane; None for what is no message on this socket (an empty event, a
    ``[DONE]`` sentinel)."""
    if not data or data == "[DONE]":
        return None
    return data if stream_id is None else ws_tag_stream_id(data, stream_id)


def ws_tag_stream_id(data: str, stream_id: str) -> str:
    """A stream event's JSON with ``stream_id`` set; `data` unchanged if it is not an object."""
    try:
        event = loads(data)
    except ValueError:
        return data
    if not isinstance(event, dict):
        return data
    event["stream_id"] = stream_id
    return dumps(event).decode()


# --- the gateway as a client of an upstream's Responses socket ----------------------------------

# Fields of an HTTP Responses request that only describe the HTTP transport: a socket always
# streams, and a background response has no socket to stream on.
_TRANSPORT_ONLY = ("stream", "stream_options", "background")
# The events that end a response on the socket (as the end of the body ends it over HTTP).
_TURN_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})
# The ends of a response the next turn may continue (the gateway keeps these too).
_CONTINUABLE = frozenset({"response.completed", "response.incomplete"})


def ws_upstream_url(url: str) -> str:
    """The socket URL for an HTTP request URL: ``http`` becomes ``ws``, ``https`` ``wss``."""
    if url.startswith("https://"):
        return "wss://" + url[len("https://") :]
    if url.startswith("http://"):
        return "ws://" + url[len("http://") :]
    raise ValueError(f"not an http(s) URL: {url!r}")


def ws_upstream_create(
    url: str, body: bytes, fields: Mapping[str, Any] | None = None
) -> str | None:
    """The ``response.create`` event standing for an HTTP request to `url` with `body`, when
    that request is a streamed Responses create (``POST <base>/responses``, ``stream: true``):
    its fields, less those of the HTTP transport. None for any other request (a whole answer,
    token counting, compaction), which stays on HTTP. `fields`: `body`'s top-level object when
    the caller already has it (`UpstreamRequest.fields`), read instead of parsing `body`."""
    path = urlsplit(url).path
    if not path.endswith("/responses"):
        return None
    obj: Any = fields
    if obj is None:
        try:
            obj = loads(body)
        except ValueError:
            return None
    if not isinstance(obj, Mapping) or obj.get("stream") is not True:
        return None
    kept = {k: v for k, v in obj.items() if k not in _TRANSPORT_ONLY and k != "type"}
    return dumps({"type": "response.create", **kept}).decode()


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamSocketEvent:
    """One upstream message, as far as the turn is concerned: its event `type` (empty when it
    has none), whether it `ends` the turn, and whether it is an ``error`` event. `kept`: the
    id of the response a ``response.completed`` or ``response.incomplete`` event ends, which
    the socket's next turn may name as its ``previous_response_id``."""

    type: str
    ends: bool
    error: bool
    kept: str | None = None


def read_ws_upstream_event(text: str) -> UpstreamSocketEvent:
    """What upstream message `text` is to the turn. A response ends with
    ``response.completed``, ``response.failed`` or ``response.incomplete``; an ``error`` event
    ends the turn too (whether the response had begun or not)."""
    try:
        event = loads(text)
    except ValueError:
        return UpstreamSocketEvent(type="", ends=False, error=False)
    kind = event.get("type") if isinstance(event, dict) else None
    if not isinstance(kind, str):
        return UpstreamSocketEvent(type="", ends=False, error=False)
    is_error = kind == "error"
    kept: str | None = None
    if kind in _CONTINUABLE:
        response = event.get("response")
        found = response.get("id") if isinstance(response, dict) else None
        kept = found if isinstance(found, str) and found else None
    ends = is_error or kind in _TURN_ENDS
    return UpstreamSocketEvent(type=kind, ends=ends, error=is_error, kept=kept)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamErrorAnswer:
    """The HTTP error answer an upstream's ``error`` event stands for."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def ws_upstream_error_answer(text: str) -> UpstreamErrorAnswer:
    """The HTTP answer an upstream ``error`` event stands for: the event's ``status`` (500 when
    it has none), the response headers its error object carries (``error.headers``: a
    ``retry-after``, rate-limit windows) and ``{"error": <its error object>}`` as the body."""
    try:
        event = loads(text)
    except ValueError:
        event = None
    status = 500
    error: object = None
    if isinstance(event, dict):
        raw = event.get("status")
        if isinstance(raw, int) and not isinstance(raw, bool) and 400 <= raw <= 599:
            status = raw
        error = event.get("error")
    if not isinstance(error, dict):
        error = {
            "type": "server_error",
            "code": None,
            "message": "the upstream sent an error event without an error object",
            "param": None,
        }
    return UpstreamErrorAnswer(
        status=status, headers=_error_headers(error.get("headers")), body=dumps({"error": error})
    )


def _error_headers(raw: object) -> list[tuple[bytes, bytes]]:
    """``error.headers`` as HTTP headers: string names that are tokens, string values on one
    line; anything else is left out."""
    if not isinstance(raw, dict):
        return []
    out: list[tuple[bytes, bytes]] = []
    for name, value in raw.items():
        if not (isinstance(name, str) and isinstance(value, str)):
            continue
        if not name or not all(c.isalnum() or c in "-_" for c in name) or not name.isascii():
            continue
        if "\r" in value or "\n" in value:
            continue
        out.append((name.lower().encode(), value.encode()))
    return out
