"""Requests across formats: every source × target pair on one conversation with system prompt,
images (URL and base64), parallel tool calls and their results; then the traffic real agents
send (Claude Code, Codex CLI; docs/conversion.md); reasoning settings; Gemini schema sanitising."""

from __future__ import annotations

from typing import Any

import pytest

from tests.twproto.conftest import DIALECTS
from twproto import ir, json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.effort import budget_for_effort, effort_for_budget
from twproto.formats import get
from twproto.formats._schema import sanitize_schema
from twproto.stream import new_stream_translator
from twproto.translate import (
    DEFAULT_MAX_TOKENS,
    TranslationError,
    translate_request,
    translate_response,
)

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5Er"
    "kJggg=="
)

WEATHER_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "units": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}

CONVERSATION = ir.Request(
    model="source-model",
    system=(ir.Text(text="You are terse. ✓"),),
    messages=(
        ir.Message(
            role=ir.Role.USER,
            parts=(
                ir.Text(text="Weather and time? 🌦 Here are two pictures."),
                ir.Image(url="https://example.com/cat.png"),
                ir.Image(data=PNG, media_type="image/png"),
            ),
        ),
        ir.Message(
            role=ir.Role.ASSISTANT,
            parts=(
                ir.Text(text="Checking both."),
                ir.ToolCall(id="call_w1", name="get_weather", arguments='{"city": "Paris"}'),
                ir.ToolCall(id="call_t2", name="get_time", arguments='{"tz": "Europe/Paris"}'),
            ),
        ),
        ir.Message(
            role=ir.Role.USER,
            parts=(
                ir.ToolResult(call_id="call_w1", content=(ir.Text(text="18°C, sunny"),)),
                ir.ToolResult(call_id="call_t2", content=(ir.Text(text="14:05"),)),
                ir.Text(text="Thanks — and tomorrow?"),
            ),
        ),
    ),
    tools=(
        ir.Tool(name="get_weather", description="Current weather", parameters=WEATHER_SCHEMA),
        ir.Tool(
            name="get_time",
            description="Local time",
            parameters={"type": "object", "properties": {"tz": {"type": "string"}}},
        ),
    ),
    tool_choice=ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO),
    temperature=0.5,
    top_p=0.9,
    stop=("END",),
    max_output_tokens=1000,
    stream=True,
)


def _source_body(source: Dialect) -> bytes:
    body, dropped = get(source).encode_request(CONVERSATION, model="source-model")
    assert not [d for d in dropped if d != "stop" and not d.startswith("tool schema")]
    return json_dumps(body)


def _decoded(target: Dialect, body: bytes) -> ir.Request:
    return get(target).decode_request(json_loads(body))


def _merged(messages: tuple[ir.Message, ...]) -> list[ir.Message]:
    """Consecutive messages of one role as one (Chat splits tool results from user text)."""
    out: list[ir.Message] = []
    for message in messages:
        if out and out[-1].role is message.role:
            out[-1] = ir.Message(role=message.role, parts=out[-1].parts + message.parts)
        else:
            out.append(message)
    return out


def _texts(message: ir.Message) -> list[str]:
    return [p.text for p in message.parts if isinstance(p, ir.Text)]


@pytest.mark.parametrize("target", DIALECTS, ids=str)
@pytest.mark.parametrize("source", DIALECTS, ids=str)
def test_conversation_survives_every_pair(source: Dialect, target: Dialect) -> None:
    result = translate_request(
        _source_body(source), source, target, model="target-model", stream=True
    )
    assert result.model == "target-model" and result.stream
    req = _decoded(target, result.body)
    if target is not Dialect.GEMINI:
        assert json_loads(result.body)["model"] == "target-model"
    assert "".join(t.text for t in req.system) == "You are terse. ✓"
    first, assistant, last = _merged(req.messages)
    assert _texts(first) == ["Weather and time? 🌦 Here are two pictures."]
    images = [p for p in first.parts if isinstance(p, ir.Image)]
    assert [(i.url, i.data) for i in images] == [
        ("https://example.com/cat.png", None),
        (None, PNG),
    ]
    assert images[1].media_type == "image/png"
    assert _texts(assistant) == ["Checking both."]
    calls = {p.id: p for p in assistant.parts if isinstance(p, ir.ToolCall)}
    assert sorted((c.name, json_loads(c.arguments)) for c in calls.values()) == [
        ("get_time", {"tz": "Europe/Paris"}),
        ("get_weather", {"city": "Paris"}),
    ]
    if Dialect.GEMINI not in (source, target):
        assert set(calls) == {"call_w1", "call_t2"}
    # Each result still answers the right call.
    results = [p for p in last.parts if isinstance(p, ir.ToolResult)]
    assert sorted((calls[r.call_id].name, r.text) for r in results) == [
        ("get_time", "14:05"),
        ("get_weather", "18°C, sunny"),
    ]
    assert _texts(last) == ["Thanks — and tomorrow?"]
    tools = {t.name: t for t in req.tools}
    assert set(tools) == {"get_weather", "get_time"}
    params = tools["get_weather"].parameters or {}
    assert params["properties"]["city"]["type"] == "string"
    assert params["required"] == ["city"]
    if target is Dialect.GEMINI:
        assert "additionalProperties" not in params and "$schema" not in params
        if source is not target:
            assert any(d.startswith("tool schema keywords") for d in result.dropped)
    assert req.tool_choice == ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO)
    assert req.temperature == 0.5 and req.top_p == 0.9
    assert req.max_output_tokens == 1000
    if Dialect.OPENAI_RESPONSES in (source, target):
        # Responses has no stop sequences: dropped, and said so.
        assert req.stop == () or source is Dialect.OPENAI_RESPONSES
        if target is Dialect.OPENAI_RESPONSES and source is not target:
            assert "stop" in result.dropped
    else:
        assert req.stop == ("END",)


@pytest.mark.parametrize("source", DIALECTS, ids=str)
def test_same_format_is_byte_for_byte(source: Dialect) -> None:
    body = _source_body(source) + b"  "
    result = translate_request(body, source, source, model=None)
    assert result.body is body
    if source is not Dialect.GEMINI:
        same_model = translate_request(body, source, source, model="source-model", stream=True)
        assert same_model.body is body


def test_same_format_model_change_touches_only_the_model() -> None:
    body = (
        b'{ "messages" : [{"role":"user","content":"model \\"x\\" {"}],\n'
        b'  "model" :  "claude-a",  "max_tokens": 1.0e3 , "metadata":{"model":"inner"}}'
    )
    out = translate_request(body, Dialect.ANTHROPIC, Dialect.ANTHROPIC, model="claude-b").body
    assert out == body.replace(b'"claude-a"', b'"claude-b"')
    streamed = translate_request(body, Dialect.ANTHROPIC, Dialect.ANTHROPIC, stream=True)
    assert streamed.body == body[:1] + b'"stream":true,' + body[1:]
    assert json_loads(streamed.body)["stream"] is True
    last = b'{"a":[1,{"b":2}],"model":"m1"}'
    assert translate_request(last, Dialect.OPENAI_CHAT, Dialect.OPENAI_CHAT, model="m2").body == (
        b'{"a":[1,{"b":2}],"model":"m2"}'
    )
    empty = translate_request(b"{}", Dialect.OPENAI_CHAT, Dialect.OPENAI_CHAT, model="m")
    assert empty.body == b'{"model":"m"}'


def test_gemini_passthrough_and_bad_bodies() -> None:
    body = b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}'
    result = translate_request(body, Dialect.GEMINI, Dialect.GEMINI, model="gemini-x", stream=True)
    assert (result.body, result.model, result.stream) == (body, "gemini-x", True)
    with pytest.raises(TranslationError) as info:
        translate_request(b"[1]", Dialect.ANTHROPIC, Dialect.OPENAI_CHAT)
    assert info.value.error_status_hint == 400
    with pytest.raises(TranslationError) as info:
        translate_response(b"not json", Dialect.ANTHROPIC, Dialect.GEMINI, client_model="m")
    assert info.value.error_status_hint == 502


def test_anthropic_target_gets_default_max_tokens() -> None:
    body = b'{"model":"gpt","messages":[{"role":"user","content":"hi"}]}'
    out = json_loads(translate_request(body, Dialect.OPENAI_CHAT, Dialect.ANTHROPIC).body)
    assert out["max_tokens"] == DEFAULT_MAX_TOKENS
    out = json_loads(
        translate_request(
            body, Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, default_max_tokens=64000
        ).body
    )
    assert out["max_tokens"] == 64000


# ----------------------------------------------------------------------------------------------
# Claude Code (tests/data/agents/bodies.py; docs/conversion.md)

CLAUDE_CODE = {
    "model": "some-alias",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": "Project instructions.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "system", "content": "You are running with an unfamiliar model."},
        {"role": "user", "content": [{"type": "text", "text": "List files"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use Bash.", "signature": "RXFvQkNrWUlDeGdD"},
                {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "content": "README.md\nsrc",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command",
            "input_schema": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "number", "exclusiveMinimum": 0},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        }
    ],
    "metadata": {"user_id": '{"device_id":"abc123","account_uuid":"u-1","session_id":"s-1-long"}'},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "stream": True,
}


def test_claude_code_to_chat() -> None:
    result = translate_request(
        json_dumps(CLAUDE_CODE), Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, model="glm-4.7"
    )
    body = json_loads(result.body)
    messages = body["messages"]
    assert messages[0] == {
        "role": "system",
        "content": "You are Claude Code, Anthropic's official CLI for Claude.",
    }
    assert messages[1] == {"role": "system", "content": "Project instructions."}
    # The in-conversation system message stays an instruction.
    assert messages[2] == {"role": "system", "content": "You are running with an unfamiliar model."}
    assert messages[4]["tool_calls"][0]["function"] == {
        "name": "Bash",
        "arguments": '{"command":"ls"}',
    }
    assert messages[5] == {"role": "tool", "tool_call_id": "toolu_01A", "content": "README.md\nsrc"}
    assert body["reasoning_effort"] == "high"  # budget 31999 reads as high
    assert body["max_completion_tokens"] == 32000
    assert body["stream_options"] == {"include_usage": True}
    assert "user" not in body
    for lost in (
        "cache_control",
        "context_management",
        "reasoning",
        "user (longer than 64 characters)",
    ):
        assert lost in result.dropped


def test_claude_code_to_responses_and_gemini() -> None:
    raw = json_dumps(CLAUDE_CODE)
    result = translate_request(raw, Dialect.ANTHROPIC, Dialect.OPENAI_RESPONSES, model="gpt-5")
    body = json_loads(result.body)
    assert body["instructions"].startswith("You are Claude Code")
    assert body["input"][0] == {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "You are running with an unfamiliar model."}],
    }
    reasoning = body["input"][2]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"] == "RXFvQkNrWUlDeGdD"
    assert body["input"][3]["type"] == "function_call"
    assert body["input"][4] == {
        "type": "function_call_output",
        "call_id": "toolu_01A",
        "output": "README.md\nsrc",
    }
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["include"] == ["reasoning.encrypted_content"] and body["store"] is False
    assert body["tools"][0]["strict"] is False

    gemini = json_loads(
        translate_request(raw, Dialect.ANTHROPIC, Dialect.GEMINI, model="gemini-2.5-flash").body
    )
    system = [p["text"] for p in gemini["systemInstruction"]["parts"]]
    assert system[-1] == "You are running with an unfamiliar model."
    call_part = gemini["contents"][1]["parts"][0]
    assert call_part["functionCall"] == {"name": "Bash", "args": {"command": "ls"}}
    assert call_part["thoughtSignature"] == "RXFvQkNrWUlDeGdD"
    assert gemini["contents"][2]["parts"][0]["functionResponse"] == {
        "name": "Bash",
        "response": {"output": "README.md\nsrc"},
    }
    params = gemini["tools"][0]["functionDeclarations"][0]["parameters"]
    assert params == {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
    }
    thinking = gemini["generationConfig"]["thinkingConfig"]
    assert thinking == {"includeThoughts": True, "thinkingBudget": 24576}  # capped for Flash
    gemini3 = json_loads(
        translate_request(raw, Dialect.ANTHROPIC, Dialect.GEMINI, model="gemini-3-pro").body
    )
    assert gemini3["generationConfig"]["thinkingConfig"]["thinkingLevel"] == "high"


def test_claude_code_adaptive_thinking() -> None:
    body = {**CLAUDE_CODE, "thinking": {"type": "adaptive"}, "output_config": {"effort": "xhigh"}}
    chat = json_loads(
        translate_request(json_dumps(body), Dialect.ANTHROPIC, Dialect.OPENAI_CHAT).body
    )
    assert chat["reasoning_effort"] == "xhigh"
    req = get(Dialect.ANTHROPIC).decode_request(body)
    assert req.reasoning == ir.ReasoningConfig(adaptive=True, effort=ir.Effort.XHIGH)
    back, _ = get(Dialect.ANTHROPIC).encode_request(req, model="claude")
    assert back["thinking"] == {"type": "adaptive"}
    assert back["output_config"] == {"effort": "xhigh"}


# ----------------------------------------------------------------------------------------------
# Codex CLI (tests/data/agents/bodies.py; docs/conversion.md)

CODEX = {
    "model": "gpt-5-codex",
    "instructions": None,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex. Sandbox: workspace-write."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look at the file."}],
            "encrypted_content": "gAAAAABpZPfm-sealed_",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_A",
            "name": "shell",
            "arguments": '{"command":["cat","a.py"]}',
        },
        {"type": "function_call_output", "call_id": "call_A", "output": "print(1)"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_B",
            "name": "apply_patch",
            "input": "*** Begin Patch\n*** End Patch\n",
        },
        {"type": "custom_tool_call_output", "call_id": "call_B", "output": "Done!"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "Run a shell command",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Apply a patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {
            "type": "namespace",
            "name": "github",
            "description": "GitHub tools",
            "tools": [
                {
                    "type": "function",
                    "name": "get_issue",
                    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
                }
            ],
        },
        {"type": "web_search"},
        {"type": "tool_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "019bb208-session",
    "client_metadata": {"x": "y"},
}


@pytest.mark.parametrize(
    "target", [Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.GEMINI], ids=str
)
def test_codex_to_other_formats(target: Dialect) -> None:
    result = translate_request(json_dumps(CODEX), Dialect.OPENAI_RESPONSES, target, model="m")
    req = get(target).decode_request(json_loads(result.body))
    system_text = "".join(t.text for t in req.system) + "".join(
        p.text
        for m in req.messages
        if m.role is ir.Role.SYSTEM
        for p in m.parts
        if isinstance(p, ir.Text)
    )
    assert "You are Codex." in system_text
    tools = {t.name: t for t in req.tools}
    assert set(tools) == {"shell", "apply_patch", "github__get_issue"}
    assert (tools["apply_patch"].parameters or {})["properties"]["input"]["type"] == "string"
    assert "tools:web_search" in result.dropped and "tools:tool_search" in result.dropped
    assert "include" in result.dropped and "client_metadata" in result.dropped
    calls = [p for m in req.messages for p in m.parts if isinstance(p, ir.ToolCall)]
    assert [(c.name, json_loads(c.arguments)) for c in calls] == [
        ("shell", {"command": ["cat", "a.py"]}),
        ("apply_patch", {"input": "*** Begin Patch\n*** End Patch\n"}),
    ]
    results = [p for m in req.messages for p in m.parts if isinstance(p, ir.ToolResult)]
    assert [r.text for r in results] == ["print(1)", "Done!"]
    # The renaming is handed back for the answer.
    assert result.tool_names.lookup("github__get_issue") == ir.ToolName(
        name="get_issue", namespace="github"
    )
    assert result.tool_names.lookup("apply_patch") == ir.ToolName(
        name="apply_patch", tool_kind=ir.ToolKind.CUSTOM
    )
    if target is Dialect.ANTHROPIC:
        body = json_loads(result.body)
        # The reasoning is sealed by OpenAI (a Fernet token): Anthropic would refuse it, so
        # it stays out, and the tool loop's turn, left without a thinking block, goes without
        # thinking (docs/conversion.md, "Reasoning in foreign histories").
        assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]
        assert "thinking" not in body
        assert {
            "reasoning.signature (OpenAI encrypted_content)",
            "reasoning (final assistant turn has no thinking block)",
        } <= set(result.dropped)


def test_codex_answer_maps_back_to_custom_and_namespace_calls() -> None:
    translated = translate_request(
        json_dumps(CODEX), Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC, model="claude"
    )
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "apply_patch",
                "input": {"input": "*** Begin Patch\n+x\n*** End Patch"},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "github__get_issue", "input": {"n": 7}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    whole = translate_response(
        json_dumps(answer),
        Dialect.ANTHROPIC,
        Dialect.OPENAI_RESPONSES,
        client_model="gpt-5-codex",
        tool_names=translated.tool_names,
    )
    output = json_loads(whole.body)["output"]
    assert output[0]["type"] == "custom_tool_call"
    assert output[0]["name"] == "apply_patch"
    assert output[0]["input"] == "*** Begin Patch\n+x\n*** End Patch"
    assert output[1]["type"] == "function_call"
    assert (output[1]["name"], output[1]["namespace"]) == ("get_issue", "github")

    # The same through a stream.
    from tests.twproto.test_convert_matrix import upstream_stream

    stream = upstream_stream(get(Dialect.ANTHROPIC).decode_response(answer), Dialect.ANTHROPIC)
    translator = new_stream_translator(
        Dialect.ANTHROPIC,
        Dialect.OPENAI_RESPONSES,
        client_model="gpt-5-codex",
        tool_names=translated.tool_names,
    )
    out = translator.feed(stream) + translator.end()
    events = [
        json_loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["type"] == "custom_tool_call"
    assert done[0]["input"] == "*** Begin Patch\n+x\n*** End Patch"
    assert any(e["type"] == "response.custom_tool_call_input.done" for e in events)
    assert (done[1]["name"], done[1]["namespace"]) == ("get_issue", "github")


def test_codex_same_format_roundtrip_keeps_everything() -> None:
    fmt = get(Dialect.OPENAI_RESPONSES)
    req = fmt.decode_request(CODEX)
    assert req.dropped == ()
    again, dropped = fmt.encode_request(req, model="gpt-5-codex")
    assert dropped == ()
    assert again == {k: v for k, v in CODEX.items() if v is not None}


# ----------------------------------------------------------------------------------------------
# Reasoning settings


def test_effort_table_roundtrips() -> None:
    for effort in (ir.Effort.LOW, ir.Effort.MEDIUM, ir.Effort.HIGH, ir.Effort.XHIGH):
        assert effort_for_budget(budget_for_effort(effort)) is effort
    assert effort_for_budget(31999) is ir.Effort.HIGH
    assert effort_for_budget(1024) is ir.Effort.LOW
    assert effort_for_budget(0) is ir.Effort.NONE


EFFORT_CASES: list[tuple[Dialect, dict[str, Any], Dialect, Any]] = [
    (
        Dialect.OPENAI_CHAT,
        {"reasoning_effort": "low"},
        Dialect.ANTHROPIC,
        {"type": "enabled", "budget_tokens": 2048},
    ),
    (
        Dialect.OPENAI_CHAT,
        {"reasoning_effort": "high"},
        Dialect.GEMINI,
        {"includeThoughts": True, "thinkingBudget": 24576},
    ),
    (
        Dialect.OPENAI_RESPONSES,
        {"reasoning": {"effort": "minimal"}},
        Dialect.OPENAI_CHAT,
        "minimal",
    ),
    (
        Dialect.ANTHROPIC,
        {"thinking": {"type": "enabled", "budget_tokens": 4000}},
        Dialect.OPENAI_RESPONSES,
        {"effort": "low", "summary": "auto"},
    ),
    (
        Dialect.GEMINI,
        {"generationConfig": {"thinkingConfig": {"thinkingBudget": 8192}}},
        Dialect.OPENAI_CHAT,
        "medium",
    ),
    (
        Dialect.GEMINI,
        {"generationConfig": {"thinkingConfig": {"thinkingLevel": "high"}}},
        Dialect.ANTHROPIC,
        {"type": "enabled", "budget_tokens": 24576},
    ),
    (
        Dialect.GEMINI,
        {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}},
        Dialect.OPENAI_CHAT,
        None,
    ),
    (Dialect.OPENAI_CHAT, {"reasoning_effort": "none"}, Dialect.ANTHROPIC, None),
]


@pytest.mark.parametrize(("source", "fields", "target", "want"), EFFORT_CASES)
def test_reasoning_effort_mapping(
    source: Dialect, fields: dict[str, Any], target: Dialect, want: Any
) -> None:
    base: dict[str, Any]
    if source is Dialect.GEMINI:
        base = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        base = {**base, **fields}
    elif source is Dialect.OPENAI_RESPONSES:
        base = {"model": "m", "input": "hi", **fields}
    else:
        base = {
            "model": "m",
            "max_tokens": 64000,
            "messages": [{"role": "user", "content": "hi"}],
            **fields,
        }
    out = json_loads(
        translate_request(
            json_dumps(base), source, target, model="gemini-2.5-flash", default_max_tokens=64000
        ).body
    )
    got: Any
    if target is Dialect.ANTHROPIC:
        got = out.get("thinking")
    elif target is Dialect.OPENAI_CHAT:
        got = out.get("reasoning_effort")
    elif target is Dialect.OPENAI_RESPONSES:
        got = out.get("reasoning")
    else:
        got = out.get("generationConfig", {}).get("thinkingConfig")
    assert got == want


def test_thinking_budget_fits_under_max_tokens() -> None:
    body = {
        "model": "m",
        "max_completion_tokens": 3000,
        "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
    }
    result = translate_request(json_dumps(body), Dialect.OPENAI_CHAT, Dialect.ANTHROPIC)
    out = json_loads(result.body)
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 2999}
    assert "temperature" not in out and "temperature (not allowed with thinking)" in result.dropped
    tiny = {**body, "max_completion_tokens": 500}
    result = translate_request(json_dumps(tiny), Dialect.OPENAI_CHAT, Dialect.ANTHROPIC)
    assert "thinking" not in json_loads(result.body)
    assert any(d.startswith("reasoning (max_tokens") for d in result.dropped)


# ----------------------------------------------------------------------------------------------
# Gemini schemas


def test_schema_sanitiser() -> None:
    schema = {
        "$schema": "x",
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "number"}},
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "point": {"$ref": "#/$defs/Point"},
            "kind": {"const": "circle"},
            "radius": {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 9},
            "tags": {
                "type": "array",
                "items": {"type": "string", "format": "uri"},
                "uniqueItems": True,
            },
            "meta": {
                "type": "object",
                "propertyNames": {"pattern": "^a"},
                "patternProperties": {"^a": {}},
                "unevaluatedProperties": False,
            },
            "choice": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "level": {"type": "integer", "enum": [1, 2]},
            "when": {"type": "string", "format": "date-time"},
        },
        "required": ["point", "missing"],
        "additionalProperties": False,
    }
    clean, removed = sanitize_schema(schema)
    props = clean["properties"]
    assert props["point"] == {"type": "object", "properties": {"x": {"type": "number"}}}
    assert props["kind"] == {"type": "string", "enum": ["circle"]}
    assert props["radius"] == {"type": "number", "nullable": True}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["meta"] == {"type": "object"}
    assert props["choice"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert props["maybe"] == {"type": "string", "nullable": True}
    assert props["level"] == {"type": "integer"}
    assert props["when"] == {"type": "string", "format": "date-time"}
    assert clean["required"] == ["point"]
    for keyword in (
        "$schema",
        "$ref",
        "$defs",
        "additionalProperties",
        "const",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "propertyNames",
        "patternProperties",
        "unevaluatedProperties",
        "uniqueItems",
    ):
        assert keyword in removed
    text = json_dumps(clean).decode()
    for keyword in ("$", "additionalProperties", "const", "exclusive", "propertyNames", "pattern"):
        assert keyword not in text


def test_schema_sanitiser_survives_recursion() -> None:
    schema = {
        "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    clean, _ = sanitize_schema(schema)
    assert clean["type"] == "object"
    assert clean["properties"]["child"] == {"type": "object"}


def test_parallel_tool_calls_and_tool_choice_mapping() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
    }
    raw = json_dumps(body)
    anthropic_body = json_loads(translate_request(raw, Dialect.OPENAI_CHAT, Dialect.ANTHROPIC).body)
    assert anthropic_body["tool_choice"] == {
        "type": "tool",
        "name": "f",
        "disable_parallel_tool_use": True,
    }
    gemini = translate_request(raw, Dialect.OPENAI_CHAT, Dialect.GEMINI)
    assert json_loads(gemini.body)["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}
    }
    assert "parallel_tool_calls" in gemini.dropped
    responses = json_loads(
        translate_request(raw, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES).body
    )
    assert responses["tool_choice"] == {"type": "function", "name": "f"}
    assert responses["parallel_tool_calls"] is False


def test_gemini_request_ids_pair_calls_and_responses() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "two lookups"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "look", "args": {"q": 1}}},
                    {"functionCall": {"name": "look", "args": {"q": 2}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "look", "response": {"output": "one"}}},
                    {"functionResponse": {"name": "look", "response": {"output": "two"}}},
                ],
            },
        ]
    }
    out = json_loads(
        translate_request(json_dumps(body), Dialect.GEMINI, Dialect.ANTHROPIC, model="claude").body
    )
    uses = [b["id"] for b in out["messages"][1]["content"]]
    results = [b["tool_use_id"] for b in out["messages"][2]["content"]]
    assert uses == results and len(set(uses)) == 2
    assert [b["content"] for b in out["messages"][2]["content"]] == ["one", "two"]
    # Gemini 3 needs a signature on the first replayed call; one from elsewhere has none.
    back = json_loads(
        translate_request(
            json_dumps(out), Dialect.ANTHROPIC, Dialect.GEMINI, model="gemini-3-pro"
        ).body
    )
    model_parts = back["contents"][1]["parts"]
    assert model_parts[0]["thoughtSignature"] == "skip_thought_signature_validator"
    assert "thoughtSignature" not in model_parts[1]
