"""The Realtime API's WebSocket as far as the gateway reads it (docs/transports.md, "Realtime").

The gateway proxies a Realtime socket frame by frame and does not take its events apart, with
two exceptions: the upstream's ``response.done`` events carry each response's usage, which the
connection's row sums and the key's limits count as it comes; and once those limits are spent,
the events that start a response (a client's ``response.create``, the upstream's
``response.created``) are looked at, to refuse or cancel it. `realtime_usage` reads that usage
from one upstream text message; `read_realtime_event` an event's type (and a
``response.created``'s response id); `realtime_cancel_event` is the client event that cancels a
response;
`realtime_upstream_url` is where a provider takes Realtime sockets, next to its HTTP API;
`realtime_error_event` is the API's ``error`` server event, for what the gateway itself has to
tell a client before it closes the connection.

Text in, values out: no IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from twproto._json import dumps, loads
from twproto.ir import Usage

__all__ = (
    "REALTIME_CHECKED_AS",
    "REALTIME_PATH",
    "RealtimeEvent",
    "add_usage",
    "read_realtime_event",
    "realtime_cancel_event",
    "realtime_error_event",
    "realtime_started_response",
    "realtime_upstream_url",
    "realtime_usage",
)

#: The client path of a Realtime WebSocket upgrade (as the OpenAI SDK opens it).
REALTIME_PATH = "/v1/realtime"
#: The path whose head checks (address, key) a Realtime upgrade is admitted by: a Responses
#: request's, the same key a Responses call would use.
REALTIME_CHECKED_AS = "/v1/responses"


def realtime_upstream_url(base_url: str, model: str) -> str:
    """The upstream's Realtime socket for `model`: ``/realtime`` under the provider's base URL
    (``https://api.openai.com/v1`` gives ``wss://api.openai.com/v1/realtime?model=...``), its
    scheme made ``ws``/``wss``."""
    if base_url.startswith("https://"):
        rest, scheme = base_url[len("https://") :], "wss://"
    elif base_url.startswith("http://"):
        rest, scheme = base_url[len("http://") :], "ws://"
    else:
        raise ValueError(f"not an http(s) base URL: {base_url!r}")
    return f"{scheme}{rest.rstrip('/')}/realtime?model={quote(model, safe='')}"


def _count(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def realtime_usage(text: str) -> Usage | None:
    """The usage of a ``response.done`` event (``response.usage``), normalised like every usage
    (`input_tokens` without the cached part); None for any other message, or one without usage.
    """
    # Most messages are deltas: skip the JSON parse for anything that cannot be the event.
    if '"response.done"' not in text:
        return None
    try:
        event = loads(text)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") != "response.done":
        return None
    response = event.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    cached = _count(usage.get("input_token_details"), "cached_tokens")
    total_input = _count(usage, "input_tokens")
    return Usage(
        input_tokens=max(0, total_input - cached),
        output_tokens=_count(usage, "output_tokens"),
        cache_read_tokens=min(cached, total_input) if total_input else cached,
    )


def add_usage(total: Usage | None, more: Usage) -> Usage:
    """`total` and `more` summed (a connection's responses)."""
    if total is None:
        return more
    return Usage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cache_read_tokens=total.cache_read_tokens + more.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + more.cache_write_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
        cache_write_1h_tokens=total.cache_write_1h_tokens + more.cache_write_1h_tokens,
    )


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """What a Realtime message is, as far as the gateway looks: its event `type` (empty when
    it is not a JSON object with one) and, for an event about a response, that response's id
    (``response.id``)."""

    type: str
    response_id: str | None = None


def read_realtime_event(text: str) -> RealtimeEvent:
    """The type (and response id) of one Realtime text message."""
    try:
        event = loads(text)
    except ValueError:
        return RealtimeEvent(type="")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return RealtimeEvent(type="")
    response = event.get("response")
    rid = response.get("id") if isinstance(response, dict) else None
    return RealtimeEvent(type=event["type"], response_id=rid if isinstance(rid, str) else None)


def realtime_started_response(text: str) -> str | None:
    """The response id when upstream message `text` is a ``response.created`` event (the
    upstream began a response), else None. A message that does not name the event is not
    parsed."""
    if '"response.created"' not in text:
        return None
    event = read_realtime_event(text)
    return event.response_id if event.type == "response.created" else None


def realtime_cancel_event(response_id: str) -> str:
    """The client event that cancels response `response_id` (``response.cancel``)."""
    return dumps(
        {
            "type": "response.cancel",
            "event_id": f"event_gw_cancel_{response_id}",
            "response_id": response_id,
        }
    ).decode()


def realtime_error_event(code: str, message: str) -> str:
    """A Realtime ``error`` server event (JSON text) with the gateway's `code` and `message`."""
    return dumps(
        {
            "type": "error",
            "event_id": f"event_gw_{code}",
            "error": {
                "type": "server_error",
                "code": code,
                "message": message,
                "param": None,
                "event_id": None,
            },
        }
    ).decode()
