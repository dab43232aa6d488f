"""First-content detection and the opening hold (docs/streams.md)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twproto.dialect import Dialect
from twproto.failures import FailureKind
from twproto.sse import SSEDecoder, SSEEvent
from twproto.stream import (
    EventRole,
    FailedBeforeContent,
    Holding,
    HoldOutcome,
    OpeningHold,
    Released,
    classify_event,
    classify_payload,
)

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
STREAMS = FIXTURES / "streams"
NOW = 1_750_000_000.0

A, C, R, G = Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.GEMINI
OPENING, CONTENT, ERROR, END = EventRole.OPENING, EventRole.CONTENT, EventRole.ERROR, EventRole.END


def ev(data: object, event: str = "") -> SSEEvent:
    return SSEEvent(data if isinstance(data, str) else json.dumps(data), event=event)


def anthropic_delta(delta: dict[str, object]) -> SSEEvent:
    return ev({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")


def chat(delta: dict[str, object] | None = None, finish: str | None = None) -> SSEEvent:
    choice: dict[str, object] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return ev({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


def gemini(parts: list[object], finish: str | None = None) -> dict[str, object]:
    cand: dict[str, object] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    return {"candidates": [cand], "modelVersion": "gemini-2.5-flash"}


def responses(kind: str, **fields: object) -> SSEEvent:
    return ev({"type": kind, "sequence_number": 1, **fields}, kind)


EVENT_CASES: list[tuple[str, Dialect, SSEEvent, EventRole]] = [
    # Anthropic
    (
        "a-message-start",
        A,
        ev({"type": "message_start", "message": {"id": "m"}}, "message_start"),
        OPENING,
    ),
    (
        "a-block-start-text",
        A,
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        ),
        OPENING,
    ),
    (
        "a-block-start-tool-use",
        A,
        ev(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "Read", "input": {}},
            },
            "content_block_start",
        ),
        OPENING,
    ),
    (
        "a-block-start-thinking",
        A,
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": ""},
            },
            "content_block_start",
        ),
        OPENING,
    ),
    (
        "a-block-start-with-text",
        A,
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": "Hi"},
            },
            "content_block_start",
        ),
        CONTENT,
    ),
    ("a-ping", A, ev({"type": "ping"}, "ping"), OPENING),
    (
        "a-block-stop",
        A,
        ev({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        OPENING,
    ),
    ("a-empty-text", A, anthropic_delta({"type": "text_delta", "text": ""}), OPENING),
    ("a-empty-thinking", A, anthropic_delta({"type": "thinking_delta", "thinking": ""}), OPENING),
    ("a-empty-json", A, anthropic_delta({"type": "input_json_delta", "partial_json": ""}), OPENING),
    ("a-text", A, anthropic_delta({"type": "text_delta", "text": "Hello"}), CONTENT),
    ("a-thinking", A, anthropic_delta({"type": "thinking_delta", "thinking": "Let me"}), CONTENT),
    ("a-signature", A, anthropic_delta({"type": "signature_delta", "signature": "EqQB"}), CONTENT),
    (
        "a-tool-json",
        A,
        anthropic_delta({"type": "input_json_delta", "partial_json": '{"a'}),
        CONTENT,
    ),
    ("a-citation", A, anthropic_delta({"type": "citations_delta", "citation": {}}), CONTENT),
    ("a-unknown-delta", A, anthropic_delta({"type": "future_delta", "x": 1}), CONTENT),
    (
        "a-message-delta-stop",
        A,
        ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 1},
            },
            "message_delta",
        ),
        END,
    ),
    (
        "a-message-delta-usage",
        A,
        ev({"type": "message_delta", "delta": {}, "usage": {}}, "message_delta"),
        OPENING,
    ),
    ("a-message-stop", A, ev({"type": "message_stop"}, "message_stop"), END),
    ("a-error", A, ev({"type": "error", "error": {"type": "overloaded_error"}}, "error"), ERROR),
    ("a-error-unparsed", A, ev("Overloaded", "error"), ERROR),
    ("a-unknown-event", A, ev({"type": "future_event"}, "future_event"), CONTENT),
    ("a-not-json", A, ev("hello", "content_block_delta"), CONTENT),
    ("a-json-array", A, ev([1, 2]), CONTENT),
    ("a-type-is-a-list", A, ev({"type": ["content_block_delta"]}), CONTENT),
    ("a-delta-type-is-a-list", A, anthropic_delta({"type": ["text_delta"], "text": ""}), CONTENT),
    (
        "a-block-type-is-an-object",
        A,
        ev({"type": "content_block_start", "content_block": {"type": {}}}),
        OPENING,
    ),
    # OpenAI Responses
    ("r-created", R, responses("response.created", response={"status": "in_progress"}), OPENING),
    ("r-in-progress", R, responses("response.in_progress", response={}), OPENING),
    ("r-queued", R, responses("response.queued", response={}), OPENING),
    (
        "r-item-added",
        R,
        responses(
            "response.output_item.added", output_index=0, item={"type": "message", "content": []}
        ),
        OPENING,
    ),
    (
        "r-function-item-added",
        R,
        responses(
            "response.output_item.added",
            item={"type": "function_call", "name": "f", "arguments": ""},
        ),
        OPENING,
    ),
    (
        "r-part-added",
        R,
        responses("response.content_part.added", part={"type": "output_text", "text": ""}),
        OPENING,
    ),
    (
        "r-summary-part-added",
        R,
        responses(
            "response.reasoning_summary_part.added", part={"type": "summary_text", "text": ""}
        ),
        OPENING,
    ),
    ("r-text-delta", R, responses("response.output_text.delta", delta="Why"), CONTENT),
    ("r-empty-text-delta", R, responses("response.output_text.delta", delta=""), OPENING),
    (
        "r-summary-delta",
        R,
        responses("response.reasoning_summary_text.delta", delta="**Plan"),
        CONTENT,
    ),
    ("r-reasoning-delta", R, responses("response.reasoning_text.delta", delta="think"), CONTENT),
    ("r-args-delta", R, responses("response.function_call_arguments.delta", delta='{"'), CONTENT),
    (
        "r-custom-input-delta",
        R,
        responses("response.custom_tool_call_input.delta", delta="*** "),
        CONTENT,
    ),
    (
        "r-empty-item-done",
        R,
        responses("response.output_item.done", item={"type": "reasoning", "summary": []}),
        OPENING,
    ),
    (
        "r-reasoning-item-done",
        R,
        responses(
            "response.output_item.done",
            item={"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
        ),
        CONTENT,
    ),
    ("r-text-done", R, responses("response.output_text.done", text="Hi"), CONTENT),
    ("r-completed", R, responses("response.completed", response={"status": "completed"}), END),
    ("r-incomplete", R, responses("response.incomplete", response={"status": "incomplete"}), END),
    (
        "r-failed",
        R,
        responses("response.failed", response={"error": {"code": "server_error"}}),
        ERROR,
    ),
    ("r-error", R, responses("error", code="rate_limit_exceeded", message="x"), ERROR),
    ("r-failed-unparsed", R, ev("boom", "response.failed"), ERROR),
    ("r-web-search", R, responses("response.web_search_call.searching", item_id="ws"), CONTENT),
    # OpenAI Chat
    ("c-role-only", C, chat({"role": "assistant"}), OPENING),
    (
        "c-role-empty-content",
        C,
        chat({"role": "assistant", "content": "", "refusal": None}),
        OPENING,
    ),
    ("c-content-null", C, chat({"role": "assistant", "content": None}), OPENING),
    ("c-no-choices", C, ev({"id": "c", "choices": [], "usage": {"prompt_tokens": 1}}), OPENING),
    ("c-choices-missing", C, ev({"id": "c", "usage": None}), OPENING),
    (
        "c-empty-reasoning-details",
        C,
        chat({"role": "assistant", "content": "", "reasoning_details": []}),
        OPENING,
    ),
    ("c-text", C, chat({"content": "The"}), CONTENT),
    ("c-reasoning-content", C, chat({"content": None, "reasoning_content": "Let"}), CONTENT),
    ("c-reasoning", C, chat({"content": "", "reasoning": "We need"}), CONTENT),
    (
        "c-tool-name",
        C,
        chat(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get", "arguments": ""},
                    }
                ]
            }
        ),
        CONTENT,
    ),
    (
        "c-tool-args",
        C,
        chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"c'}}]}),
        CONTENT,
    ),
    (
        "c-tool-empty",
        C,
        chat({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}),
        OPENING,
    ),
    ("c-refusal", C, chat({"refusal": "I can't"}), CONTENT),
    ("c-unknown-field", C, chat({"audio": {"data": "AAA"}}), CONTENT),
    ("c-finish", C, chat({}, finish="stop"), END),
    ("c-finish-with-text", C, chat({"content": "."}, finish="stop"), CONTENT),
    ("c-done", C, ev("[DONE]"), END),
    ("c-error", C, ev({"error": {"message": "x", "type": "server_error"}}), ERROR),
    ("c-not-json", C, ev('{"id": '), CONTENT),
    # Gemini over SSE
    ("g-text", G, ev(gemini([{"text": "The"}])), CONTENT),
    ("g-thought", G, ev(gemini([{"text": "**Plan**", "thought": True}])), CONTENT),
    ("g-function-call", G, ev(gemini([{"functionCall": {"name": "f", "args": {}}}])), CONTENT),
    ("g-empty-text", G, ev(gemini([{"text": ""}])), OPENING),
    ("g-empty-parts", G, ev(gemini([])), OPENING),
    ("g-usage-only", G, ev({"usageMetadata": {"promptTokenCount": 3}}), OPENING),
    ("g-finish", G, ev(gemini([{"text": ""}], finish="STOP")), END),
    (
        "g-signature-with-finish",
        G,
        ev(gemini([{"text": "", "thoughtSignature": "Eq0"}], "STOP")),
        CONTENT,
    ),
    ("g-blocked", G, ev({"promptFeedback": {"blockReason": "SAFETY"}}), END),
    ("g-error", G, ev({"error": {"code": 503, "status": "UNAVAILABLE"}}), ERROR),
    ("g-array-error", G, ev([{"error": {"code": 429}}]), ERROR),
    (
        "g-inline-data",
        G,
        ev(gemini([{"inlineData": {"mimeType": "image/png", "data": "AA"}}])),
        CONTENT,
    ),
]


@pytest.mark.parametrize(
    ("name", "dialect", "event", "role"), EVENT_CASES, ids=[c[0] for c in EVENT_CASES]
)
def test_classify_event(name: str, dialect: Dialect, event: SSEEvent, role: EventRole) -> None:
    assert classify_event(dialect, event) is role


def test_classify_payload_for_gemini_array_elements() -> None:
    elements = json.loads((STREAMS / "gemini-jsonarray-thought-functioncall.json").read_bytes())
    assert [classify_payload(G, e) for e in elements] == [CONTENT, CONTENT]
    assert classify_payload(G, {"usageMetadata": {}}) is OPENING
    assert classify_payload(G, {"error": {"code": 500}}) is ERROR
    assert classify_payload(A, {"type": "ping"}) is OPENING
    assert classify_payload(A, {}, event="ping") is OPENING
    assert classify_payload(C, "[DONE]") is END


# --- recorded streams ---------------------------------------------------------------------


def dialect_of(path: Path) -> Dialect:
    name = path.name
    if name.startswith("anthropic"):
        return A
    if name.startswith("openai-responses"):
        return R
    if name.startswith("gemini"):
        return G
    return C


# fixture -> (kind of outcome, reason or failure kind, events before the decisive one)
STREAM_EXPECT: dict[str, tuple[type, str, int]] = {
    "anthropic-cache-read-compaction.sse": (Released, "content", 3),
    "anthropic-cache-usage.sse": (Released, "content", 4),
    "anthropic-error-midstream-overloaded.sse": (FailedBeforeContent, "overloaded", 3),
    "anthropic-error-overloaded-docs.sse": (FailedBeforeContent, "overloaded", 0),
    "anthropic-parallel-tool-use.sse": (Released, "content", 2),
    "anthropic-text.sse": (Released, "content", 3),
    "anthropic-thinking-signature-text.sse": (Released, "content", 3),
    "anthropic-tool-use-input-json-delta.sse": (Released, "content", 4),
    "gemini-jsonarray-text-thought.json": (Released, "content", 0),
    "gemini-jsonarray-thought-functioncall.json": (Released, "content", 0),
    "gemini-sse-functioncall-thoughtsignature.sse": (Released, "content", 0),
    "gemini-sse-text.sse": (Released, "content", 0),
    "gemini-sse-thought-parts.sse": (Released, "content", 0),
    "openai-chat-midstream-error.sse": (Released, "content", 1),
    "openai-chat-parallel-tool-calls.sse": (Released, "content", 1),
    "openai-chat-reasoning-content-deepseek.sse": (Released, "content", 1),
    "openai-chat-reasoning-content-glm.sse": (Released, "content", 0),
    "openai-chat-text-include-usage.sse": (Released, "content", 1),
    "openai-responses-failed-docs.sse": (FailedBeforeContent, "server", 0),
    "openai-responses-failed-insufficient-quota.sse": (FailedBeforeContent, "no_balance", 2),
    "openai-responses-function-call-args.sse": (Released, "content", 3),
    "openai-responses-reasoning-summary-encrypted.sse": (Released, "content", 4),
    "openai-responses-text.sse": (Released, "content", 4),
    "openrouter-chat-midstream-error.sse": (Released, "content", 0),
}
STREAM_PATHS = sorted(p for p in STREAMS.iterdir() if p.suffix in (".sse", ".json"))


def run_hold(
    path: Path, pieces: list[bytes], *, limit: int = 1 << 20
) -> tuple[HoldOutcome, int, int]:
    """Feed until decided; return the outcome, the bytes fed and the pieces fed."""
    hold = OpeningHold(dialect_of(path), sse=path.suffix == ".sse", limit=limit)
    fed = 0
    for i, piece in enumerate(pieces):
        outcome = hold.feed(piece, now=NOW)
        fed += len(piece)
        assert hold.held_bytes == fed or not isinstance(outcome, Holding)
        if not isinstance(outcome, Holding):
            assert hold.finished
            return outcome, fed, i + 1
    return hold.end(now=NOW), fed, len(pieces)


def check_outcome(path: Path, outcome: HoldOutcome, raw: bytes, fed: int) -> None:
    kind, detail, _ = STREAM_EXPECT[path.name]
    assert isinstance(outcome, kind), outcome
    if isinstance(outcome, Released):
        assert outcome.reason == detail
        assert outcome.data == raw[:fed]  # everything fed so far, byte for byte
    elif isinstance(outcome, FailedBeforeContent):
        assert outcome.failure.kind.value == detail


def test_every_stream_fixture_has_an_expectation() -> None:
    assert {p.name for p in STREAM_PATHS} == set(STREAM_EXPECT)


@pytest.mark.parametrize("path", STREAM_PATHS, ids=lambda p: p.name)
def test_hold_on_recorded_stream(path: Path) -> None:
    raw = path.read_bytes()
    outcome, fed, _ = run_hold(path, [raw])
    check_outcome(path, outcome, raw, fed)
    assert fed == len(raw)
    outcome, fed, _ = run_hold(path, [raw[i : i + 1] for i in range(len(raw))])
    check_outcome(path, outcome, raw, fed)
    if isinstance(outcome, Released):
        # Released on the very byte that completed the first decisive event: SSE needs its
        # blank line, a JSON-array element its closing brace.
        _, _, before = STREAM_EXPECT[path.name]
        if path.suffix == ".sse":
            events_so_far = SSEDecoder().feed(raw[:fed])
            assert len(events_so_far) == before + 1
            assert len(SSEDecoder().feed(raw[: fed - 1])) == before


@settings(max_examples=60, deadline=None)
@given(
    path=st.sampled_from(STREAM_PATHS),
    points=st.lists(st.integers(min_value=0, max_value=80_000), max_size=10),
)
def test_hold_random_splits(path: Path, points: list[int]) -> None:
    raw = path.read_bytes()
    cuts = sorted({p % (len(raw) + 1) for p in points})
    bounds = [0, *cuts, len(raw)]
    pieces = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    outcome, fed, _ = run_hold(path, pieces)
    check_outcome(path, outcome, raw, fed)


def opening_only(path: Path) -> bytes:
    """The fixture cut just before its first decisive event."""
    raw = path.read_bytes()
    _, _, before = STREAM_EXPECT[path.name]
    blocks = raw.split(b"\n\n")
    return b"\n\n".join(blocks[:before]) + (b"\n\n" if before else b"")


@pytest.mark.parametrize(
    "name",
    [
        "anthropic-text.sse",
        "anthropic-tool-use-input-json-delta.sse",
        "openai-responses-text.sse",
        "openai-responses-reasoning-summary-encrypted.sse",
        "openai-chat-text-include-usage.sse",
    ],
)
def test_stream_ending_after_its_opening_is_stream_ended_early(name: str) -> None:
    path = STREAMS / name
    head = opening_only(path)
    assert head
    for pieces in ([head], [head[i : i + 1] for i in range(len(head))]):
        hold = OpeningHold(dialect_of(path))
        for piece in pieces:
            assert isinstance(hold.feed(piece, now=NOW), Holding)
        assert hold.held_bytes == len(head)
        outcome = hold.end(now=NOW)
        assert isinstance(outcome, FailedBeforeContent)
        assert outcome.failure.kind is FailureKind.STREAM_ENDED_EARLY
        assert outcome.failure.temporary and outcome.failure.failover
        assert outcome.payload is None


def test_empty_stream_is_stream_ended_early() -> None:
    for sse in (True, False):
        outcome = OpeningHold(G, sse=sse).end(now=NOW)
        assert isinstance(outcome, FailedBeforeContent)
        assert outcome.failure.kind is FailureKind.STREAM_ENDED_EARLY


def test_final_event_without_blank_line() -> None:
    hold = OpeningHold(C)
    assert isinstance(
        hold.feed(b'data: {"choices":[{"delta":{"content":"hi"}}]}', now=NOW), Holding
    )
    outcome = hold.end(now=NOW)
    assert isinstance(outcome, Released)
    assert outcome.reason == "content"
    # A last line cut off mid-JSON is a broken connection, not content.
    hold = OpeningHold(C)
    hold.feed(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\ndata: {"choi', now=NOW)
    outcome = hold.end(now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.STREAM_ENDED_EARLY


def test_proper_empty_answer_is_released_as_end() -> None:
    stream = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    outcome = OpeningHold(C).feed(stream, now=NOW)
    assert outcome == Released(data=stream, reason="end")
    # Byte by byte it is released on the finish chunk, before [DONE].
    hold = OpeningHold(C)
    for i in range(len(stream)):
        outcome = hold.feed(stream[i : i + 1], now=NOW)
        if not isinstance(outcome, Holding):
            break
    assert outcome == Released(data=stream[: stream.index(b"data: [DONE]")], reason="end")


def test_limit_releases_a_stream_that_only_pings() -> None:
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    hold = OpeningHold(A, limit=1000)
    fed = b""
    while True:
        outcome = hold.feed(ping, now=NOW)
        fed += ping
        if not isinstance(outcome, Holding):
            break
    assert isinstance(outcome, Released)
    assert outcome.reason == "limit"
    assert outcome.data == fed
    assert 1000 < len(fed) <= 1000 + len(ping)


def test_an_event_larger_than_the_limit_releases() -> None:
    big = b'event: message_start\ndata: {"type":"message_start","x":"' + b"y" * 5000 + b'"}\n\n'
    outcome = OpeningHold(A, limit=1000).feed(big, now=NOW)
    assert isinstance(outcome, Released)
    assert outcome.reason == "limit"
    assert outcome.data == big


def test_first_decisive_event_in_a_chunk_wins() -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    text = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    )
    assert isinstance(OpeningHold(A).feed(text + error, now=NOW), Released)
    assert isinstance(OpeningHold(A).feed(error + text, now=NOW), FailedBeforeContent)


def test_error_before_content_is_classified() -> None:
    body = json.loads(
        (FIXTURES / "errors" / "codex-usage-limit-reached-stream-error-event.json").read_text()
    )["body"]
    stream = b"event: error\ndata: " + body.encode() + b"\n\n"
    outcome = OpeningHold(R).feed(stream, now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.QUOTA_USED_UP
    assert outcome.failure.reset_at == 1777936568.0
    assert isinstance(outcome.payload, dict)
    assert outcome.payload["error"]["type"] == "usage_limit_reached"


def test_chat_and_gemini_errors_before_content() -> None:
    chat_error = b'data: {"error":{"message":"boom","type":"server_error"}}\n\n'
    outcome = OpeningHold(C).feed(chat_error, now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.SERVER
    gemini_error = (
        b'data: {"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}\r\n\r\n'
    )
    outcome = OpeningHold(G).feed(gemini_error, now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.OVERLOADED


def test_gemini_json_array_error_form() -> None:
    body = json.loads((FIXTURES / "errors" / "gemini-cloudcode-429-array-form.json").read_text())
    raw = body["body"].encode()
    hold = OpeningHold(G, sse=False)
    for i in range(len(raw)):
        outcome = hold.feed(raw[i : i + 1], now=NOW)
        if not isinstance(outcome, Holding):
            break
    # Decided on the element's closing brace, before the array's "\n]".
    assert raw[i + 1 :] == b"\n]"
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.RATE_LIMITED


def test_malformed_json_array_is_stream_ended_early() -> None:
    outcome = OpeningHold(G, sse=False).feed(b'{"error": 1}', now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind is FailureKind.STREAM_ENDED_EARLY


def test_feeding_after_a_decision_is_a_caller_bug() -> None:
    hold = OpeningHold(C)
    assert isinstance(
        hold.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', now=NOW), Released
    )
    with pytest.raises(RuntimeError):
        hold.feed(b"data: more\n\n", now=NOW)
    with pytest.raises(RuntimeError):
        hold.end(now=NOW)


def test_outcomes_match_positionally() -> None:
    match Released(data=b"x", reason="end"):
        case Released(data, reason):
            assert (data, reason) == (b"x", "end")
    with pytest.raises(ValueError):
        OpeningHold(A, limit=0)
