"""twproto.stream.resume: the continuation request, the overlap trimmer and the spliced client
stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twproto import ir
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.failures import Failure, FailureKind, PauseRule, classify_response
from twproto.formats import new_stream_decoder
from twproto.sse import SSEDecoder
from twproto.stream import (
    CONTINUE_INSTRUCTION,
    MIN_REPEAT,
    OverlapTrimmer,
    ResumableStream,
    continued_request,
    refuses_prefill,
)
from twproto.translate import translate_request

# --- the trimmer ------------------------------------------------------------------------------


def trim(before: str, pieces: list[str]) -> str:
    trimmer = OverlapTrimmer(before)
    return "".join(trimmer.feed(p) for p in pieces) + trimmer.flush()


def splits(text: str) -> st.SearchStrategy[list[str]]:
    """`text` cut into pieces at arbitrary points."""

    def cut(points: set[int]) -> list[str]:
        bounds = sorted(points)
        return [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]

    return st.sets(st.integers(0, len(text)), max_size=6).map(cut)


WORDS = st.text(alphabet="abc de.", max_size=60)


@given(data=st.data(), before=WORDS, new=WORDS)
def test_trimmer_drops_only_a_repeat_whatever_the_split(
    data: st.DataObject, before: str, new: str
) -> None:
    out = trim(before, data.draw(splits(new)))
    assert out == trim(before, [new])  # the split does not matter
    assert new.endswith(out)
    dropped = new[: len(new) - len(out)]
    assert before.endswith(dropped)  # what was dropped, the client has already
    assert len(dropped) >= MIN_REPEAT or dropped.isspace() or not dropped


@given(
    data=st.data(),
    before=st.text(alphabet="abc de.", min_size=MIN_REPEAT, max_size=80),
    continuation=WORDS,
)
def test_client_text_is_prefix_plus_continuation_without_duplication(
    data: st.DataObject, before: str, continuation: str
) -> None:
    # The new upstream repeats the last `repeat` characters (none, or enough to be recognised)
    # and then continues: the client ends up with the continuation exactly once at the end.
    repeat = data.draw(st.sampled_from([0, *range(MIN_REPEAT, len(before) + 1)]))
    new = before[len(before) - repeat :] + continuation
    out = trim(before, data.draw(splits(new)))
    assert (before + out).endswith(continuation)
    assert len(out) <= len(continuation)


@given(
    data=st.data(),
    before=st.text(alphabet="abcde ", min_size=MIN_REPEAT, max_size=80),
    continuation=st.text(alphabet="xyz", max_size=40),
)
def test_a_repeat_is_dropped_exactly(data: st.DataObject, before: str, continuation: str) -> None:
    repeat = data.draw(st.integers(MIN_REPEAT, len(before)))
    out = trim(before, data.draw(splits(before[-repeat:] + continuation)))
    assert before + out == before + continuation


def test_trimmer_cases() -> None:
    assert trim("Hello ", [" world"]) == "world"  # a whitespace overlap
    assert trim("The quick br", ["uick", " bro", "wn"]) == "own"
    assert trim("step 1", ["1 more"]) == "1 more"  # one character is no repeat
    assert trim("", ["anything"]) == "anything"
    assert trim("abc", []) == ""
    # Held back only while the repeat may still grow.
    trimmer = OverlapTrimmer("The quick brown")
    assert trimmer.feed("quick") == ""
    assert trimmer.feed(" brown fox") == " fox"
    assert trimmer.feed("!") == "!"


# --- the continuation request -----------------------------------------------------------------

BODY = json.dumps(
    {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
).encode()


def upstream_body(target: Dialect, text: str, *, prefill: bool = True) -> dict[str, Any]:
    translated = translate_request(
        BODY, Dialect.ANTHROPIC, target, model="m", continuation=text, prefill=prefill
    )
    body: dict[str, Any] = json.loads(translated.body)
    return body


def test_anthropic_gets_a_prefill_without_trailing_whitespace() -> None:
    last = upstream_body(Dialect.ANTHROPIC, "Hello wor ")["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "Hello wor"}]}


def test_chat_gets_the_text_as_a_trailing_assistant_message() -> None:
    last = upstream_body(Dialect.OPENAI_CHAT, "Hello wor ")["messages"][-1]
    assert last["role"] == "assistant" and last["content"] == "Hello wor "


def test_gemini_gets_a_trailing_model_turn() -> None:
    last = upstream_body(Dialect.GEMINI, "Hello wor")["contents"][-1]
    assert last == {"role": "model", "parts": [{"text": "Hello wor"}]}


def test_responses_gets_the_text_and_an_instruction() -> None:
    items = upstream_body(Dialect.OPENAI_RESPONSES, "Hello wor")["input"]
    assert items[-2]["role"] == "assistant" and "Hello wor" in json.dumps(items[-2])
    assert items[-1]["role"] == "user" and CONTINUE_INSTRUCTION in json.dumps(items[-1])


def test_without_prefill_every_format_gets_the_instruction() -> None:
    messages = upstream_body(Dialect.ANTHROPIC, "Hello wor", prefill=False)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[-1]["content"][0]["text"] == CONTINUE_INSTRUCTION


def test_no_text_means_the_request_unchanged() -> None:
    req = ir.Request(
        model="m", messages=(ir.Message(role=ir.Role.USER, parts=(ir.Text(text="hi"),)),)
    )
    assert continued_request(req, "", Dialect.ANTHROPIC) is req
    assert continued_request(req, "  ", Dialect.ANTHROPIC) is req  # nothing left to prefill


def _failure(status: int | None, message: str) -> Failure:
    return Failure(
        kind=FailureKind.CLIENT_ERROR,
        failover=False,
        temporary=False,
        pause=PauseRule.NONE,
        status=status,
        message=message,
    )


def test_refuses_prefill() -> None:
    body = json.dumps(
        {"error": {"message": "This model does not support assistant message prefill."}}
    ).encode()
    assert refuses_prefill(classify_response(400, [], body, now=0.0))
    assert refuses_prefill(_failure(400, "The final assistant content cannot end with whitespace"))
    assert not refuses_prefill(_failure(400, "messages: field required"))
    assert not refuses_prefill(_failure(500, "prefill exploded"))


# --- the spliced stream -----------------------------------------------------------------------


def anthropic_events(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def anthropic_stream(
    texts: list[str], *, thinking: str | None = None, end: bool = True, error: bool = False
) -> bytes:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    index = 0
    if thinking is not None:
        events += [
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": thinking},
            },
            {"type": "content_block_stop", "index": 0},
        ]
        index = 1
    events.append(
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        }
    )
    events += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}
        for t in texts
    ]
    if error:
        events.append(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )
    if end:
        events += [
            {"type": "content_block_stop", "index": index},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 9},
            },
            {"type": "message_stop"},
        ]
    return anthropic_events(*events)


def chat_stream(texts: list[str]) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    return (
        chunk({"role": "assistant", "content": ""})
        + b"".join(chunk({"content": t}) for t in texts)
        + chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )


def client_events(client: Dialect, data: bytes) -> list[Any]:
    decoder = new_stream_decoder(client)
    framing = SSEDecoder()
    return [e for event in framing.feed(data) + framing.end() for e in decoder.feed(event)]


@pytest.mark.parametrize(
    "client", [Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES]
)
def test_a_second_upstream_continues_the_same_client_stream(client: Dialect) -> None:
    stream = ResumableStream(Dialect.ANTHROPIC, client, client_model="m")
    out = stream.feed(anthropic_stream(["The qu", "ick br"], end=False))
    assert stream.resume_point == len("The quick br") and stream.text == "The quick br"
    stream.next_leg(Dialect.OPENAI_CHAT, tool_names=None)
    out += stream.feed(chat_stream(["uick br", "own fox."]))
    out += stream.end()
    assert stream.finished and stream.legs == 2

    events = client_events(client, out)
    assert sum(isinstance(e, ir.MessageStart) for e in events) == 1
    deltas = [e for e in events if isinstance(e, ir.TextDelta)]
    assert "".join(d.text for d in deltas) == "The quick brown fox."
    assert len({d.index for d in deltas}) == 1  # one text part, continued
    assert sum(isinstance(e, ir.Finish) for e in events) == 1


def test_a_later_legs_reasoning_is_dropped() -> None:
    stream = ResumableStream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m")
    out = stream.feed(anthropic_stream(["Hello"], end=False))
    stream.next_leg(Dialect.ANTHROPIC, tool_names=None)
    out += stream.feed(anthropic_stream([" world"], thinking="let me see")) + stream.end()
    events = client_events(Dialect.ANTHROPIC, out)
    assert not any(isinstance(e, ir.ReasoningDelta) for e in events)
    assert "".join(e.text for e in events if isinstance(e, ir.TextDelta)) == "Hello world"


def test_an_in_stream_error_is_held_back_until_the_ending() -> None:
    stream = ResumableStream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m")
    out = stream.feed(anthropic_stream(["Hello"], end=False, error=True)) + stream.end()
    assert b"event: error" not in out and not stream.finished
    assert stream.error is not None
    err = GatewayError(status=502, category=ErrorCategory.UPSTREAM, code="gw.x", message="x")
    ending = stream.fail(err)
    assert b"event: error" in ending and b"Overloaded" in ending  # the upstream's own error


def test_a_tool_call_that_reached_the_client_refuses_the_resume() -> None:
    stream = ResumableStream(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    tool = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    }
    start = anthropic_stream([], end=False).split(b"event: content_block_start")[0]
    stream.feed(start + anthropic_events(tool))
    assert stream.resume_point is None


def test_a_part_closed_before_the_break_is_not_reopened() -> None:
    stream = ResumableStream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m")
    whole = anthropic_stream(["First."])
    out = stream.feed(whole.split(b"event: message_delta")[0])  # the text part was stopped
    stream.next_leg(Dialect.ANTHROPIC, tool_names=None)
    out += stream.feed(anthropic_stream([" Second."])) + stream.end()
    events = client_events(Dialect.ANTHROPIC, out)
    starts = [e.index for e in events if isinstance(e, ir.PartStart)]
    assert len(starts) == 2 and len(set(starts)) == 2
    assert "".join(e.text for e in events if isinstance(e, ir.TextDelta)) == "First. Second."


def test_a_tool_call_cut_off_inside_its_first_event_starts_over() -> None:
    # The break came in the middle of the tool call's opening event: the client never saw any
    # of it, so the answer is resumed and the next upstream's call goes out whole.
    stream = ResumableStream(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    tool = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    }
    text = anthropic_stream(["Let me look."]).split(b"event: message_delta")[0]
    out = stream.feed(text + anthropic_events(tool)[:40])
    assert stream.resume_point == len("Let me look.")
    stream.next_leg(Dialect.OPENAI_CHAT, tool_names=None)
    call = {"index": 0, "id": "call_1", "type": "function"}
    chunks = [
        {"role": "assistant", "content": None},
        {"tool_calls": [{**call, "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]},
    ]
    body = b"".join(
        b"data: "
        + json.dumps(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": d, "finish_reason": None}],
            }
        ).encode()
        + b"\n\n"
        for d in chunks
    )
    done = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
    }
    body += b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n"
    out += stream.feed(body) + stream.end()
    events = client_events(Dialect.OPENAI_CHAT, out)
    assert [e.name for e in events if isinstance(e, ir.ToolCallStart)] == ["f"]
    assert "".join(e.arguments for e in events if isinstance(e, ir.ToolArgsDelta)) == '{"a":1}'
    assert "".join(e.text for e in events if isinstance(e, ir.TextDelta)) == "Let me look."


def _spliced(client: Dialect, first: list[bytes], second: list[bytes]) -> list[Any]:
    stream = ResumableStream(Dialect.ANTHROPIC, client, client_model="m")
    out = b"".join(stream.feed(piece) for piece in first)
    stream.next_leg(Dialect.OPENAI_CHAT, tool_names=None)
    out += b"".join(stream.feed(piece) for piece in second) + stream.end()
    return client_events(client, out)


def _shape(events: list[Any]) -> tuple[str, list[str]]:
    """The text, and the kinds of events with each run of text deltas as one."""
    kinds: list[str] = []
    for e in events:
        kind = type(e).__name__
        if not (kind == "TextDelta" and kinds and kinds[-1] == kind):
            kinds.append(kind)
    return "".join(e.text for e in events if isinstance(e, ir.TextDelta)), kinds


FIRST = anthropic_stream(["The qu", "ick br"], end=False)
SECOND = chat_stream(["uick br", "own fox."])


def _bytes_split(data: bytes) -> st.SearchStrategy[list[bytes]]:
    def cut(points: set[int]) -> list[bytes]:
        bounds = sorted(points)
        return [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]

    return st.sets(st.integers(0, len(data)), max_size=8).map(cut)


@pytest.mark.parametrize("client", [Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.GEMINI])
def test_the_spliced_stream_byte_by_byte_is_the_one_shot_result(client: Dialect) -> None:
    whole = _shape(_spliced(client, [FIRST], [SECOND]))
    assert whole[0] == "The quick brown fox."
    bytewise = _spliced(client, [bytes([b]) for b in FIRST], [bytes([b]) for b in SECOND])
    assert _shape(bytewise) == whole


@given(data=st.data())
def test_the_spliced_stream_at_any_split_is_the_one_shot_result(data: st.DataObject) -> None:
    first = data.draw(_bytes_split(FIRST))
    second = data.draw(_bytes_split(SECOND))
    assert _shape(_spliced(Dialect.ANTHROPIC, first, second)) == _shape(
        _spliced(Dialect.ANTHROPIC, [FIRST], [SECOND])
    )
