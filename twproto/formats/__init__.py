"""The four API formats, one module each, looked up by `Dialect`.

Each module (`anthropic`, `openai_chat`, `openai_responses`, `gemini`) has the same surface:

* ``decode_request(obj) -> ir.Request`` and ``encode_request(req, *, model) -> (dict, dropped)``
* ``decode_response(obj) -> ir.Answer`` and
  ``encode_response(ans, *, model, dropped=None, created=None) -> dict``
* ``StreamDecoder`` — fed one SSE event (or, for Gemini, one JSON-array element) at a time:
  ``feed(event) -> list[ir.StreamEvent]``, ``feed_into(event, handler)``, ``watch(event)``;
  ``usage``, ``finished``, ``error``, ``dropped``
* ``StreamEncoder`` — an `ir.StreamHandler` whose ``take()`` returns framed bytes, with
  ``fail(err) -> bytes`` for an error ending; ``ended``, ``dropped``

`FORMATS` maps a `Dialect` to a `Format` holding those callables, so callers need not import
the modules by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from twproto import ir
from twproto.dialect import Dialect
from twproto.errors import GatewayError
from twproto.formats import anthropic, gemini, openai_chat, openai_responses
from twproto.sse import SSEEvent

__all__ = [
    "FORMATS",
    "Format",
    "StreamDecoder",
    "StreamEncoder",
    "get",
    "new_stream_decoder",
    "new_stream_encoder",
]


class StreamDecoder(Protocol):
    """What every format's stream decoder offers."""

    usage: ir.Usage | None
    finished: bool
    error: ir.StreamErrorEvent | None
    dropped: list[str]

    def feed(self, event: SSEEvent) -> list[ir.StreamEvent]: ...

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None: ...

    def watch(self, event: SSEEvent) -> None: ...


class StreamEncoder(ir.StreamHandler, Protocol):
    """What every format's stream encoder offers on top of `ir.StreamHandler`."""

    ended: bool
    dropped: list[str]

    def take(self) -> bytes: ...

    def fail(self, err: GatewayError) -> bytes: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Format:
    """One format's converters."""

    dialect: Dialect
    decode_request: Callable[[Mapping[str, Any]], ir.Request]
    encode_request: Callable[..., tuple[dict[str, Any], tuple[str, ...]]]
    decode_response: Callable[[Mapping[str, Any]], ir.Answer]
    encode_response: Callable[..., dict[str, Any]]


FORMATS: Mapping[Dialect, Format] = {
    module.DIALECT: Format(
        dialect=module.DIALECT,
        decode_request=module.decode_request,
        encode_request=module.encode_request,
        decode_response=module.decode_response,
        encode_response=module.encode_response,
    )
    for module in (anthropic, openai_chat, openai_responses, gemini)
}


def get(dialect: Dialect) -> Format:
    """The converters of `dialect`."""
    return FORMATS[dialect]


def new_stream_decoder(dialect: Dialect) -> StreamDecoder:
    """A fresh stream decoder for answers in `dialect`."""
    if dialect is Dialect.ANTHROPIC:
        return anthropic.StreamDecoder()
    if dialect is Dialect.OPENAI_CHAT:
        return openai_chat.StreamDecoder()
    if dialect is Dialect.OPENAI_RESPONSES:
        return openai_responses.StreamDecoder()
    return gemini.StreamDecoder()


def new_stream_encoder(
    dialect: Dialect, *, model: str, created: int | None = None, sse: bool = True
) -> StreamEncoder:
    """A fresh stream encoder writing `dialect` for a client that asked for `model`.

    `created` (unix seconds) stands in where the upstream gave no timestamp; `sse` False
    selects Gemini's JSON-array framing (other formats are always SSE).
    """
    if dialect is Dialect.ANTHROPIC:
        return anthropic.StreamEncoder(model=model, created=created)
    if dialect is Dialect.OPENAI_CHAT:
        return openai_chat.StreamEncoder(model=model, created=created)
    if dialect is Dialect.OPENAI_RESPONSES:
        return openai_responses.StreamEncoder(model=model, created=created)
    return gemini.StreamEncoder(model=model, sse=sse)
