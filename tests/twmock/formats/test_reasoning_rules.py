"""The mock refuses reasoning in a history as the real APIs do, in their words: Anthropic's
thinking-block rule for a tool round and its signature check, Gemini's "Corrupted thought
signature." for a seal it cannot have made."""

from __future__ import annotations

import base64
import json
from typing import Any

from tests.twmock.formats.test_formats import run
from twmock.answer import Ids, sealed_by_openai, standard_base64

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
