"""Refusing a WebSocket upgrade the way the providers do: a plain HTTP error answer with an
OpenAI-style JSON error body, then the connection closed (shared by the mock's Realtime and
Responses sockets)."""

from __future__ import annotations

import json
from contextlib import suppress

from twserve.server.base import Handoff


async def refuse_upgrade(handoff: Handoff, status: int, message: str) -> None:
    """Answer the upgrade request on `handoff` with `status` and close; a client already gone
    is not an error."""
    body = json.dumps(
        {"error": {"type": "server_error", "code": None, "message": message, "param": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} Refused\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    with suppress(Exception):
        await handoff.stream.send(head.encode() + body)
    with suppress(Exception):
        await handoff.stream.aclose()
