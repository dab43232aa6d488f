"""Failover, retries and pauses through the real gateway, seen by the official SDKs.

Two or three mock upstreams of the client's format sit in a fallback group. The first one is
given a fault; the client must then see either the next upstream's clean answer or a well-formed
error its SDK raises as an API error — never a silent truncated success, never a hang (every SDK
call is bounded by a short timeout) — and the request row must list the attempts (docs/failover.md,
docs/failures.md; the row: docs/operations.md).

``failover.wait_secs`` is 1 s unless a test needs a retry: shorter than the first retry pause,
so a request whose last candidate failed temporarily ends at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anthropic
import pytest

from tests.twserve.conftest import (
    ERRORS,
    FORMATS,
    KEY,
    MODELS,
    Answer,
    Sdks,
    StackFactory,
    ask,
    attempts,
    fallback,
    http,
    mock_origin,
)
from tests.twserve.support.ports import refusing_port
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

B_TEXT = "A clean answer from upstream b."
B_USAGE = {"input": 30, "cache_read": 10, "output": 8}
B_ANSWER = Answer(B_TEXT, (), (30, 10, 8))


def _up(protocol: str, script: dict[str, Any], **extra: Any) -> Upstream:
    return Upstream(protocol, MockSettings(script=parse_script(script), seed=5), extra=extra)


def _healthy(protocol: str) -> Upstream:
    return _up(protocol, {"text": B_TEXT, "usage": B_USAGE})


# The ports `_closed_port` holds, let go after each test.
_HELD = ExitStack()


@pytest.fixture(autouse=True)
def _let_ports_go() -> Iterator[None]:
    yield
    _HELD.close()


def _closed_port() -> int:
    return _HELD.enter_context(refusing_port())


# name -> (script of upstream a, status its attempt records, failure kinds it may record)
FAULTS: dict[str, tuple[dict[str, Any], int | None, set[str]]] = {
    "429-retry-after": ({"error": {"status": 429, "retry_after": 30}}, 429, {"rate_limited"}),
    # Gemini's 429 without a RetryInfo reads "You exceeded your current quota": a used-up quota.
    "429": ({"error": 429}, 429, {"rate_limited", "quota_used_up"}),
    "401": ({"error": 401}, 401, {"auth_rejected"}),
    "402": ({"error": 402}, 402, {"no_balance"}),
    "404": ({"error": 404}, 404, {"model_unavailable"}),
    "500": ({"error": 500}, 500, {"server", "overloaded"}),
    "502": ({"error": 502}, 502, {"server", "overloaded"}),
    "503": ({"error": 503}, 503, {"server", "overloaded"}),
    "529": ({"error": 529}, 529, {"server", "overloaded"}),
    "reset-before-head": ({"reset_before_head": True}, None, {"connect"}),
    "connection-refused": ({}, None, {"connect"}),
    "error-event-before-content": ({"stream_error_after": 0}, None, {"overloaded"}),
    "cut-after-opening-events": ({"break_after": 0}, None, {"stream_ended_early"}),
}
# Faults that only a streamed answer can have.
STREAM_ONLY = {"error-event-before-content", "cut-after-opening-events"}


def _fault_stack(stack: StackFactory, fmt: str, fault: str) -> Stack:
    script, _, _ = FAULTS[fault]
    extra = {}
    if fault == "connection-refused":
        base = "" if fmt in ("anthropic", "gemini") else "/v1"
        extra = {"base_url": f"http://127.0.0.1:{_closed_port()}{base}"}
    upstreams = {
        "a": _up(fmt, {"text": "upstream a must not be heard", **script}, **extra),
        "b": _healthy(fmt),
        "c": _healthy(fmt),
    }
    return stack(upstreams, config=fallback("a", "b", "c"))


@pytest.mark.sdk
@pytest.mark.parametrize(
    ("fault", "stream"),
    [(f, True) for f in FAULTS] + [(f, False) for f in FAULTS if f not in STREAM_ONLY],
    ids=lambda v: v if isinstance(v, str) else ("stream" if v else "whole"),
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_fault_on_first_upstream_fails_over(
    stack: StackFactory, sdks: Sdks, fmt: str, fault: str, stream: bool
) -> None:
    st = _fault_stack(stack, fmt, fault)

    answer = ask(sdks, st, fmt, stream=stream)

    assert answer == B_ANSWER
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"]) == (200, "b")
    assert (row["input_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (30, 10, 8)
    first, second = attempts(row)
    _, status, kinds = FAULTS[fault]
    assert first["provider"] == "a" and first["outcome"] == "failed"
    assert first["error"] in kinds
    if status is not None:
        assert first["status"] == status
    assert second["provider"] == "b" and second["outcome"] == "ok"
    assert not st.mock("c").received


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_stream_cut_after_content_is_an_error(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    st = stack(
        {"a": _up(fmt, {"chunks": 6, "break_after": 3}), "b": _healthy(fmt)},
        config=fallback("a", "b"),
    )

    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)

    (row,) = st.wait_rows(1)
    assert (row["status"], row["error_code"]) == (200, "gw.upstream.broken_after_content")
    (only,) = attempts(row)
    assert only["provider"] == "a" and only["outcome"] == "failed"
    assert not st.mock("b").received  # after content nothing fails over


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_whole_answer_cut_off_fails_over(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    # A whole answer that breaks off half-way has no content yet: the next upstream answers.
    st = stack(
        {"a": _up(fmt, {"chunks": 6, "break_after": 3}), "b": _healthy(fmt)},
        config=fallback("a", "b"),
    )

    assert ask(sdks, st, fmt, stream=False) == B_ANSWER

    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["outcome"]) for a in attempts(row)] == [
        ("a", "failed"),
        ("b", "ok"),
    ]


@pytest.mark.sdk
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_upstream_failing_is_an_api_error(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    st = stack(
        {"a": _up(fmt, {"error": 500}), "b": _up(fmt, {"error": 529})},
        config=fallback("a", "b"),
    )

    with pytest.raises(ERRORS[fmt]) as caught:
        ask(sdks, st, fmt, stream=stream)

    error = caught.value
    status = getattr(error, "status_code", None) or getattr(error, "code", None)
    assert status == 529
    assert "(tried: a → b)" in str(error)
    response = getattr(error, "response", None)
    if response is not None:  # written by the gateway, not passed through
        assert response.headers.get("x-thinkwatch-error") == "upstream"
    (row,) = st.wait_rows(1)
    assert row["status"] == 529 and row["provider"] is None
    assert [(a["provider"], a["outcome"], a["status"]) for a in attempts(row)] == [
        ("a", "failed", 500),
        ("b", "failed", 529),
    ]


_PATHS = {
    "anthropic": "/v1/messages",
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "gemini": f"/v1beta/models/{MODELS['gemini']}:generateContent",
}
_BODIES = {
    "anthropic": b'{"model":"claude-e2e-1","max_tokens":16,"stream":%s,'
    b'"messages":[{"role":"user","content":"hi"}]}',
    "openai-chat": b'{"model":"gpt-e2e-1","stream":%s,"messages":[{"role":"user","content":"hi"}]}',
    "openai-responses": b'{"model":"gpt-e2e-1","stream":%s,"input":"hi"}',
    "gemini": b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
}
_KEY_HEADERS = {
    "anthropic": ("x-api-key", KEY),
    "openai-chat": ("authorization", f"Bearer {KEY}"),
    "openai-responses": ("authorization", f"Bearer {KEY}"),
    "gemini": ("x-goog-api-key", KEY),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_last_candidates_400_reaches_the_client_unchanged(
    stack: StackFactory, frozen_mock_clock: None, fmt: str, stream: bool
) -> None:
    bad_request = {"error": {"status": 400, "message": "messages.0: unexpected tool_result"}}
    st = stack(
        {
            "a": _up(fmt, {"error": 503}),
            "b": _up(fmt, bad_request),
            "twin": _up(fmt, bad_request),  # b's double, asked directly
        },
        config=fallback("a", "b"),
    )
    path = _PATHS[fmt]
    if fmt == "gemini" and stream:
        path = path.replace(":generateContent", ":streamGenerateContent")
    body = _BODIES[fmt].replace(b"%s", b"true" if stream else b"false")

    reply = http(st.url + path, body=body, headers=[_KEY_HEADERS[fmt]])
    direct = http(mock_origin(st, "twin") + path, body=body)

    assert (reply.status, direct.status) == (400, 400)
    assert reply.body == direct.body
    assert reply.header("content-type") == direct.header("content-type")
    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["status"]) for a in attempts(row)] == [("a", 503), ("b", 400)]


@pytest.mark.sdk
def test_temporary_failure_is_retried_after_backoff(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(
        {"a": _up("anthropic", {"fail_first": 1, "error": 503, "text": B_TEXT, "usage": B_USAGE})},
        config={"failover": {"wait_secs": 4}},
    )
    started = time.monotonic()

    assert ask(sdks, st, "anthropic", stream=True) == B_ANSWER

    assert 1.5 < time.monotonic() - started < 4
    (row,) = st.wait_rows(1)
    first, second = attempts(row)
    assert (first["provider"], first["outcome"], first["status"], first["retry"]) == (
        "a",
        "failed",
        503,
        0,
    )
    assert (second["provider"], second["outcome"], second["retry"]) == ("a", "ok", 1)
    assert 1600 <= second["backoff_ms"] <= 2400  # 2 s ± 20%
    assert st.mock("a").count() == 2


@pytest.mark.sdk
def test_unexplained_failures_pause_the_upstream(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(
        {
            "a": _up("openai-chat", {"error": 500}),
            # b answers four requests, then fails its fifth
            "b": _up(
                "openai-chat", {"fail_every": 5, "error": 503, "text": B_TEXT, "usage": B_USAGE}
            ),
        },
        config=fallback("a", "b", failures_to_pause=3, pause_secs=60),
    )

    for _ in range(4):
        assert ask(sdks, st, "openai-chat", stream=True) == B_ANSWER
    with pytest.raises(ERRORS["openai-chat"]):
        ask(sdks, st, "openai-chat", stream=True)

    rows = st.wait_rows(5)
    assert len(rows) == 5
    for row in rows[:3]:
        assert [(a["provider"], a["outcome"]) for a in attempts(row)] == [
            ("a", "failed"),
            ("b", "ok"),
        ]
    # Paused after its third failure in a row: a is no longer asked while b can answer ...
    assert [(a["provider"], a["outcome"]) for a in attempts(rows[3])] == [("b", "ok")]
    assert st.mock("a").count() == 3
    # ... and when b fails, a sits out as paused rather than being asked again.
    failed, paused = attempts(rows[4])
    assert (failed["provider"], failed["outcome"], failed["status"]) == ("b", "failed", 503)
    assert (paused["provider"], paused["outcome"], paused["skipped"]) == ("a", "skipped", "paused")
    assert rows[4]["status"] == 503


@pytest.mark.sdk
def test_silent_upstream_is_left_on_slow_start(stack: StackFactory, sdks: Sdks) -> None:
    # The idle timeout is 30 s at least, too slow for a test; the slow-start switch (5 s at
    # least) moves a silent stream to the next upstream instead.
    st = stack(
        {"a": _up("anthropic", {"silence": "after_head"}), "b": _healthy("anthropic")},
        config=fallback("a", "b", next_on_slow_start=True, stream_start_wait_secs=5),
    )
    started = time.monotonic()

    assert ask(sdks, st, "anthropic", stream=True, timeout=10) == B_ANSWER

    assert 4.5 < time.monotonic() - started < 5 + 3
    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["outcome"], a["error"]) for a in attempts(row)] == [
        ("a", "slow_start", "gw.slow_start"),
        ("b", "ok", None),
    ]


def test_in_stream_overload_keeps_its_type_for_anthropic_clients(
    stack: StackFactory, sdks: Sdks
) -> None:
    # An Anthropic upstream whose stream opens with overloaded_error, nothing to fail over to
    # and no retrying: the SDK must see an overload (529, overloaded_error), not an api_error.
    st = stack(
        {"a": _up("anthropic", {"stream_error_after": 0})}, config=fallback("a", wait_secs=0)
    )
    with pytest.raises(anthropic.OverloadedError) as info:
        ask(sdks, st, "anthropic", stream=True)
    assert info.value.status_code == 529
    body = info.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("fmt", FORMATS)
def test_upstream_credential_refusal_never_echoes_the_upstreams_words(
    stack: StackFactory, fmt: str, status: int
) -> None:
    # A relay that echoes the key it was sent: its words must not reach the client.
    echo = f"invalid api key: upstream-key-a (sent as {status})"
    st = stack(
        {"a": _up(fmt, {"error": {"status": status, "message": echo}})},
        config=fallback("a"),
    )
    reply = http(
        st.url + _PATHS[fmt],
        body=_BODIES[fmt] % b"false" if b"%s" in _BODIES[fmt] else _BODIES[fmt],
        headers=[("content-type", "application/json"), _KEY_HEADERS[fmt]],
    )
    assert reply.status == 502, reply.body
    assert reply.header("x-thinkwatch-error") == "upstream"
    assert b"upstream-key-a" not in reply.body and b"invalid api key" not in reply.body
    assert b"refused the gateway's credentials" in reply.body
    (row,) = st.wait_rows(1)
    assert row["error_code"] == "gw.upstream.auth_rejected"
    assert [(a["provider"], a["status"]) for a in attempts(row)] == [("a", status)]


def test_idle_timeout_after_content_names_the_upstream_that_answered(
    stack: StackFactory,
) -> None:
    import dataclasses

    st = stack({"a": _up("anthropic", {"stall_after": 1, "text": B_TEXT})}, config=fallback("a"))
    gw = st.app.gateway
    # failover.idle_timeout_secs is at least 30 s in a config; the machine takes any figure.
    gw.settings = dataclasses.replace(gw.settings, idle_timeout_secs=0.5)
    reply = http(
        st.url + _PATHS["anthropic"],
        body=_BODIES["anthropic"] % b"true",
        headers=[("content-type", "application/json"), _KEY_HEADERS["anthropic"]],
    )
    assert reply.status == 200 and b"event: error" in reply.body
    (row,) = st.wait_rows(1)
    assert row["provider"] == "a" and row["error_code"] == "gw.upstream.idle_timeout"
    assert row["cancelled"] == 0
