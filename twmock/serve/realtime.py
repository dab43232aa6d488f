"""The mock upstream's Realtime endpoint: a WebSocket on ``/v1/realtime`` (wsproto).

Enough of the OpenAI Realtime API for the gateway's proxy to be tried against (event names as
the openai SDK's ``types/realtime`` has them):

* on accept it sends ``session.created``; a ``session.update`` is answered with
  ``session.updated`` carrying the session sent;
* a ``response.create`` is answered with ``response.created``, ``response.output_text.delta``
  events spelling `REALTIME_TEXT`, ``response.output_text.done`` and ``response.done`` with
  `REALTIME_USAGE`;
* a binary message is sent back as it came (audio frames pass both ways on a real upstream);
* ``{"type": "mock.close", "code": N}`` makes the mock close the socket with code N, which is how
  tests have an upstream close on them; ``{"type": "mock.big", "bytes": N}`` is answered with
  one message of about N bytes; `RealtimeLog.refuse_status` set, upgrades are refused with it;
* ``{"type": "mock.respond"}`` makes the mock start a response of its own, as an upstream does
  when its voice detection hears the end of speech: ``response.created``, and then, at the
  next client event, ``response.done`` — ``cancelled`` (no usage) when that event is a
  ``response.cancel`` of it (logged in `RealtimeLog.cancelled`), else ``completed`` with
  `REALTIME_USAGE`;
* pings are answered; other events are ignored.

`RealtimeLog` keeps what tests assert on: the upgrades seen (with their headers) and how each
socket ended.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    TextMessage,
)
from wsproto.events import Request as WSRequest

from twmock.serve.upgrade import refuse_upgrade
from twserve.server.base import Handoff, Request, Switch
from twserve.server.listener import READ_SIZE

__all__ = ["REALTIME_TEXT", "REALTIME_USAGE", "RealtimeLog", "realtime_switch"]

REALTIME_TEXT = "Hello from the mock realtime upstream."
REALTIME_USAGE: dict[str, Any] = {
    "total_tokens": 19,
    "input_tokens": 12,
    "output_tokens": 7,
    "input_token_details": {"cached_tokens": 2, "text_tokens": 12, "audio_tokens": 0},
    "output_token_details": {"text_tokens": 7, "audio_tokens": 0},
}


@dataclass(slots=True)
class RealtimeLog:
    """What the mock's Realtime endpoint saw: each upgrade's headers and target, how many
    sockets are open, and each ended socket's end (the close code received or sent, or None
    when the connection was lost without one)."""

    upgrades: list[Request] = field(default_factory=list)
    open: int = 0
    ended: list[int | None] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)
    # A test knob: answer upgrades with this HTTP status instead of switching.
    refuse_status: int | None = None
    # The responses a client cancelled (their ids).
    cancelled: list[str] = field(default_factory=list)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_ended(self, count: int, timeout: float = 5.0) -> None:
        """Wait until `count` sockets have ended."""
        with anyio.fail_after(timeout):
            while len(self.ended) < count:
                await self.changed.wait()


def realtime_switch(log: RealtimeLog) -> Switch:
    """The mock server's switch for ``GET /v1/realtime`` WebSocket upgrades."""

    def switch(request: Request) -> Callable[[Handoff], Awaitable[None]] | None:
        if request.method != "GET" or request.path != "/v1/realtime":
            return None
        if not any(k == b"upgrade" and b"websocket" in v.lower() for k, v in request.headers):
            return None

        async def take(handoff: Handoff) -> None:
            if log.refuse_status is not None:
                await refuse_upgrade(handoff, log.refuse_status, "refused")
                return
            await _serve(handoff, log)

        return take

    return switch


async def _serve(handoff: Handoff, log: RealtimeLog) -> None:
    req = handoff.request
    ws = WSConnection(ConnectionType.SERVER)
    head = b"GET " + req.target + b" HTTP/1.1\r\n"
    head += b"".join(k + b": " + v + b"\r\n" for k, v in req.headers)
    ws.receive_data(head + b"\r\n")
    if not any(isinstance(e, WSRequest) for e in ws.events()):
        return
    stream = handoff.stream
    log.upgrades.append(req)
    ids = itertools.count(1)
    end: int | None = None

    async def send(*events: Any) -> None:
        data = b""
        for event in events:
            if isinstance(event, dict):
                event = TextMessage(data=json.dumps({"event_id": f"ev_{next(ids)}", **event}))
            data += ws.send(event)
        await stream.send(data)

    log.open += 1
    log._changed()
    try:
        await send(AcceptConnection(), {"type": "session.created", "session": {"type": "realtime"}})
        if handoff.buffered:
            ws.receive_data(handoff.buffered)
        parts: list[str] = []
        started: list[str] = []  # a response the mock started by itself, not yet done
        while ws.state is ConnectionState.OPEN:
            for event in ws.events():
                if isinstance(event, Ping):
                    await send(event.response())
                elif isinstance(event, BytesMessage):
                    await send(event)
                elif isinstance(event, TextMessage):
                    parts.append(event.data)
                    if event.message_finished:
                        text, parts = "".join(parts), []
                        if started:
                            await _finish_own(text, started.pop(), send, log)
                            continue
                        if '"mock.respond"' in text:
                            started.append(await _start_own(send))
                            continue
                        end = await _answer(text, send, ws)
                        if end is not None:
                            return
                elif isinstance(event, CloseConnection):
                    end = event.code
                    await send(event.response())
                    return
            try:
                data = await stream.receive(READ_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            ws.receive_data(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        log.open -= 1
        log.ended.append(end)
        log._changed()
        with suppress(Exception):
            await stream.aclose()


async def _answer(text: str, send: Callable[..., Awaitable[None]], ws: WSConnection) -> int | None:
    """Answer one client event; the close code when it asked the mock to close."""
    try:
        event = json.loads(text)
    except ValueError:
        error = {"type": "invalid_request_error", "message": "not JSON"}
        await send({"type": "error", "error": error})
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "session.update":
        await send({"type": "session.updated", "session": event.get("session") or {}})
    elif kind == "response.create":
        rid = "resp_mock_1"
        response = {"id": rid, "object": "realtime.response", "status": "in_progress", "output": []}
        deltas = [
            {
                "type": "response.output_text.delta",
                "response_id": rid,
                "item_id": "item_mock_1",
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
            for piece in _pieces(REALTIME_TEXT)
        ]
        done = {
            **response,
            "status": "completed",
            "output": [
                {
                    "id": "item_mock_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": REALTIME_TEXT}],
                }
            ],
            "usage": REALTIME_USAGE,
        }
        await send(
            {"type": "response.created", "response": response},
            *deltas,
            {
                "type": "response.output_text.done",
                "response_id": rid,
                "item_id": "item_mock_1",
                "output_index": 0,
                "content_index": 0,
                "text": REALTIME_TEXT,
            },
            {"type": "response.done", "response": done},
        )
    elif kind == "mock.big":
        # One text message of about `bytes` bytes (a size limit's test).
        size = int(event.get("bytes") or 0)
        await send({"type": "mock.big", "padding": "x" * size})
    elif kind == "mock.close":
        code = int(event.get("code") or 1000)
        await send(CloseConnection(code=code, reason="mock closes"))
        return code
    return None


async def _start_own(send: Callable[..., Awaitable[None]]) -> str:
    """A response the mock starts by itself; its id."""
    rid = "resp_mock_own"
    response = {"id": rid, "object": "realtime.response", "status": "in_progress", "output": []}
    await send({"type": "response.created", "response": response})
    return rid


async def _finish_own(
    text: str, rid: str, send: Callable[..., Awaitable[None]], log: RealtimeLog
) -> None:
    """End the mock's own response `rid` at the client event `text`: cancelled by a
    ``response.cancel`` of it, else completed."""
    try:
        event = json.loads(text)
    except ValueError:
        event = None
    cancel = (
        isinstance(event, dict)
        and event.get("type") == "response.cancel"
        and event.get("response_id") == rid
    )
    response: dict[str, Any] = {"id": rid, "object": "realtime.response", "output": []}
    if cancel:
        log.cancelled.append(rid)
        response["status"] = "cancelled"
    else:
        response["status"] = "completed"
        response["usage"] = REALTIME_USAGE
    await send({"type": "response.done", "response": response})


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
