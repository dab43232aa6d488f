"""The four API formats, one package each, looked up by `Dialect`.

Each format package (`anthropic`, `openai_chat`, `openai_responses`, `gemini`) keeps its request
codec and the wire vocabulary in ``request.py``, its usage and whole responses in
``response.py`` and its stream codecs in ``stream.py``, and exports all of them from its
``__init__``, which is a `Format`: the typing protocol below names the surface every one of them
has, and mypy checks each against it where `FORMATS` is built
(tests/twproto/formats/test_format_protocol.py checks it again at run time, signatures
included):

* ``DIALECT`` — the `Dialect` it speaks
* ``decode_request(obj) -> ir.Request`` and ``encode_request(req, *, model) -> (dict, dropped)``
* ``decode_response(obj) -> ir.Answer`` and
  ``encode_response(ans, *, model, dropped=None, created=None) -> dict``
* ``new_stream_decoder() -> StreamDecoder`` — fed one SSE event (or, for Gemini, one JSON-array
  element) at a time: ``feed(event) -> list[ir.StreamEvent]``, ``feed_into(event, handler)``,
  ``watch(event)``; ``usage``, ``finished``, ``error``, ``dropped``
* ``new_stream_encoder(*, model, created=None, sse=True) -> StreamEncoder`` — an
  `ir.StreamHandler` whose ``take()`` returns framed bytes, with ``fail(err) -> bytes`` for an
  error ending; ``ended``, ``dropped``
* ``WATCH`` — its `WatchNeedles`: what the watch path of a stream relayed unchanged looks for,
  in raw chunks and in decoded events, to follow usage, the finish and errors

The stream factories are the format's `StreamDecoder` and `StreamEncoder` classes themselves;
what the four formats' codecs share is written once, in their bases (`formats/_codec.py`).

`FORMATS` maps a `Dialect` to its format, so callers need not import the formats by name.
`seal_maker` / `welcome_seal` (``seals.py``) say which reasoning seals an upstream of a format
would refuse for certain (docs/conversion.md, "Reasoning in foreign histories").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from twproto import ir
from twproto.dialect import Dialect
from twproto.errors import GatewayError
from twproto.formats import anthropic, gemini, openai_chat, openai_responses
from twproto.formats._codec import WatchNeedles
from twproto.formats.seals import GEMINI_PLACEHOLDER, SealMaker, seal_maker, welcome_seal
from twproto.sse import SSEEvent

__all__ = (
    "FORMATS",
    "GEMINI_PLACEHOLDER",
    "Format",
    "SealMaker",
    "StreamDecoder",
    "StreamEncoder",
    "WatchNeedles",
    "get",
    "new_stream_decoder",
    "new_stream_encoder",
    "seal_maker",
    "welcome_seal",
)


@runtime_checkable
class StreamDecoder(Protocol):
    """What every format's stream decoder offers."""

    usage: ir.Usage | None
    finished: bool
    stop_reason: ir.StopReason | None
    error: ir.StreamErrorEvent | None
    dropped: list[str]

    def feed(self, event: SSEEvent) -> list[ir.StreamEvent]: ...

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None: ...

    def watch(self, event: SSEEvent) -> None: ...


@runtime_checkable
class StreamEncoder(ir.StreamHandler, Protocol):
    """What every format's stream encoder offers on top of `ir.StreamHandler`."""

    ended: bool
    dropped: list[str]

    def take(self) -> bytes: ...

    def fail(self, err: GatewayError) -> bytes: ...


@runtime_checkable
class Format(Protocol):
    """One API format's converters: what each module of `twproto.formats` is."""

    @property
    def DIALECT(self) -> Dialect: ...

    @property
    def WATCH(self) -> WatchNeedles: ...

    def decode_request(self, obj: Mapping[str, Any]) -> ir.Request:
        """A client's request body (parsed JSON) → IR."""
        ...

    def encode_request(
        self, req: ir.Request, *, model: str
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """IR → a request body for this API, with what had to be dropped."""
        ...

    def decode_response(self, obj: Mapping[str, Any]) -> ir.Answer:
        """A whole answer body (parsed JSON) → IR."""
        ...

    def encode_response(
        self,
        ans: ir.Answer,
        *,
        model: str,
        dropped: list[str] | None = None,
        created: int | None = None,
    ) -> dict[str, Any]:
        """IR → a whole answer body in this API's shape."""
        ...

    def new_stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one streamed answer in this format."""
        ...

    def new_stream_encoder(
        self, *, model: str, created: int | None = None, sse: bool = True
    ) -> StreamEncoder:
        """A fresh encoder writing this format's stream for a client that asked for `model`."""
        ...


# Each module assigned to a `Format` name, so mypy checks it against the protocol here (mypy
# checks a module against a protocol on assignment, not inside a tuple display).
_anthropic: Format = anthropic
_openai_chat: Format = openai_chat
_openai_responses: Format = openai_responses
_gemini: Format = gemini
_MODULES: tuple[Format, ...] = (_anthropic, _openai_chat, _openai_responses, _gemini)

FORMATS: Mapping[Dialect, Format] = {module.DIALECT: module for module in _MODULES}


def get(dialect: Dialect) -> Format:
    """The converters of `dialect`."""
    return FORMATS[dialect]


def new_stream_decoder(dialect: Dialect) -> StreamDecoder:
    """A fresh stream decoder for answers in `dialect`."""
    return FORMATS[dialect].new_stream_decoder()


def new_stream_encoder(
    dialect: Dialect, *, model: str, created: int | None = None, sse: bool = True
) -> StreamEncoder:
    """A fresh stream encoder writing `dialect` for a client that asked for `model`.

    `created` (unix seconds) stands in where the upstream gave no timestamp; `sse` False
    selects Gemini's JSON-array framing (other formats are always SSE).
    """
    return FORMATS[dialect].new_stream_encoder(model=model, created=created, sse=sse)
