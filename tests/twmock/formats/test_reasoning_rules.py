"""The mock refuses reasoning in a history as the real APIs do, in their words: Anthropic's
thinking-block rule for a tool round and its signature check, Gemini's "Corrupted thought
signature." for a seal it cannot have made."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.twmock.formats.test_formats import run
from twmock.answer import Ids, sealed_by_openai, standard_base64
from twproto.dialect import Dialect
from twproto.translate import translate_request

THINKING = {"type": "enabled", "budget_tokens": 4096}
FERNET = Ids(7).fernet(120)
OWN_SIGNATURE = Ids(7).signature(0x12, 180)


def _anthropic(first_block: dict[str, Any], *, thinking: Any = THINKING) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 32000,
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    first_block,
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ],
    }
    if thinking is not None:
        body["thinking"] = thinking
    return body


def _message(plan: Any) -> str:
    return str(json.loads(plan.body)["error"]["message"])


def test_the_mocks_seals_have_the_real_shapes() -> None:
    assert FERNET.startswith("gAAAAA") and sealed_by_openai(FERNET)
    assert OWN_SIGNATURE.startswith("E") and standard_base64(OWN_SIGNATURE)
    assert not sealed_by_openai(OWN_SIGNATURE)


def test_a_tool_round_without_thinking_is_refused_with_thinking_on() -> None:
    p = run("/v1/messages", _anthropic({"type": "text", "text": "let me look"}))
    assert p.status == 400
    assert json.loads(p.body)["error"]["type"] == "invalid_request_error"
    assert _message(p) == (
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`text`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
        "We recommend you include thinking blocks from previous turns. To avoid this "
        "requirement, disable `thinking`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


def test_the_same_round_is_answered_with_thinking_off_or_a_thinking_block() -> None:
    text = {"type": "text", "text": "let me look"}
    assert run("/v1/messages", _anthropic(text, thinking=None)).status == 200
    assert run("/v1/messages", _anthropic(text, thinking={"type": "disabled"})).status == 200
    signed = {"type": "thinking", "thinking": "hmm", "signature": OWN_SIGNATURE}
    assert run("/v1/messages", _anthropic(signed)).status == 200


def test_a_foreign_signature_is_refused_by_anthropic() -> None:
    for seal in (FERNET, "skip_thought_signature_validator"):
        p = run("/v1/messages", _anthropic({"type": "thinking", "thinking": "", "signature": seal}))
        assert p.status == 400
        assert _message(p) == "messages.1.content.0: Invalid `signature` in `thinking` block"


def _gemini(signature: str) -> dict[str, Any]:
    return {
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
                "parts": [{"functionResponse": {"name": "weather", "response": {"output": "x"}}}],
            },
        ]
    }


def test_gemini_refuses_an_openai_seal_in_its_words() -> None:
    path = "/v1beta/models/gemini-test:generateContent"
    p = run(path, _gemini(FERNET))
    assert p.status == 400
    assert json.loads(p.body)["error"] == {
        "code": 400,
        "message": "Corrupted thought signature.",
        "status": "INVALID_ARGUMENT",
    }
    assert run(path, _gemini("skip_thought_signature_validator")).status == 200
    own = base64.b64encode(b"\x0a" + bytes(40)).decode()
    assert run(path, _gemini(own)).status == 200


def test_later_messages_of_the_turn_may_go_without_thinking() -> None:
    body = _anthropic({"type": "thinking", "thinking": "hmm", "signature": OWN_SIGNATURE})
    body["messages"] += [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "windy"}],
        },
    ]
    assert run("/v1/messages", body).status == 200
    body["messages"][1]["content"] = body["messages"][1]["content"][1:]
    p = run("/v1/messages", body)
    assert p.status == 400 and _message(p).startswith("messages.1.content.0.type: Expected")


def test_thinking_blocks_must_open_the_assistant_message() -> None:
    body = _anthropic({"type": "text", "text": "let me look"}, thinking=None)
    body["messages"][1]["content"].append(
        {"type": "thinking", "thinking": "hmm", "signature": OWN_SIGNATURE}
    )
    p = run("/v1/messages", body)
    assert p.status == 400
    assert _message(p) == (
        "messages.1.content.0: If an assistant message contains any thinking blocks, the first "
        "block must be thinking or redacted_thinking. Found text."
    )


# What the gateway sends a thinking Anthropic upstream is never refused by the mock's rules,
# whatever the history: the encoder and the mock agree on the rule.
_SEALS = st.sampled_from([OWN_SIGNATURE, FERNET, "skip_thought_signature_validator", None])


@st.composite
def _histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in range(draw(st.integers(1, 4))):
        blocks: list[dict[str, Any]] = []
        seal = draw(_SEALS)
        if seal is not None:
            blocks.append({"type": "thinking", "thinking": "hmm", "signature": seal})
        if draw(st.booleans()):
            blocks.insert(draw(st.integers(0, len(blocks))), {"type": "text", "text": "ok"})
        call = f"toolu_{turn}"
        blocks.append({"type": "tool_use", "id": call, "name": "weather", "input": {}})
        messages.append({"role": "assistant", "content": blocks})
        result = {"type": "tool_result", "tool_use_id": call, "content": "sunny"}
        content: list[dict[str, Any]] = [result]
        if draw(st.booleans()):
            content.append({"type": "text", "text": "and?"})
        messages.append({"role": "user", "content": content})
    return messages


@settings(max_examples=150, deadline=None)
@given(_histories(), st.booleans())
def test_the_gateway_never_sends_what_the_rules_refuse(
    messages: list[dict[str, Any]], drop: bool
) -> None:
    body = {
        "model": "claude-test",
        "max_tokens": 32000,
        "thinking": THINKING,
        "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
        "messages": messages,
    }
    # Through the IR (a rule's output limit), as a converted or resent request goes.
    out = translate_request(
        json.dumps(body).encode(),
        Dialect.ANTHROPIC,
        Dialect.ANTHROPIC,
        max_tokens=30000,
        drop_sealed_reasoning=drop,
    )
    p = run("/v1/messages", json.loads(out.body))
    assert p.status == 200, p.body
