"""One turn of a Responses WebSocket (twserve/server/websocket.py): the request its message
became, and the `Responder` its handler writes to.

The handler answers a turn as it answers a Responses request, with a stream; `TurnResponder`
decodes that stream and sends its events to the socket as text messages, each echoing the lane
(`stream_id`) the turn came on. An answer refused before its stream started becomes the turn's
one event, a failed response, and the socket stays usable.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from twproto import ErrorCategory, GatewayError, SSEDecoder, SSEError, SSEEvent
from twproto.sockets import (
    WS_MAX_ERROR_BODY,
    AnswerError,
    FailedResponse,
    ws_answer_failed_event,
    ws_completed_event,
    ws_gateway_error_event,
    ws_stream_message,
)
from twserve.server.base import Headers, Request, ResponderBase

log = logging.getLogger("twserve.server.websocket")

__all__ = ["Turn", "TurnResponder", "TurnSink", "failed_response"]

# The stream decoded here is the gateway's own, already bounded where it was read from the
# upstream; but its closing event repeats the whole answer, which may
# be far larger than any one upstream event.
_MAX_EVENT = 256 * 1024 * 1024


class TurnSink(Protocol):
    """Where a turn's messages go: the session's socket."""

    async def send_text(self, text: str) -> None: ...

    async def send_texts(self, texts: list[str]) -> None: ...


@dataclass(slots=True, kw_only=True)
class Turn:
    request: Request
    stream_id: str | None
    model: str = ""
    reserved: int = 0  # bytes of the body budget its message holds


class TurnResponder(ResponderBase):
    """The `Responder` a turn's handler writes to: SSE events out as text messages, an error
    answer out as one ``error`` event (events are decoded and framed as messages by `send`,
    so `ready` stays false)."""

    __slots__ = (
        "_body",
        "_decoder",
        "_model",
        "_session",
        "_status",
        "_stream_id",
        "refused",
    )

    def __init__(self, session: TurnSink, stream_id: str | None, model: str = "") -> None:
        super().__init__()
        self._session = session
        self._stream_id = stream_id
        self._model = model
        self._status = 0
        self._decoder: SSEDecoder | None = None
        self._body = bytearray()
        self.refused: AnswerError | None = None  # the turn's error answer, if it had one

    async def start(self, status: int, headers: Headers) -> None:
        self._begin()
        self._status = status
        content_type = b""
        for name, value in headers:
            if name == b"content-type":
                content_type = value
        if status < 400 and content_type.startswith(b"text/event-stream"):
            self._decoder = SSEDecoder(max_event_size=_MAX_EVENT)

    async def send(self, data: bytes) -> None:
        if self._decoder is None:
            if len(self._body) + len(data) <= WS_MAX_ERROR_BODY:
                self._body += data
            return
        try:
            events = self._decoder.feed(data)
        except SSEError:
            log.exception("the gateway wrote a stream that does not decode")
            await self.abort()
            return
        if events:
            # The events of one piece of the stream go out in one socket write.
            await self._session.send_texts(self._messages(events))

    def _messages(self, events: list[SSEEvent]) -> list[str]:
        # Events of a turn echo the lane it was sent on.
        out = [ws_stream_message(e.data, self._stream_id) for e in events]
        return [m for m in out if m is not None]

    async def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._decoder is not None:
            await self._session.send_texts(self._messages(self._decoder.end()))
            return
        status = self._status
        if status < 400:
            # A whole (non-streamed) answer: the handler was asked for a stream, so this is
            # not expected; pass it on as the completed response rather than drop it.
            completed = ws_completed_event(bytes(self._body))
            if completed is not None:
                await self._session.send_text(completed)
                return
            status = 500
        # Refused before its stream started: the turn's one event is a failed response, and
        # the socket stays usable.
        self.refused = ws_answer_failed_event(
            status, bytes(self._body), failed_response(self._model), self._stream_id
        )
        await self._session.send_text(self.refused.event)

    async def abort(self) -> None:
        """The answer broke after it started: the turn fails, the socket stays."""
        if self._ended:
            return
        self._ended = True
        err = GatewayError(
            status=502,
            category=ErrorCategory.UPSTREAM,
            code="gw.ws.upstream_closed",
            message="the upstream's answer ended before the turn was complete",
        )
        await self._session.send_text(ws_gateway_error_event(err, self._stream_id))


def failed_response(model: str) -> FailedResponse:
    """The failed response a refused turn is answered with: an id of the gateway's own (no
    upstream made one), made now."""
    return FailedResponse(
        id=f"resp_gw_{secrets.token_hex(12)}", created_at=int(time.time()), model=model
    )
