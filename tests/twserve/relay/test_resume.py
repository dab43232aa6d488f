"""Resuming a broken stream on the next upstream, seen by the official SDKs (docs/failover.md,
"Resuming a broken stream").

Every upstream is scripted with the same answer text. The first one breaks off mid-answer (a
cut, a stall, an in-stream error); the next one, asked with the text so far, continues from
there — repeating a few characters, as a model asked to continue may, so the gateway's trimmer
has something to drop. The client must get one answer whose text is exactly the whole text:
the part the first upstream produced followed by what the second added, nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.twserve.conftest import (
    ERRORS,
    FORMATS,
    KEY,
    Sdks,
    StackFactory,
    ask,
    attempts,
    fallback,
    http,
)
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

TEXT = (
    "The quick brown fox jumps over the lazy dog, then it rests under the old oak tree "
    "until the evening comes."
)
CHUNK = 4  # the mock's characters per chunk
CUT = 5  # chunks the first upstream gets out before it breaks off
SENT = TEXT[: CUT * CHUNK]
REPEAT = 7  # characters the continuing upstream repeats
UPSTREAMS = ("anthropic", "openai-chat")


def _up(protocol: str, script: dict[str, Any]) -> Upstream:
    return Upstream(protocol, MockSettings(script=parse_script({"text": TEXT, **script}), seed=3))


def _resuming(*names: str, on: str = "group", **failover: Any) -> dict[str, Any]:
    config = fallback(*names, **failover)
    if on == "group":
        config["groups"][0]["resume"] = True
    else:
        config["routes"][0]["resume"] = True
    return config


def _last_body(st: Stack, name: str) -> dict[str, Any]:
    body: dict[str, Any] = st.mock(name).received[-1].json()
    return body


def _stack(
    stack: StackFactory, upstream: str, fault: dict[str, Any], second: dict[str, Any] | None = None
) -> Stack:
    return stack(
        {
            "a": _up(upstream, fault),
            "b": _up(upstream, second or {"continue_repeat": REPEAT}),
        },
        config=_resuming("a", "b"),
    )


@pytest.mark.sdk
@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_cut_stream_is_resumed_into_one_answer(
    stack: StackFactory, sdks: Sdks, fmt: str, upstream: str
) -> None:
    st = _stack(stack, upstream, {"break_after": CUT})

    answer = ask(sdks, st, fmt, stream=True)

    assert answer.text == TEXT
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"], row["error_code"]) == (200, "b", None)
    first, second = attempts(row)
    assert (first["provider"], first["outcome"], first["error"]) == (
        "a",
        "failed",
        "gw.upstream.broken_after_content",
    )
    assert (second["provider"], second["outcome"], second["resumed_from"]) == ("b", "ok", len(SENT))
    assert first["resumed_from"] is None
    # b was asked to continue the text the client had, as a trailing assistant message
    # (Anthropic's without the trailing space: it refuses one).
    last = _last_body(st, "b")["messages"][-1]
    content = last["content"]
    text = content if isinstance(content, str) else "".join(p["text"] for p in content)
    assert last["role"] == "assistant"
    assert text == (SENT.rstrip() if upstream == "anthropic" else SENT)


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_other_upstream_formats_continue_too(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    # A Gemini upstream continues a trailing model turn; a Responses upstream, which takes no
    # prefill, gets the text as an earlier turn and an instruction to continue.
    st = stack(
        {
            "a": _up("gemini", {"break_after": CUT}),
            "b": _up("openai-responses", {"continue_repeat": REPEAT}),
        },
        config=_resuming("a", "b", on="route"),
    )

    assert ask(sdks, st, fmt, stream=True).text == TEXT

    items = _last_body(st, "b")["input"]
    assert items[-2]["role"] == "assistant" and items[-1]["role"] == "user"
    assert "Continue" in str(items[-1]["content"])


@pytest.mark.sdk
@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_in_stream_error_after_content_is_resumed(
    stack: StackFactory, sdks: Sdks, fmt: str, upstream: str
) -> None:
    st = _stack(stack, upstream, {"stream_error_after": CUT})

    assert ask(sdks, st, fmt, stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["outcome"]) for a in attempts(row)] == [("a", "failed"), ("b", "ok")]


@pytest.mark.sdk
@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_stalled_stream_is_resumed(
    stack: StackFactory, sdks: Sdks, fmt: str, upstream: str
) -> None:
    st = _stack(stack, upstream, {"stall_after": CUT})
    gw = st.app.gateway
    # failover.idle_timeout_secs is at least 30 s in a config; the machine takes any figure.
    gw.settings = dataclasses.replace(gw.settings, idle_timeout_secs=0.5)

    assert ask(sdks, st, fmt, stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    first, second = attempts(row)
    assert (first["provider"], first["error"]) == ("a", "idle_timeout")
    assert (second["provider"], second["outcome"], second["resumed_from"]) == ("b", "ok", len(SENT))


@pytest.mark.sdk
@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_refused_is_resent_with_an_instruction(
    stack: StackFactory, sdks: Sdks, fmt: str, upstream: str
) -> None:
    st = _stack(
        stack, upstream, {"break_after": CUT}, {"refuse_prefill": True, "continue_repeat": REPEAT}
    )

    assert ask(sdks, st, fmt, stream=True).text == TEXT

    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["outcome"], a["resend"]) for a in attempts(row)] == [
        ("a", "failed", None),
        ("b", "resent", None),
        ("b", "ok", "prefill_refused"),
    ]
    refused, resent = (r.json()["messages"] for r in st.mock("b").received)
    assert refused[-1]["role"] == "assistant"
    assert [m["role"] for m in resent[-2:]] == ["assistant", "user"]


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_refused_twice_ends_with_an_error_event(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    # The resend without a prefill is refused as well (an ordinary 400): the 200 is out, so
    # the client's stream ends with an error event its SDK raises.
    st = _stack(stack, "anthropic", {"break_after": CUT}, {"refuse_prefill": True, "error": 400})

    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)

    (row,) = st.wait_rows(1)
    assert row["status"] == 200 and row["error_code"] == "gw.upstream.error"
    assert [a["provider"] for a in attempts(row)] == ["a", "b", "b"]


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_tool_call_in_progress_refuses_the_resume(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    # The answer broke inside a tool call's arguments: it ends with an error, as without
    # resuming; the next upstream is not asked.
    st = _stack(stack, "anthropic", {"text": "Let me look.", "tool_calls": 1, "break_after": 5})

    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True, tools=True)

    (row,) = st.wait_rows(1)
    assert (row["status"], row["error_code"]) == (200, "gw.upstream.broken_after_content")
    assert [a["provider"] for a in attempts(row)] == ["a"]
    assert not st.mock("b").received


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_candidate_left_ends_with_an_error_event(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    st = stack({"a": _up("anthropic", {"break_after": CUT})}, config=_resuming("a"))

    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)

    (row,) = st.wait_rows(1)
    assert (row["status"], row["error_code"]) == (200, "gw.upstream.broken_after_content")


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_resumed_leg_failing_moves_on_to_the_next(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    # The continuing upstream fails before content: the one after it continues instead.
    st = stack(
        {
            "a": _up("openai-chat", {"break_after": CUT}),
            "b": _up("anthropic", {"error": 529}),
            "c": _up("anthropic", {"continue_repeat": 0}),
        },
        config=_resuming("a", "b", "c"),
    )

    assert ask(sdks, st, fmt, stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert [(a["provider"], a["outcome"], a["resumed_from"]) for a in attempts(row)] == [
        ("a", "failed", None),
        ("b", "failed", len(SENT)),
        ("c", "ok", len(SENT)),
    ]


@pytest.mark.sdk
def test_resume_off_by_default(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(
        {"a": _up("anthropic", {"break_after": CUT}), "b": _up("anthropic", {})},
        config=fallback("a", "b"),
    )

    with pytest.raises(ERRORS["anthropic"]):
        ask(sdks, st, "anthropic", stream=True)
    assert not st.mock("b").received


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_answer_is_resumed_more_than_once(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    # b continues, then sends an error event two chunks later; c continues from there.
    st = stack(
        {
            "a": _up("anthropic", {"break_after": CUT}),
            "b": _up("openai-chat", {"continue_repeat": REPEAT, "stream_error_after": 4}),
            "c": _up("gemini", {"continue_repeat": REPEAT}),
        },
        config=_resuming("a", "b", "c"),
    )

    assert ask(sdks, st, fmt, stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    legs = [(a["provider"], a["outcome"], a["resumed_from"]) for a in attempts(row)]
    assert legs[:2] == [("a", "failed", None), ("b", "failed", len(SENT))]
    (c,) = legs[2:]
    assert c[:2] == ("c", "ok") and c[2] is not None and c[2] > len(SENT)


@pytest.mark.parametrize("resumed", [True, False], ids=["resumed", "last-candidate"])
def test_gemini_json_array_client_stays_one_array(stack: StackFactory, resumed: bool) -> None:
    # A Gemini client without alt=sse reads one JSON array: across upstreams it stays one,
    # and an error ending after a failed resume closes it properly.
    names = ("a", "b") if resumed else ("a",)
    st = stack(
        {
            "a": _up("anthropic", {"break_after": CUT}),
            "b": _up("openai-chat", {"continue_repeat": REPEAT}),
        },
        config=_resuming(*names),
    )
    reply = http(
        st.url + "/v1beta/models/gemini-e2e-1:streamGenerateContent",
        body=json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).encode(),
        headers=[("content-type", "application/json"), ("x-goog-api-key", KEY)],
    )
    assert reply.status == 200
    elements = json.loads(reply.body)  # one JSON array
    text = "".join(
        part.get("text", "")
        for element in elements
        for candidate in element.get("candidates", ())
        for part in candidate["content"]["parts"]
    )
    errors = [element["error"] for element in elements if "error" in element]
    if resumed:
        assert text == TEXT and not errors
    else:
        assert text == SENT and [e["code"] for e in errors] == [502]
