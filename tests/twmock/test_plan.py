"""Planning failures: HTTP errors in each format and named shapes, in-stream errors, broken,
silent and reset connections, the fail selectors, the script header, bad requests, pacing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.twmock.formats.test_formats import (
    ANTHROPIC_BODY,
    CHAT_BODY,
    GEMINI_BODY,
    GEMINI_STREAM,
    RESPONSES_BODY,
    fixture_events,
    parse_sse,
    run,
    sse_json,
)
from twmock import SHAPES, Break, Chunk, End, Head, ResetBeforeHead, Silence
from twproto.failures import FailureKind, classify_response

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"

ROUTES: dict[str, tuple[str, dict[str, Any], str]] = {
    "anthropic": ("/v1/messages", ANTHROPIC_BODY, ""),
    "chat": ("/v1/chat/completions", CHAT_BODY, ""),
    "responses": ("/v1/responses", RESPONSES_BODY, ""),
    "gemini": ("/v1beta/models/gemini-test:generateContent", GEMINI_BODY, ""),
}


def stream_route(fmt: str) -> tuple[str, dict[str, Any], str]:
    if fmt == "gemini":
        return GEMINI_STREAM, GEMINI_BODY, "alt=sse"
    path, body, query = ROUTES[fmt]
    return path, {**body, "stream": True}, query


def error_object(fmt: str, body: bytes) -> dict[str, Any]:
    parsed = json.loads(body)
    if fmt == "anthropic":
        assert parsed["type"] == "error"
        assert set(parsed) == {"type", "error", "request_id"}
        assert set(parsed["error"]) == {"type", "message"}
    elif fmt == "gemini":
        assert set(parsed["error"]) >= {"code", "message", "status"}
    else:
        assert list(parsed["error"]) == ["message", "type", "param", "code"]
    error = parsed["error"]
    assert isinstance(error, dict)
    return error


# --------------------------------------------------------------------------------------------
# HTTP errors in the format's own shape

EXPECTED = {
    # status: (anthropic type, openai type, gemini status)
    400: ("invalid_request_error", "invalid_request_error", "INVALID_ARGUMENT"),
    401: ("authentication_error", "invalid_request_error", "UNAUTHENTICATED"),
    402: ("billing_error", "unknown_error", "FAILED_PRECONDITION"),
    403: ("permission_error", "invalid_request_error", "PERMISSION_DENIED"),
    404: ("not_found_error", "invalid_request_error", "NOT_FOUND"),
    429: ("rate_limit_error", "requests", "RESOURCE_EXHAUSTED"),
    500: ("api_error", "server_error", "INTERNAL"),
    502: ("api_error", "cf_bad_gateway", "INTERNAL"),
    503: ("api_error", "server_error", "UNAVAILABLE"),
    529: ("overloaded_error", "server_error", "UNAVAILABLE"),
}


@pytest.mark.parametrize("fmt", list(ROUTES))
@pytest.mark.parametrize("status", list(EXPECTED))
def test_http_error_in_format_shape(fmt: str, status: int) -> None:
    path, body, query = ROUTES[fmt]
    p = run(path, body, {"error": status}, query=query)
    assert p.outcome == "error"
    assert p.status == status
    assert isinstance(p.steps[-1], End)
    assert p.header(b"content-length") == str(len(p.body)).encode()
    error = error_object(fmt, p.body)
    anthropic_type, openai_type, gemini_status = EXPECTED[status]
    if fmt == "anthropic":
        assert error["type"] == anthropic_type
        retry = b"true" if status in (429, 500, 502, 503, 529) else b"false"
        assert p.header(b"x-should-retry") == retry
    elif fmt == "gemini":
        assert error["status"] == gemini_status and error["code"] == status
        assert p.header(b"content-type") == b"application/json; charset=UTF-8"
    else:
        assert error["type"] == openai_type
    if status == 404:
        assert "gemini-test" in error["message"] or "test" in error["message"]


def test_anthropic_429_and_529_bodies_match_fixtures() -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": 529})
    real = json.loads((FIXTURES / "errors" / "anthropic-529-overloaded.json").read_text())
    assert json.loads(p.body)["error"] == json.loads(real["body"])["error"]
    assert p.header(
        b"request-id",
    ).startswith(b"req_")  # type: ignore[union-attr]


def test_default_error_is_overloaded() -> None:
    assert run("/v1/messages", ANTHROPIC_BODY, {"error": True}).status == 529
    assert run("/chat/completions", CHAT_BODY, {"error": True}).status == 503
    gemini = run(*ROUTES["gemini"][:2], {"error": True})
    assert gemini.status == 503
    assert json.loads(gemini.body)["error"]["status"] == "UNAVAILABLE"


def test_openai_500_matches_fixture_layout() -> None:
    p = run("/chat/completions", CHAT_BODY, {"error": 500})
    real = json.loads((FIXTURES / "errors" / "openai-500-server-error.json").read_text())
    assert p.body.startswith(b'{\n  "error": {\n    "message": ')
    assert list(json.loads(p.body)["error"]) == list(json.loads(real["body"])["error"])


@pytest.mark.parametrize("fmt", ["anthropic", "chat", "responses"])
def test_retry_after_headers(fmt: str) -> None:
    path, body, _ = ROUTES[fmt]
    p = run(path, body, {"error": {"status": 429, "retry_after": 1.2}})
    assert p.header(b"retry-after") == b"2"
    p = run(path, body, {"error": {"status": 429, "retry_after_ms": 250}})
    assert p.header(b"retry-after-ms") == b"250"
    assert p.header(b"retry-after") is None


def test_gemini_retry_delay_in_body() -> None:
    path, body, _ = ROUTES["gemini"]
    p = run(path, body, {"error": {"status": 429, "retry_after": 5}})
    assert p.header(b"retry-after") is None
    details = json.loads(p.body)["error"]["details"]
    assert details[-1] == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"}
    without = json.loads(run(path, body, {"error": 429}).body)["error"]["details"]
    assert [d["@type"] for d in without] == ["type.googleapis.com/google.rpc.Help"]


def test_gemini_error_on_json_array_stream_is_an_array() -> None:
    p = run(GEMINI_STREAM, GEMINI_BODY, {"error": 503})
    parsed = json.loads(p.body)
    assert isinstance(parsed, list) and parsed[0]["error"]["status"] == "UNAVAILABLE"
    p = run(GEMINI_STREAM, GEMINI_BODY, {"error": 503}, query="alt=sse")
    assert isinstance(json.loads(p.body), dict)


def test_error_message_extra_headers_and_delay() -> None:
    script = {
        "error": {"status": 400, "message": "nope", "headers": {"x-extra": "1"}, "delay": 0.3},
        "head_delay": 0.1,
    }
    p = run("/chat/completions", CHAT_BODY, script)
    assert json.loads(p.body)["error"]["message"] == "nope"
    assert p.header(b"x-extra") == b"1"
    head = p.steps[0]
    assert isinstance(head, Head) and head.delay == pytest.approx(0.4)


# --------------------------------------------------------------------------------------------
# named shapes

VERBATIM = {
    # shape: fixture whose body it reproduces byte for byte (no placeholders involved)
    "glm-1113": "glm-429-1113-insufficient-balance",
    "glm-1303": "glm-429-1303-frequency",
    "glm-1304": "glm-429-1304-daily-limit",
    "deepseek-insufficient-balance": "deepseek-402-insufficient-balance",
    "openai-insufficient-quota": "openai-429-insufficient-quota",
    "openai-context-length": "openai-400-context-length-exceeded",
    "openai-invalid-encrypted-content": "openai-responses-400-invalid-encrypted-content",
    "openai-unsupported-effort": "openai-400-unsupported-value-reasoning-effort",
    "gemini-unavailable": "gemini-503-unavailable",
    "gemini-quota-daily": "gemini-429-resource-exhausted-help-only",
    "gemini-missing-thought-signature": "gemini-400-missing-thought-signature",
    "gemini-corrupted-thought-signature": "gemini-400-corrupted-thought-signature",
    "gemini-array-429": "gemini-cloudcode-429-array-form",
}


@pytest.mark.parametrize(("shape", "fixture"), list(VERBATIM.items()))
def test_named_shapes_reproduce_fixtures(shape: str, fixture: str) -> None:
    real = json.loads((FIXTURES / "errors" / f"{fixture}.json").read_text())
    for fmt in ROUTES:
        path, body, _ = ROUTES[fmt]
        p = run(path, body, {"error": shape})
        assert p.status == real["status"]
        assert p.body == real["body"].encode()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_plays(shape: str) -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": shape})
    assert p.status == SHAPES[shape].status
    assert p.header(b"content-type") == SHAPES[shape].content_type.encode()
    assert b"{model}" not in p.body and b"{request_id}" not in p.body
    if SHAPES[shape].content_type.startswith("application/json"):
        json.loads(p.body)


def test_glm_1308_names_reset_time_in_china() -> None:
    # now = 1_767_000_000 (2025-12-29 09:20:00 UTC); resets in an hour -> 18:20 China time
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": {"shape": "glm-1308", "resets_in": 3600}})
    message = json.loads(p.body)["error"]["message"]
    assert message == "已达到 5 小时的使用上限。您的限额将在 2025-12-29 18:20:00 重置。"


def test_codex_usage_limit() -> None:
    p = run(
        "/responses", RESPONSES_BODY, {"error": {"shape": "codex-usage-limit", "resets_in": 60}}
    )
    assert p.status == 429
    error = json.loads(p.body)["error"]
    assert error["type"] == "usage_limit_reached"
    assert error["resets_in_seconds"] == 60 and error["resets_at"] == 1_767_000_060
    assert p.header(b"x-codex-primary-used-percent") == b"100"
    assert p.header(b"x-codex-primary-reset-at") == b"1767000060"


def test_shape_status_and_message_override() -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": {"shape": "glm-1305", "status": 503}})
    assert p.status == 503
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": {"shape": "glm-1302", "message": "x"}})
    assert json.loads(p.body)["error"]["message"] == "x"


def test_unknown_shape_is_a_bad_request() -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": "no-such-shape"})
    assert p.status == 400 and p.outcome == "bad_request"
    assert "no-such-shape" in json.loads(p.body)["error"]["message"]


# --------------------------------------------------------------------------------------------
# in-stream errors


def test_anthropic_stream_error_before_content_matches_fixture() -> None:
    path, body, query = stream_route("anthropic")
    p = run(path, body, {"stream_error_before_content": True, "error": 529}, query=query)
    assert p.status == 200 and p.outcome == "stream_error"
    ours = sse_json(p.body)
    real = fixture_events("anthropic-error-midstream-overloaded.sse")
    assert [n for n, _ in ours] == [n for n, _ in real]
    assert ours[-1][1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    docs = (FIXTURES / "streams" / "anthropic-error-overloaded-docs.sse").read_bytes()
    assert p.body.endswith(docs)


def test_chat_stream_error_matches_fixture() -> None:
    path, body, query = stream_route("chat")
    p = run(path, body, {"stream_error_after": 3, "error": 500}, query=query)
    ours = [d for _, d in parse_sse(p.body)]
    assert "[DONE]" not in ours
    error = json.loads(ours[-1])
    assert list(error) == ["error"] and set(error["error"]) == {"message", "type"}
    assert error["error"]["type"] == "server_error"
    real = (FIXTURES / "streams" / "openai-chat-midstream-error.sse").read_text()
    assert real.strip().split("\n\n")[-1].startswith('data: {"error": {"message": ')
    assert ours[-1].startswith('{"error": {"message": ')
    texts = [json.loads(d)["choices"][0]["delta"].get("content") for d in ours[1:-1]]
    assert len(texts) == 3


def test_responses_stream_error_matches_fixture() -> None:
    path, body, query = stream_route("responses")
    p = run(path, body, {"stream_error_before_content": True, "error": 429}, query=query)
    ours = sse_json(p.body)
    real = fixture_events("openai-responses-failed-insufficient-quota.sse")
    assert [n for n, _ in ours][-2:] == [n for n, _ in real][-2:] == ["error", "response.failed"]
    assert [d["sequence_number"] for _, d in ours] == list(range(len(ours)))
    error = ours[-2][1]["error"]
    assert set(error) == set(real[-2][1]["error"])
    failed = ours[-1][1]["response"]
    assert failed["status"] == "failed" and failed["id"] == ours[0][1]["response"]["id"]
    assert failed["error"] == {"code": "rate_limit_exceeded", "message": error["message"]}
    assert set(failed) == set(ours[0][1]["response"])


def test_responses_stream_error_with_codex_shape() -> None:
    path, body, query = stream_route("responses")
    script = {"stream_error_after": 0, "error": {"shape": "codex-usage-limit", "resets_in": 10}}
    ours = sse_json(run(path, body, script, query=query).body)
    error = ours[-2][1]["error"]
    assert error["type"] == error["code"] == "usage_limit_reached"
    assert error["resets_in_seconds"] == 10
    assert ours[-1][1]["response"]["error"]["code"] == "usage_limit_reached"


def test_gemini_stream_errors_in_both_framings() -> None:
    p = run(GEMINI_STREAM, GEMINI_BODY, {"stream_error_after": 2, "error": 503}, query="alt=sse")
    events = p.body.split(b"\r\n\r\n")
    assert len(events) == 4 and events[-1] == b""
    assert json.loads(events[2][6:])["error"]["status"] == "UNAVAILABLE"
    p = run(GEMINI_STREAM, GEMINI_BODY, {"stream_error_after": 2, "error": 503})
    parsed = json.loads(p.body)
    assert len(parsed) == 3 and parsed[-1]["error"]["code"] == 503
    p = run(GEMINI_STREAM, GEMINI_BODY, {"stream_error_before_content": True})
    assert json.loads(p.body) == [
        {
            "error": {
                "code": 503,
                "message": "The model is overloaded. Please try again later.",
                "status": "UNAVAILABLE",
            }
        }
    ]


def test_stream_error_on_a_whole_request_is_an_http_error() -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"stream_error_after": 0, "error": 529})
    assert p.status == 529 and p.outcome == "error"


# --------------------------------------------------------------------------------------------
# broken, stalled, silent, reset


def content_chunks(steps: tuple[Any, ...]) -> int:
    return sum(1 for s in steps if isinstance(s, Chunk) and s.delay > 0)


@pytest.mark.parametrize("fmt", list(ROUTES))
def test_break_after_opening_events(fmt: str) -> None:
    path, body, query = stream_route(fmt)
    p = run(path, body, {"break_after": 0, "first_delay": 1.0}, query=query)
    assert p.outcome == "break"
    assert isinstance(p.steps[0], Head) and isinstance(p.steps[-1], Break)
    assert all(not (isinstance(s, Chunk) and s.delay) for s in p.steps)  # no content was sent
    if fmt == "anthropic":
        assert [n for n, _ in parse_sse(p.body)] == ["message_start", "content_block_start", "ping"]
    elif fmt == "chat":
        (only,) = parse_sse(p.body)
        assert json.loads(only[1])["choices"][0]["delta"]["role"] == "assistant"
    elif fmt == "responses":
        assert [n for n, _ in parse_sse(p.body)] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
    else:
        assert p.body == b""


@pytest.mark.parametrize("fmt", list(ROUTES))
def test_break_after_n_content_chunks(fmt: str) -> None:
    path, body, query = stream_route(fmt)
    p = run(path, body, {"break_after": 3, "chunk_delay": 0.5, "first_delay": 1.0}, query=query)
    assert isinstance(p.steps[-1], Break)
    delays = [s.delay for s in p.steps if isinstance(s, Chunk) and s.delay]
    assert delays == [1.0, 0.5, 0.5]


def test_stall_after_content() -> None:
    path, body, query = stream_route("chat")
    p = run(path, body, {"stall_after": 2, "chunk_delay": 0.1}, query=query)
    assert p.outcome == "stall" and isinstance(p.steps[-1], Silence)
    assert content_chunks(p.steps) == 1  # the first content chunk has no first_delay here


def test_break_beyond_the_content_cuts_before_closing_events() -> None:
    path, body, query = stream_route("anthropic")
    p = run(path, body, {"break_after": 1000, "chunks": 2}, query=query)
    names = [n for n, _ in parse_sse(p.body)]
    assert names[-1] == "content_block_delta" and isinstance(p.steps[-1], Break)


def test_earliest_cut_wins() -> None:
    path, body, query = stream_route("chat")
    p = run(path, body, {"break_after": 5, "stall_after": 2}, query=query)
    assert p.outcome == "stall"


def test_silence_and_reset() -> None:
    path, body, query = stream_route("anthropic")
    p = run(path, body, {"silence": "before_head"}, query=query)
    assert p.steps == (Silence(),) and p.status is None
    p = run(path, body, {"silence": True}, query=query)
    assert isinstance(p.steps[0], Head) and p.steps[1:] == (Silence(),)
    p = run(path, body, {"reset_before_head": True}, query=query)
    assert p.steps == (ResetBeforeHead(),) and p.outcome == "reset"


def test_whole_answer_failures() -> None:
    path, body, _ = ROUTES["chat"]
    p = run(path, body, {"break_after": 2})
    full = run(path, body, {})
    assert isinstance(p.steps[-1], Break)
    assert p.body == full.body[: len(full.body) // 2]
    assert run(path, body, {"stall_after": 0}).steps == (Silence(),)
    p = run(path, body, {"silence": "after_head"})
    assert isinstance(p.steps[0], Head) and p.steps[1] == Silence()


# --------------------------------------------------------------------------------------------
# selectors, header override, bad requests, pacing


def test_fail_first_by_number() -> None:
    script = {"fail_first": 2, "error": 529}
    statuses = [run("/v1/messages", ANTHROPIC_BODY, script, number=n).status for n in (1, 2, 3)]
    assert statuses == [529, 529, 200]


def test_fail_every_and_rate() -> None:
    script = {"fail_every": 2, "error": 500}
    statuses = [run("/chat/completions", CHAT_BODY, script, number=n).status for n in range(1, 5)]
    assert statuses == [200, 500, 200, 500]
    script = {"fail_rate": 0.5, "error": 500}
    assert run("/chat/completions", CHAT_BODY, script, draw=0.4).status == 500
    assert run("/chat/completions", CHAT_BODY, script, draw=0.6).status == 200


def test_selected_request_without_failure_gets_overloaded() -> None:
    assert run("/v1/messages", ANTHROPIC_BODY, {"fail_first": 1}).status == 529


def test_selector_with_stream_failure() -> None:
    path, body, query = stream_route("chat")
    script = {"fail_first": 1, "break_after": 0}
    assert run(path, body, script, query=query, number=1).outcome == "break"
    assert run(path, body, script, query=query, number=2).outcome == "stream"


def test_script_header_overrides() -> None:
    header = ((b"x-mock-script", b'{"error": 429, "chunks": 1}'),)
    p = run("/v1/messages", ANTHROPIC_BODY, {"chunks": 5}, headers=header)
    assert p.status == 429
    header = ((b"x-mock-script", b'{"text": "from header"}'),)
    p = run("/v1/messages", ANTHROPIC_BODY, {"error": 500}, headers=header)
    assert p.status == 500  # fields not in the header stay
    p = run("/v1/messages", ANTHROPIC_BODY, {"text": "base"}, headers=header)
    assert json.loads(p.body)["content"][0]["text"] == "from header"


@pytest.mark.parametrize("bad", [b"{", b"[]", b'{"nope": 1}', b'{"chunks": "x"}'])
def test_bad_script_header_is_400_in_format(bad: bytes) -> None:
    for fmt in ROUTES:
        path, body, query = ROUTES[fmt]
        p = run(path, body, {}, headers=((b"x-mock-script", bad),), query=query)
        assert p.status == 400 and p.outcome == "bad_request"
        assert "x-mock-script" in error_object(fmt, p.body)["message"]


@pytest.mark.parametrize("fmt", list(ROUTES))
def test_body_not_json_is_400_in_format(fmt: str) -> None:
    path, _, query = ROUTES[fmt]
    p = run(path, b"not json", {}, query=query)
    assert p.status == 400
    error_object(fmt, p.body)


@pytest.mark.parametrize(
    ("fmt", "body", "message"),
    [
        ("anthropic", {"messages": [], "max_tokens": 1}, "model: Field required"),
        ("anthropic", {"model": "m", "messages": []}, "max_tokens: Field required"),
        ("chat", {"model": "m"}, "Missing required parameter: 'messages'."),
        ("responses", {"input": "x"}, "Missing required parameter: 'model'."),
        ("gemini", {}, "contents is not specified"),
    ],
)
def test_missing_required_fields(fmt: str, body: dict[str, Any], message: str) -> None:
    path, _, query = ROUTES[fmt]
    p = run(path, body, {}, query=query)
    assert p.status == 400
    assert message in error_object(fmt, p.body)["message"]
    assert run(path, body, {"validate": False}, query=query).status == 200


def test_count_tokens_needs_no_max_tokens() -> None:
    p = run("/v1/messages/count_tokens", {"model": "m", "messages": []})
    assert p.status == 200 and p.outcome == "count_tokens"


def test_whole_answer_waits_for_all_of_it() -> None:
    p = run("/chat/completions", CHAT_BODY, {"chunks": 5, "first_delay": 1, "chunk_delay": 0.5})
    head = p.steps[0]
    assert isinstance(head, Head) and head.delay == pytest.approx(3.0)


def test_stream_pacing_and_merged_writes() -> None:
    path, body, query = stream_route("anthropic")
    p = run(path, body, {"chunks": 4, "first_delay": 0.2, "chunk_delay": 0.05}, query=query)
    chunks = [s for s in p.steps if isinstance(s, Chunk)]
    # opening events in one write, 4 content writes, closing events in one write
    assert [c.delay for c in chunks] == [0, 0.2, 0.05, 0.05, 0.05, 0]
    assert chunks[0].data.count(b"event: ") == 3
    assert chunks[-1].data.count(b"event: ") == 3


def test_plans_are_reproducible() -> None:
    path, body, query = stream_route("responses")
    assert run(path, body, {"reasoning": True}, query=query) == run(
        path, body, {"reasoning": True}, query=query
    )


def test_many_chunks_plan_whole() -> None:
    # How fast is for benchmarks/, not for an assertion on a shared machine.
    path, body, query = stream_route("responses")
    p = run(path, body, {"chunks": 5000}, query=query)
    assert sum(1 for s in p.steps if isinstance(s, Chunk)) >= 5000


@pytest.mark.parametrize(
    ("fmt", "shape"),
    [
        ("anthropic", "anthropic-prompt-too-long"),
        ("chat", "openai-context-length"),
        ("responses", "openai-responses-context-length"),
        ("gemini", "gemini-context-length"),
    ],
)
def test_context_overflow_answers_each_formats_own_error(fmt: str, shape: str) -> None:
    path, body, _ = ROUTES[fmt]
    p = run(path, body, {"error": "context-overflow"})
    assert p.status == 400
    assert p.body == run(path, body, {"error": shape}).body
    failure = classify_response(p.status, [], p.body, now=0.0)
    assert failure.kind is FailureKind.CONTEXT_OVERFLOW
