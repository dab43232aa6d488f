"""Agent histories across formats with reasoning on, driven by the official SDKs
(docs/conversion.md, "Reasoning in foreign histories").

The mock upstreams enforce the real APIs' rules in their words (tests/twmock/formats/
test_reasoning_rules.py): Anthropic refuses a thinking request whose tool loop turn does not
open with a thinking block, and a signature another API made; Gemini refuses an OpenAI seal with
"Corrupted thought signature.". Each cell is answered the first time — the upstream saw one
request — except the two safety-net cells, where the upstream refuses a seal whose shape names
no maker and the one resend without seals is answered.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.genai import types as gtypes

from tests.twserve.support.sdk_clients import SdkClients, sdk_clients
from tests.twserve.support.stack import Stack, Upstream, running_stack
from twmock.answer import Ids
from twmock.script import ErrorSpec, MockSettings, Script

FINAL_TURN = "reasoning (final assistant turn has no thinking block)"
OPENAI_SEAL = "reasoning.signature (OpenAI encrypted_content)"
# An OpenAI encrypted_content (a Fernet token, as twmock's Responses upstream makes them).
FERNET = Ids(3).fernet(200)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
ANSWER = "It is sunny."

UPSTREAMS = {
    "anthropic": ("anthropic", Script(text=ANSWER), "claude-up"),
    "gemini": ("gemini", Script(text=ANSWER), "gemini-up"),
    "claude-thinks-tools": (
        "anthropic",
        Script(reasoning="Look it up.", text="Checking.", tool_calls=1, tool_name="weather"),
        "claude-tools",
    ),
    "anthropic-refuses-once": (
        "anthropic",
        Script(text=ANSWER, fail_first=1, error=ErrorSpec(shape="anthropic-invalid-signature")),
        "claude-refuses",
    ),
    "anthropic-refuses-gemini": (
        "anthropic",
        Script(text=ANSWER, fail_first=1, error=ErrorSpec(shape="anthropic-invalid-signature")),
        "claude-refuses-gemini",
    ),
    "gemini-refuses-once": (
        "gemini",
        Script(
            text=ANSWER, fail_first=1, error=ErrorSpec(shape="gemini-corrupted-thought-signature")
        ),
        "gemini-refuses",
    ),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {
        name: Upstream(fmt, MockSettings(script=script), models=[model])
        for name, (fmt, script, model) in UPSTREAMS.items()
    }
    config = {"failover": {"failures_to_pause": 100, "wait_secs": 0}}
    data_dir: Path = tmp_path_factory.mktemp("foreign-reasoning")
    with running_stack(data_dir, upstreams, config=config) as stack:
        yield stack


@pytest.fixture(scope="module")
def clients(gateway: Stack) -> Iterator[SdkClients]:
    with sdk_clients(gateway.url) as made:
        yield made


def _bodies(gateway: Stack, name: str, since: int) -> list[dict[str, Any]]:
    return [r.json() for r in list(gateway.mock(name).received)[since:]]


def _row(gateway: Stack, count: int) -> dict[str, Any]:
    row = gateway.wait_rows(count)[-1]
    return {**row, "translated": json.loads(row["translated"] or "[]")}


def _settled(gateway: Stack) -> int:
    """The rows written, once the earlier tests' last rows are in (a row is written just after
    its answer ends, so one may still be on its way when the next test starts)."""
    written, quiet_since = gateway.app.store.written, time.monotonic()
    while time.monotonic() - quiet_since < 0.3:
        time.sleep(0.02)
        if gateway.app.store.written != written:
            written, quiet_since = gateway.app.store.written, time.monotonic()
    return written


def _seen(gateway: Stack, name: str) -> int:
    return len(gateway.mock(name).received)


# ----------------------------------------------------------------------------------------------
# Histories to an Anthropic upstream with thinking on


def test_a_chat_tool_round_is_answered_by_thinking_anthropic(
    gateway: Stack, clients: SdkClients
) -> None:
    before, rows = _seen(gateway, "anthropic"), _settled(gateway)
    reply = clients.openai.chat.completions.create(
        model="claude-up",
        reasoning_effort="high",
        max_completion_tokens=16000,
        tools=[{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    assert reply.choices[0].message.content == ANSWER
    (sent,) = _bodies(gateway, "anthropic", before)  # answered the first time
    assert "thinking" not in sent
    assert FINAL_TURN in _row(gateway, rows + 1)["translated"]


def _responses_history(seal: str) -> list[Any]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look it up."}],
            "encrypted_content": seal,
        },
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]


def test_a_responses_history_sealed_by_openai_is_answered_by_thinking_anthropic(
    gateway: Stack, clients: SdkClients
) -> None:
    before, rows = _seen(gateway, "anthropic"), _settled(gateway)
    reply = clients.openai.responses.create(
        model="claude-up",
        reasoning={"effort": "high"},
        max_output_tokens=16000,
        tools=[{"type": "function", "name": "weather", "parameters": SCHEMA, "strict": False}],
        input=_responses_history(FERNET),  # type: ignore[arg-type]
    )
    assert reply.output_text == ANSWER
    (sent,) = _bodies(gateway, "anthropic", before)
    assert FERNET not in json.dumps(sent)
    assert "thinking" not in sent
    assert {OPENAI_SEAL, FINAL_TURN} <= set(_row(gateway, rows + 1)["translated"])


def test_codex_on_anthropic_keeps_its_thinking_across_the_tool_round(
    gateway: Stack, clients: SdkClients
) -> None:
    # Anthropic's own signature, carried by the Responses client as encrypted_content, goes
    # back with thinking on: that is the round trip the seal rule must keep.
    tools: Any = [{"type": "function", "name": "weather", "parameters": SCHEMA, "strict": False}]
    first = clients.openai.responses.create(
        model="claude-tools",
        reasoning={"effort": "high"},
        max_output_tokens=16000,
        include=["reasoning.encrypted_content"],
        tools=tools,
        input="Weather in Paris?",
    )
    items = [item.model_dump(exclude_none=True) for item in first.output]
    call = next(i for i in items if i["type"] == "function_call")
    seal = next(i for i in items if i["type"] == "reasoning")["encrypted_content"]
    before = _seen(gateway, "claude-thinks-tools")
    clients.openai.responses.create(
        model="claude-tools",
        reasoning={"effort": "high"},
        max_output_tokens=16000,
        tools=tools,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *items,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ],
    )
    (sent,) = _bodies(gateway, "claude-thinks-tools", before)
    assert sent["thinking"]["type"] == "enabled"
    opening = sent["messages"][1]["content"][0]
    assert opening["type"] == "thinking" and opening["signature"] == seal


def test_a_gemini_history_with_the_placeholder_is_answered_by_thinking_anthropic(
    gateway: Stack, clients: SdkClients
) -> None:
    # Gemini CLI replays a call it has no signature for with Google's placeholder; Google's SDK
    # sends bytes as URL-safe base64, which the placeholder's 32 characters are.
    placeholder = base64.urlsafe_b64decode("skip_thought_signature_validator")
    before, rows = _seen(gateway, "anthropic"), _settled(gateway)
    reply = clients.genai.models.generate_content(
        model="claude-up",
        config=gtypes.GenerateContentConfig(
            max_output_tokens=16000,
            thinking_config=gtypes.ThinkingConfig(thinking_budget=4096),
            tools=[
                gtypes.Tool(
                    function_declarations=[
                        gtypes.FunctionDeclaration(name="weather", parameters_json_schema=SCHEMA)
                    ]
                )
            ],
        ),
        contents=[
            gtypes.Content(role="user", parts=[gtypes.Part(text="Weather in Paris?")]),
            gtypes.Content(
                role="model",
                parts=[
                    gtypes.Part(
                        function_call=gtypes.FunctionCall(name="weather", args={"city": "Paris"}),
                        thought_signature=placeholder,
                    )
                ],
            ),
            gtypes.Content(
                role="user",
                parts=[
                    gtypes.Part(
                        function_response=gtypes.FunctionResponse(
                            name="weather", response={"output": "sunny"}
                        )
                    )
                ],
            ),
        ],
    )
    assert reply.text == ANSWER
    (sent,) = _bodies(gateway, "anthropic", before)
    text = json.dumps(sent)
    assert "skip" not in text and "thinking" not in sent
    translated = _row(gateway, rows + 1)["translated"]
    assert {"reasoning.signature (Gemini placeholder)", FINAL_TURN} <= set(translated)


def test_the_resend_without_seals_is_not_refused_for_its_thinking(
    gateway: Stack, clients: SdkClients
) -> None:
    # The safety net: the upstream refuses the signature (another account's); the one resend
    # leaves it out and, its tool loop left without a thinking block, thinking too.
    signature = Ids(5).signature(0x12, 180)
    before, rows = _seen(gateway, "anthropic-refuses-once"), _settled(gateway)
    reply = clients.anthropic.messages.create(
        model="claude-refuses",
        max_tokens=16000,
        thinking={"type": "enabled", "budget_tokens": 4096},
        tools=[{"name": "weather", "input_schema": SCHEMA}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": signature},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ],
    )
    assert reply.content[-1].type == "text" and reply.content[-1].text == ANSWER
    first, second = _bodies(gateway, "anthropic-refuses-once", before)
    assert first["thinking"]["type"] == "enabled"
    assert "thinking" not in second
    assert [b["type"] for b in second["messages"][1]["content"]] == ["tool_use"]
    row = _row(gateway, rows + 1)
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["outcome"], a["resend"]) for a in attempts] == [
        ("resent", None),
        ("ok", "sealed_reasoning"),
    ]
    assert {"reasoning:sealed_for_account", FINAL_TURN} <= set(row["translated"])


# ----------------------------------------------------------------------------------------------
# Histories to a Gemini upstream


def test_a_responses_history_sealed_by_openai_is_answered_by_gemini(
    gateway: Stack, clients: SdkClients
) -> None:
    before, rows = _seen(gateway, "gemini"), _settled(gateway)
    reply = clients.openai.responses.create(
        model="gemini-up",
        reasoning={"effort": "high"},
        tools=[{"type": "function", "name": "weather", "parameters": SCHEMA, "strict": False}],
        input=_responses_history(FERNET),  # type: ignore[arg-type]
    )
    assert reply.output_text == ANSWER
    (sent,) = _bodies(gateway, "gemini", before)
    assert FERNET not in json.dumps(sent)
    assert OPENAI_SEAL in _row(gateway, rows + 1)["translated"]


def _anthropic_history(signature: str) -> list[Any]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": signature},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
        },
    ]


def test_an_anthropic_history_sealed_by_openai_is_answered_by_gemini(
    gateway: Stack, clients: SdkClients
) -> None:
    # Claude Code that was served by a Responses upstream holds OpenAI seals as signatures.
    before, rows = _seen(gateway, "gemini"), _settled(gateway)
    reply = clients.anthropic.messages.create(
        model="gemini-up",
        max_tokens=16000,
        thinking={"type": "enabled", "budget_tokens": 4096},
        tools=[{"name": "weather", "input_schema": SCHEMA}],
        messages=_anthropic_history(FERNET),
    )
    assert reply.content[-1].type == "text" and reply.content[-1].text == ANSWER
    (sent,) = _bodies(gateway, "gemini", before)
    assert FERNET not in json.dumps(sent)
    assert OPENAI_SEAL in _row(gateway, rows + 1)["translated"]


def test_gemini_refusing_a_signature_gets_the_resend_without_seals(
    gateway: Stack, clients: SdkClients
) -> None:
    # An Anthropic signature has no shape that names its maker: it goes, Gemini answers
    # "Corrupted thought signature.", and the one resend leaves the seals out.
    signature = Ids(6).signature(0x12, 180)
    before, rows = _seen(gateway, "gemini-refuses-once"), _settled(gateway)
    reply = clients.anthropic.messages.create(
        model="gemini-refuses",
        max_tokens=16000,
        thinking={"type": "enabled", "budget_tokens": 4096},
        tools=[{"name": "weather", "input_schema": SCHEMA}],
        messages=_anthropic_history(signature),
    )
    assert reply.content[-1].type == "text" and reply.content[-1].text == ANSWER
    first, second = _bodies(gateway, "gemini-refuses-once", before)
    assert signature in json.dumps(first) and signature not in json.dumps(second)
    row = _row(gateway, rows + 1)
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["outcome"], a["resend"]) for a in attempts] == [
        ("resent", None),
        ("ok", "sealed_reasoning"),
    ]


def test_a_gemini_signature_refused_by_anthropic_gets_the_resend_without_seals(
    gateway: Stack, clients: SdkClients
) -> None:
    # Gemini CLI's own signature (no shape names it Gemini's) goes to Anthropic, which refuses
    # it; the resend leaves it out and, its tool loop left without thinking, thinking too.
    signature = Ids(8).signature(0x0A, 160)
    before, rows = _seen(gateway, "anthropic-refuses-gemini"), _settled(gateway)
    reply = clients.genai.models.generate_content(
        model="claude-refuses-gemini",
        config=gtypes.GenerateContentConfig(
            max_output_tokens=16000,
            thinking_config=gtypes.ThinkingConfig(thinking_budget=4096),
        ),
        contents=[
            gtypes.Content(role="user", parts=[gtypes.Part(text="Weather in Paris?")]),
            gtypes.Content(
                role="model",
                parts=[
                    gtypes.Part(text="Let me check."),
                    gtypes.Part(
                        function_call=gtypes.FunctionCall(name="weather", args={"city": "Paris"}),
                        thought_signature=base64.b64decode(signature),
                    ),
                ],
            ),
            gtypes.Content(
                role="user",
                parts=[
                    gtypes.Part(
                        function_response=gtypes.FunctionResponse(
                            name="weather", response={"output": "sunny"}
                        )
                    )
                ],
            ),
        ],
    )
    assert reply.text == ANSWER
    first, second = _bodies(gateway, "anthropic-refuses-gemini", before)
    # The first went with thinking on, its (moved) thinking block opening the turn.
    assert first["thinking"]["type"] == "enabled"
    assert [b["type"] for b in first["messages"][1]["content"]] == ["thinking", "text", "tool_use"]
    assert "thinking" not in second
    assert [b["type"] for b in second["messages"][1]["content"]] == ["text", "tool_use"]
    row = _row(gateway, rows + 1)
    assert [a["resend"] for a in json.loads(row["routing"])["attempts"]] == [
        None,
        "sealed_reasoning",
    ]
