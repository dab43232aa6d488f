"""Reasoning in foreign histories (docs/conversion.md): seals another API made are left out, and
a tool round with no thinking block goes to a thinking Anthropic upstream with thinking off."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from twproto.dialect import Dialect
from twproto.formats.seals import GEMINI_PLACEHOLDER, SealMaker, seal_maker, welcome_seal
from twproto.translate import translate_request

# Recorded seals (tests/data/fixtures): an Anthropic signature, a Gemini thoughtSignature, an
# OpenAI encrypted_content.
ANTHROPIC_SIG = "Er4BCkYICxgCKkCoxqLHLrx4mFL9Ox7/aHKht87WDzXfvZ7qbZKSnHV8imA5b3LXxuVqcXQ9z5sX"
GEMINI_SIG = "CiIB0e2Kb6Syj1a961Ef"
FERNET = "gAAAAABpPMlcH0HHEv5_" + "x" * 40 + "=="
FINAL_TURN = "reasoning (final assistant turn has no thinking block)"
WEATHER = {"name": "weather", "parameters": {"type": "object", "properties": {}}}


def _fernet(stamp: int, rest: bytes) -> str:
    return base64.urlsafe_b64encode(b"\x80" + stamp.to_bytes(8, "big") + rest).decode()


@given(st.integers(0, 2**32 - 1), st.binary(min_size=16, max_size=200))
def test_every_fernet_token_is_named_openai(stamp: int, rest: bytes) -> None:
    assert seal_maker(_fernet(stamp, rest)) is SealMaker.OPENAI


@given(st.binary(min_size=1, max_size=300))
def test_a_protobuf_signature_is_never_named(rest: bytes) -> None:
    # Anthropic's and Gemini's signatures open with 0x12 or 0x0a: the shape names no maker.
    for first in (b"\x12", b"\x0a"):
        seal = base64.b64encode(first + rest).decode()
        assert seal_maker(seal) is SealMaker.UNKNOWN
        assert welcome_seal(seal, Dialect.ANTHROPIC) is None
        assert welcome_seal(seal, Dialect.GEMINI) is None


def test_what_each_target_refuses() -> None:
    assert seal_maker(GEMINI_PLACEHOLDER) is SealMaker.GEMINI_PLACEHOLDER
    assert welcome_seal(GEMINI_PLACEHOLDER, Dialect.ANTHROPIC) is not None
    assert welcome_seal(GEMINI_PLACEHOLDER, Dialect.GEMINI) is None
    assert welcome_seal(FERNET, Dialect.ANTHROPIC) is not None
    assert welcome_seal(FERNET, Dialect.GEMINI) is not None
    assert welcome_seal(FERNET, Dialect.OPENAI_RESPONSES) is None  # its own
    for seal in (ANTHROPIC_SIG, GEMINI_SIG):
        assert seal_maker(seal) is SealMaker.UNKNOWN


def _to(body: dict[str, Any], source: Dialect, target: Dialect, **kw: Any) -> Any:
    out = translate_request(json.dumps(body).encode(), source, target, model="m", **kw)
    return json.loads(out.body), out.dropped


def _chat_tool_round() -> dict[str, Any]:
    return {
        "model": "m",
        "reasoning_effort": "high",
        "max_completion_tokens": 16000,
        "tools": [{"type": "function", "function": WEATHER}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }


def test_a_chat_tool_round_goes_to_anthropic_without_thinking() -> None:
    out, dropped = _to(_chat_tool_round(), Dialect.OPENAI_CHAT, Dialect.ANTHROPIC)
    assert "thinking" not in out
    assert FINAL_TURN in dropped


def test_a_chat_question_after_the_round_keeps_thinking() -> None:
    # The rule is for the tool round in progress only: a new user turn starts a fresh one.
    body = _chat_tool_round()
    body["messages"].append({"role": "assistant", "content": "It is sunny."})
    body["messages"].append({"role": "user", "content": "thanks"})
    out, dropped = _to(body, Dialect.OPENAI_CHAT, Dialect.ANTHROPIC)
    assert out["thinking"]["type"] == "enabled"
    assert FINAL_TURN not in dropped


def _responses_round(seal: str) -> dict[str, Any]:
    return {
        "model": "m",
        "reasoning": {"effort": "high"},
        "max_output_tokens": 16000,
        "tools": [{"type": "function", **WEATHER}],
        "input": [
            {"role": "user", "content": "weather?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "look it up"}],
                "encrypted_content": seal,
            },
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    }


def test_openai_encrypted_content_never_reaches_anthropic() -> None:
    out, dropped = _to(_responses_round(FERNET), Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC)
    assert FERNET not in json.dumps(out)
    assert "thinking" not in out
    assert "reasoning.signature (OpenAI encrypted_content)" in dropped
    assert FINAL_TURN in dropped


def test_an_anthropic_signature_carried_by_codex_goes_back_with_thinking() -> None:
    out, dropped = _to(_responses_round(ANTHROPIC_SIG), Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC)
    turn = out["messages"][1]["content"]
    assert turn[0] == {"type": "thinking", "thinking": "look it up", "signature": ANTHROPIC_SIG}
    assert out["thinking"]["type"] == "enabled"
    assert FINAL_TURN not in dropped


def test_openai_encrypted_content_never_reaches_gemini() -> None:
    out, dropped = _to(_responses_round(FERNET), Dialect.OPENAI_RESPONSES, Dialect.GEMINI)
    assert FERNET not in json.dumps(out)
    assert "reasoning.signature (OpenAI encrypted_content)" in dropped


def _gemini_round(signature: str) -> dict[str, Any]:
    return {
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 4096}, "maxOutputTokens": 16000},
        "tools": [{"functionDeclarations": [WEATHER]}],
        "contents": [
            {"role": "user", "parts": [{"text": "weather?"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "weather", "args": {}}, "thoughtSignature": signature}
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "weather", "response": {"output": "sunny"}}}
                ],
            },
        ],
    }


def test_the_gemini_placeholder_never_becomes_an_anthropic_signature() -> None:
    out, dropped = _to(_gemini_round(GEMINI_PLACEHOLDER), Dialect.GEMINI, Dialect.ANTHROPIC)
    text = json.dumps(out)
    assert "skip" not in text and "thinking" not in out
    assert "reasoning.signature (Gemini placeholder)" in dropped
    assert FINAL_TURN in dropped


def test_the_resend_without_seals_turns_thinking_off() -> None:
    # The safety net: an Anthropic history whose signature the upstream refused goes again
    # without it, and so without thinking for this turn, not into the thinking-block 400.
    body = {
        "model": "m",
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 4096},
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ANTHROPIC_SIG},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ],
    }
    kept, _ = _to(body, Dialect.ANTHROPIC, Dialect.ANTHROPIC)
    assert kept == body | {"model": "m"}  # passed through: it opens with its thinking block
    out, dropped = _to(body, Dialect.ANTHROPIC, Dialect.ANTHROPIC, drop_sealed_reasoning=True)
    assert "thinking" not in out
    assert [b["type"] for b in out["messages"][1]["content"]] == ["tool_use"]
    assert {"reasoning:sealed_for_account", FINAL_TURN} <= set(dropped)


@given(st.sampled_from([FERNET, GEMINI_PLACEHOLDER, ANTHROPIC_SIG, GEMINI_SIG]), st.booleans())
def test_a_thinking_anthropic_request_is_never_one_the_api_refuses(seal: str, gemini: bool) -> None:
    # Whatever seal the history carries, no thinking block carries another API's known shape,
    # and with thinking on the tool round's assistant turn opens with a thinking block.
    if gemini:
        out, _ = _to(_gemini_round(seal), Dialect.GEMINI, Dialect.ANTHROPIC)
    else:
        out, _ = _to(_responses_round(seal), Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC)
    blocks = [b for m in out["messages"] for b in m["content"]]
    signatures = [b["signature"] for b in blocks if b["type"] == "thinking"]
    assert all(seal_maker(s) is SealMaker.UNKNOWN for s in signatures)
    opens = out["messages"][-2]["content"][0]["type"]
    assert ("thinking" in out) == (opens == "thinking")


def test_later_messages_of_a_thinking_turn_need_no_thinking_block() -> None:
    # Without interleaved thinking only the turn's first message thinks; the API takes that.
    use = {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_2", "content": "windy"}
    body = {
        "model": "m",
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 4096},
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ANTHROPIC_SIG},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
    }
    out, dropped = _to(body, Dialect.ANTHROPIC, Dialect.ANTHROPIC, max_tokens=30000)
    assert out["thinking"]["type"] == "enabled"
    assert FINAL_TURN not in dropped


def test_a_gemini_seal_after_text_opens_the_anthropic_turn() -> None:
    # Gemini seals a step on its first function call, after any text: Anthropic wants the
    # thinking block first in the message.
    body = _gemini_round(ANTHROPIC_SIG)
    body["contents"][1]["parts"].insert(0, {"text": "Let me check."})
    out, dropped = _to(body, Dialect.GEMINI, Dialect.ANTHROPIC)
    kinds = [b["type"] for b in out["messages"][1]["content"]]
    assert kinds == ["thinking", "text", "tool_use"]
    assert out["thinking"]["type"] == "enabled" and FINAL_TURN not in dropped
