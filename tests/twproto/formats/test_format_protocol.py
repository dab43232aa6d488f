"""Each format module is a `twproto.Format`: every member present, with the protocol's
signature, and its stream factories make objects that are `StreamDecoder`/`StreamEncoder`.

mypy checks the same on assignment in twproto/formats/__init__.py; this checks it at run time,
where a module could also be swapped or monkeypatched.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import pytest

import twproto
import twproto.formats
import twproto.ir
from twproto.formats import anthropic, gemini, openai_chat, openai_responses

MODULES = {
    twproto.Dialect.ANTHROPIC: anthropic,
    twproto.Dialect.OPENAI_CHAT: openai_chat,
    twproto.Dialect.OPENAI_RESPONSES: openai_responses,
    twproto.Dialect.GEMINI: gemini,
}

MEMBERS = (
    "decode_request",
    "encode_request",
    "decode_response",
    "encode_response",
    "new_stream_decoder",
    "new_stream_encoder",
)


def _shape(fn: Any, *, drop_self: bool) -> list[tuple[str, Any, bool]]:
    params = list(inspect.signature(fn).parameters.values())
    if drop_self:
        params = params[1:]
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in params]


@pytest.mark.parametrize("dialect", list(MODULES), ids=str)
def test_module_is_a_format(dialect: twproto.Dialect) -> None:
    module: ModuleType = MODULES[dialect]
    assert isinstance(module, twproto.Format)
    assert module.DIALECT is dialect
    assert twproto.FORMATS[dialect] is module
    for name in MEMBERS:
        expected = _shape(getattr(twproto.Format, name), drop_self=True)
        assert _shape(getattr(module, name), drop_self=False) == expected, name
        assert name in module.__all__


@pytest.mark.parametrize("dialect", list(MODULES), ids=str)
def test_stream_factories_make_conforming_objects(dialect: twproto.Dialect) -> None:
    fmt = twproto.FORMATS[dialect]
    decoder = fmt.new_stream_decoder()
    encoder = fmt.new_stream_encoder(model="m", created=1)
    assert isinstance(decoder, twproto.formats.StreamDecoder)
    assert isinstance(encoder, twproto.formats.StreamEncoder)
    assert type(decoder) is MODULES[dialect].StreamDecoder
    assert type(encoder) is MODULES[dialect].StreamEncoder
    assert type(twproto.formats.new_stream_decoder(dialect)) is type(decoder)
    # The factory's encoder writes a stream the same factory's decoder reads back.
    encoder.message_start("x", "m", 1, None)
    encoder.part_start(0, twproto.ir.PartKind.TEXT, None)
    encoder.text(0, "hi")
    encoder.part_stop(0)
    encoder.finish(twproto.ir.StopReason.END_TURN, None)
    encoder.end()
    collector = twproto.ir.EventCollector()
    for event in twproto.SSEDecoder().feed(encoder.take()):
        decoder.feed_into(event, collector)
    texts = [e.text for e in collector.events if isinstance(e, twproto.ir.TextDelta)]
    assert "".join(texts) == "hi"
    assert decoder.finished


def test_a_module_missing_a_member_is_not_a_format() -> None:
    fake = ModuleType("fake")
    for name in MEMBERS[:-1]:
        setattr(fake, name, getattr(anthropic, name))
    fake.DIALECT = twproto.Dialect.ANTHROPIC  # type: ignore[attr-defined]
    assert not isinstance(fake, twproto.Format)
