"""What the Responses WebSocket tests share: one turn over the openai SDK's
``responses.connect()`` read to the event that ends it, the text of its deltas, and the one
function tool (``weather``) their tool rounds call."""

from __future__ import annotations

from typing import Any

import anyio

__all__ = ["TOOL_SCRIPT", "TURN_ENDS", "WEATHER", "socket_turn", "turn_text"]

# The events that end a turn on the socket, an ``error`` event included.
TURN_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})

# A function tool as a Responses request lists it.
WEATHER: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
# A mock script whose answer calls it once.
TOOL_SCRIPT = {"tool_calls": 1, "tool_name": "weather", "tool_arguments": '{"city":"Oslo"}'}


async def socket_turn(conn: Any, create: dict[str, Any], *, timeout: float = 10.0) -> list[Any]:
    """Send ``response.create`` with the fields `create` on `conn` (an SDK socket) and collect
    its events up to the one that ends the turn, within `timeout` seconds."""
    await conn.send({"type": "response.create", **create})
    events = []
    with anyio.fail_after(timeout):
        while True:
            event = await conn.recv()
            events.append(event)
            if event.type in TURN_ENDS:
                return events


def turn_text(events: list[Any]) -> str:
    """The text of a turn's ``response.output_text.delta`` events."""
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")
