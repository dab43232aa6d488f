"""Responses conversation state, pure: what a response leaves for the next turn, and a request
with ``previous_response_id`` expanded into the whole conversation.

A response's *items* are its request's input items (already expanded, so a chain's last record
holds the whole conversation) followed by its output items; a later request naming it gets those
items in front of its own input, and loses ``previous_response_id`` (no upstream knows the
gateway's ids, and another format has no such field). `SocketMemory` keeps the items of a
Responses WebSocket's turns, bounded by count and bytes (docs/conversion.md, "Responses state").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from twproto._json import dumps as json_dumps
from twproto._json import loads as json_loads

__all__ = (
    "NOT_FOUND_CODE",
    "SocketMemory",
    "closing_response",
    "expand_body",
    "input_items",
    "is_warm_up",
    "load_items",
    "not_found_body",
    "previous_id",
    "record_items",
    "response_items",
    "warm_up",
)

# The OpenAI API's own ``error.code`` for an id it does not know.
NOT_FOUND_CODE = "previous_response_not_found"


def previous_id(body: Mapping[str, Any]) -> str | None:
    """The ``previous_response_id`` a request names, if it names one."""
    value = body.get("previous_response_id")
    return value if isinstance(value, str) and value else None


def input_items(body: Mapping[str, Any]) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return list(raw) if isinstance(raw, list) else []


def expand_body(body: Mapping[str, Any], previous: list[Any]) -> dict[str, Any]:
    """`body` with the conversation `previous` in front of its input, and no
    ``previous_response_id``."""
    out = {k: v for k, v in body.items() if k != "previous_response_id"}
    out["input"] = [*previous, *input_items(body)]
    return out


def response_items(response: Mapping[str, Any]) -> list[Any]:
    """A response object's output items as the next request's input takes them."""
    output = response.get("output")
    if not isinstance(output, list):
        return []
    return [item for item in output if isinstance(item, dict)]


def record_items(body: Mapping[str, Any], response: Mapping[str, Any]) -> bytes:
    """What is kept for `response` (answering `body`, already expanded): input then output
    items, as JSON."""
    return json_dumps([*input_items(body), *response_items(response)])


def load_items(record: bytes) -> list[Any]:
    """The items `record_items` wrote."""
    items = json_loads(record)
    return items if isinstance(items, list) else []


_CLOSING = ("response.completed", "response.incomplete")


def closing_response(event: str, data: str) -> dict[str, Any] | None:
    """The response a stream's closing event (completed or incomplete) carries, else None."""
    if event not in _CLOSING and not any(c in data[:80] for c in _CLOSING):
        return None
    try:
        found = json_loads(data)
    except ValueError:
        return None
    response = found.get("response") if isinstance(found, dict) else None
    if not isinstance(response, dict) or found.get("type") not in _CLOSING:
        return None
    return response


def warm_up(body: Mapping[str, Any], response_id: str) -> tuple[dict[str, Any], bytes]:
    """A warm-up turn's (``generate: false``) answer made without an upstream: an empty
    completed response, and its stream (created, completed)."""
    model = body.get("model")
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": model if isinstance(model, str) else "",
        "output": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    }
    events = []
    for number, kind in enumerate(("response.created", "response.completed")):
        shown = response if number else {**response, "status": "in_progress"}
        data = json_dumps({"type": kind, "sequence_number": number, "response": shown})
        events.append(b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n")
    return response, b"".join(events)


def is_warm_up(body: Mapping[str, Any]) -> bool:
    """A socket's warm-up turn: ``generate: false``."""
    return body.get("generate") is False


def not_found_body(response_id: str) -> bytes:
    """The OpenAI API's answer (400) to an unknown ``previous_response_id``."""
    return json_dumps(
        {
            "error": {
                "message": f"Previous response with id '{response_id}' not found.",
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": NOT_FOUND_CODE,
            }
        }
    )


class SocketMemory:
    """One client socket's responses, newest kept: at most `max_count` records and `max_bytes`
    bytes in all (the oldest go first; a record larger than `max_bytes` is not kept)."""

    __slots__ = ("_records", "_size", "max_bytes", "max_count")

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._records: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return len(self._records)

    def keep(self, response_id: str, record: bytes) -> None:
        old = self._records.pop(response_id, None)
        if old is not None:
            self._size -= len(old)
        if len(record) > self.max_bytes or self.max_count <= 0:
            return
        self._records[response_id] = record
        self._size += len(record)
        while len(self._records) > self.max_count or self._size > self.max_bytes:
            _, dropped = self._records.popitem(last=False)
            self._size -= len(dropped)

    def get(self, response_id: str) -> bytes | None:
        return self._records.get(response_id)
