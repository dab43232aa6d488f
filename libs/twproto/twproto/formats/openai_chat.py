"""OpenAI Chat Completions (``POST /v1/chat/completions``) ⇄ IR.

Theory of operation
-------------------

Requests: leading ``system``/``developer`` messages become `Request.system`, later ones
`Role.SYSTEM` messages in place. ``tool`` messages become `ToolResult` parts of a user message
(consecutive ones share it), which is how the other formats group them. Reasoning replayed by
DeepSeek-style servers (``reasoning_content``) becomes a `Reasoning` part; the GLM-style
``thinking: {type: enabled|disabled}`` switch turns reasoning on or off. ``reasoning_effort``
maps through the effort table.

Encoding: a request converted to Chat always asks for ``stream_options.include_usage`` when it
streams (usage is otherwise absent from a Chat stream) and writes the output limit as
``max_completion_tokens`` (what OpenAI's reasoning models require). Reasoning parts are not sent
to another format's Chat upstream: plain Chat has no field for them and some servers refuse
unknown message fields. ``user`` longer than 64 characters (Claude Code's JSON ``user_id``) is
dropped rather than refused by the API.

Answers and streams: ``reasoning_content`` / ``reasoning`` deltas are reasoning, ``refusal`` is
text with stop reason refusal; a ``stop`` finish after tool calls reads as tool use (some
servers say ``stop``). Tool-call deltas are keyed by their ``index``; a call without an id gets
one derived from the chunk id and that index. The encoder writes one chunk per delta from
prebuilt byte templates (only the delta's own JSON is serialised per chunk), closes with one
chunk carrying ``finish_reason`` *and* ``usage`` (which SDKs read from any chunk, and which
clients that index ``choices[0]`` can still read), then ``data: [DONE]``. A mid-stream error is a
chunk ``{"error": {...}}``, which the OpenAI SDK raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import _json, ir
from twproto.dialect import Dialect
from twproto.effort import OPENAI_EFFORT, effort_for_budget, parse_effort
from twproto.errors import GatewayError, stream_error_event
from twproto.formats._codec import DecoderBase, EncoderBase, WatchNeedles
from twproto.formats._common import (
    EMPTY_PARAMETERS,
    MALFORMED,
    Dropped,
    as_dict,
    as_int,
    as_list,
    as_str,
    builtin_tool,
    carry_extras,
    custom_arguments,
    custom_input,
    data_url,
    drop_cache_control,
    error_status,
    flat_name,
    flatten_call,
    flatten_tool,
    image_from_url,
    json_text,
    need_str,
    opt_bool,
    opt_float,
    opt_int,
    prefixed_id,
)
from twproto.sse import SSEEvent

__all__ = (
    "DIALECT",
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "decode_request",
    "decode_response",
    "decode_usage",
    "encode_request",
    "encode_response",
    "encode_usage",
    "new_stream_decoder",
    "new_stream_encoder",
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
            for part in message.parts:
                if isinstance(part, ir.ToolResult):
                    if any(isinstance(p, ir.Image) for p in part.content):
                        dropped.add("tool_result image")
                    if part.is_error:
                        dropped.add("tool_result.is_error")
                    messages.append(
                        {"role": "tool", "tool_call_id": part.call_id, "content": part.text}
                    )
                else:
                    rest.append(part)
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


def decode_usage(raw: Any) -> ir.Usage:
    usage = as_dict(raw)
    prompt = as_int(usage.get("prompt_tokens"))
    details = as_dict(usage.get("prompt_tokens_details"))
    cached = as_int(details.get("cached_tokens")) or as_int(usage.get("prompt_cache_hit_tokens"))
    written = as_int(details.get("cache_write_tokens")) or as_int(
        details.get("cache_creation_tokens")
    )
    reasoning = as_int(as_dict(usage.get("completion_tokens_details")).get("reasoning_tokens"))
    return ir.Usage(
        input_tokens=max(prompt - cached - written, 0),
        output_tokens=as_int(usage.get("completion_tokens")),
        cache_read_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=reasoning,
    )


def encode_usage(usage: ir.Usage) -> dict[str, Any]:
    prompt_details: dict[str, int] = {"cached_tokens": usage.cache_read_tokens}
    if usage.cache_write_tokens:
        prompt_details["cache_write_tokens"] = usage.cache_write_tokens
    return {
        "prompt_tokens": usage.total_input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def decode_response(obj: Mapping[str, Any]) -> ir.Answer:
    """A chat completion (non-streamed) as an `ir.Answer` (the first choice)."""
    dropped = Dropped()
    choices = as_list(obj.get("choices"))
    if len(choices) > 1:
        dropped.add("choices[1:]")
    choice = as_dict(choices[0]) if choices else {}
    message = as_dict(choice.get("message"))
    parts: list[ir.Part] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append(ir.Reasoning(text=reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append(ir.Text(text=content))
    elif isinstance(content, list):
        parts.extend(p for p in _content_parts(content, dropped) if isinstance(p, ir.Text))
    refusal = message.get("refusal")
    refused = isinstance(refusal, str) and bool(refusal)
    if refused:
        parts.append(ir.Text(text=str(refusal)))
    calls = [
        c
        for c in (
            _decode_call(x) for x in as_list(message.get("tool_calls")) if isinstance(x, Mapping)
        )
        if c
    ]
    answer_id = str(obj.get("id", ""))
    for n, call in enumerate(calls):
        if not call.id:
            call = ir.ToolCall(
                id=ir.derive_call_id(answer_id, n),
                name=call.name,
                arguments=call.arguments,
                tool_kind=call.tool_kind,
            )
        parts.append(call)
    reason = _finish(choice.get("finish_reason"), bool(calls))
    if refused:
        reason = ir.StopReason.REFUSAL
    return ir.Answer(
        id=answer_id,
        model=str(obj.get("model", "")),
        parts=tuple(parts),
        stop_reason=reason,
        usage=decode_usage(obj["usage"]) if isinstance(obj.get("usage"), Mapping) else None,
        created=opt_int(obj.get("created")),
        dropped=dropped.tuple(),
    )


def _answer_call(call: ir.ToolCall) -> dict[str, Any]:
    if call.tool_kind is ir.ToolKind.CUSTOM and not call.namespace:
        return {
            "id": call.id,
            "type": "custom",
            "custom": {"name": call.name, "input": custom_input(call.arguments)},
        }
    flat = flatten_call(call)
    return {
        "id": flat.id,
        "type": "function",
        "function": {"name": flat.name, "arguments": flat.arguments},
    }


def encode_response(
    ans: ir.Answer,
    *,
    model: str,
    dropped: list[str] | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """`ans` as a chat completion naming `model`; what it cannot carry goes to `dropped`."""
    lost = Dropped()
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in ans.parts:
        if isinstance(part, ir.Text):
            texts.append(part.text)
        elif isinstance(part, ir.Reasoning):
            if part.text:
                reasoning.append(part.text)
            if part.seal or part.redacted_data:
                lost.add("reasoning.signature")
        elif isinstance(part, ir.ToolCall):
            calls.append(_answer_call(part))
        else:
            lost.add(f"content:{part.kind}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    message["refusal"] = None
    if dropped is not None:
        dropped.extend(lost.tuple())
    out: dict[str, Any] = {
        "id": prefixed_id("chatcmpl-", ans.id),
        "object": "chat.completion",
        "created": ans.created if ans.created is not None else (created or 0),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": FINISH_TO[ans.stop_reason],
            }
        ],
    }
    if ans.usage is not None:
        out["usage"] = encode_usage(ans.usage)
    return out


# ----------------------------------------------------------------------------------------------
# Streams


# The watch path's needles. Chat events have no names: usage, the finish reason and errors are
# found in the data (servers write JSON with and without spaces), and the end is ``[DONE]``. A
# chunk that ends like a plain delta chunk (``"finish_reason":null``, no usage) carries none.
WATCH = WatchNeedles(
    chunk_markers=(
        b'"finish_reason":"',
        b'"finish_reason": "',
        b'"usage":{',
        b'"usage": {',
        b"error",
        b"[DONE]",
    ),
    delta_ends=(
        b'"finish_reason":null}]}\n\n',
        b'"finish_reason":null}],"usage":null}\n\n',
    ),
    data_starts=("[DONE]",),
    data_needles=(
        '"usage":{',
        '"usage": {',
        '"error"',
        '"finish_reason":"',
        '"finish_reason": "',
    ),
)


class StreamDecoder(DecoderBase):
    """Chat chunks (SSE events) → IR stream calls; see `twproto.formats.anthropic.StreamDecoder`
    for the `feed` / `feed_into` / `watch` split."""

    __slots__ = (
        "_created",
        "_id",
        "_next",
        "_reasoning",
        "_started",
        "_text",
        "_tool_ids",
        "_tools",
    )
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._id = ""
        self._created: int | None = None
        self._next = 0
        self._text: int | None = None
        self._reasoning: int | None = None
        self._tools: dict[int, int] = {}  # Chat tool-call index → IR index
        self._tool_ids: dict[str, int] = {}  # call id → Chat tool-call index

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            data = event.data
            if data[:6] == "[DONE]":
                if not self.finished:
                    self._close(h)
                    self.finished = True
                    h.finish(
                        ir.StopReason.TOOL_USE if self._tools else ir.StopReason.END_TURN, None
                    )
                h.end()
                return
            try:
                obj = _json.loads(data)
            except _json.JSONDecodeError:
                if data.strip():
                    self._drop("chunk (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            if obj.get("error"):
                err = obj["error"]
                if isinstance(err, Mapping):
                    etype = str(err.get("type") or err.get("code") or "api_error")
                    code = err.get("code")
                    status = (
                        code
                        if isinstance(code, int) and 400 <= code <= 599
                        else error_status(etype)
                    )
                    message = str(err.get("message", "upstream error"))
                else:
                    etype, status, message = "api_error", 500, str(err)
                self.error = ir.StreamErrorEvent(message=message, type=etype, status=status)
                h.error(self.error)
                return
            if not self._started:
                self._started = True
                self._id = str(obj.get("id", ""))
                self._created = opt_int(obj.get("created"))
                h.message_start(self._id, str(obj.get("model", "")), self._created, None)
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                delta = choice.get("delta")
                if delta:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if reasoning and reasoning.__class__ is str:
                        index = self._reasoning
                        if index is None:
                            self._stop_text(h)
                            index = self._reasoning = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.REASONING, None)
                        h.reasoning(index, reasoning)
                    content = delta.get("content")
                    if content and content.__class__ is str:
                        index = self._text
                        if index is None:
                            self._stop_reasoning(h)
                            index = self._text = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.TEXT, None)
                        h.text(index, content)
                    refusal = delta.get("refusal")
                    if refusal and isinstance(refusal, str):
                        self._drop("refusal (as text)")
                        index = self._text
                        if index is None:
                            index = self._text = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.TEXT, None)
                        h.text(index, refusal)
                    calls = delta.get("tool_calls")
                    if calls:
                        self._tool_deltas(calls, h)
                reason = choice.get("finish_reason")
                if reason and not self.finished:
                    self._close(h)
                    self.finished = True
                    h.finish(_finish(reason, bool(self._tools)), None)
            usage = obj.get("usage")
            if usage:
                self.usage = decode_usage(usage)
                h.usage(self.usage)
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _tool_deltas(self, calls: list[Any], h: ir.StreamHandler) -> None:
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            call_id = call.get("id")
            number = call.get("index")
            if not isinstance(number, int):
                # Servers that omit the index: an id names the call; without one, a delta
                # continues the latest call.
                if call_id and call_id in self._tool_ids:
                    number = self._tool_ids[call_id]
                elif call_id or not self._tools:
                    number = len(self._tools)
                else:
                    number = max(self._tools)
            function = call.get("function") or {}
            name = function.get("name") or ""
            index = self._tools.get(number)
            if index is None:
                self._stop_text(h)
                self._stop_reasoning(h)
                index = self._tools[number] = self._next
                self._next += 1
                call_id = str(call_id or ir.derive_call_id(self._id, number))
                self._tool_ids[call_id] = number
                h.tool_call_start(
                    index,
                    call_id,
                    need_str(name),
                    ir.ToolKind.FUNCTION,
                    None,
                    None,
                )
            arguments = function.get("arguments")
            if arguments:
                h.tool_args(
                    index, arguments if isinstance(arguments, str) else json_text(arguments)
                )

    def _stop_text(self, h: ir.StreamHandler) -> None:
        if self._text is not None:
            h.part_stop(self._text)
            self._text = None

    def _stop_reasoning(self, h: ir.StreamHandler) -> None:
        if self._reasoning is not None:
            h.part_stop(self._reasoning)
            self._reasoning = None

    def _close(self, h: ir.StreamHandler) -> None:
        self._stop_reasoning(h)
        self._stop_text(h)
        for index in self._tools.values():
            h.part_stop(index)


class StreamEncoder(EncoderBase):
    """IR stream calls → Chat chunk SSE bytes; `take()` returns what is ready to send.

    `sse` is not used: this format always streams as SSE.
    """

    __slots__ = ("_args", "_created", "_custom", "_head", "_tail", "_tools")

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._created = created or 0
        self._head = b""
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._tools: dict[int, int] = {}  # IR index → Chat tool index
        self._args: dict[int, bytes] = {}  # IR index → argument-delta prefix
        self._custom: dict[int, tuple[str, str, list[str]]] = {}  # buffered custom calls

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        if created is not None:
            self._created = created
        if usage is not None:
            self._usage = usage
        self._head = (
            b'data: {"id":'
            + _json.dumps(prefixed_id("chatcmpl-", id))
            + b',"object":"chat.completion.chunk","created":'
            + str(self._created).encode()
            + b',"model":'
            + _json.dumps(self._model)
            + b',"choices":[{"index":0,"delta":'
        )
        self._out.append(self._head + b'{"role":"assistant","content":""}' + self._tail)

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        self._ensure_started()

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        if self.ended or index in self._tools:
            return
        self._ensure_started()
        number = self._tools[index] = len(self._tools)
        if tool_kind is ir.ToolKind.CUSTOM and not namespace:
            self._custom[index] = (id, name, [])
            return
        call = {
            "index": number,
            "id": id,
            "type": "function",
            "function": {"name": flat_name(name, namespace), "arguments": ""},
        }
        self._out.append(self._head + _json.dumps({"tool_calls": [call]}) + self._tail)
        self._args[index] = (
            self._head
            + b'{"tool_calls":[{"index":'
            + str(number).encode()
            + b',"function":{"arguments":'
        )

    def text(self, index: int, text: str) -> None:
        if self.ended:
            return
        if not self._started:
            self._ensure_started()
        self._out.append(self._head + b'{"content":' + _json.dumps(text) + b"}" + self._tail)

    def reasoning(self, index: int, text: str) -> None:
        if self.ended or not text:
            return
        if not self._started:
            self._ensure_started()
        self._out.append(
            self._head + b'{"reasoning_content":' + _json.dumps(text) + b"}" + self._tail
        )

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        self._drop("reasoning.signature")

    def tool_args(self, index: int, arguments: str) -> None:
        prefix = self._args.get(index)
        if prefix is not None:
            if arguments and not self.ended:
                self._out.append(prefix + _json.dumps(arguments) + b"}}]}" + self._tail)
            return
        custom = self._custom.get(index)
        if custom is not None:
            custom[2].append(arguments)

    def part_stop(self, index: int) -> None:
        custom = self._custom.pop(index, None)
        if custom is None or self.ended:
            return
        call_id, name, chunks = custom
        call = {
            "index": self._tools[index],
            "id": call_id,
            "type": "custom",
            "custom": {"name": name, "input": custom_input("".join(chunks))},
        }
        self._out.append(self._head + _json.dumps({"tool_calls": [call]}) + self._tail)

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        for index in list(self._custom):
            self.part_stop(index)
        reason = self._reason
        if reason is None:
            reason = ir.StopReason.TOOL_USE if self._tools else ir.StopReason.END_TURN
        closing = (
            self._head
            + b'{},"logprobs":null,"finish_reason":"'
            + FINISH_TO[reason].encode()
            + b'"}]'
        )
        if self._usage is not None:
            closing += b',"usage":' + _json.dumps(encode_usage(self._usage))
        self._out.append(closing + b"}\n\ndata: [DONE]\n\n")
        self.ended = True

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        self._out.append(stream_error_event(DIALECT, err))


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
