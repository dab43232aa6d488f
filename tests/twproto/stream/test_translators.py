"""`StreamTranslator` on recorded provider streams: the same-format watch path relays bytes
unchanged while still finding usage, the finish and errors; every recorded stream converts to
every client format; endings, failures and broken framing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.twproto.conftest import (
    DIALECTS,
    FIXTURES,
    bytewise,
    decode_stream,
    fixture,
    fixture_dialect,
    run_translator,
    stream_events,
    summarize,
)
from twproto import _json, ir, json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.formats import new_stream_decoder
from twproto.stream import StreamTranslator, new_stream_translator

STREAMS = sorted(p.name for p in (FIXTURES / "streams").iterdir())
ERR = GatewayError(
    status=504, category=ErrorCategory.TIMEOUT, code="gw.timeout", message="too slow"
)


def _framing(name: str) -> bool:
    return not name.endswith(".json")


def _reference(name: str) -> tuple[ir.Answer, Any]:
    dialect = fixture_dialect(name)
    decoder = new_stream_decoder(dialect)
    builder = ir.AnswerBuilder()
    for event in stream_events(dialect, fixture(f"streams/{name}"), sse=_framing(name)):
        decoder.feed_into(event, builder)
    return builder.answer(), decoder


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
@pytest.mark.parametrize("name", STREAMS)
def test_watch_path_relays_unchanged(name: str, size: int) -> None:
    dialect = fixture_dialect(name)
    data = fixture(f"streams/{name}")
    sse = _framing(name)
    translator = new_stream_translator(
        dialect, dialect, client_model="client", upstream_sse=sse, client_sse=sse
    )
    out = []
    for chunk in [data[i : i + size] for i in range(0, len(data), size)]:
        relayed = translator.feed(chunk)
        assert relayed is chunk
        out.append(relayed)
    assert translator.end() == b""
    assert b"".join(out) == data
    _, reference = _reference(name)
    assert translator.usage == reference.usage
    assert translator.finished == (reference.finished and reference.error is None)
    assert translator.error == reference.error


def test_watch_path_parses_only_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = _json.loads

    def counting(data: Any) -> Any:
        calls.append(data)
        return real(data)

    # Every decoder parses through twproto._json; count the parses of one watched stream.
    monkeypatch.setattr(_json, "loads", counting)
    data = fixture("streams/anthropic-thinking-signature-text.sse")
    translator = new_stream_translator(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="c")
    translator.feed(data)
    translator.end()
    events = stream_events(Dialect.ANTHROPIC, data)
    assert len(events) > 60
    assert len(calls) == 3  # message_start, message_delta, message_stop
    assert translator.finished and translator.usage is not None


@pytest.mark.parametrize("client", DIALECTS, ids=str)
@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream_reaches_every_client(name: str, client: Dialect) -> None:
    upstream = fixture_dialect(name)
    data = fixture(f"streams/{name}")
    sse = _framing(name)
    reference, ref_decoder = _reference(name)

    def make() -> StreamTranslator:
        return new_stream_translator(
            upstream, client, client_model="client-model", upstream_sse=sse
        )

    out, translator = run_translator(make, [data])
    assert out == run_translator(make, bytewise(data))[0]
    decoded = decode_stream(client, out)
    if ref_decoder.error is not None:
        assert translator.error == ref_decoder.error
        assert not translator.finished
        assert decoded.error is not None
        if upstream is not client:
            assert decoded.error.message == ref_decoder.error.message
        return
    assert translator.finished and decoded.finished
    want = summarize(reference)
    got = summarize(decoded.answer)
    assert got["text"] == want["text"]
    assert got["stop"] == want["stop"]
    assert [c[:2] for c in got["calls"]] == [c[:2] for c in want["calls"]]
    assert [c[2] for c in got["calls"]] == [c[2] for c in want["calls"]]
    if want["reasoning"]:
        assert got["reasoning"] == want["reasoning"]
    assert decoded.answer.usage is not None and reference.usage is not None
    assert decoded.answer.usage.total_input_tokens == reference.usage.total_input_tokens
    assert decoded.answer.usage.output_tokens == reference.usage.output_tokens
    assert translator.usage == ref_decoder.usage


# ----------------------------------------------------------------------------------------------
# Endings and failures


def _cut(name: str, before: str) -> bytes:
    """A recorded stream cut just before the first event whose data contains `before`."""
    data = fixture(f"streams/{name}")
    return data[: data.index(before.encode())]


@pytest.mark.parametrize("client", DIALECTS, ids=str)
@pytest.mark.parametrize(
    ("name", "marker"),
    [
        ("anthropic-text.sse", '"message_delta"'),
        ("openai-chat-text-include-usage.sse", '"finish_reason":"stop"'),
        ("openai-responses-text.sse", '"response.output_text.done"'),
        ("gemini-sse-text.sse", '"finishReason"'),
    ],
)
def test_cut_stream_is_not_finished_and_fails_cleanly(
    name: str, marker: str, client: Dialect
) -> None:
    upstream = fixture_dialect(name)
    data = _cut(name, marker)
    # Cut mid-event, too: the data line of the event before the marker is incomplete.
    data = data[: data.rindex(b"data: ") + 20]
    translator = new_stream_translator(upstream, client, client_model="m")
    out = translator.feed(data) + translator.end()
    assert not translator.finished
    out += translator.fail(ERR)
    decoded = decode_stream(client, out) if upstream is not client else None
    if decoded is not None:
        assert decoded.error is not None and decoded.error.message == "too slow"
        assert not decoded.finished
    else:
        # The watch path ended the half event before writing the error event.
        assert b"too slow" in out
        tail = out[len(data) :]
        assert tail.startswith(b"\n\n")
        assert decode_stream(client, tail).error is not None


def test_fail_after_end_writes_nothing_more() -> None:
    data = fixture("streams/anthropic-text.sse")
    translator = new_stream_translator(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    out = translator.feed(data) + translator.end()
    assert out.endswith(b"data: [DONE]\n\n")
    assert translator.fail(ERR) == b""


def test_gemini_json_array_watch_failure_closes_the_array() -> None:
    data = fixture("streams/gemini-jsonarray-text-thought.json")
    cut = data[: len(data) // 2]
    translator = new_stream_translator(
        Dialect.GEMINI, Dialect.GEMINI, client_model="g", upstream_sse=False, client_sse=False
    )
    assert translator.feed(cut) is cut
    translator.end()
    assert not translator.finished
    tail = translator.fail(ERR)
    assert tail.startswith(b",\r\n{") and tail.endswith(b"]")
    fresh = new_stream_translator(
        Dialect.GEMINI, Dialect.GEMINI, client_model="g", upstream_sse=False, client_sse=False
    )
    assert json_loads(fresh.fail(ERR)) == [
        {"error": {"code": 504, "message": "too slow", "status": "DEADLINE_EXCEEDED"}}
    ]


@pytest.mark.parametrize("client", DIALECTS, ids=str)
def test_stream_to_whole_with_upstream_error(client: Dialect) -> None:
    data = fixture("streams/openai-chat-midstream-error.sse")
    translator = new_stream_translator(
        Dialect.OPENAI_CHAT, client, client_model="m", client_stream=False
    )
    assert translator.feed(data) == b""
    body = json_loads(translator.end())
    assert "error" in body
    assert not translator.finished
    assert "error" in json_loads(translator.fail(ERR))


def test_stream_to_whole_unfinished_returns_nothing() -> None:
    translator = new_stream_translator(
        Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m", client_stream=False
    )
    translator.feed(_cut("anthropic-text.sse", '"message_delta"'))
    assert translator.end() == b""
    assert not translator.finished


def test_watch_path_oversized_event_breaks_the_stream() -> None:
    translator = new_stream_translator(
        Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m", max_event_bytes=1 << 20
    )
    piece = b"x" * 65536
    for _ in range(20):
        assert translator.feed(piece) is piece
    assert translator.broken and translator.too_large and not translator.finished


def test_oversized_event_breaks_the_stream() -> None:
    big = b"event: content_block_delta\ndata: " + b"x" * (1 << 20) + b"\n\n"
    translator = new_stream_translator(
        Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m", max_event_bytes=1 << 20
    )
    translator.feed(b"event: message_start\ndata: {}\n\n")
    assert translator.feed(big) == b""
    assert translator.broken and translator.too_large and not translator.finished
    assert b'"error"' in translator.fail(ERR)


def test_only_gemini_streams_json_arrays() -> None:
    with pytest.raises(ValueError):
        new_stream_translator(
            Dialect.ANTHROPIC, Dialect.GEMINI, client_model="m", upstream_sse=False
        )


def test_dropped_is_reported_for_streams() -> None:
    data = fixture("streams/anthropic-cache-usage.sse")
    _, translator = run_translator(
        lambda: new_stream_translator(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m"),
        [data],
    )
    assert "content:server_tool_use" in translator.dropped
    data = fixture("streams/anthropic-thinking-signature-text.sse")
    _, translator = run_translator(
        lambda: new_stream_translator(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m"),
        [data],
    )
    assert "reasoning.signature" in translator.dropped


def _error_fixture(name: str) -> bytes:
    body = json_loads(fixture(f"errors/{name}"))["body"]
    assert isinstance(body, str)
    return body.encode()


def test_codex_usage_limit_event_in_stream() -> None:
    data = (
        b"event: error\ndata: "
        + _error_fixture("codex-usage-limit-reached-stream-error-event.json")
        + b"\n\n"
    )
    translator = new_stream_translator(
        Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC, client_model="m"
    )
    out = translator.feed(data) + translator.end()
    assert translator.error == ir.StreamErrorEvent(
        message="The usage limit has been reached", type="usage_limit_reached", status=429
    )
    decoded = decode_stream(Dialect.ANTHROPIC, out)
    assert decoded.error is not None and decoded.error.type == "rate_limit_error"


def test_gemini_array_error_element() -> None:
    data = _error_fixture("gemini-cloudcode-429-array-form.json")
    translator = new_stream_translator(
        Dialect.GEMINI, Dialect.OPENAI_CHAT, client_model="m", upstream_sse=False
    )
    out = translator.feed(data) + translator.end()
    assert translator.error is not None and translator.error.status == 429
    assert not translator.finished
    error = json_loads(out.split(b"data: ")[-1])["error"]
    assert error["message"].startswith("Resource exhausted")


def test_chat_tool_calls_without_index() -> None:
    head = '{"id":"chatcmpl-q","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    deltas = [
        '[{"index":0,"delta":{"tool_calls":[{"id":"a","type":"function",'
        '"function":{"name":"f","arguments":"{\\"q\\""}}]}}]',
        '[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":": 1}"}}]}}]',
        '[{"index":0,"delta":{"tool_calls":[{"id":"b","type":"function",'
        '"function":{"name":"g","arguments":"{}"}}]}}]',
        '[{"index":0,"delta":{},"finish_reason":"stop"}]',
    ]
    data = ("".join(f"data: {head}{d}}}\n\n" for d in deltas) + "data: [DONE]\n\n").encode()
    out, _ = run_translator(
        lambda: new_stream_translator(Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, client_model="m"),
        [data],
    )
    got = summarize(decode_stream(Dialect.ANTHROPIC, out).answer)
    assert got["calls"] == [("f", {"q": 1}, "a"), ("g", {}, "b")]
    assert got["stop"] == "tools"
