"""OpenAI Chat Completions requests ⇄ IR.

The wire vocabulary the response and stream codecs share (the dialect, the finish reasons, the
decoders of content parts) is defined here, with the request codec that uses it first; the
package docstring of `twproto.formats.openai_chat` tells how the format maps to the IR.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.dialect import Dialect
from twproto.effort import OPENAI_EFFORT, effort_for_budget, parse_effort
from twproto.formats._common import (
    EMPTY_PARAMETERS,
    Dropped,
    as_dict,
    as_list,
    as_str,
    builtin_tool,
    carry_extras,
    custom_arguments,
    data_url,
    drop_cache_control,
    flat_name,
    flatten_call,
    flatten_tool,
    image_from_url,
    json_text,
    opt_bool,
    opt_float,
    opt_int,
)

__all__ = (
    "DIALECT",
    "decode_request",
    "encode_request",
)


DIALECT = Dialect.OPENAI_CHAT

FINISH_FROM: Mapping[str, ir.StopReason] = {
    "stop": ir.StopReason.END_TURN,
    "length": ir.StopReason.MAX_TOKENS,
    "tool_calls": ir.StopReason.TOOL_USE,
    "function_call": ir.StopReason.TOOL_USE,
    "content_filter": ir.StopReason.CONTENT_FILTER,
    "refusal": ir.StopReason.REFUSAL,
    "insufficient_system_resource": ir.StopReason.ERROR,
    "error": ir.StopReason.ERROR,
}
FINISH_TO: Mapping[ir.StopReason, str] = {
    ir.StopReason.END_TURN: "stop",
    ir.StopReason.STOP_SEQUENCE: "stop",
    ir.StopReason.MAX_TOKENS: "length",
    ir.StopReason.TOOL_USE: "tool_calls",
    ir.StopReason.CONTENT_FILTER: "content_filter",
    ir.StopReason.REFUSAL: "content_filter",
    ir.StopReason.PAUSE: "stop",
    ir.StopReason.ERROR: "stop",
    ir.StopReason.OTHER: "stop",
}

_REQUEST_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "parallel_tool_calls",
        "user",
        "reasoning_effort",
        "response_format",
        "metadata",
        "prompt_cache_key",
        "store",
    }
)

# OpenAI's limit on ``user`` / ``safety_identifier``.
_MAX_USER = 64


def _finish(value: Any, saw_tools: bool) -> ir.StopReason:
    reason = FINISH_FROM.get(str(value), ir.StopReason.END_TURN)
    if reason is ir.StopReason.END_TURN and saw_tools:
        return ir.StopReason.TOOL_USE
    return reason


# ----------------------------------------------------------------------------------------------
# Requests


def _content_parts(content: Any, dropped: Dropped) -> list[ir.Text | ir.Image | ir.Opaque]:
    if isinstance(content, str):
        return [ir.Text(text=content)]
    out: list[ir.Text | ir.Image | ir.Opaque] = []
    for part in as_list(content):
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            out.append(
                ir.Text(text=str(part.get("text", "")), cache_control=part.get("cache_control"))
            )
        elif kind == "refusal":
            out.append(ir.Text(text=str(part.get("refusal", ""))))
        elif kind == "image_url":
            image = part.get("image_url")
            if isinstance(image, str):
                out.append(image_from_url(image))
            elif isinstance(image, Mapping) and isinstance(image.get("url"), str):
                out.append(image_from_url(image["url"], as_str(image.get("detail"))))
        else:
            out.append(ir.Opaque(dialect=DIALECT, raw=dict(part)))
    return out


def _texts(content: Any) -> tuple[ir.Text, ...]:
    if isinstance(content, str):
        return (ir.Text(text=content),)
    texts = [
        str(p.get("text", ""))
        for p in as_list(content)
        if isinstance(p, Mapping) and p.get("type") in ("text", "input_text")
    ]
    return (ir.Text(text="".join(texts)),) if texts else ()


def _decode_call(call: Mapping[str, Any]) -> ir.ToolCall | None:
    kind = call.get("type", "function")
    if kind == "custom":
        custom = as_dict(call.get("custom"))
        return ir.ToolCall(
            id=str(call.get("id", "")),
            name=str(custom.get("name", "")),
            arguments=custom_arguments(str(custom.get("input", ""))),
            tool_kind=ir.ToolKind.CUSTOM,
        )
    function = as_dict(call.get("function"))
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json_text(arguments)
    return ir.ToolCall(
        id=str(call.get("id", "")), name=str(function.get("name", "")), arguments=arguments or "{}"
    )


def _decode_tools(raw: Any) -> list[ir.Tool]:
    tools = []
    for tool in as_list(raw):
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type")
        if kind == "function":
            function = as_dict(tool.get("function"))
            tools.append(
                ir.Tool(
                    name=str(function.get("name", "")),
                    description=as_str(function.get("description")),
                    parameters=as_dict(function["parameters"])
                    if "parameters" in function
                    else None,
                    strict=opt_bool(function.get("strict")),
                )
            )
        elif kind == "custom":
            custom = as_dict(tool.get("custom"))
            tools.append(
                ir.Tool(
                    name=str(custom.get("name", "")),
                    description=as_str(custom.get("description")),
                    kind=ir.ToolKind.CUSTOM,
                    format=as_dict(custom.get("format")) or None,
                )
            )
        else:
            tools.append(
                ir.Tool(name=str(kind), kind=ir.ToolKind.BUILTIN, raw=dict(tool), dialect=DIALECT)
            )
    return tools


def _decode_choice(raw: Any) -> ir.ToolChoice | None:
    if raw == "auto":
        return ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO)
    if raw == "none":
        return ir.ToolChoice(mode=ir.ToolChoiceMode.NONE)
    if raw == "required":
        return ir.ToolChoice(mode=ir.ToolChoiceMode.REQUIRED)
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        inner = as_dict(raw.get("custom" if kind == "custom" else "function"))
        if isinstance(inner.get("name"), str):
            return ir.ToolChoice(mode=ir.ToolChoiceMode.NAMED, name=inner["name"])
    return None


def _decode_format(raw: Any) -> ir.OutputFormat | None:
    fmt = as_dict(raw)
    kind = fmt.get("type")
    if kind == "json_object":
        return ir.OutputFormat(type="json_object")
    if kind == "json_schema":
        schema = as_dict(fmt.get("json_schema"))
        return ir.OutputFormat(
            type="json_schema",
            name=as_str(schema.get("name")),
            schema=as_dict(schema.get("schema")),
            strict=opt_bool(schema.get("strict")),
            description=as_str(schema.get("description")),
        )
    return None


def decode_request(obj: Mapping[str, Any]) -> ir.Request:
    """A Chat Completions request body (parsed JSON) as an `ir.Request`."""
    dropped = Dropped()
    extras = {k: v for k, v in obj.items() if k not in _REQUEST_FIELDS}
    system: list[ir.Text] = []
    messages: list[ir.Message] = []
    leading = True
    for message in as_list(obj.get("messages")):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            texts = _texts(content)
            if leading:
                system.extend(texts)
            else:
                messages.append(ir.Message(role=ir.Role.SYSTEM, parts=texts))
            continue
        leading = False
        if "name" in message:
            dropped.add("messages[].name")
        if role == "assistant":
            parts: list[ir.Part] = []
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                parts.append(ir.Reasoning(text=reasoning))
            if content is not None:
                parts.extend(p for p in _content_parts(content, dropped))
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                parts.append(ir.Text(text=refusal))
            for call in as_list(message.get("tool_calls")):
                if isinstance(call, Mapping):
                    decoded = _decode_call(call)
                    if decoded is not None:
                        parts.append(decoded)
            legacy = message.get("function_call")
            if isinstance(legacy, Mapping):
                parts.append(_decode_call({"id": "", "function": legacy}) or ir.Text(text=""))
            messages.append(ir.Message(role=ir.Role.ASSISTANT, parts=tuple(parts)))
        elif role == "tool":
            result = ir.ToolResult(
                call_id=str(message.get("tool_call_id", "")),
                content=tuple(
                    p for p in _content_parts(content, dropped) if not isinstance(p, ir.Opaque)
                ),
            )
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.role is ir.Role.USER
                and last.parts
                and all(isinstance(p, ir.ToolResult) for p in last.parts)
            ):
                messages[-1] = ir.Message(role=ir.Role.USER, parts=(*last.parts, result))
            else:
                messages.append(ir.Message(role=ir.Role.USER, parts=(result,)))
        elif role == "function":
            dropped.add("messages[].role=function")
        else:
            messages.append(
                ir.Message(role=ir.Role.USER, parts=tuple(_content_parts(content, dropped)))
            )

    reasoning_cfg = None
    effort = parse_effort(obj.get("reasoning_effort"))
    thinking = as_dict(obj.get("thinking")).get("type")
    if effort is not None:
        reasoning_cfg = ir.ReasoningConfig(effort=effort, enabled=effort is not ir.Effort.NONE)
    elif thinking in ("enabled", "disabled"):
        reasoning_cfg = ir.ReasoningConfig(enabled=thinking == "enabled")

    stop = obj.get("stop")
    stops = (
        (stop,) if isinstance(stop, str) else tuple(s for s in as_list(stop) if isinstance(s, str))
    )
    max_tokens = opt_int(obj.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = opt_int(obj.get("max_tokens"))
    user = as_str(obj.get("user"))
    if user is None:
        user = as_str(obj.get("safety_identifier"))
    metadata = obj.get("metadata")
    return ir.Request(
        model=str(obj.get("model", "")),
        system=tuple(system),
        messages=tuple(messages),
        tools=tuple(_decode_tools(obj.get("tools"))),
        tool_choice=_decode_choice(obj.get("tool_choice")),
        temperature=opt_float(obj.get("temperature")),
        top_p=opt_float(obj.get("top_p")),
        stop=stops,
        max_output_tokens=max_tokens,
        reasoning=reasoning_cfg,
        stream=obj.get("stream") is True,
        parallel_tool_calls=opt_bool(obj.get("parallel_tool_calls")),
        user=user,
        metadata=dict(metadata) if isinstance(metadata, Mapping) else None,
        cache_key=as_str(obj.get("prompt_cache_key")),
        store=opt_bool(obj.get("store")),
        output_format=_decode_format(obj.get("response_format")),
        origin=DIALECT,
        extras=extras,
        dropped=dropped.tuple(),
    )


def _encode_content(parts: list[ir.Part], same: bool, dropped: Dropped) -> str | list[Any] | None:
    items: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, ir.Text):
            item: dict[str, Any] = {"type": "text", "text": part.text}
            if same and part.cache_control is not None:
                item["cache_control"] = part.cache_control
            items.append(item)
        elif isinstance(part, ir.Image):
            url = part.url if part.url is not None else data_url(part.media_type, part.data or "")
            image: dict[str, Any] = {"url": url}
            if part.detail:
                image["detail"] = part.detail
            items.append({"type": "image_url", "image_url": image})
        elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
            items.append(dict(part.raw))
        else:
            dropped.add(
                f"content:{part.raw.get('type') if isinstance(part, ir.Opaque) else part.kind}"
            )
    if not items:
        return None
    if len(items) == 1 and items[0]["type"] == "text" and len(items[0]) == 2:
        text: str = items[0]["text"]
        return text
    return items


def _encode_call(call: ir.ToolCall, dropped: Dropped) -> dict[str, Any]:
    flat = flatten_call(call)
    return {
        "id": flat.id,
        "type": "function",
        "function": {"name": flat.name, "arguments": flat.arguments},
    }


def _system(req: ir.Request, out: dict[str, Any]) -> None:
    # Chat has no system field: the system prompt opens the messages, one system message a text.
    out["messages"] = [{"role": "system", "content": text.text} for text in req.system]


def _messages(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    same = req.origin is DIALECT
    messages: list[dict[str, Any]] = out["messages"]  # opened by `_system`
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            joined = "".join(p.text for p in message.parts if isinstance(p, ir.Text))
            messages.append({"role": "system", "content": joined})
            continue
        if message.role is ir.Role.USER:
            rest: list[ir.Part] = []
            # Chat takes only text in a `tool` message ("Image URLs are only allowed for messages
            # with role 'user'"), and every tool message must follow the assistant's calls
            # directly: a result's images go into the user message after the tool messages,
            # each set introduced by the call it answers.
            shown: list[ir.Part] = []
            for part in message.parts:
                if isinstance(part, ir.ToolResult):
                    images = [p for p in part.content if isinstance(p, ir.Image)]
                    if images:
                        label = f"Image(s) returned by tool call {part.call_id}:"
                        shown.extend((ir.Text(text=label), *images))
                    if part.is_error:
                        dropped.add("tool_result.is_error")
                    messages.append(
                        {"role": "tool", "tool_call_id": part.call_id, "content": part.text}
                    )
                else:
                    rest.append(part)
            rest = shown + rest
            if rest:
                content = _encode_content(rest, same, dropped)
                if content is not None:
                    messages.append({"role": "user", "content": content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for part in message.parts:
            if isinstance(part, ir.Text):
                texts.append(part.text)
            elif isinstance(part, ir.ToolCall):
                calls.append(_encode_call(part, dropped))
            elif isinstance(part, ir.Reasoning):
                if same and part.text:
                    reasoning.append(part.text)
                else:
                    dropped.add("reasoning")
            elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
                texts.append(str(part.raw.get("text", "")))
            else:
                dropped.add(f"assistant {part.kind}")
        if not texts and not calls:
            continue
        out_message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if reasoning:
            out_message["reasoning_content"] = "".join(reasoning)
        if calls:
            out_message["tool_calls"] = calls
        messages.append(out_message)


def _tools(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> bool:
    tools = []
    for tool in req.tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            raw = builtin_tool(tool, DIALECT, dropped)
            if raw is not None:
                tools.append(raw)
            continue
        flat = flatten_tool(tool)
        function: dict[str, Any] = {"name": flat.name}
        if flat.description:
            function["description"] = flat.description
        function["parameters"] = flat.parameters if flat.parameters else EMPTY_PARAMETERS
        if flat.strict is not None:
            function["strict"] = flat.strict
        tools.append({"type": "function", "function": function})
    if tools:
        out["tools"] = tools
    return bool(tools)


def _tool_choice(req: ir.Request, out: dict[str, Any], *, tools: bool) -> None:
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        if mode is ir.ToolChoiceMode.NAMED:
            name = flat_name(req.tool_choice.name or "", req.tool_choice.namespace)
            out["tool_choice"] = {"type": "function", "function": {"name": name}}
        else:
            out["tool_choice"] = {
                ir.ToolChoiceMode.AUTO: "auto",
                ir.ToolChoiceMode.NONE: "none",
                ir.ToolChoiceMode.REQUIRED: "required",
            }[mode]
    if req.parallel_tool_calls is not None and tools:
        out["parallel_tool_calls"] = req.parallel_tool_calls


def _output_limit(req: ir.Request, out: dict[str, Any]) -> None:
    # max_completion_tokens, not max_tokens: OpenAI's reasoning models refuse the older name.
    if req.max_output_tokens is not None:
        out["max_completion_tokens"] = req.max_output_tokens


def _reasoning(req: ir.Request, out: dict[str, Any]) -> None:
    reasoning = req.reasoning
    if reasoning is not None:
        if reasoning.effort is not None and (reasoning.enabled or req.origin is DIALECT):
            out["reasoning_effort"] = OPENAI_EFFORT[reasoning.effort]
        elif reasoning.enabled and reasoning.budget_tokens:
            effort = effort_for_budget(reasoning.budget_tokens)
            out["reasoning_effort"] = OPENAI_EFFORT[effort]


def _sampling(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        out["top_p"] = req.top_p
    if req.top_k is not None:
        dropped.add("top_k")


def _stop_sequences(req: ir.Request, out: dict[str, Any]) -> None:
    if req.stop:
        out["stop"] = list(req.stop)


def _options(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    # Streaming, the end user, metadata, the prompt-cache key and storage.
    same = req.origin is DIALECT
    if req.stream:
        out["stream"] = True
        if not same:
            out["stream_options"] = {"include_usage": True}
    if req.user is not None:
        if len(req.user) <= _MAX_USER or same:
            out["user"] = req.user
        else:
            dropped.add("user (longer than 64 characters)")
    if req.metadata is not None:
        if same:
            out["metadata"] = req.metadata
        else:
            dropped.add("metadata")
    if req.cache_key is not None:
        out["prompt_cache_key"] = req.cache_key
    if req.store is not None:
        if same:
            out["store"] = req.store
        else:
            dropped.add("store")


def _output_format(req: ir.Request, out: dict[str, Any]) -> None:
    fmt = req.output_format
    if fmt is not None:
        if fmt.type == "json_schema":
            schema: dict[str, Any] = {"name": fmt.name or "response"}
            if fmt.description:
                schema["description"] = fmt.description
            schema["schema"] = fmt.schema or {}
            if fmt.strict is not None:
                schema["strict"] = fmt.strict
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            out["response_format"] = {"type": "json_object"}


def encode_request(req: ir.Request, *, model: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`req` as a Chat Completions body for `model`, and what could not be carried."""
    # One section helper per part of the body, called in the order the body's fields are
    # written (the same helper names in every format module).
    dropped = Dropped()
    same = req.origin is DIALECT
    out: dict[str, Any] = {"model": model}
    _system(req, out)
    _messages(req, out, dropped)
    tools = _tools(req, out, dropped)
    _tool_choice(req, out, tools=tools)
    _output_limit(req, out)
    _reasoning(req, out)
    _sampling(req, out, dropped)
    _stop_sequences(req, out)
    _options(req, out, dropped)
    _output_format(req, out)
    drop_cache_control(req, same=same, dropped=dropped)
    carry_extras(out, req, same=same, dropped=dropped)
    return out, dropped.tuple()


# ----------------------------------------------------------------------------------------------
# Whole answers
