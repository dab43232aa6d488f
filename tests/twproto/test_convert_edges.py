"""What the converter fuzzing (tests/fuzz/test_fuzz_convert.py) found, each with the smallest
input that showed it: numbers and nesting JSON allows but orjson does not write, and text
Python's recursion cannot take apart. Each converts, or raises the one typed error."""

from __future__ import annotations

import json

import pytest

from twproto import (
    Dialect,
    json_dumps,
    json_loads,
    new_stream_translator,
    summarize,
    translate_request,
    translate_response,
)
from twproto.ir import MAX_TOKEN_COUNT, Usage
from twproto.translate import UpstreamTranslationError


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def test_an_integer_beyond_64_bits_in_an_answer_s_usage_is_converted() -> None:
    # orjson reads 2**64 as a float; the usage reader takes it back as an integer, which
    # orjson then refused to write ("Integer exceeds 64-bit range", a TypeError). A count
    # beyond any request's is kept at MAX_TOKEN_COUNT.
    body = b'{"content":[],"usage":{"input_tokens":18446744073709551616}}'
    out = translate_response(body, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    assert json.loads(out.body)["usage"]["prompt_tokens"] == MAX_TOKEN_COUNT
    assert out.usage is not None and out.usage.input_tokens == MAX_TOKEN_COUNT


def test_usage_that_sums_beyond_64_bits_is_converted() -> None:
    # Each count fits in 64 bits; the total a Chat answer reports did not.
    top = 2**64 - 1
    body = json.dumps(
        {"content": [], "usage": {"input_tokens": top, "cache_read_input_tokens": top}}
    ).encode()
    out = translate_response(body, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    assert json.loads(out.body)["usage"]["prompt_tokens"] == 2 * MAX_TOKEN_COUNT


def test_a_stream_s_usage_beyond_64_bits_is_converted() -> None:
    event = b'data: {"choices":[],"usage":{"prompt_tokens":18446744073709551616}}\n\n'
    translator = new_stream_translator(
        Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, client_model="m", client_stream=False
    )
    translator.feed(event + b"data: [DONE]\n\n")
    body = translator.end()
    assert json.loads(body)["usage"]["input_tokens"] == MAX_TOKEN_COUNT


def test_negative_counts_are_none() -> None:
    assert Usage(input_tokens=-5, output_tokens=-(2**70)) == Usage()


def test_a_parsed_request_with_an_integer_beyond_64_bits_is_summarised() -> None:
    # The standard library's reader keeps 2**64 an integer; the summary writes such a block
    # out to count it.
    body = json.loads('{"messages":[{"role":"user","content":[{"type":18446744073709551616}]}]}')
    assert summarize(body, Dialect.ANTHROPIC).input_tokens > 0


def test_nesting_orjson_does_not_write_is_written() -> None:
    # orjson reads 1024 levels and writes 254: a tool's input 300 levels deep, converted.
    body = (
        '{"content":[{"type":"tool_use","id":"t","name":"f","input":{"a":' + _nested(300) + "}}]}"
    ).encode()
    out = translate_response(body, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    call = json.loads(out.body)["choices"][0]["message"]["tool_calls"][0]
    assert json_loads(call["function"]["arguments"]) == {"a": json.loads(_nested(300))}


def test_a_request_nested_deeper_than_orjson_writes_converts() -> None:
    schema = '{"type":"object","properties":{"a":' + _nested(600, "{}") + "}}"
    body = (
        '{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],'
        '"tools":[{"name":"f","input_schema":' + schema + "}]}"
    ).encode()
    out = translate_request(body, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, model="m")
    assert json.loads(out.body)["tools"][0]["function"]["name"] == "f"


def test_text_nested_too_deep_to_print_is_a_translation_error() -> None:
    # A part's text that is a list nested 1000 deep: reading it as text recursed past
    # Python's limit (RecursionError, not a ProtocolError).
    body = ('{"candidates":[{"content":{"parts":[{"text":' + _nested(1000) + "}]}}]}").encode()
    with pytest.raises(UpstreamTranslationError):
        translate_response(body, Dialect.GEMINI, Dialect.ANTHROPIC, client_model="m")


def test_a_stream_event_nested_too_deep_to_print_is_dropped() -> None:
    nested = _nested(1000)
    event = f'event: error\ndata: {{"type":"error","error":{{"message":{nested}}}}}\n\n'
    translator = new_stream_translator(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    translator.feed(event.encode())
    translator.end()
    assert not translator.finished and "event (malformed)" in translator.dropped


def test_a_lone_surrogate_in_a_parsed_request_is_summarised() -> None:
    # The standard library's reader keeps "\ud800" as a lone surrogate, which orjson refuses
    # to write; the summary counts such a block by its JSON size.
    body = json.loads('{"messages":[{"role":"user","content":[{"type":"x","v":"\\ud800"}]}]}')
    summary = summarize(body, Dialect.ANTHROPIC)
    assert summary.input_tokens > 0
    assert json_dumps("\ud800") == '"\ufffd"'.encode()


def test_wide_values_are_written_as_json_is() -> None:
    value = {"n": [2**70, -(2**64)], "deep": json.loads(_nested(500)), "t": "é\ud83d\ude00"}
    assert json.loads(json_dumps(value)) == {**value, "t": "é😀"}
    # Everything orjson writes itself comes out the same either way.
    assert json_dumps({"a": [1, 2.5, None, True, "x"]}) == b'{"a":[1,2.5,null,true,"x"]}'
    with pytest.raises(TypeError):
        json_dumps({1: [2**70]})  # a key that is not text is no JSON, wide or not
