"""Writing to the client: the stream's head, a whole answer, an error response or error event.

The relay decides *what* goes out (from the attempt ledger's actions); this is *how*: status
lines and headers through the `Responder`, and the request row's status and error code noted in
the `RelayOutcome` as they go. Error bodies and events are written in the client's format by
`twproto.errors` and the stream translators.

Every answer that comes from an upstream — a whole answer, a stream's head, an error that
reports an upstream's failure — names it: ``x-twserve-provider`` (the upstream's name in the
config) and ``x-twserve-model`` (the model it was sent). The gateway's own answers name none.
A stream whose 200 went out early (keep-alive) has no upstream to name yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twengine.attempt import AttemptRecord
from twproto import ir
from twproto.bedrock import count_answer, count_unsupported
from twproto.bedrock.converse import converse_answer_as_anthropic
from twproto.dialect import Dialect
from twproto.errors import (
    ERROR_HEADER,
    ErrorCategory,
    GatewayError,
    error_body,
    error_for_failure,
    error_for_unreadable_answer,
    error_headers,
)
from twproto.failures import Failure
from twproto.headers import client_response_headers
from twproto.paths import Operation
from twproto.stream import StreamTranslator, new_stream_translator
from twproto.translate import TranslatedRequest, UpstreamTranslationError, translate_response
from twproto.upstream_request import ClientCall
from twserve.server.base import Headers, Responder

if TYPE_CHECKING:
    from twengine.destinations import Destination
    from twserve.relay.reader import Attempt

__all__ = [
    "MODEL_HEADER",
    "PROVIDER_HEADER",
    "ClientAnswer",
    "RelayOutcome",
    "stream_head",
]


@dataclass(slots=True, kw_only=True)
class RelayOutcome:
    """What the request row records; filled in as the request goes."""

    status: int | None = None
    provider: str | None = None
    ttfb_ms: int | None = None
    usage: Any = None
    # Why the answer ended, as its upstream said (an `ir.StopReason`; None: unknown).
    stop_reason: Any = None
    error_code: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    dropped: list[str] = field(default_factory=list)  # what conversion could not carry
    cancelled: bool = False
    # Usage reported by attempts that did not give the answer (by attempt index): tokens an
    # upstream may bill although its attempt failed or was cancelled.
    attempt_usage: dict[int, Any] = field(default_factory=dict)
    # The client left after the whole answer had gone out (not a cancelled request).
    delivered: bool = False
    # Per upstream: the level a refused effort was resent with ("off": without one).
    effort_resent: dict[str, str] = field(default_factory=dict)
    # A turn of a client's Responses WebSocket: the attempts (by index) that went over their
    # upstream's own socket. None for any other request.
    over_socket: set[int] | None = None


#: The upstream that answered (its name in the config) and the model it was sent.
PROVIDER_HEADER = b"x-twserve-provider"
MODEL_HEADER = b"x-twserve-model"


def _header_value(text: str) -> bytes:
    """`text` as a header value: visible ASCII and spaces; anything else becomes ``?``."""
    if text.isascii() and text.isprintable():  # the usual name: nothing to replace
        return text.strip().encode("ascii")
    return "".join(c if " " <= c <= "~" else "?" for c in text).strip().encode("ascii")


def stream_head(sse: bool) -> Headers:
    """The headers of a streamed answer's 200."""
    kind = b"text/event-stream" if sse else b"application/json"
    return [(b"content-type", kind), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class ClientAnswer:
    """The client's side of one relayed request."""

    def __init__(
        self,
        responder: Responder,
        call: ClientCall,
        model: str,
        out: RelayOutcome,
        wall: Callable[[], float],
        head_sent_at: float | None = None,
        dests: Mapping[str, Destination] | None = None,
    ) -> None:
        self.wall = wall
        self.dests: Mapping[str, Destination] = dests or {}
        self.responder = responder
        self.call = call
        self.model = model
        self.out = out
        # The 200 and stream headers are out (`head_sent_at`: before the relay began, while
        # the request waited for its key's turn).
        self.started = head_sent_at is not None

    def served(self, provider: str | None) -> Headers:
        """The headers naming `provider` and the model it was sent; none for None."""
        dest = self.dests.get(provider) if provider is not None else None
        if dest is None:
            return []
        return [
            (PROVIDER_HEADER, _header_value(dest.name)),
            (MODEL_HEADER, _header_value(dest.target.model)),
        ]

    def _bedrock_count(self, dest: Destination | None) -> bool:
        """Whether this is a token count sent to Bedrock's CountTokens (through `dest`)."""
        return (
            self.call.operation is Operation.COUNT_TOKENS
            and dest is not None
            and dest.target.aws is not None
        )

    async def start_stream(self, provider: str | None = None) -> None:
        """The 200 and the stream's headers (naming `provider`), once."""
        if not self.started:
            self.started = True
            await self.responder.start(200, stream_head(self.call.sse) + self.served(provider))

    async def whole(
        self, status: int, headers: Headers, body: bytes, provider: str | None = None
    ) -> None:
        """A whole response: `headers` plus its length (and `provider`'s names), then `body`."""
        responder = self.responder
        length = (b"content-length", str(len(body)).encode())
        await responder.start(status, [*headers, *self.served(provider), length])
        await responder.send(body)
        await responder.end()

    async def whole_answer(
        self,
        provider: str,
        dialect: Dialect,
        headers: Headers,
        body: bytes,
        *,
        tool_names: ir.ToolNames | None,
        created: int,
    ) -> None:
        """A whole answer from `provider` (format `dialect`), translated for the client."""
        out = self.out
        out.provider, out.status = provider, 200
        same = dialect is self.call.dialect
        dest = self.dests.get(provider)
        if dest is not None and dest.target.converse and not self._bedrock_count(dest):
            # A Converse answer, read back as the Anthropic message it says.
            try:
                body = converse_answer_as_anthropic(body, dest.target.model)
            except ValueError as exc:
                reason = f"answer has an unexpected shape: {exc}"
                await self.error(error_for_unreadable_answer(provider, reason), provider)
                return
            headers = [(b"content-type", b"application/json")]
        if self._bedrock_count(dest):
            # Bedrock's CountTokens answer, {"inputTokens": N}, in the client's count shape.
            counted = count_answer(body, self.call.dialect)
            if counted is None:
                reason = "a CountTokens answer without inputTokens"
                await self.error(error_for_unreadable_answer(provider, reason), provider)
                return
            await self.whole(200, [(b"content-type", b"application/json")], counted, provider)
            return
        try:
            answer = translate_response(
                body,
                dialect,
                self.call.dialect,
                client_model=dest.client_model(self.model) if dest is not None else self.model,
                tool_names=tool_names,
                created=created,
            )
        except UpstreamTranslationError as exc:
            if not same:
                await self.error(error_for_unreadable_answer(provider, str(exc)), provider)
                return
            answer = None  # a same-format answer goes through as it came
        if answer is not None:
            out.usage, out.stop_reason = answer.usage, answer.stop_reason
            out.dropped.extend(answer.dropped)
        # Same format: the upstream's bytes, with only the model renamed (translate_response).
        payload = body if answer is None else answer.body
        kept = (
            client_response_headers(headers) if same else [(b"content-type", b"application/json")]
        )
        await self.whole(200, kept, payload, provider)

    async def finish(
        self, live: Attempt, dest: Destination, translated: TranslatedRequest | None
    ) -> None:
        """`live`'s answer from `dest` ended cleanly: its end, or the whole answer."""
        if live.whole is None:
            await self.finish_stream(live)
            return
        await self.whole_answer(
            live.provider,
            dest.target.dialect,
            live.headers,
            live.whole,
            tool_names=translated.tool_names if translated is not None else None,
            created=int(self.wall()),
        )

    async def pass_through(
        self,
        saved: tuple[int, Headers, bytes, Dialect] | None,
        failure: Failure,
        provider: str | None = None,
    ) -> None:
        """`provider`'s own error response as it came, when it was kept and speaks the
        client's format; otherwise the same status, written in the client's format."""
        if (
            saved is not None
            and self._bedrock_count(self.dests.get(provider) if provider else None)
            and count_unsupported(saved[0], saved[2])
        ):
            # A Bedrock model without token counting: answered as by an upstream without the
            # counting endpoint, whose 404 the token count's responder replaces with the
            # local estimate (twserve.gateway.responders.LocalFallbackResponder).
            await self.whole(404, [(b"content-type", b"application/json")], saved[2], provider)
            return
        if saved is None or saved[3] is not self.call.dialect:
            await self.error(error_for_failure(failure, passed_on=True), provider)
            return
        status, headers, body, _ = saved
        self.out.status, self.out.error_code = status, "gw.upstream.error"
        # The upstream's own body, marked as the upstream's like every error the gateway relays.
        tag = (ERROR_HEADER, ErrorCategory.UPSTREAM.value.encode())
        await self.whole(status, [*headers, tag], body, provider)

    async def error(self, err: GatewayError, provider: str | None = None) -> None:
        """`err` as an error response in the client's format; `provider`: the upstream whose
        failure it reports."""
        self.out.status = err.status
        self.out.error_code = err.code
        body = error_body(self.call.dialect, err)
        await self.whole(err.status, error_headers(err), body, provider)

    async def commit(self, live: Attempt | None, send_headers: bool) -> None:
        """The answer is settled: the stream's head if due; with `live`, its held bytes."""
        if send_headers:
            await self.start_stream(live.provider if live is not None else None)
        if live is not None:
            await live.stream.commit()  # its held bytes, then maybe the reader's own writes

    async def finish_stream(self, live: Attempt) -> None:
        """`live`'s stream ended cleanly: its last bytes, then the end."""
        translator = live.stream.translator
        assert translator is not None
        out = self.out
        out.provider, out.status = live.provider, 200
        out.usage, out.stop_reason = translator.usage, translator.stop_reason
        out.dropped.extend(translator.dropped)
        await live.stream.flush()
        await self.responder.end()

    async def end_stream_with_error(
        self,
        err: GatewayError,
        live: Attempt | None,
        resumed: tuple[StreamTranslator, str | None] | None = None,
        provider: str | None = None,
    ) -> None:
        """End the client's stream with `err` as an error event (the 200 may be out already);
        `provider`: the upstream whose failure it reports. `resumed`: the answer that broke off
        and could not be continued, and the upstream it last came from."""
        self.out.error_code = err.code
        self.out.status = 200 if self.started else err.status
        if live is not None and live.stream.committed:
            self.out.provider = live.provider  # it answered, then broke off
        translator = live.stream.translator if live is not None else None
        if resumed is not None:
            translator, self.out.provider = resumed
        if translator is None:
            # Nothing came from an upstream: the error event alone, as the client's format
            # frames it.
            call = self.call
            translator = new_stream_translator(
                call.dialect, call.dialect, client_model=self.model, client_sse=call.sse
            )
        else:
            self.out.usage = translator.usage
        await self.start_stream(provider)
        await self.responder.send(translator.fail(err))
        await self.responder.end()
