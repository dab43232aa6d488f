"""Anthropic Messages requests ⇄ IR.

The wire vocabulary the response and stream codecs share (the dialect, the finish reasons, the
decoders of content parts) is defined here, with the request codec that uses it first; the
package docstring of `twproto.formats.anthropic` tells how the format maps to the IR.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.dialect import Dialect
from twproto.effort import ANTHROPIC_EFFORT, ANTHROPIC_MIN_BUDGET, budget_for_effort, parse_effort
from twproto.formats._common import (
    EMPTY_PARAMETERS,
    Dropped,
    as_dict,
    as_list,
    as_str,
    builtin_tool,
    carry_extras,
    flat_name,
    flatten_call,
    flatten_tool,
    is_base64,
    json_text,
    opt_bool,
    opt_float,
    opt_int,
    parse_arguments,
    standard_base64,
)
from twproto.formats.seals import welcome_seal

__all__ = (
    "DEFAULT_MAX_TOKENS",
    "DIALECT",
    "decode_request",
    "encode_request",
)


DIALECT = Dialect.ANTHROPIC

#: ``max_tokens`` for a request converted to Anthropic that set no output limit and whose
#: caller did not pass the model's own limit. Every current Claude model accepts it.
DEFAULT_MAX_TOKENS = 8192

STOP_FROM: Mapping[str, ir.StopReason] = {
    "end_turn": ir.StopReason.END_TURN,
    "max_tokens": ir.StopReason.MAX_TOKENS,
    "stop_sequence": ir.StopReason.STOP_SEQUENCE,
    "tool_use": ir.StopReason.TOOL_USE,
    "pause_turn": ir.StopReason.PAUSE,
    "refusal": ir.StopReason.REFUSAL,
    "model_context_window_exceeded": ir.StopReason.MAX_TOKENS,
}
STOP_TO: Mapping[ir.StopReason, str] = {
    ir.StopReason.END_TURN: "end_turn",
    ir.StopReason.MAX_TOKENS: "max_tokens",
    ir.StopReason.STOP_SEQUENCE: "stop_sequence",
    ir.StopReason.TOOL_USE: "tool_use",
    ir.StopReason.PAUSE: "pause_turn",
    ir.StopReason.REFUSAL: "refusal",
    ir.StopReason.CONTENT_FILTER: "refusal",
    ir.StopReason.ERROR: "end_turn",
    ir.StopReason.OTHER: "end_turn",
}

# Top-level request fields with an IR slot; anything else is an extra.
_REQUEST_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "thinking",
    }
)

_TOOL_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _tool_id(value: str) -> str:
    return _TOOL_ID_UNSAFE.sub("_", value) if value else "toolu_gateway"


# ----------------------------------------------------------------------------------------------
# Requests


def _decode_text_blocks(value: Any) -> tuple[ir.Text, ...]:
    if isinstance(value, str):
        return (ir.Text(text=value),) if value else ()
    out = []
    for block in as_list(value):
        if isinstance(block, Mapping) and block.get("type") == "text":
            out.append(
                ir.Text(text=str(block.get("text", "")), cache_control=block.get("cache_control"))
            )
    return tuple(out)


def _decode_image(block: Mapping[str, Any]) -> ir.Image | None:
    source = as_dict(block.get("source"))
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        return ir.Image(
            data=source["data"],
            media_type=as_str(source.get("media_type")),
            cache_control=block.get("cache_control"),
        )
    if kind == "url" and isinstance(source.get("url"), str):
        return ir.Image(url=source["url"], cache_control=block.get("cache_control"))
    return None


def _decode_block(block: Any, dropped: Dropped | None = None) -> ir.Part | None:
    if not isinstance(block, Mapping):
        return None
    kind = block.get("type")
    if kind == "text":
        return ir.Text(text=str(block.get("text", "")), cache_control=block.get("cache_control"))
    if kind == "image":
        image = _decode_image(block)
        if image is not None:
            return image
    elif kind == "tool_use":
        return ir.ToolCall(
            id=str(block.get("id", "")),
            name=str(block.get("name", "")),
            arguments=json_text(block.get("input") or {}),
            cache_control=block.get("cache_control"),
        )
    elif kind == "tool_result":
        content = block.get("content")
        parts: list[ir.Text | ir.Image] = []
        if isinstance(content, str):
            parts.append(ir.Text(text=content))
        else:
            for sub in as_list(content):
                if not isinstance(sub, Mapping):
                    continue
                if sub.get("type") == "text":
                    parts.append(
                        ir.Text(
                            text=str(sub.get("text", "")), cache_control=sub.get("cache_control")
                        )
                    )
                elif sub.get("type") == "image":
                    image = _decode_image(sub)
                    if image is not None:
                        parts.append(image)
                elif dropped is not None:
                    dropped.add(f"tool_result content:{sub.get('type')}")
        return ir.ToolResult(
            call_id=str(block.get("tool_use_id", "")),
            content=tuple(parts),
            is_error=bool(block.get("is_error", False)),
            cache_control=block.get("cache_control"),
        )
    elif kind == "thinking":
        return ir.Reasoning(
            text=str(block.get("thinking", "")), signature=as_str(block.get("signature")) or None
        )
    elif kind == "redacted_thinking":
        return ir.Reasoning(redacted_data=str(block.get("data", "")))
    return ir.Opaque(dialect=DIALECT, raw=dict(block))


def _decode_reasoning(obj: Mapping[str, Any]) -> ir.ReasoningConfig | None:
    thinking = as_dict(obj.get("thinking"))
    effort = parse_effort(as_dict(obj.get("output_config")).get("effort"))
    kind = thinking.get("type")
    if kind == "enabled":
        return ir.ReasoningConfig(
            budget_tokens=opt_int(thinking.get("budget_tokens")), effort=effort
        )
    if kind == "adaptive":
        return ir.ReasoningConfig(adaptive=True, effort=effort)
    if kind == "disabled":
        return ir.ReasoningConfig(enabled=False)
    if effort is not None:
        return ir.ReasoningConfig(effort=effort)
    return None


def decode_request(obj: Mapping[str, Any]) -> ir.Request:
    """An Anthropic Messages request body (parsed JSON) as an `ir.Request`."""
    dropped = Dropped()
    extras = {k: v for k, v in obj.items() if k not in _REQUEST_FIELDS}
    messages: list[ir.Message] = []
    for message in as_list(obj.get("messages")):
        if not isinstance(message, Mapping):
            dropped.add("messages[] (not an object)")
            continue
        role_name = message.get("role")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        parts = []
        for block in as_list(blocks):
            part = _decode_block(block, dropped)
            if part is not None:
                parts.append(part)
        if role_name == "system":
            role = ir.Role.SYSTEM
        elif role_name == "assistant":
            role = ir.Role.ASSISTANT
        else:
            role = ir.Role.USER
        messages.append(ir.Message(role=role, parts=tuple(parts)))

    tools = []
    for tool in as_list(obj.get("tools")):
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type")
        if kind in (None, "custom") and "input_schema" in tool:
            tools.append(
                ir.Tool(
                    name=str(tool.get("name", "")),
                    description=as_str(tool.get("description")),
                    parameters=as_dict(tool.get("input_schema")),
                    strict=opt_bool(tool.get("strict")),
                    cache_control=tool.get("cache_control"),
                )
            )
        else:
            tools.append(
                ir.Tool(
                    name=str(kind or tool.get("name", "")),
                    kind=ir.ToolKind.BUILTIN,
                    raw=dict(tool),
                    dialect=DIALECT,
                )
            )

    choice = None
    parallel = None
    raw_choice = as_dict(obj.get("tool_choice"))
    if raw_choice:
        kind = raw_choice.get("type")
        if kind == "tool" and isinstance(raw_choice.get("name"), str):
            choice = ir.ToolChoice(mode=ir.ToolChoiceMode.NAMED, name=raw_choice["name"])
        elif kind == "any":
            choice = ir.ToolChoice(mode=ir.ToolChoiceMode.REQUIRED)
        elif kind == "none":
            choice = ir.ToolChoice(mode=ir.ToolChoiceMode.NONE)
        elif kind == "auto":
            choice = ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO)
        if raw_choice.get("disable_parallel_tool_use") is True:
            parallel = False

    metadata = as_dict(obj.get("metadata"))
    stop = obj.get("stop_sequences")
    output_format = None
    fmt = as_dict(as_dict(obj.get("output_config")).get("format")) or as_dict(
        obj.get("output_format")
    )
    if fmt.get("type") == "json_schema":
        output_format = ir.OutputFormat(type="json_schema", schema=as_dict(fmt.get("schema")))

    return ir.Request(
        model=str(obj.get("model", "")),
        system=_decode_text_blocks(obj.get("system")),
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=choice,
        temperature=opt_float(obj.get("temperature")),
        top_p=opt_float(obj.get("top_p")),
        top_k=opt_int(obj.get("top_k")),
        stop=tuple(s for s in as_list(stop) if isinstance(s, str)),
        max_output_tokens=opt_int(obj.get("max_tokens")),
        reasoning=_decode_reasoning(obj),
        stream=obj.get("stream") is True,
        parallel_tool_calls=parallel,
        user=as_str(metadata.get("user_id")),
        output_format=output_format,
        origin=DIALECT,
        extras=extras,
        dropped=dropped.tuple(),
    )


def _with_cache(block: dict[str, Any], cache_control: ir.JSONObject | None) -> dict[str, Any]:
    if cache_control is not None:
        block["cache_control"] = cache_control
    return block


def _encode_image(image: ir.Image) -> dict[str, Any]:
    media_type = image.media_type or "image/png"
    kind = "document" if media_type == "application/pdf" else "image"
    source: dict[str, Any]
    if image.data is not None:
        source = {"type": "base64", "media_type": media_type, "data": image.data}
    else:
        source = {"type": "url", "url": image.url}
    return _with_cache({"type": kind, "source": source}, image.cache_control)


def _encode_part(
    part: ir.Part, dropped: Dropped, *, url_safe_seals: bool = False
) -> dict[str, Any] | None:
    if isinstance(part, ir.Text):
        if not part.text:
            return None  # the API refuses empty text blocks
        return _with_cache({"type": "text", "text": part.text}, part.cache_control)
    if isinstance(part, ir.Image):
        return _encode_image(part)
    if isinstance(part, ir.ToolCall):
        call = flatten_call(part)
        args, ok = parse_arguments(call.arguments)
        if not ok:
            dropped.add("tool_call.arguments (not a JSON object)")
        return _with_cache(
            {"type": "tool_use", "id": _tool_id(call.id), "name": call.name, "input": args},
            call.cache_control,
        )
    if isinstance(part, ir.ToolResult):
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(part.call_id)}
        if len(part.content) == 1 and isinstance(part.content[0], ir.Text):
            if part.content[0].cache_control is None:
                block["content"] = part.content[0].text
            else:
                block["content"] = [
                    _with_cache(
                        {"type": "text", "text": part.content[0].text},
                        part.content[0].cache_control,
                    )
                ]
        elif part.content:
            content = []
            for sub in part.content:
                if isinstance(sub, ir.Text):
                    if sub.text:
                        content.append(
                            _with_cache({"type": "text", "text": sub.text}, sub.cache_control)
                        )
                else:
                    content.append(_encode_image(sub))
            block["content"] = content
        if part.is_error:
            block["is_error"] = True
        return _with_cache(block, part.cache_control)
    if isinstance(part, ir.Reasoning):
        if part.redacted_data is not None:
            return {"type": "redacted_thinking", "data": part.redacted_data}
        seal = part.seal
        if not seal:
            dropped.add("reasoning (no signature)")
            return None
        refused = welcome_seal(seal, DIALECT)
        if refused is not None:
            # Another API's seal: Anthropic would refuse it ("Invalid `signature`").
            dropped.add(refused)
            return None
        if url_safe_seals and is_base64(seal):
            # Signatures are standard base64; Google's SDK replays a thoughtSignature it was
            # given in the URL-safe alphabet (it decodes bytes fields and encodes them again).
            seal = standard_base64(seal)
        return {"type": "thinking", "thinking": part.text, "signature": seal}
    if part.dialect is DIALECT:
        return dict(part.raw)
    dropped.add(f"content:{part.raw.get('type', 'unknown')}")
    return None


def _output_limit(req: ir.Request, out: dict[str, Any]) -> int:
    # Anthropic requires max_tokens; the translator passes the model's own limit when it knows it.
    max_tokens = req.max_output_tokens or DEFAULT_MAX_TOKENS
    out["max_tokens"] = max_tokens
    return max_tokens


def _system(req: ir.Request, out: dict[str, Any]) -> None:
    # The system prompt, then the text of every system message (folded in here: the API without
    # the beta takes system text only at the top level; `_messages` skips those messages).
    system = [
        _with_cache({"type": "text", "text": t.text}, t.cache_control) for t in req.system if t.text
    ]
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            for part in message.parts:
                if isinstance(part, ir.Text) and part.text:
                    system.append(
                        _with_cache({"type": "text", "text": part.text}, part.cache_control)
                    )
    if system:
        if len(system) == 1 and "cache_control" not in system[0]:
            out["system"] = system[0]["text"]
        else:
            out["system"] = system


def _messages(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    from_gemini = req.origin is Dialect.GEMINI
    messages: list[dict[str, Any]] = []
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            # Its text went to the system prompt (`_system`); nothing else can go there.
            for part in message.parts:
                if not isinstance(part, ir.Text):
                    dropped.add(f"system message {part.kind}")
            continue
        role = "assistant" if message.role is ir.Role.ASSISTANT else "user"
        blocks = [
            b
            for b in (_encode_part(p, dropped, url_safe_seals=from_gemini) for p in message.parts)
            if b is not None
        ]
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message_out in messages:
        if message_out["role"] == "user":
            # Tool results must open the user turn that answers the tool calls.
            message_out["content"].sort(key=lambda b: b.get("type") != "tool_result")
        elif message_out["content"][0].get("type") not in _THINKING_BLOCKS:
            # Thinking blocks must open an assistant message that has any; a Gemini history
            # seals its reasoning on a later part (a function call after some text). One that
            # already opens with thinking keeps its order (interleaved thinking).
            message_out["content"].sort(key=lambda b: b.get("type") not in _THINKING_BLOCKS)
    out["messages"] = messages


def _unsigned_tool_turn(messages: list[dict[str, Any]]) -> bool:
    """Whether `messages` end in a tool loop whose assistant turn does not open with a
    thinking block. The turn opens at the first assistant message after the last user message
    that carries no tool results; the API's rule, with thinking on: "a final `assistant`
    message must start with a thinking block (preceeding the lastmost set of `tool_use` and
    `tool_result` blocks)"; later messages of the turn may go without one."""
    if not messages or messages[-1]["role"] != "user":
        return False
    opening: dict[str, Any] | None = None
    for message in reversed(messages):
        results = any(block.get("type") == "tool_result" for block in message["content"])
        if message["role"] == "user" and not results:
            break
        if message["role"] == "assistant":
            opening = message
    if opening is None:
        return False  # the last user message is a question, not tool results
    return opening["content"][0].get("type") not in _THINKING_BLOCKS


_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _tools(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> bool:
    tools = []
    for tool in req.tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            raw = builtin_tool(tool, DIALECT, dropped)
            if raw is not None:
                tools.append(raw)
            continue
        flat = flatten_tool(tool)
        schema = dict(flat.parameters) if flat.parameters else dict(EMPTY_PARAMETERS)
        schema.setdefault("type", "object")
        tool_out: dict[str, Any] = {"name": flat.name}
        if flat.description:
            tool_out["description"] = flat.description
        tool_out["input_schema"] = schema
        if flat.strict is not None and req.origin is DIALECT:
            tool_out["strict"] = flat.strict
        tools.append(_with_cache(tool_out, flat.cache_control))
    if tools:
        out["tools"] = tools
    return bool(tools)


def _tool_choice(req: ir.Request, out: dict[str, Any], *, tools: bool) -> None:
    choice: dict[str, Any] | None = None
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        if mode is ir.ToolChoiceMode.NAMED:
            choice = {
                "type": "tool",
                "name": flat_name(req.tool_choice.name or "", req.tool_choice.namespace),
            }
        elif mode is ir.ToolChoiceMode.REQUIRED:
            choice = {"type": "any"}
        elif mode is ir.ToolChoiceMode.NONE:
            choice = {"type": "none"}
        else:
            choice = {"type": "auto"}
    if req.parallel_tool_calls is False and tools:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None and (tools or choice["type"] == "none"):
        out["tool_choice"] = choice


def _reasoning(
    req: ir.Request,
    out: dict[str, Any],
    output_config: dict[str, Any],
    dropped: Dropped,
    *,
    max_tokens: int,
) -> bool:
    # Returns whether thinking is on: `_sampling` must then leave out what the API refuses.
    same = req.origin is DIALECT
    thinking_on = False
    reasoning = req.reasoning
    if reasoning is not None and reasoning.enabled and reasoning.effort is not ir.Effort.NONE:
        if reasoning.adaptive:
            out["thinking"] = {"type": "adaptive"}
            thinking_on = True
        else:
            budget = reasoning.budget_tokens or budget_for_effort(
                reasoning.effort or ir.Effort.MEDIUM
            )
            budget = min(budget, max_tokens - 1)
            if budget < ANTHROPIC_MIN_BUDGET:
                dropped.add("reasoning (max_tokens below the smallest thinking budget)")
            else:
                out["thinking"] = {"type": "enabled", "budget_tokens": budget}
                thinking_on = True
        if reasoning.effort is not None and (same or reasoning.adaptive):
            output_config["effort"] = ANTHROPIC_EFFORT.get(reasoning.effort, "high")
    elif reasoning is not None and not reasoning.enabled and same:
        out["thinking"] = {"type": "disabled"}
    return thinking_on


def _sampling(req: ir.Request, out: dict[str, Any], dropped: Dropped, *, thinking_on: bool) -> None:
    same = req.origin is DIALECT
    if req.temperature is not None:
        if thinking_on and not same:
            dropped.add("temperature (not allowed with thinking)")
        else:
            out["temperature"] = req.temperature
    if req.top_p is not None:
        if thinking_on and not same and req.top_p < 0.95:
            dropped.add("top_p (not allowed with thinking)")
        else:
            out["top_p"] = req.top_p
    if req.top_k is not None:
        if thinking_on and not same:
            dropped.add("top_k (not allowed with thinking)")
        else:
            out["top_k"] = req.top_k


def _stop_sequences(req: ir.Request, out: dict[str, Any]) -> None:
    if req.stop:
        out["stop_sequences"] = list(req.stop)


def _output_format(req: ir.Request, output_config: dict[str, Any], dropped: Dropped) -> None:
    if req.output_format is not None:
        if req.output_format.type == "json_schema" and req.output_format.schema is not None:
            output_config["format"] = {"type": "json_schema", "schema": req.output_format.schema}
        else:
            dropped.add(f"output_format:{req.output_format.type}")


def _options(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    # Streaming, the end user, metadata, the prompt-cache key and storage.
    if req.stream:
        out["stream"] = True
    if req.user is not None:
        out["metadata"] = {"user_id": req.user}
    if req.metadata:
        dropped.add("metadata")
    if req.cache_key is not None:
        dropped.add("prompt_cache_key")
    if req.store is not None and req.origin is not DIALECT:
        dropped.add("store")


def encode_request(req: ir.Request, *, model: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`req` as an Anthropic Messages body for `model`, and what could not be carried."""
    # One section helper per part of the body, called in the order the body's fields are
    # written (the same helper names in every format module).
    dropped = Dropped()
    same = req.origin is DIALECT
    out: dict[str, Any] = {"model": model}
    max_tokens = _output_limit(req, out)
    _system(req, out)
    _messages(req, out, dropped)
    tools = _tools(req, out, dropped)
    _tool_choice(req, out, tools=tools)
    # output_config gathers the effort (from the reasoning) and the structured-output format.
    output_config: dict[str, Any] = {}
    thinking_on = _reasoning(req, out, output_config, dropped, max_tokens=max_tokens)
    if thinking_on and _unsigned_tool_turn(out["messages"]):
        # With thinking on, the API refuses a tool round whose assistant turn does not open
        # with a (signed) thinking block; a history from another format, or one whose seals
        # were left out, has none: this turn goes without thinking (docs/conversion.md).
        del out["thinking"]
        thinking_on = False
        dropped.add("reasoning (final assistant turn has no thinking block)")
    _sampling(req, out, dropped, thinking_on=thinking_on)
    _stop_sequences(req, out)
    _output_format(req, output_config, dropped)
    _options(req, out, dropped)
    if output_config:
        existing = as_dict(req.extras.get("output_config")) if same else {}
        out["output_config"] = {**existing, **output_config}
    carry_extras(out, req, same=same, dropped=dropped)
    return out, dropped.tuple()


# ----------------------------------------------------------------------------------------------
# Whole answers
