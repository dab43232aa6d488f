"""Usage on every Chat stream: the upstream is asked for it (``stream_options.include_usage``),
and a Chat client that did not ask gets its stream without the usage-only chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twproto import ir
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.sse import SSEDecoder
from twproto.stream import FirstContent, UpstreamStream, new_stream_translator
from twproto.translate import translate_request

CHAT = Dialect.OPENAI_CHAT
FIXTURE = Path(__file__).parents[2] / "data/fixtures/streams/openai-chat-text-include-usage.sse"
STREAM = FIXTURE.read_bytes()
# The fixture without its usage-only chunk: what a client that did not ask for usage gets.
(USAGE_EVENT,) = [e + b"\n\n" for e in STREAM.split(b"\n\n") if b'"choices":[]' in e]
WITHOUT_USAGE = STREAM.replace(USAGE_EVENT, b"")
ERR = GatewayError(status=502, category=ErrorCategory.UPSTREAM, code="gw.x", message="broke")


def _body(**fields: object) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def test_the_fixture_has_one_usage_only_chunk() -> None:
    assert b'"choices":[]' in USAGE_EVENT and b'"choices":[]' not in WITHOUT_USAGE
    assert len(WITHOUT_USAGE) == len(STREAM) - len(USAGE_EVENT)


# --- the request ---------------------------------------------------------------------------------


def test_a_chat_stream_without_stream_options_asks_for_usage() -> None:
    body = _body(stream=True, temperature=0.5)
    out = translate_request(body, CHAT, CHAT)
    assert out.hide_usage_chunk
    sent = json.loads(out.body)
    assert sent == {**json.loads(body), "stream_options": {"include_usage": True}}
    assert out.body.endswith(body[1:])  # passed through: only the option is written in


def test_the_clients_other_stream_options_are_kept() -> None:
    options = {"include_usage": False, "include_obfuscation": False}
    out = translate_request(_body(stream=True, stream_options=options), CHAT, CHAT)
    assert out.hide_usage_chunk
    sent = json.loads(out.body)["stream_options"]
    assert sent == {"include_usage": True, "include_obfuscation": False}


def test_a_client_that_asked_for_usage_is_passed_through_as_it_came() -> None:
    body = _body(stream=True, stream_options={"include_usage": True})
    out = translate_request(body, CHAT, CHAT)
    assert out.body == body and not out.hide_usage_chunk


def test_whole_answers_and_other_formats_are_untouched() -> None:
    body = _body()
    assert translate_request(body, CHAT, CHAT).body == body
    assert not translate_request(body, CHAT, CHAT).hide_usage_chunk
    claude = _body(max_tokens=9, stream=True)
    assert not translate_request(claude, Dialect.ANTHROPIC, Dialect.ANTHROPIC).hide_usage_chunk
    # Converted to Chat: usage asked for as before; the Chat encoder is not a relayed stream.
    converted = translate_request(claude, Dialect.ANTHROPIC, CHAT)
    assert json.loads(converted.body)["stream_options"] == {"include_usage": True}
    assert not converted.hide_usage_chunk


def test_a_rewritten_chat_stream_asks_for_usage_too() -> None:
    # A routing rule's `set` rewrites a same-format body through the IR.
    body = _body(stream=True, stream_options={"include_obfuscation": False})
    out = translate_request(body, CHAT, CHAT, max_tokens=50)
    assert out.hide_usage_chunk
    sent = json.loads(out.body)
    assert sent["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    assert sent["max_completion_tokens"] == 50


# --- the stream ----------------------------------------------------------------------------------


def _relay(data: bytes, size: int, *, hide: bool) -> tuple[bytes, ir.Usage | None, bool]:
    t = new_stream_translator(CHAT, CHAT, client_model="m", hide_usage_chunk=hide)
    out = b"".join(t.feed(data[i : i + size]) for i in range(0, len(data), size))
    out += t.end()
    return out, t.usage, t.finished


@pytest.mark.parametrize("size", [1, 7, 97, 400, 1 << 20])
def test_the_usage_only_chunk_is_left_out_however_the_bytes_arrive(size: int) -> None:
    out, usage, finished = _relay(STREAM, size, hide=True)
    assert out == WITHOUT_USAGE
    assert usage is not None and usage.output_tokens == 238 and finished


@pytest.mark.parametrize("size", [1, 97, 1 << 20])
def test_without_hiding_every_byte_is_relayed(size: int) -> None:
    out, usage, _ = _relay(STREAM, size, hide=False)
    assert out == STREAM and usage is not None


def test_a_chunk_that_ends_its_events_goes_out_as_the_same_object() -> None:
    t = new_stream_translator(CHAT, CHAT, client_model="m", hide_usage_chunk=True)
    first = STREAM[: STREAM.index(b"\n\n") + 2]
    assert t.feed(first) is first


def test_crlf_line_ends() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    out, usage, _ = _relay(crlf, 53, hide=True)
    assert out == WITHOUT_USAGE.replace(b"\n", b"\r\n") and usage is not None


def test_a_last_event_without_its_blank_line() -> None:
    cut = STREAM.rstrip(b"\n")  # ends with "data: [DONE]"
    out, _, finished = _relay(cut, 64, hide=True)
    assert out == WITHOUT_USAGE.rstrip(b"\n") and finished


def test_usage_in_a_chunk_with_choices_is_kept() -> None:
    # Some servers put usage on the finish chunk itself: that chunk is content, relayed.
    finish = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    finish += b'"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    data = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        + finish
        + b"data: [DONE]\n\n"
    )
    out, usage, _ = _relay(data, 11, hide=True)
    assert out == data and usage is not None and usage.output_tokens == 2


def test_a_break_after_a_held_event_still_relays_what_came() -> None:
    # The client gets what it would have without hiding, then the error event.
    t = new_stream_translator(CHAT, CHAT, client_model="m", hide_usage_chunk=True)
    cut = STREAM.index(b"\n\n", 2000) + 40  # 38 bytes into an event
    out = t.feed(STREAM[:cut])
    assert t.end() == b""  # not a proper end: the held bytes go with the error
    out += t.fail(ERR)
    assert out.startswith(STREAM[:cut] + b"\n\n")
    events = SSEDecoder().feed(out[cut:])
    assert "error" in json.loads(events[-1].data)


def test_the_opening_hold_hands_over_a_stream_that_hides_the_chunk() -> None:
    # A short answer arrives in one piece, usage chunk and all, while the stream is held.
    stream = UpstreamStream(CHAT, CHAT, client_model="m", hide_usage_chunk=True)
    opened = stream.feed(STREAM, now=0.0)
    assert isinstance(opened, FirstContent)
    out = opened.data + opened.translator.end()
    assert out == WITHOUT_USAGE
    assert opened.translator.usage is not None
