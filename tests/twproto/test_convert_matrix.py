"""Every client format × every upstream format, for whole answers and streams.

Each scenario is an IR answer (text with multi-byte characters, parallel tool calls, reasoning
with a seal, usage with cache reads and writes, length and content-filter stops). It is written
in the upstream's format by that format's encoder — streamed with text and JSON arguments cut
into small pieces — then translated for the client and read back with the client format's own
decoder. What the client relies on must survive: text, reasoning text, tool names, ids and
parsed arguments, the stop reason, and the usage both formats can express. Upstream streams are
fed whole, byte by byte and at Hypothesis-chosen splits, and must give identical client bytes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.twproto.conftest import (
    DIALECTS,
    bytewise,
    decode_stream,
    pieces,
    run_translator,
    summarize,
    usage_view,
)
from twproto import ir, json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.formats import get, new_stream_encoder
from twproto.stream import StreamTranslator, new_stream_translator
from twproto.translate import answer_to_stream, translate_response

TEXT = "Héllo, wörld! 🎉 naïve café — 你好, 😀👍🏽 done."
USAGE = ir.Usage(input_tokens=60, output_tokens=30, cache_read_tokens=40, cache_write_tokens=10)

SCENARIOS: dict[str, ir.Answer] = {
    "text": ir.Answer(
        id="resp_up1",
        model="upstream-model",
        parts=(ir.Text(text=TEXT),),
        stop_reason=ir.StopReason.END_TURN,
        usage=ir.Usage(input_tokens=12, output_tokens=9),
        created=1700000000,
    ),
    "tools": ir.Answer(
        id="resp_up2",
        model="upstream-model",
        parts=(
            ir.Text(text="Checking both — ✓."),
            ir.ToolCall(
                id="call_weather_1",
                name="get_weather",
                arguments='{"city": "Zürich", "units": "c", "days": [1, 2]}',
            ),
            ir.ToolCall(
                id="call_time_2", name="get_time", arguments='{"tz": "Asia/東京", "fmt": "24h"}'
            ),
        ),
        stop_reason=ir.StopReason.TOOL_USE,
        usage=ir.Usage(input_tokens=100, output_tokens=40),
        created=1700000001,
    ),
    "reasoning": ir.Answer(
        id="resp_up3",
        model="upstream-model",
        parts=(
            ir.Reasoning(text="Let me think… 🤔 6×7?", signature="c2lnbmF0dXJl"),
            ir.Text(text="The answer is 42."),
        ),
        stop_reason=ir.StopReason.END_TURN,
        usage=ir.Usage(input_tokens=20, output_tokens=50, reasoning_tokens=35),
        created=1700000002,
    ),
    "usage": ir.Answer(
        id="resp_up4",
        model="upstream-model",
        parts=(ir.Text(text="cached"),),
        stop_reason=ir.StopReason.END_TURN,
        usage=USAGE,
        created=1700000003,
    ),
    "length": ir.Answer(
        id="resp_up5",
        model="upstream-model",
        parts=(ir.Text(text="cut off mid-sen"),),
        stop_reason=ir.StopReason.MAX_TOKENS,
        usage=ir.Usage(input_tokens=5, output_tokens=16),
        created=1700000004,
    ),
    "filter": ir.Answer(
        id="resp_up6",
        model="upstream-model",
        parts=(ir.Text(text="I can't"),),
        stop_reason=ir.StopReason.CONTENT_FILTER,
        usage=ir.Usage(input_tokens=5, output_tokens=3),
        created=1700000005,
    ),
}

PAIRS = [(u, c) for u in DIALECTS for c in DIALECTS]
CLIENT_MODEL = "client-model-name"


def _chunks(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def play(answer: ir.Answer, h: ir.StreamHandler) -> None:
    """Drive `h` with `answer` as a stream whose text and arguments come in small pieces."""
    h.message_start(answer.id, answer.model, answer.created, None)
    for index, part in enumerate(answer.parts):
        if isinstance(part, ir.Text):
            h.part_start(index, ir.PartKind.TEXT, None)
            for piece in _chunks(part.text):
                h.text(index, piece)
            h.part_stop(index)
        elif isinstance(part, ir.Reasoning):
            h.part_start(index, ir.PartKind.REASONING, None)
            for piece in _chunks(part.text):
                h.reasoning(index, piece)
            h.reasoning_seal(index, part.signature, part.encrypted_content, None)
            h.part_stop(index)
        elif isinstance(part, ir.ToolCall):
            h.tool_call_start(index, part.id, part.name, part.tool_kind, None, None)
            for piece in _chunks(part.arguments, 5):
                h.tool_args(index, piece)
            h.part_stop(index)
    if answer.usage is not None:
        h.usage(answer.usage)
    h.finish(answer.stop_reason, None)
    h.end()


def upstream_stream(answer: ir.Answer, dialect: Dialect) -> bytes:
    encoder = new_stream_encoder(dialect, model=answer.model, created=answer.created)
    play(answer, encoder)
    return encoder.take()


def upstream_whole(answer: ir.Answer, dialect: Dialect) -> bytes:
    return json_dumps(get(dialect).encode_response(answer, model=answer.model))


def expected(answer: ir.Answer) -> dict[str, Any]:
    return summarize(answer)


def check(got: ir.Answer, want: ir.Answer, upstream: Dialect, client: Dialect) -> None:
    assert summarize(got) == expected(want)
    assert usage_view(got.usage, upstream, client) == usage_view(want.usage, upstream, client)


def _translator(upstream: Dialect, client: Dialect, **kw: Any) -> StreamTranslator:
    return new_stream_translator(upstream, client, client_model=CLIENT_MODEL, created=1234, **kw)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("upstream", "client"), PAIRS, ids=lambda d: str(d))
def test_stream_to_stream(upstream: Dialect, client: Dialect, scenario: str) -> None:
    answer = SCENARIOS[scenario]
    data = upstream_stream(answer, upstream)
    out, translator = run_translator(lambda: _translator(upstream, client), [data])
    assert translator.finished and translator.error is None
    decoded = decode_stream(client, out)
    assert decoded.finished
    check(decoded.answer, answer, upstream, client)
    if upstream is not client:
        assert decoded.answer.model == CLIENT_MODEL
    assert translator.usage is not None
    # Byte by byte: the same client bytes.
    out_bytes, _ = run_translator(lambda: _translator(upstream, client), bytewise(data))
    assert out_bytes == out


@pytest.mark.parametrize(("upstream", "client"), PAIRS, ids=lambda d: str(d))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=st.sampled_from(sorted(SCENARIOS)),
    cuts=st.lists(st.integers(min_value=1, max_value=20_000), max_size=30),
)
def test_stream_any_split(
    upstream: Dialect, client: Dialect, scenario: str, cuts: list[int]
) -> None:
    data = upstream_stream(SCENARIOS[scenario], upstream)
    whole, _ = run_translator(lambda: _translator(upstream, client), [data])
    split, _ = run_translator(
        lambda: _translator(upstream, client), pieces(data, [c % len(data) for c in cuts])
    )
    assert split == whole


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("upstream", "client"), PAIRS, ids=lambda d: str(d))
def test_whole_to_whole(upstream: Dialect, client: Dialect, scenario: str) -> None:
    answer = SCENARIOS[scenario]
    result = translate_response(
        upstream_whole(answer, upstream), upstream, client, client_model=CLIENT_MODEL
    )
    got = get(client).decode_response(json_loads(result.body))
    check(got, answer, upstream, client)
    assert got.model == CLIENT_MODEL
    assert (
        result.stop_reason
        is get(upstream).decode_response(json_loads(upstream_whole(answer, upstream))).stop_reason
    )
    assert result.usage is not None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("upstream", "client"), PAIRS, ids=lambda d: str(d))
def test_stream_to_whole(upstream: Dialect, client: Dialect, scenario: str) -> None:
    answer = SCENARIOS[scenario]
    data = upstream_stream(answer, upstream)
    translator = _translator(upstream, client, client_stream=False)
    assert translator.feed(data) == b""
    body = translator.end()
    assert translator.finished
    got = get(client).decode_response(json_loads(body))
    check(got, answer, upstream, client)
    assert got.model == CLIENT_MODEL


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("upstream", "client"), PAIRS, ids=lambda d: str(d))
def test_whole_to_stream(upstream: Dialect, client: Dialect, scenario: str) -> None:
    answer = SCENARIOS[scenario]
    out = answer_to_stream(
        upstream_whole(answer, upstream), upstream, client, client_model=CLIENT_MODEL
    )
    decoded = decode_stream(client, out)
    assert decoded.finished
    check(decoded.answer, answer, upstream, client)


@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
@pytest.mark.parametrize("scenario", ["text", "tools", "reasoning"])
def test_gemini_json_array_framing(upstream: Dialect, scenario: str) -> None:
    answer = SCENARIOS[scenario]
    # Gemini client without alt=sse: a JSON array, from every upstream.
    data = upstream_stream(answer, upstream)
    out, translator = run_translator(
        lambda: _translator(upstream, Dialect.GEMINI, client_sse=False), bytewise(data)
    )
    assert out.startswith(b"[") and out.endswith(b"]")
    elements = json_loads(out)
    assert isinstance(elements, list) and elements
    decoded = decode_stream(Dialect.GEMINI, out, sse=False)
    check(decoded.answer, answer, upstream, Dialect.GEMINI)
    # Gemini upstream without alt=sse, to every client.
    encoder = new_stream_encoder(Dialect.GEMINI, model="m", sse=False)
    play(answer, encoder)
    array = encoder.take()
    for client in DIALECTS:
        out, translator = run_translator(
            lambda c=client: _translator(Dialect.GEMINI, c, upstream_sse=False), bytewise(array)
        )
        assert translator.finished
        check(decode_stream(client, out).answer, answer, Dialect.GEMINI, client)


def _interleaved_chat_tools() -> bytes:
    """A Chat stream whose two tool calls' arguments arrive interleaved."""
    head = '{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    chunks = [
        '[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]',
        '[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function",'
        '"function":{"name":"fa","arguments":"{\\"x\\""}}]},"finish_reason":null}]',
        '[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function",'
        '"function":{"name":"fb","arguments":"{\\"y\\""}}]},"finish_reason":null}]',
        '[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]},'
        '"finish_reason":null}]',
        '[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":": 2}"}}]},'
        '"finish_reason":null}]',
        '[{"index":0,"delta":{},"finish_reason":"tool_calls"}]',
    ]
    body = "".join(f"data: {head}{c}}}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return body.encode()


@pytest.mark.parametrize("client", DIALECTS, ids=str)
def test_interleaved_parallel_tool_calls(client: Dialect) -> None:
    out, translator = run_translator(
        lambda: _translator(Dialect.OPENAI_CHAT, client), [_interleaved_chat_tools()]
    )
    assert translator.finished
    got = summarize(decode_stream(client, out).answer)
    assert got["calls"] == [("fa", {"x": 1}, "call_a"), ("fb", {"y": 2}, "call_b")]
    assert got["stop"] == "tools"


def test_tool_call_indices_never_collide() -> None:
    # Text, two tools, text again: every format numbers its blocks/items without reuse.
    answer = ir.Answer(
        id="r",
        model="m",
        parts=(
            ir.Text(text="a"),
            ir.ToolCall(id="c1", name="f", arguments="{}"),
            ir.ToolCall(id="c2", name="g", arguments='{"k": 1}'),
        ),
        stop_reason=ir.StopReason.TOOL_USE,
    )
    for upstream in DIALECTS:
        data = upstream_stream(answer, upstream)
        out, _ = run_translator(lambda u=upstream: _translator(u, Dialect.ANTHROPIC), [data])
        starts = [
            json_loads(line[6:])["index"]
            for line in out.decode().splitlines()
            if line.startswith("data: ") and '"content_block_start"' in line
        ]
        assert starts == list(range(len(starts)))
        out, _ = run_translator(lambda u=upstream: _translator(u, Dialect.OPENAI_CHAT), [data])
        indices = [
            call["index"]
            for line in out.decode().splitlines()
            if line.startswith("data: {")
            for choice in json_loads(line[6:]).get("choices", [])
            for call in choice.get("delta", {}).get("tool_calls", [])
            if "id" in call
        ]
        assert indices == [0, 1]
