"""One exception family: `twproto.ProtocolError` with `error_status_hint`, and the two kinds of
`TranslationError` telling whose body could not be converted."""

from __future__ import annotations

import pytest

import twproto
import twproto.sse
import twproto.translate
from twproto import Dialect


def test_family_tree() -> None:
    assert issubclass(twproto.TranslationError, twproto.ProtocolError)
    assert issubclass(twproto.ClientTranslationError, twproto.TranslationError)
    assert issubclass(twproto.UpstreamTranslationError, twproto.TranslationError)
    assert issubclass(twproto.SSEError, twproto.ProtocolError)
    assert issubclass(twproto.sse.SSEEventTooLarge, twproto.SSEError)
    assert issubclass(twproto.sse.JSONArrayError, twproto.SSEError)


@pytest.mark.parametrize("cls", [twproto.ProtocolError, twproto.TranslationError])
def test_grouping_classes_cannot_be_raised(cls: type[twproto.ProtocolError]) -> None:
    with pytest.raises(TypeError, match="subclass"):
        cls("x")


@pytest.mark.parametrize(
    ("body", "source", "target"),
    [
        (b"not json", Dialect.OPENAI_CHAT, Dialect.ANTHROPIC),
        (b"[1]", Dialect.ANTHROPIC, Dialect.GEMINI),
        (b'"a string"', Dialect.GEMINI, Dialect.OPENAI_RESPONSES),
    ],
)
def test_a_client_request_that_cannot_be_converted_hints_400(
    body: bytes, source: Dialect, target: Dialect
) -> None:
    with pytest.raises(twproto.ClientTranslationError) as info:
        twproto.translate_request(body, source, target, model="m")
    assert info.value.error_status_hint == 400
    assert not isinstance(info.value, twproto.UpstreamTranslationError)


@pytest.mark.parametrize("body", [b"not json", b"[]", b'"text"'])
def test_an_upstream_answer_that_cannot_be_converted_hints_502(body: bytes) -> None:
    with pytest.raises(twproto.UpstreamTranslationError) as info:
        twproto.translate_response(body, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    assert info.value.error_status_hint == 502
    with pytest.raises(twproto.UpstreamTranslationError):
        twproto.translate.answer_to_stream(
            body, Dialect.GEMINI, Dialect.ANTHROPIC, client_model="m"
        )


def test_broken_stream_framing_hints_502_and_a_bad_event_to_encode_500() -> None:
    decoder = twproto.SSEDecoder(max_event_size=8)
    with pytest.raises(twproto.sse.SSEEventTooLarge) as info:
        decoder.feed(b"data: " + b"x" * 64)
    assert info.value.error_status_hint == 502
    with pytest.raises(twproto.SSEError) as bad:
        twproto.encode_event(twproto.SSEEvent(event="a\nb", data="{}"))
    assert bad.value.error_status_hint == 500


def test_a_hint_can_be_given_per_raise() -> None:
    err = twproto.UpstreamTranslationError("x", error_status_hint=504)
    assert (err.error_status_hint, str(err)) == (504, "x")
    assert twproto.UpstreamTranslationError("y").error_status_hint == 502
