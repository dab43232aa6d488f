"""The conversion matrix through the real gateway, judged by the official SDKs.

Every client format (Anthropic, OpenAI Chat, OpenAI Responses, Gemini — each driven by its own
SDK) against a mock upstream of every format, whole and streamed. Routing is by model name: each
mock upstream offers one model (``up-<format>-<script>``) and plays one script; the client asks
for an alias of it (``e2e-<format>-<script>``), so the answer's model name shows whether the
gateway names the model the client asked for.

One gateway with its 20 mocks runs for the whole module; the mocks' request logs tell what each
upstream received, in its own format.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.twserve.support.sdk_clients import SdkClients, sdk_clients
from tests.twserve.support.stack import Stack, Upstream, running_stack
from twmock.script import MockSettings, parse_script

pytestmark = pytest.mark.sdk

FORMATS = ("anthropic", "openai-chat", "openai-responses", "gemini")
SHORT = {
    "anthropic": "anthropic",
    "openai-chat": "chat",
    "openai-responses": "responses",
    "gemini": "gemini",
}

PROMPT = "Wie wird das Wetter in Zürich? Réponds brièvement 🌦️"
TEXT = "Grüße aus Zürich: 18 °C, sonnig ☀️ — 天气很好 🌍🚀"
TOOL_TEXT = "Ich prüfe das 🔎"
REASONING = "Der Nutzer fragt nach dem Wetter 🤔; zuerst die Werkzeuge prüfen…"
ANSWER = "Sonnig 🌞"
CUT = "Abgeschnit"
PARTIAL = "Teilantwort ✂️ bis hierher und weiter"
# The usage the "text" upstreams report: uncached input, cache read, cache write, output.
USAGE = {"input": 60, "cache_read": 40, "cache_write": 10, "output": 12}

# A 1×1 PNG.
PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
    "AAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG = base64.b64decode(PNG_B64)
DATA_URL = "data:image/png;base64," + PNG_B64

TOOLS = (
    ("get_weather", "The weather at a place."),
    ("get_time", "The local time at a place."),
)
SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"],
}
# What the mock puts into each of its parallel calls (its default arguments).
CALL_ARGS = [{"location": "Paris, France", "unit": "celsius", "call": i} for i in range(2)]
RESULTS = {"get_weather": "18 °C, sonnig ☀️", "get_time": "14:05 MEZ 🕑"}

SCRIPTS: dict[str, dict[str, Any]] = {
    "text": {"text": TEXT, "usage": USAGE},
    "tools": {"reasoning": REASONING, "text": TOOL_TEXT, "tool_calls": 2},
    "reasoning": {"reasoning": REASONING, "text": ANSWER},
    "length": {"text": CUT, "finish": "length"},
    "error": {"text": PARTIAL, "stream_error_after": 2},
    "thinks": {
        "reasoning": REASONING,
        "text": ANSWER,
        "usage": {**USAGE, "output": 262, "reasoning": 250},
    },
}

# Stop reasons as each client format writes them.
STOPS: dict[str, dict[str, Any]] = {
    "anthropic": {"end": "end_turn", "length": "max_tokens", "tool": "tool_use"},
    "openai-chat": {"end": "stop", "length": "length", "tool": "tool_calls"},
    "openai-responses": {
        "end": ("completed", None),
        "length": ("incomplete", "max_output_tokens"),
        "tool": ("completed", None),
    },
    "gemini": {"end": "STOP", "length": "MAX_TOKENS", "tool": "STOP"},
}

TIMEOUT = 5.0
CODEX = "e2e-codex"


def provider(upstream: str, script: str) -> str:
    return f"{SHORT[upstream]}-{script}"


def asked(upstream: str, script: str) -> str:
    """The model a client asks for to reach the `script` mock of format `upstream`."""
    return f"e2e-{SHORT[upstream]}-{script}"


def sent(upstream: str, script: str) -> str:
    """The model that mock offers, and receives (the alias resolved)."""
    return f"up-{SHORT[upstream]}-{script}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {
        provider(fmt, script): Upstream(
            fmt, MockSettings(script=parse_script(body)), models=[sent(fmt, script)]
        )
        for fmt in FORMATS
        for script, body in SCRIPTS.items()
    }
    aliases = {asked(fmt, script): sent(fmt, script) for fmt in FORMATS for script in SCRIPTS}
    # models only the row test asks for, so that it finds its own rows
    aliases |= {f"{CODEX}-{mode}": sent("openai-chat", "text") for mode in ("whole", "stream")}
    config = {
        "aliases": aliases,
        # the error scripts fail every request; keep those upstreams in play
        "failover": {"failures_to_pause": 100, "wait_secs": 0},
    }
    data_dir: Path = tmp_path_factory.mktemp("convert-e2e")
    with running_stack(data_dir, upstreams, config=config) as stack:
        yield stack


@pytest.fixture(scope="module")
def clients(gateway: Stack) -> Iterator[SdkClients]:
    with sdk_clients(gateway.url, timeout=TIMEOUT) as made:
        yield made


# ----------------------------------------------------------------------------------------------
# Asking through each SDK


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer as the client's SDK parsed it, reduced to what the tests compare."""

    model: str
    text: str
    reasoning: str
    calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments)
    stop: Any  # as the client format writes it, see STOPS
    # all input, cache read, cache write (None: the client format has none), output
    usage: tuple[int, int, int | None, int] | None
    raw: Any  # the SDK's own object, for the next turn


def ask(
    clients: SdkClients,
    client: str,
    model: str,
    *,
    stream: bool,
    tools: bool = False,
    image: bool = False,
    follow_up: Reply | None = None,
) -> Reply:
    """One request through the official SDK of `client`; `follow_up` answers its tool calls."""
    if client == "anthropic":
        return _ask_anthropic(clients.anthropic, model, stream, tools, image, follow_up)
    if client == "openai-chat":
        return _ask_chat(clients.openai, model, stream, tools, image, follow_up)
    if client == "openai-responses":
        return _ask_responses(clients.openai, model, stream, tools, image, follow_up)
    return _ask_gemini(clients.genai, model, stream, tools, image, follow_up)


def _anthropic_block(block: Any) -> dict[str, Any]:
    """An answer's block as the next request replays it (the way Claude Code does)."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    assert block.type == "tool_use", block.type
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}


def _ask_anthropic(
    c: anthropic.Anthropic,
    model: str,
    stream: bool,
    tools: bool,
    image: bool,
    follow_up: Reply | None,
) -> Reply:
    content: list[dict[str, Any]] = [{"type": "text", "text": PROMPT}]
    if image:
        source = {"type": "base64", "media_type": "image/png", "data": PNG_B64}
        content.append({"type": "image", "source": source})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    if follow_up is not None:
        blocks = follow_up.raw.content
        messages.append(
            {
                "role": "assistant",
                "content": [
                    _anthropic_block(b)
                    for b in blocks
                    if b.type != "thinking" or b.signature  # the API refuses unsigned thinking
                ],
            }
        )
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": RESULTS[b.name]}
            for b in blocks
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    kwargs: dict[str, Any] = {"model": model, "max_tokens": 256, "messages": messages}
    if tools:
        kwargs["tools"] = [{"name": n, "description": d, "input_schema": SCHEMA} for n, d in TOOLS]
    if stream:
        with c.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = c.messages.create(**kwargs)
    u = message.usage
    cache_read = u.cache_read_input_tokens or 0
    cache_write = u.cache_creation_input_tokens or 0
    return Reply(
        model=message.model,
        text="".join(b.text for b in message.content if b.type == "text"),
        reasoning="".join(b.thinking for b in message.content if b.type == "thinking"),
        calls=[(b.id, b.name, dict(b.input)) for b in message.content if b.type == "tool_use"],
        stop=message.stop_reason,
        usage=(u.input_tokens + cache_read + cache_write, cache_read, cache_write, u.output_tokens),
        raw=message,
    )


def _ask_chat(
    c: openai.OpenAI,
    model: str,
    stream: bool,
    tools: bool,
    image: bool,
    follow_up: Reply | None,
) -> Reply:
    content: list[dict[str, Any]] = [{"type": "text", "text": PROMPT}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": DATA_URL}})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    if follow_up is not None:
        msg = follow_up.raw.choices[0].message
        calls = [call for call in msg.tool_calls or () if call.type == "function"]
        messages.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                    for call in calls
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": call.id, "content": RESULTS[call.function.name]}
            for call in calls
        )
    kwargs: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        kwargs["tools"] = [
            {"type": "function", "function": {"name": n, "description": d, "parameters": SCHEMA}}
            for n, d in TOOLS
        ]
    if stream:
        with c.chat.completions.stream(**kwargs, stream_options={"include_usage": True}) as events:
            try:
                completion: Any = events.get_final_completion()
            except openai.LengthFinishReasonError as exc:
                # The helper refuses to parse a cut-off answer; it keeps what arrived, without
                # the usage.
                completion = exc.completion
    else:
        completion = c.chat.completions.create(**kwargs)
    choice = completion.choices[0]
    u = completion.usage
    if u is None:
        assert stream and choice.finish_reason == "length", "no usage"
        usage = None
    else:
        details = u.prompt_tokens_details
        cache_read = (details.cached_tokens if details else 0) or 0
        cache_write = (getattr(details, "cache_write_tokens", None) if details else 0) or 0
        usage = (u.prompt_tokens, cache_read, cache_write, u.completion_tokens)
    return Reply(
        model=completion.model,
        text=choice.message.content or "",
        reasoning=getattr(choice.message, "reasoning_content", None) or "",
        calls=[
            (call.id, call.function.name, json.loads(call.function.arguments))
            for call in choice.message.tool_calls or ()
            if call.type == "function"
        ],
        stop=choice.finish_reason,
        usage=usage,
        raw=completion,
    )


class ResponseFailed(Exception):
    """A Responses stream ended with ``response.failed`` (the SDK hands it over as an event)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def _responses_stream(c: openai.OpenAI, kwargs: dict[str, Any]) -> Any:
    """The final response of a Responses stream, however it ended."""
    with c.responses.stream(**kwargs) as events:
        last: Any = None
        for event in events:
            last = event
        assert last is not None, "an empty stream"
        if last.type == "response.failed":
            error = last.response.error
            raise ResponseFailed(error.message if error else "response.failed")
        if last.type == "response.incomplete":
            # The SDK's get_final_response() only knows response.completed.
            return last.response
        assert last.type == "response.completed", last.type
        return events.get_final_response()


def _ask_responses(
    c: openai.OpenAI,
    model: str,
    stream: bool,
    tools: bool,
    image: bool,
    follow_up: Reply | None,
) -> Reply:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": PROMPT}]
    if image:
        content.append({"type": "input_image", "image_url": DATA_URL, "detail": "auto"})
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": content}]
    if follow_up is not None:
        # Replayed the way Codex does: the answer's items, then one output per call.
        output = follow_up.raw.output
        for item in output:
            if item.type == "message":
                text = "".join(p.text for p in item.content if p.type == "output_text")
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }
                )
            elif item.type == "reasoning":
                reasoning: dict[str, Any] = {
                    "type": "reasoning",
                    "id": item.id,
                    "summary": [{"type": "summary_text", "text": p.text} for p in item.summary],
                }
                if item.encrypted_content:
                    reasoning["encrypted_content"] = item.encrypted_content
                items.append(reasoning)
            elif item.type == "function_call":
                items.append(
                    {
                        "type": "function_call",
                        "id": item.id,
                        "call_id": item.call_id,
                        "name": item.name,
                        "arguments": item.arguments,
                    }
                )
        items.extend(
            {"type": "function_call_output", "call_id": item.call_id, "output": RESULTS[item.name]}
            for item in output
            if item.type == "function_call"
        )
    kwargs: dict[str, Any] = {"model": model, "input": items}
    if tools:
        kwargs["tools"] = [
            {"type": "function", "name": n, "description": d, "parameters": SCHEMA}
            for n, d in TOOLS
        ]
    response: Any = _responses_stream(c, kwargs) if stream else c.responses.create(**kwargs)
    u = response.usage
    assert u is not None, "no usage"
    details = u.input_tokens_details
    cache_read = (details.cached_tokens if details else 0) or 0
    cache_write = (getattr(details, "cache_write_tokens", None) if details else 0) or 0
    incomplete = response.incomplete_details
    return Reply(
        model=response.model,
        text="".join(
            p.text
            for item in response.output
            if item.type == "message"
            for p in item.content
            if p.type == "output_text"
        ),
        reasoning="".join(
            s.text for item in response.output if item.type == "reasoning" for s in item.summary
        ),
        calls=[
            (item.call_id, item.name, json.loads(item.arguments))
            for item in response.output
            if item.type == "function_call"
        ],
        stop=(response.status, incomplete.reason if incomplete else None),
        usage=(u.input_tokens, cache_read, cache_write, u.output_tokens),
        raw=response,
    )


def _ask_gemini(
    c: Any,
    model: str,
    stream: bool,
    tools: bool,
    image: bool,
    follow_up: Reply | None,
) -> Reply:
    parts = [gtypes.Part.from_text(text=PROMPT)]
    if image:
        parts.append(gtypes.Part.from_bytes(data=PNG, mime_type="image/png"))
    contents = [gtypes.Content(role="user", parts=parts)]
    if follow_up is not None:
        turn: gtypes.Content = follow_up.raw.candidates[0].content
        contents.append(turn)
        contents.append(
            gtypes.Content(
                role="user",
                parts=[
                    gtypes.Part(
                        function_response=gtypes.FunctionResponse(
                            id=p.function_call.id,
                            name=p.function_call.name,
                            response={"output": RESULTS[p.function_call.name or ""]},
                        )
                    )
                    for p in turn.parts or ()
                    if p.function_call is not None
                ],
            )
        )
    config = gtypes.GenerateContentConfig(
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    if tools:
        config.tools = [
            gtypes.Tool(
                function_declarations=[
                    gtypes.FunctionDeclaration(name=n, description=d, parameters_json_schema=SCHEMA)
                    for n, d in TOOLS
                ]
            )
        ]
    if stream:
        chunks = list(
            c.models.generate_content_stream(model=model, contents=contents, config=config)
        )
    else:
        chunks = [c.models.generate_content(model=model, contents=contents, config=config)]
    text, thoughts = [], []
    calls: list[tuple[str, str, dict[str, Any]]] = []
    usage = finish = model_version = None
    for chunk in chunks:
        usage = chunk.usage_metadata or usage
        model_version = chunk.model_version or model_version
        for cand in chunk.candidates or ():
            finish = cand.finish_reason or finish
            for part in (cand.content.parts if cand.content else None) or ():
                if part.text:
                    (thoughts if part.thought else text).append(part.text)
                if part.function_call is not None:
                    fc = part.function_call
                    calls.append((fc.id or "", fc.name or "", dict(fc.args or {})))
    assert usage is not None, "no usage metadata"
    output = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
    return Reply(
        model=model_version or "",
        text="".join(text),
        reasoning="".join(thoughts),
        calls=calls,
        stop=finish.value if finish else None,
        usage=(usage.prompt_token_count or 0, usage.cached_content_token_count or 0, None, output),
        raw=chunks[-1],
    )


# ----------------------------------------------------------------------------------------------
# What an upstream received, read in its own format


def received_images(upstream: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(media type, base64 data) of every image in the request's user turns."""
    found: list[tuple[str, str]] = []
    if upstream == "anthropic":
        for msg in body["messages"]:
            for block in msg["content"] if isinstance(msg["content"], list) else ():
                if block["type"] == "image":
                    src = block["source"]
                    assert src["type"] == "base64", src
                    found.append((src["media_type"], src["data"]))
    elif upstream == "openai-chat":
        for msg in body["messages"]:
            for part in msg["content"] if isinstance(msg["content"], list) else ():
                if part["type"] == "image_url":
                    found.append(_split_data_url(part["image_url"]["url"]))
    elif upstream == "openai-responses":
        for item in body["input"]:
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "input_image":
                    found.append(_split_data_url(part["image_url"]))
    else:
        for content in body["contents"]:
            for part in content["parts"]:
                if "inlineData" in part:
                    blob = part["inlineData"]
                    # Google's SDK writes mime_type (Gemini reads both spellings).
                    found.append((blob.get("mimeType", blob.get("mime_type")), blob["data"]))
    return found


def _split_data_url(url: str) -> tuple[str, str]:
    head, _, data = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), url[:40]
    return head[len("data:") : -len(";base64")], data


def received_texts(upstream: str, body: dict[str, Any]) -> list[str]:
    """Every text part of the request's conversation."""
    texts: list[str] = []
    if upstream in ("anthropic", "openai-chat"):
        for msg in body["messages"]:
            if isinstance(msg["content"], str):
                texts.append(msg["content"])
                continue
            texts.extend(p["text"] for p in msg["content"] or () if p.get("type") == "text")
    elif upstream == "openai-responses":
        for item in body["input"]:
            content = item.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(p["text"] for p in content if "text" in p)
    else:
        for content in body["contents"]:
            texts.extend(p["text"] for p in content["parts"] if "text" in p)
    return texts


def received_tool_turns(
    upstream: str, body: dict[str, Any]
) -> tuple[list[tuple[str, str, dict[str, Any]]], list[tuple[str, str]]]:
    """The replayed calls (id, name, arguments) and the results (the id or, for Gemini, which
    pairs by name, the name of the call they answer; the output text)."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    results: list[tuple[str, str]] = []
    if upstream == "anthropic":
        for msg in body["messages"]:
            for block in msg["content"] if isinstance(msg["content"], list) else ():
                if block["type"] == "tool_use":
                    calls.append((block["id"], block["name"], block["input"]))
                elif block["type"] == "tool_result":
                    content = block["content"]
                    if isinstance(content, list):
                        content = "".join(p["text"] for p in content if p["type"] == "text")
                    results.append((block["tool_use_id"], content))
    elif upstream == "openai-chat":
        for msg in body["messages"]:
            for call in msg.get("tool_calls") or ():
                fn = call["function"]
                calls.append((call["id"], fn["name"], json.loads(fn["arguments"])))
            if msg["role"] == "tool":
                results.append((msg["tool_call_id"], msg["content"]))
    elif upstream == "openai-responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                calls.append((item["call_id"], item["name"], json.loads(item["arguments"])))
            elif item.get("type") == "function_call_output":
                results.append((item["call_id"], item["output"]))
    else:
        for content in body["contents"]:
            for part in content["parts"]:
                if "functionCall" in part:
                    fc = part["functionCall"]
                    calls.append((fc["name"], fc["name"], fc.get("args", {})))
                elif "functionResponse" in part:
                    fr = part["functionResponse"]
                    results.append((fr["name"], fr["response"]["output"]))
    return calls, results


def client_seals(client: str, reply: Reply) -> list[str]:
    """The reasoning seals the client was given, in its format's own spelling."""
    if client == "anthropic":
        return [b.signature for b in reply.raw.content if b.type == "thinking" and b.signature]
    if client == "openai-responses":
        return [
            item.encrypted_content
            for item in reply.raw.output
            if item.type == "reasoning" and item.encrypted_content
        ]
    if client == "gemini":
        parts = reply.raw.candidates[0].content.parts or ()
        return [
            base64.b64encode(p.thought_signature).decode() for p in parts if p.thought_signature
        ]
    return []  # Chat has no seals


def received_seals(upstream: str, body: dict[str, Any]) -> list[str]:
    """The seals replayed in the request's model turns."""
    if upstream == "anthropic":
        return [
            b["signature"]
            for msg in body["messages"]
            if msg["role"] == "assistant" and isinstance(msg["content"], list)
            for b in msg["content"]
            if b["type"] == "thinking"
        ]
    if upstream == "openai-responses":
        return [
            item["encrypted_content"]
            for item in body["input"]
            if item.get("type") == "reasoning" and item.get("encrypted_content")
        ]
    if upstream == "gemini":
        return [
            p.get("thoughtSignature", p.get("thought_signature"))
            for content in body["contents"]
            if content["role"] == "model"
            for p in content["parts"]
            if "thoughtSignature" in p or "thought_signature" in p
        ]
    return []


def received_thinking(body: dict[str, Any]) -> list[str]:
    return [
        b["thinking"]
        for msg in body["messages"]
        if msg["role"] == "assistant" and isinstance(msg["content"], list)
        for b in msg["content"]
        if b["type"] == "thinking"
    ]


def _b64bytes(value: str) -> bytes:
    """Base64 in either alphabet, decoded."""
    return base64.urlsafe_b64decode(
        value.replace("+", "-").replace("/", "_") + "=" * (-len(value) % 4)
    )


# ----------------------------------------------------------------------------------------------
# The matrix


def expected_usage(client: str, upstream: str) -> tuple[int, int, int | None, int]:
    total = USAGE["input"] + USAGE["cache_read"] + USAGE["cache_write"]
    if client == "gemini":
        cache_write = None  # Gemini has no cache writes; they stay inside the prompt count
    elif upstream == "anthropic":
        cache_write = USAGE["cache_write"]
    else:
        cache_write = 0  # only Anthropic reports cache writes; elsewhere they are plain input
    return (total, USAGE["cache_read"], cache_write, USAGE["output"])


@pytest.mark.parametrize("scenario", ["text", "image", "tools", "reasoning", "length"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("upstream", FORMATS)
@pytest.mark.parametrize("client", FORMATS)
def test_matrix(
    gateway: Stack, clients: SdkClients, client: str, upstream: str, stream: bool, scenario: str
) -> None:
    script = "text" if scenario == "image" else scenario
    reply = ask(
        clients,
        client,
        asked(upstream, script),
        stream=stream,
        tools=scenario == "tools",
        image=scenario == "image",
    )
    # Under an alias, even a same-format answer names the model the client asked for.
    assert reply.model == asked(upstream, script)
    stops = STOPS[client]

    if scenario in ("text", "image"):
        assert reply.text == TEXT
        assert reply.calls == []
        assert reply.stop == stops["end"]
        assert reply.usage == expected_usage(client, upstream)

    if scenario == "image":
        body = gateway.mock(provider(upstream, script)).received[-1].json()
        if upstream == "gemini":
            path = gateway.mock(provider(upstream, script)).received[-1].path
            assert f"/models/{sent(upstream, script)}:" in path
        else:
            assert body["model"] == sent(upstream, script)
        # Google's SDK writes bytes URL-safe: relayed as they are to Gemini, converted to the
        # standard alphabet for the APIs that accept only that.
        same_gemini = client == upstream == "gemini"
        data = base64.urlsafe_b64encode(PNG).decode() if same_gemini else PNG_B64
        assert received_images(upstream, body) == [("image/png", data)]
        assert PROMPT in received_texts(upstream, body)

    if scenario == "tools":
        assert reply.text == TOOL_TEXT
        assert [(name, args) for _, name, args in reply.calls] == [
            ("get_weather", CALL_ARGS[0]),
            ("get_time", CALL_ARGS[1]),
        ]
        if client != "gemini":
            ids = [call_id for call_id, _, _ in reply.calls]
            assert all(ids) and len(set(ids)) == 2, ids
        assert reply.stop == stops["tool"]

    if scenario == "reasoning":
        assert reply.reasoning == REASONING
        assert reply.text == ANSWER
        assert reply.calls == []
        assert reply.stop == stops["end"]

    if scenario == "length":
        assert reply.text == CUT
        assert reply.stop == stops["length"]


# ----------------------------------------------------------------------------------------------
# A tool round trip


@pytest.mark.parametrize("upstream", FORMATS)
@pytest.mark.parametrize("client", FORMATS)
def test_tool_round_trip(gateway: Stack, clients: SdkClients, client: str, upstream: str) -> None:
    """The client answers the calls; the upstream gets its own format's results, paired."""
    model = asked(upstream, "tools")
    first = ask(clients, client, model, stream=False, tools=True)
    assert [name for _, name, _ in first.calls] == ["get_weather", "get_time"]
    mock = gateway.mock(provider(upstream, "tools"))
    issued, _ = received_tool_turns(upstream, mock.received[-1].json())
    assert issued == []

    ask(clients, client, model, stream=False, tools=True, follow_up=first)
    body = mock.received[-1].json()
    calls, results = received_tool_turns(upstream, body)
    assert [(name, args) for _, name, args in calls] == [
        ("get_weather", CALL_ARGS[0]),
        ("get_time", CALL_ARGS[1]),
    ]
    # Each result answers its call (by id, or for Gemini by name), in order.
    assert [key for key, _ in results] == [key for key, _, _ in calls]
    assert len({key for key, _, _ in calls}) == 2
    assert [output for _, output in results] == [RESULTS["get_weather"], RESULTS["get_time"]]
    if client != "gemini" and upstream != "gemini":
        # Ids go back to the upstream as the client saw them.
        assert [key for key, _, _ in calls] == [call_id for call_id, _, _ in first.calls]
    assert PROMPT in received_texts(upstream, body)
    assert TOOL_TEXT in received_texts(upstream, body)
    # The reasoning's seals come back as the upstream wrote them — an Anthropic signature in
    # standard base64 though Google's SDK replays bytes URL-safe; Gemini takes either alphabet.
    seen = client_seals(client, first)
    got = received_seals(upstream, body)
    if upstream == "gemini":
        assert [_b64bytes(s) for s in got] == [_b64bytes(s) for s in seen]
    else:
        assert got == seen
    if upstream == "anthropic" and seen:
        assert received_thinking(body) == [REASONING]


# ----------------------------------------------------------------------------------------------
# What a conversion dropped is on the request's row


def row_of(gateway: Stack, model: str, client: str = "openai-responses") -> dict[str, Any]:
    """The one stored row of a request for `model` from a `client`, once it is written."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        rows = [r for r in gateway.wait_rows(0) if r["model"] == model and r["format"] == client]
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_dropped_hosted_tool_is_recorded(gateway: Stack, clients: SdkClients, stream: bool) -> None:
    """A Codex-shaped request with a ``web_search`` tool, served by a Chat upstream."""
    model = f"{CODEX}-{'stream' if stream else 'whole'}"
    kwargs: dict[str, Any] = {
        "model": model,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": PROMPT}],
            },
        ],
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": False},
            {"type": "web_search"},
        ],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "parallel_tool_calls": True,
    }
    response: Any = (
        _responses_stream(clients.openai, kwargs)
        if stream
        else clients.openai.responses.create(**kwargs)
    )
    assert response.output_text == TEXT

    upstream_body = gateway.mock(provider("openai-chat", "text")).received[-1].json()
    assert [t["function"]["name"] for t in upstream_body["tools"]] == ["get_weather"]

    row = row_of(gateway, model)
    assert row["format"] == "openai-responses"
    assert row["model"] == model
    assert row["provider"] == provider("openai-chat", "text")
    assert row["status"] == 200
    assert row["stream"] == int(stream)
    assert (
        row["input_tokens"],
        row["cache_read_tokens"],
        row["cache_write_tokens"],
        row["output_tokens"],
    ) == (
        # A Chat upstream reports no cache writes: they count as uncached input.
        USAGE["input"] + USAGE["cache_write"],
        USAGE["cache_read"],
        0,
        USAGE["output"],
    )
    assert "tools:web_search" in json.loads(row["translated"])


# ----------------------------------------------------------------------------------------------
# An upstream error after content


def _stream_until_error(clients: SdkClients, client: str, model: str, sink: list[str]) -> None:
    """Stream through the SDK of `client`, collecting text; returns only on a clean end."""
    if client == "anthropic":
        with clients.anthropic.messages.stream(
            model=model, max_tokens=256, messages=[{"role": "user", "content": PROMPT}]
        ) as events:
            sink.extend(events.text_stream)
    elif client == "openai-chat":
        with clients.openai.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
        ) as chunks:
            for chunk in chunks:
                sink.extend(c.delta.content or "" for c in chunk.choices)
    elif client == "openai-responses":
        with clients.openai.responses.stream(model=model, input=PROMPT) as events:
            last: Any = None
            for event in events:
                last = event
                if event.type == "response.output_text.delta":
                    sink.append(event.delta)
            if last is not None and last.type == "response.failed":
                # The SDK hands the failure over as the last event and has no final response.
                with pytest.raises(RuntimeError, match=r"response\.completed"):
                    events.get_final_response()
                error = last.response.error
                raise ResponseFailed(
                    error.message if error else "response.failed", error.code if error else ""
                )
    else:
        for chunk in clients.genai.models.generate_content_stream(model=model, contents=PROMPT):
            sink.append(chunk.text or "")


ERRORS: dict[str, type[Exception] | tuple[type[Exception], ...]] = {
    "anthropic": anthropic.APIStatusError,
    "openai-chat": openai.APIError,
    # Same format, the upstream's own ``error`` event, which the SDK raises; converted, a
    # ``response.failed`` (see _stream_until_error).
    "openai-responses": (openai.APIError, ResponseFailed),
    "gemini": genai_errors.APIError,
}


@pytest.mark.parametrize("upstream", FORMATS)
@pytest.mark.parametrize("client", FORMATS)
def test_error_after_content_reaches_the_sdk(
    gateway: Stack, clients: SdkClients, client: str, upstream: str
) -> None:
    sink: list[str] = []
    with pytest.raises(ERRORS[client]):
        _stream_until_error(clients, client, asked(upstream, "error"), sink)
    # The mock sent two 4-character chunks before its error event; they reached the client.
    assert "".join(sink) == PARTIAL[:8]
    assert gateway.mock(provider(upstream, "error")).received[-1].outcome == "stream_error"
    row = row_of(gateway, asked(upstream, "error"), client)
    assert row["provider"] == provider(upstream, "error")
    assert row["error_code"] == "gw.upstream.broken_after_content"


# The error types each API documents for an error inside a stream (Anthropic's errors page and
# SDK `ErrorType`; the Responses reference's `ResponseError.code`, plus the `insufficient_quota`
# the real API sends; google.rpc canonical codes with their HTTP status).
ANTHROPIC_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "timeout_error",
    "overloaded_error",
}
GEMINI_CODES = {"INTERNAL": 500, "UNAVAILABLE": 503, "RESOURCE_EXHAUSTED": 429}


def _error_words(client: str, error: Exception) -> tuple[str, ...]:
    """What the client's SDK says the error was: its type, code or status."""
    if client == "anthropic":
        assert isinstance(error, anthropic.APIStatusError)
        body = error.body
        assert isinstance(body, dict) and body["type"] == "error"
        return (body["error"]["type"],)
    if client == "openai-chat":
        assert isinstance(error, openai.APIError)
        return (str(error.type),)
    if client == "openai-responses":
        if isinstance(error, ResponseFailed):
            return (error.code,)
        assert isinstance(error, openai.APIError)
        return (str(error.code),)
    assert isinstance(error, genai_errors.APIError)
    return (str(error.status), str(error.code))


@pytest.mark.parametrize("upstream", FORMATS)
@pytest.mark.parametrize("client", FORMATS)
def test_overload_after_content_in_the_clients_words(
    gateway: Stack, clients: SdkClients, client: str, upstream: str
) -> None:
    # Every mock's mid-stream error is its API's own overload (Anthropic overloaded_error, Chat
    # server_error "The server is overloaded…", Responses server_error, Gemini UNAVAILABLE).
    with pytest.raises(ERRORS[client]) as caught:
        _stream_until_error(clients, client, asked(upstream, "error"), [])
    words = _error_words(client, caught.value)
    if client == "anthropic":
        assert words == ("overloaded_error",)
        assert words[0] in ANTHROPIC_TYPES
    elif client == "openai-chat" or client == "openai-responses":
        assert words == ("server_error",)
    else:
        assert words == ("UNAVAILABLE", "503")
        assert GEMINI_CODES[words[0]] == int(words[1])


def _reasoning_tokens(client: str, raw: Any) -> int | None:
    """The reasoning count in the client SDK's own usage object (None: the field is absent)."""
    if client == "anthropic":
        details = raw.usage.output_tokens_details
        return None if details is None else details.thinking_tokens
    if client == "openai-chat":
        details = raw.usage.completion_tokens_details
        return None if details is None else details.reasoning_tokens
    if client == "openai-responses":
        return raw.usage.output_tokens_details.reasoning_tokens
    count: int | None = raw.usage_metadata.thoughts_token_count
    return count


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("upstream", FORMATS)
@pytest.mark.parametrize("client", FORMATS)
def test_reasoning_tokens_reach_every_client(
    clients: SdkClients, client: str, upstream: str, stream: bool
) -> None:
    # The upstream reported 250 of its 262 output tokens as reasoning, in its own field
    # (Anthropic output_tokens_details.thinking_tokens, Chat completion_tokens_details,
    # Responses output_tokens_details, Gemini thoughtsTokenCount).
    reply = ask(clients, client, asked(upstream, "thinks"), stream=stream)
    assert reply.reasoning == REASONING
    assert _reasoning_tokens(client, reply.raw) == 250


# ----------------------------------------------------------------------------------------------
# Images in tool results (a screenshot tool, as computer-use and browser agents have)

SHOT_TOOL = {"name": "screenshot", "description": "A screenshot of the screen."}


def _send_screenshot_result(clients: SdkClients, client: str, model: str) -> str:
    """A history whose last tool result is a text and a PNG; returns the answer's text."""
    if client == "anthropic":
        message = clients.anthropic.messages.create(
            model=model,
            max_tokens=256,
            tools=[{**SHOT_TOOL, "input_schema": {"type": "object", "properties": {}}}],
            messages=[
                {"role": "user", "content": "Take a screenshot"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_01", "name": "screenshot", "input": {}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_01",
                            "content": [
                                {"type": "text", "text": "Here it is"},
                                {
                                    "type": "image",
                                    "source": {
                                        "type": "base64",
                                        "media_type": "image/png",
                                        "data": PNG_B64,
                                    },
                                },
                            ],
                        }
                    ],
                },
            ],
        )
        return "".join(b.text for b in message.content if b.type == "text")
    response = clients.openai.responses.create(
        model=model,
        tools=[{"type": "function", **SHOT_TOOL, "parameters": {"type": "object"}}],
        input=[
            {"role": "user", "content": "Take a screenshot"},
            {
                "type": "function_call",
                "call_id": "call_01",
                "name": "screenshot",
                "arguments": "{}",
            },
            {
                "type": "function_call_output",
                "call_id": "call_01",
                "output": [
                    {"type": "input_text", "text": "Here it is"},
                    {"type": "input_image", "image_url": DATA_URL},
                ],
            },
        ],
    )
    return response.output_text


@pytest.mark.parametrize("upstream", ["openai-chat", "gemini"])
@pytest.mark.parametrize("client", ["anthropic", "openai-responses"])
def test_tool_result_image_reaches_the_upstream(
    gateway: Stack, clients: SdkClients, client: str, upstream: str
) -> None:
    # The Chat mock refuses an image in a `tool` message with the API's own 400.
    assert _send_screenshot_result(clients, client, asked(upstream, "text")) == TEXT
    body = gateway.mock(provider(upstream, "text")).received[-1].json()
    assert received_images(upstream, body) == [("image/png", PNG_B64)]
    if upstream == "openai-chat":
        roles = [m["role"] for m in body["messages"]]
        # The tool message follows the call; the image comes in the user message after it.
        assert roles[-3:] == ["assistant", "tool", "user"]
        assert body["messages"][-2]["content"] == "Here it is"
    else:
        parts = body["contents"][-1]["parts"]
        assert "functionResponse" in parts[0] and "inlineData" in parts[-1]


@pytest.mark.parametrize("url", ["https://example.com/shot.png", "https://example.com/a.webp?x=1"])
def test_image_url_reaches_gemini_with_its_type(
    gateway: Stack, clients: SdkClients, url: str
) -> None:
    clients.openai.chat.completions.create(
        model=asked("gemini", "text"),
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": PROMPT},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    )
    body = gateway.mock(provider("gemini", "text")).received[-1].json()
    files = [p["fileData"] for c in body["contents"] for p in c["parts"] if "fileData" in p]
    expected = "image/png" if url.endswith(".png") else "image/webp"
    assert files == [{"mimeType": expected, "fileUri": url}]
