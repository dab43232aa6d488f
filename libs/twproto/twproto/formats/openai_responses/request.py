"""OpenAI Responses requests ⇄ IR.

The wire vocabulary the response and stream codecs share (the dialect, the finish reasons, the
decoders of content parts) is defined here, with the request codec that uses it first; the
package docstring of `twproto.formats.openai_responses` tells how the format maps to the IR.
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
    call_kinds,
    carry_extras,
    custom_arguments,
    custom_input,
    data_url,
    drop_cache_control,
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


DIALECT = Dialect.OPENAI_RESPONSES

INCOMPLETE_FROM: Mapping[str, ir.StopReason] = {
    "max_output_tokens": ir.StopReason.MAX_TOKENS,
    "content_filter": ir.StopReason.CONTENT_FILTER,
}
INCOMPLETE_TO: Mapping[ir.StopReason, str] = {
    ir.StopReason.MAX_TOKENS: "max_output_tokens",
    ir.StopReason.CONTENT_FILTER: "content_filter",
    ir.StopReason.REFUSAL: "content_filter",
}

_REQUEST_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_output_tokens",
        "stream",
        "parallel_tool_calls",
        "reasoning",
        "user",
        "safety_identifier",
        "metadata",
        "prompt_cache_key",
        "store",
        "text",
    }
)

_MAX_USER = 64
_ENCRYPTED = "reasoning.encrypted_content"


def _escape_fragment(text: str) -> str:
    """`text` escaped for the inside of a JSON string (no quotes)."""
    return json_text(text)[1:-1]


# ----------------------------------------------------------------------------------------------
# Requests


def _content_parts(content: Any) -> list[ir.Text | ir.Image | ir.Opaque]:
    if isinstance(content, str):
        return [ir.Text(text=content)]
    out: list[ir.Text | ir.Image | ir.Opaque] = []
    for part in as_list(content):
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            out.append(ir.Text(text=str(part.get("text", ""))))
        elif kind == "refusal":
            out.append(ir.Text(text=str(part.get("refusal", ""))))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            out.append(image_from_url(part["image_url"], as_str(part.get("detail"))))
        else:
            out.append(ir.Opaque(dialect=DIALECT, raw=dict(part)))
    return out


def _reasoning_text(item: Mapping[str, Any]) -> str:
    summary = [
        str(s.get("text", "")) for s in as_list(item.get("summary")) if isinstance(s, Mapping)
    ]
    if summary:
        return "\n\n".join(summary)
    content = [
        str(c.get("text", "")) for c in as_list(item.get("content")) if isinstance(c, Mapping)
    ]
    return "".join(content)


def _decode_reasoning_item(item: Mapping[str, Any]) -> ir.Reasoning:
    return ir.Reasoning(
        text=_reasoning_text(item),
        encrypted_content=as_str(item.get("encrypted_content")),
        item_id=as_str(item.get("id")),
    )


def _decode_call_item(item: Mapping[str, Any]) -> ir.ToolCall:
    if item.get("type") == "custom_tool_call":
        return ir.ToolCall(
            id=str(item.get("call_id", "")),
            name=str(item.get("name", "")),
            arguments=custom_arguments(str(item.get("input", ""))),
            tool_kind=ir.ToolKind.CUSTOM,
            namespace=as_str(item.get("namespace")),
            item_id=as_str(item.get("id")),
        )
    arguments = item.get("arguments", "")
    return ir.ToolCall(
        id=str(item.get("call_id", "")),
        name=str(item.get("name", "")),
        arguments=arguments if isinstance(arguments, str) and arguments else "{}",
        namespace=as_str(item.get("namespace")),
        item_id=as_str(item.get("id")),
    )


def _decode_tool(
    tool: Mapping[str, Any], out: list[ir.Tool], namespace: Mapping[str, Any] | None
) -> None:
    kind = tool.get("type")
    ns = as_str(namespace.get("name")) if namespace else None
    ns_desc = as_str(namespace.get("description")) if namespace else None
    if kind == "function":
        out.append(
            ir.Tool(
                name=str(tool.get("name", "")),
                description=as_str(tool.get("description")),
                parameters=as_dict(tool["parameters"])
                if isinstance(tool.get("parameters"), Mapping)
                else None,
                strict=opt_bool(tool.get("strict")),
                namespace=ns,
                namespace_description=ns_desc,
            )
        )
    elif kind == "custom":
        out.append(
            ir.Tool(
                name=str(tool.get("name", "")),
                description=as_str(tool.get("description")),
                kind=ir.ToolKind.CUSTOM,
                format=as_dict(tool.get("format")) or None,
                namespace=ns,
                namespace_description=ns_desc,
            )
        )
    elif kind == "namespace" and namespace is None:
        for sub in as_list(tool.get("tools")):
            if isinstance(sub, Mapping):
                _decode_tool(sub, out, tool)
    else:
        out.append(
            ir.Tool(name=str(kind), kind=ir.ToolKind.BUILTIN, raw=dict(tool), dialect=DIALECT)
        )


def _decode_choice(raw: Any) -> ir.ToolChoice | None:
    if raw in ("auto", "none", "required"):
        return ir.ToolChoice(mode=ir.ToolChoiceMode(raw))
    choice = as_dict(raw)
    if choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return ir.ToolChoice(
            mode=ir.ToolChoiceMode.NAMED,
            name=choice["name"],
            namespace=as_str(choice.get("namespace")),
        )
    return None


def decode_request(obj: Mapping[str, Any]) -> ir.Request:
    """A Responses request body (parsed JSON) as an `ir.Request`."""
    dropped = Dropped()
    extras = {k: v for k, v in obj.items() if k not in _REQUEST_FIELDS}
    if "previous_response_id" in obj:
        # The conversation lives on the upstream that stored it; another format cannot see it.
        dropped.add("previous_response_id")
    system: tuple[ir.Text, ...] = ()
    instructions = obj.get("instructions")
    if isinstance(instructions, str) and instructions:
        system = (ir.Text(text=instructions),)

    messages: list[ir.Message] = []
    role: ir.Role | None = None
    parts: list[ir.Part] = []

    def push(new_role: ir.Role, new_parts: list[ir.Part], merge: bool = True) -> None:
        nonlocal role, parts
        if merge and role is new_role:
            parts.extend(new_parts)
            return
        if role is not None:
            messages.append(ir.Message(role=role, parts=tuple(parts)))
        role, parts = new_role, list(new_parts)

    raw_input = obj.get("input")
    items: list[Any] = (
        [{"type": "message", "role": "user", "content": raw_input}]
        if isinstance(raw_input, str)
        else as_list(raw_input)
    )
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            item_role = item.get("role")
            content: list[ir.Part] = list(_content_parts(item.get("content")))
            if item_role in ("system", "developer"):
                push(ir.Role.SYSTEM, content, merge=False)
            elif item_role == "assistant":
                push(ir.Role.ASSISTANT, content)
            else:
                push(ir.Role.USER, content)
        elif kind in ("function_call", "custom_tool_call"):
            push(ir.Role.ASSISTANT, [_decode_call_item(item)])
        elif kind == "reasoning":
            push(ir.Role.ASSISTANT, [_decode_reasoning_item(item)])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            result_parts = tuple(p for p in _content_parts(output) if not isinstance(p, ir.Opaque))
            push(
                ir.Role.USER,
                [ir.ToolResult(call_id=str(item.get("call_id", "")), content=result_parts)],
            )
        else:
            # Items only Responses understands (item_reference, shell calls…) stay in place.
            push(role or ir.Role.USER, [ir.Opaque(dialect=DIALECT, raw=dict(item))])
    if role is not None:
        messages.append(ir.Message(role=role, parts=tuple(parts)))

    tools: list[ir.Tool] = []
    for tool in as_list(obj.get("tools")):
        if isinstance(tool, Mapping):
            _decode_tool(tool, tools, None)

    reasoning_cfg = None
    raw_reasoning = as_dict(obj.get("reasoning"))
    if raw_reasoning:
        effort = parse_effort(raw_reasoning.get("effort"))
        reasoning_cfg = ir.ReasoningConfig(
            effort=effort,
            enabled=effort is not ir.Effort.NONE,
            summary=as_str(raw_reasoning.get("summary")),
        )
    output_format = None
    fmt = as_dict(as_dict(obj.get("text")).get("format"))
    if fmt.get("type") == "json_schema":
        output_format = ir.OutputFormat(
            type="json_schema",
            name=as_str(fmt.get("name")),
            schema=as_dict(fmt.get("schema")),
            strict=opt_bool(fmt.get("strict")),
            description=as_str(fmt.get("description")),
        )
    elif fmt.get("type") == "json_object":
        output_format = ir.OutputFormat(type="json_object")
    user = as_str(obj.get("safety_identifier"))
    if user is None:
        user = as_str(obj.get("user"))
    metadata = obj.get("metadata")
    return ir.Request(
        model=str(obj.get("model", "")),
        system=system,
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=_decode_choice(obj.get("tool_choice")),
        temperature=opt_float(obj.get("temperature")),
        top_p=opt_float(obj.get("top_p")),
        max_output_tokens=opt_int(obj.get("max_output_tokens")),
        reasoning=reasoning_cfg,
        stream=obj.get("stream") is True,
        parallel_tool_calls=opt_bool(obj.get("parallel_tool_calls")),
        user=user,
        metadata=dict(metadata) if isinstance(metadata, Mapping) else None,
        cache_key=as_str(obj.get("prompt_cache_key")),
        store=opt_bool(obj.get("store")),
        output_format=output_format,
        origin=DIALECT,
        extras=extras,
        dropped=dropped.tuple(),
    )


def _image_item(image: ir.Image) -> dict[str, Any]:
    url = image.url if image.url is not None else data_url(image.media_type, image.data or "")
    return {"type": "input_image", "image_url": url, "detail": image.detail or "auto"}


def _tool_item(tool: ir.Tool) -> dict[str, Any]:
    if tool.kind is ir.ToolKind.CUSTOM:
        out: dict[str, Any] = {"type": "custom", "name": tool.name}
        if tool.description:
            out["description"] = tool.description
        if tool.format:
            out["format"] = tool.format
        return out
    out = {"type": "function", "name": tool.name}
    if tool.description:
        out["description"] = tool.description
    out["parameters"] = tool.parameters if tool.parameters is not None else EMPTY_PARAMETERS
    out["strict"] = bool(tool.strict)
    return out


def _system(req: ir.Request, out: dict[str, Any]) -> None:
    if req.system:
        out["instructions"] = "\n\n".join(t.text for t in req.system)


def _messages(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    same = req.origin is DIALECT
    calls = call_kinds(req.messages)
    items: list[dict[str, Any]] = []
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            text = "".join(p.text for p in message.parts if isinstance(p, ir.Text))
            items.append(
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": text}],
                }
            )
            continue
        user = message.role is ir.Role.USER
        pending: list[dict[str, Any]] = []

        def flush(pending: list[dict[str, Any]] = pending, user: bool = user) -> None:
            if pending:
                items.append(
                    {
                        "type": "message",
                        "role": "user" if user else "assistant",
                        "content": list(pending),
                    }
                )
                pending.clear()

        for part in message.parts:
            if isinstance(part, ir.Text):
                if user:
                    pending.append({"type": "input_text", "text": part.text})
                else:
                    pending.append({"type": "output_text", "text": part.text, "annotations": []})
            elif isinstance(part, ir.Image):
                if user:
                    pending.append(_image_item(part))
                else:
                    dropped.add("assistant image")
            elif isinstance(part, ir.ToolResult):
                flush()
                call = calls.get(part.call_id)
                custom = call is not None and call.tool_kind is ir.ToolKind.CUSTOM
                output: str | list[dict[str, Any]]
                if any(isinstance(p, ir.Image) for p in part.content):
                    output = [
                        {"type": "input_text", "text": p.text}
                        if isinstance(p, ir.Text)
                        else _image_item(p)
                        for p in part.content
                    ]
                else:
                    output = part.text
                if part.is_error:
                    dropped.add("tool_result.is_error")
                items.append(
                    {
                        "type": "custom_tool_call_output" if custom else "function_call_output",
                        "call_id": part.call_id,
                        "output": output,
                    }
                )
            elif isinstance(part, ir.ToolCall):
                flush()
                item: dict[str, Any]
                if part.tool_kind is ir.ToolKind.CUSTOM:
                    item = {
                        "type": "custom_tool_call",
                        "call_id": part.id,
                        "name": part.name,
                        "input": custom_input(part.arguments),
                    }
                else:
                    item = {
                        "type": "function_call",
                        "call_id": part.id,
                        "name": part.name,
                        "arguments": part.arguments,
                    }
                if part.namespace:
                    item["namespace"] = part.namespace
                if part.item_id and same:
                    item["id"] = part.item_id
                items.append(item)
            elif isinstance(part, ir.Reasoning):
                flush()
                seal = part.encrypted_content or part.signature
                if not seal and not (same and part.item_id):
                    dropped.add("reasoning (no encrypted content)")
                    continue
                reasoning: dict[str, Any] = {"type": "reasoning"}
                if part.item_id:
                    reasoning["id"] = part.item_id
                reasoning["summary"] = (
                    [{"type": "summary_text", "text": part.text}] if part.text else []
                )
                if seal:
                    reasoning["encrypted_content"] = seal
                items.append(reasoning)
            elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
                flush()
                items.append(dict(part.raw))
            else:
                dropped.add(
                    f"content:{part.raw.get('type') if isinstance(part, ir.Opaque) else part.kind}"
                )
        flush()
    out["input"] = items


def _tools(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> bool:
    same = req.origin is DIALECT
    tools: list[dict[str, Any]] = []
    namespaces: dict[str, dict[str, Any]] = {}
    for tool in req.tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            raw = builtin_tool(tool, DIALECT, dropped)
            if raw is not None:
                tools.append(raw)
            continue
        item_out = _tool_item(tool)
        if tool.strict is None and same:
            item_out.pop("strict", None)
        if tool.namespace:
            group = namespaces.get(tool.namespace)
            if group is None:
                group = namespaces[tool.namespace] = {
                    "type": "namespace",
                    "name": tool.namespace,
                    "description": tool.namespace_description or "",
                    "tools": [],
                }
                tools.append(group)
            group["tools"].append(item_out)
        else:
            tools.append(item_out)
    if tools:
        out["tools"] = tools
    return bool(tools)


def _tool_choice(req: ir.Request, out: dict[str, Any], *, tools: bool) -> None:
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        if mode is ir.ToolChoiceMode.NAMED:
            kind = "function"
            for tool in req.tools:
                if tool.name == req.tool_choice.name and tool.kind is ir.ToolKind.CUSTOM:
                    kind = "custom"
            choice: dict[str, Any] = {"type": kind, "name": req.tool_choice.name}
            if req.tool_choice.namespace:
                choice["namespace"] = req.tool_choice.namespace
            out["tool_choice"] = choice
        else:
            out["tool_choice"] = mode.value
    if req.parallel_tool_calls is not None and tools:
        out["parallel_tool_calls"] = req.parallel_tool_calls


def _output_limit(req: ir.Request, out: dict[str, Any]) -> None:
    if req.max_output_tokens is not None:
        out["max_output_tokens"] = req.max_output_tokens


def _sampling(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        out["top_p"] = req.top_p
    if req.top_k is not None:
        dropped.add("top_k")


def _stop_sequences(req: ir.Request, dropped: Dropped) -> None:
    # Responses has no stop sequences.
    if req.stop:
        dropped.add("stop")


def _reasoning(req: ir.Request, out: dict[str, Any]) -> bool:
    # Returns whether reasoning is on: `_options` then asks for its encrypted content.
    same = req.origin is DIALECT
    reasoning = req.reasoning
    if reasoning is None:
        return False
    settings: dict[str, Any] = {}
    effort = reasoning.effort
    if effort is None and reasoning.enabled and reasoning.budget_tokens:
        effort = effort_for_budget(reasoning.budget_tokens)
    if effort is not None and (reasoning.enabled or same):
        settings["effort"] = OPENAI_EFFORT[effort]
    if reasoning.summary is not None:
        settings["summary"] = reasoning.summary
    elif reasoning.enabled and not same:
        settings["summary"] = "auto"
    if settings:
        out["reasoning"] = settings
    return reasoning.enabled and effort is not ir.Effort.NONE


def _options(req: ir.Request, out: dict[str, Any], dropped: Dropped, *, reasoning_on: bool) -> None:
    # Streaming, storage, the prompt-cache key, the end user and metadata.
    same = req.origin is DIALECT
    if req.stream:
        out["stream"] = True
    if same:
        if req.store is not None:
            out["store"] = req.store
    else:
        out["store"] = req.store if req.store is not None else False
        if reasoning_on and not out["store"]:
            out["include"] = [_ENCRYPTED]
    if req.cache_key is not None:
        out["prompt_cache_key"] = req.cache_key
    if req.user is not None:
        if same:
            out["safety_identifier" if "user" not in req.extras else "user"] = req.user
        elif len(req.user) <= _MAX_USER:
            out["safety_identifier"] = req.user
        else:
            dropped.add("user (longer than 64 characters)")
    if req.metadata is not None:
        out["metadata"] = req.metadata


def _output_format(req: ir.Request, out: dict[str, Any]) -> None:
    fmt = req.output_format
    if fmt is not None:
        if fmt.type == "json_schema":
            text_format: dict[str, Any] = {"type": "json_schema", "name": fmt.name or "response"}
            if fmt.description:
                text_format["description"] = fmt.description
            text_format["schema"] = fmt.schema or {}
            if fmt.strict is not None:
                text_format["strict"] = fmt.strict
        else:
            text_format = {"type": "json_object"}
        out["text"] = (
            {**as_dict(req.extras.get("text")), "format": text_format}
            if req.origin is DIALECT
            else {"format": text_format}
        )


def encode_request(req: ir.Request, *, model: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`req` as a Responses body for `model`, and what could not be carried."""
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
    _sampling(req, out, dropped)
    _stop_sequences(req, dropped)
    reasoning_on = _reasoning(req, out)
    _options(req, out, dropped, reasoning_on=reasoning_on)
    _output_format(req, out)
    drop_cache_control(req, same=same, dropped=dropped)
    carry_extras(out, req, same=same, dropped=dropped)
    return out, dropped.tuple()


# ----------------------------------------------------------------------------------------------
# Whole answers
