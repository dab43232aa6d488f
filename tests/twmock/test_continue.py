"""The mock continuing an earlier answer (``continue_repeat``) and refusing a prefill
(``refuse_prefill``), for the gateway's resume (docs/mock-upstream.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.twmock.formats.test_formats import (
    ANTHROPIC_BODY,
    CHAT_BODY,
    GEMINI_BODY,
    RESPONSES_BODY,
    run,
)
from twmock.answer import PREFILL_REFUSAL, earlier_answer

TEXT = "The quick brown fox jumps over the lazy dog."


def _whole_text(fmt: str, body: bytes) -> str:
    obj = json.loads(body)
    if fmt == "anthropic":
        return "".join(b["text"] for b in obj["content"] if b["type"] == "text")
    if fmt == "chat":
        return str(obj["choices"][0]["message"]["content"])
    if fmt == "responses":
        return "".join(c["text"] for item in obj["output"] for c in item.get("content", ()))
    return "".join(p["text"] for p in obj["candidates"][0]["content"]["parts"])


def _with_earlier(fmt: str, earlier: str, *, prefill: bool) -> tuple[str, dict[str, Any]]:
    follow = [] if prefill else [{"role": "user", "content": "Continue."}]
    if fmt == "anthropic":
        body = {**ANTHROPIC_BODY}
        body["messages"] = [*body["messages"], {"role": "assistant", "content": earlier}, *follow]
        return "/v1/messages", body
    if fmt == "chat":
        body = {**CHAT_BODY}
        body["messages"] = [*body["messages"], {"role": "assistant", "content": earlier}, *follow]
        return "/v1/chat/completions", body
    if fmt == "responses":
        assistant = {"role": "assistant", "content": [{"type": "output_text", "text": earlier}]}
        user = [{"role": "user", "content": "Continue."}] if not prefill else []
        body = {**RESPONSES_BODY, "input": [{"role": "user", "content": "hi"}, assistant, *user]}
        return "/v1/responses", body
    model_turn = {"role": "model", "parts": [{"text": earlier}]}
    user_turn = [{"role": "user", "parts": [{"text": "Continue."}]}] if not prefill else []
    body = {**GEMINI_BODY, "contents": [*GEMINI_BODY["contents"], model_turn, *user_turn]}
    return "/v1beta/models/gemini-test:generateContent", body


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "instruction"])
@pytest.mark.parametrize("fmt", ["anthropic", "chat", "responses", "gemini"])
def test_an_earlier_answer_is_continued_with_a_repeat(fmt: str, prefill: bool) -> None:
    path, body = _with_earlier(fmt, "The quick brown ", prefill=prefill)
    played = run(path, body, {"text": TEXT, "continue_repeat": 6})
    # "The quick brown" (the earlier answer without its trailing space), from 6 characters back.
    assert _whole_text(fmt, played.body) == TEXT[len("The quick brown") - 6 :]


def test_an_earlier_answer_that_is_not_the_start_gets_the_whole_text() -> None:
    path, body = _with_earlier("anthropic", "Something else", prefill=True)
    assert (
        _whole_text("anthropic", run(path, body, {"text": TEXT, "continue_repeat": 0}).body) == TEXT
    )


def test_without_continue_repeat_the_whole_text_is_played() -> None:
    path, body = _with_earlier("chat", "The quick", prefill=True)
    assert _whole_text("chat", run(path, body, {"text": TEXT}).body) == TEXT


@pytest.mark.parametrize("fmt", ["anthropic", "chat", "gemini"])
def test_refuse_prefill_answers_a_prefill_with_a_400(fmt: str) -> None:
    path, body = _with_earlier(fmt, "The quick", prefill=True)
    played = run(path, body, {"text": TEXT, "refuse_prefill": True})
    assert played.status == 400 and PREFILL_REFUSAL.encode() in played.body
    path, body = _with_earlier(fmt, "The quick", prefill=False)
    assert run(path, body, {"text": TEXT, "refuse_prefill": True}).status == 200


def test_earlier_answer() -> None:
    assert earlier_answer({"messages": [{"role": "user", "content": "hi"}]}) == ("", False)
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert earlier_answer({"messages": [{"role": "assistant", "content": blocks}]}) == ("ab", True)
    thought = {"contents": [{"role": "model", "parts": [{"text": "x", "thought": True}]}]}
    assert earlier_answer(thought) == ("", True)
    assert earlier_answer([]) == ("", False)
