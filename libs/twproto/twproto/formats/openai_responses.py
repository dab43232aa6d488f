"""OpenAI Responses (``POST /v1/responses``, Codex's wire) ⇄ IR.

Theory of operation
-------------------

Requests: ``instructions`` is `Request.system`; ``input`` items become messages. Consecutive
items that belong to one speaker are one IR message: ``reasoning``, assistant ``message`` and
``function_call``/``custom_tool_call`` items make an assistant message; ``function_call_output``
items and user messages a user message; ``system``/``developer`` messages (Codex's system prompt)
are `Role.SYSTEM` messages in place. Tools keep their kind: ``function``, ``custom`` (free-form,
with its grammar), functions inside a ``namespace`` (each tool remembers its namespace), and
hosted tools (``web_search``, ``tool_search``…) as `ToolKind.BUILTIN`, which other formats drop.

Encoding from another format: the request is stateless (``store: false`` unless the client said
otherwise) and, when reasoning is on, asks for ``include: ["reasoning.encrypted_content"]`` so the
reasoning can be replayed on the next turn, and for a reasoning summary so the client sees the
reasoning text. Function tools get ``strict: false`` unless the source said, so schemas that
are not strict-compatible are accepted. Reasoning parts are replayed as reasoning items only
when they carry a seal (encrypted content, or another format's signature standing in for it).

Answers and streams: output items are numbered by ``output_index``; the decoder gives each
reasoning item, text content part and tool call its own IR index. A custom tool call's input
streams as raw text; the decoder wraps it as the JSON ``{"input": …}`` the IR uses, escaping
each piece on its own (JSON string escaping is per character). The encoder writes the full
event sequence the SDK's accumulator checks (``output_item.added`` → deltas → ``*.done`` →
``output_item.done``, ``sequence_number`` on every event, stable item ids derived from the
response id and the output index), and ends with ``response.completed`` — or
``response.incomplete`` for a length or content-filter stop — carrying every output item and the
usage. A custom call's input is delivered in one piece when the call ends (it arrives as JSON
from other formats). Errors are ``response.failed``.
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
    call_kinds,
    carry_extras,
    custom_arguments,
    custom_input,
    data_url,
    drop_cache_control,
    error_status,
    image_from_url,
    json_text,
    need_int,
    need_str,
    opt_bool,
    opt_float,
    opt_int,
    prefixed_id,
    usage_or_zero,
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


def decode_usage(raw: Any) -> ir.Usage:
    usage = as_dict(raw)
    total_in = as_int(usage.get("input_tokens"))
    details = as_dict(usage.get("input_tokens_details"))
    cached = as_int(details.get("cached_tokens"))
    written = as_int(details.get("cache_write_tokens"))
    return ir.Usage(
        input_tokens=max(total_in - cached - written, 0),
        output_tokens=as_int(usage.get("output_tokens")),
        cache_read_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=as_int(
            as_dict(usage.get("output_tokens_details")).get("reasoning_tokens")
        ),
    )


def encode_usage(usage: ir.Usage) -> dict[str, Any]:
    details: dict[str, int] = {"cached_tokens": usage.cache_read_tokens}
    if usage.cache_write_tokens:
        details["cache_write_tokens"] = usage.cache_write_tokens
    return {
        "input_tokens": usage.total_input_tokens,
        "input_tokens_details": details,
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _stop_reason(response: Mapping[str, Any], saw_calls: bool) -> ir.StopReason:
    status = response.get("status")
    if status == "incomplete":
        reason = as_dict(response.get("incomplete_details")).get("reason")
        return INCOMPLETE_FROM.get(str(reason), ir.StopReason.OTHER)
    if status == "failed":
        return ir.StopReason.ERROR
    return ir.StopReason.TOOL_USE if saw_calls else ir.StopReason.END_TURN


def decode_response(obj: Mapping[str, Any]) -> ir.Answer:
    """A Responses response object as an `ir.Answer`."""
    dropped = Dropped()
    parts: list[ir.Part] = []
    saw_calls = False
    refused = False
    for item in as_list(obj.get("output")):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in as_list(item.get("content")):
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") == "output_text":
                    parts.append(ir.Text(text=str(part.get("text", ""))))
                elif part.get("type") == "refusal":
                    refused = True
                    parts.append(ir.Text(text=str(part.get("refusal", ""))))
        elif kind == "reasoning":
            parts.append(_decode_reasoning_item(item))
        elif kind in ("function_call", "custom_tool_call"):
            saw_calls = True
            parts.append(_decode_call_item(item))
        else:
            parts.append(ir.Opaque(dialect=DIALECT, raw=dict(item)))
            dropped.add(f"output:{kind}")
    reason = _stop_reason(obj, saw_calls)
    if refused:
        reason = ir.StopReason.REFUSAL
    return ir.Answer(
        id=str(obj.get("id", "")),
        model=str(obj.get("model", "")),
        parts=tuple(parts),
        stop_reason=reason,
        usage=decode_usage(obj["usage"]) if isinstance(obj.get("usage"), Mapping) else None,
        created=opt_int(obj.get("created_at")),
        dropped=dropped.tuple(),
    )


def _item_base(response_id: str) -> str:
    return response_id.removeprefix("resp_") or "gateway"


def _response_object(
    response_id: str,
    model: str,
    created: int,
    status: str,
    output: list[dict[str, Any]],
    usage: ir.Usage | None,
    reason: ir.StopReason | None = None,
) -> dict[str, Any]:
    incomplete = None
    if status == "incomplete" and reason is not None:
        incomplete = {"reason": INCOMPLETE_TO.get(reason, "max_output_tokens")}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "usage": encode_usage(usage) if usage is not None else None,
        "metadata": {},
    }


def _final_status(reason: ir.StopReason) -> str:
    return "incomplete" if reason in INCOMPLETE_TO else "completed"


def _reasoning_item(item_id: str, text: str, seal: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if text else [],
    }
    if seal:
        item["encrypted_content"] = seal
    return item


def _call_item(item_id: str, call: ir.ToolCall, arguments: str, status: str) -> dict[str, Any]:
    if call.tool_kind is ir.ToolKind.CUSTOM:
        item: dict[str, Any] = {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "input": custom_input(arguments) if arguments else "",
        }
    else:
        item = {
            "id": item_id,
            "type": "function_call",
            "status": status,
            "arguments": arguments,
            "call_id": call.id,
            "name": call.name,
        }
    if call.namespace:
        item["namespace"] = call.namespace
    return item


def _message_item(item_id: str, texts: list[str], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [
            {"type": "output_text", "annotations": [], "logprobs": [], "text": t} for t in texts
        ],
    }


def encode_response(
    ans: ir.Answer,
    *,
    model: str,
    dropped: list[str] | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """`ans` as a Responses response object naming `model`."""
    lost = Dropped()
    response_id = prefixed_id("resp_", ans.id)
    base = _item_base(response_id)
    output: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            output.append(_message_item(f"msg_{base}_{len(output)}", list(texts), "completed"))
            texts.clear()

    for part in ans.parts:
        if isinstance(part, ir.Text):
            texts.append(part.text)
        elif isinstance(part, ir.Reasoning):
            flush()
            if part.redacted_data is not None:
                lost.add("reasoning (redacted)")
                continue
            output.append(
                _reasoning_item(part.item_id or f"rs_{base}_{len(output)}", part.text, part.seal)
            )
        elif isinstance(part, ir.ToolCall):
            flush()
            prefix = "ctc" if part.tool_kind is ir.ToolKind.CUSTOM else "fc"
            item_id = part.item_id or f"{prefix}_{base}_{len(output)}"
            output.append(_call_item(item_id, part, part.arguments, "completed"))
        elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
            flush()
            output.append(dict(part.raw))
        else:
            lost.add(f"content:{part.kind}")
    flush()
    if dropped is not None:
        dropped.extend(lost.tuple())
    created_at = ans.created if ans.created is not None else (created or 0)
    return _response_object(
        response_id,
        model,
        created_at,
        _final_status(ans.stop_reason),
        output,
        ans.usage,
        ans.stop_reason,
    )


# ----------------------------------------------------------------------------------------------
# Streams

# The watch path's needles: usage and the finish come in the response's terminal events, errors
# in response.failed and error; response.created is watched too, for the ids an error ending
# repeats. A chunk of one output, arguments or reasoning delta event carries none of them.
WATCH = WatchNeedles(
    chunk_markers=(
        b"response.created",
        b"response.completed",
        b"response.incomplete",
        b"response.failed",
        b"error",
    ),
    delta_starts=(
        b"event: response.output_text.delta\n",
        b"event: response.function_call_arguments.delta\n",
        b"event: response.reasoning_summary_text.delta\n",
        b"event: response.reasoning_text.delta\n",
        b"event: response.custom_tool_call_input.delta\n",
    ),
    event_names=frozenset(
        {
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
            "response.created",
        }
    ),
    data_needles=(
        '"response.completed"',
        '"response.failed"',
        '"response.incomplete"',
        '"error"',
    ),
)


class StreamDecoder(DecoderBase):
    """Responses stream events → IR stream calls; see `twproto.formats.anthropic.StreamDecoder`
    for the `feed` / `feed_into` / `watch` split."""

    __slots__ = (
        "_args_seen",
        "_custom",
        "_items",
        "_next",
        "_saw_calls",
        "_stopped",
        "_text_parts",
        "created_at",
        "response_id",
        "response_model",
    )
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.created_at: int | None = None
        self._items: dict[int, tuple[str, int]] = {}  # output_index → (item type, IR index)
        self._text_parts: dict[tuple[int, int], int] = {}
        self._custom: set[int] = set()
        self._args_seen: set[int] = set()
        self._stopped: set[int] = set()
        self._next = 0
        self._saw_calls = False

    def _new_index(self) -> int:
        index = self._next
        self._next += 1
        return index

    def _stop(self, index: int, h: ir.StreamHandler) -> None:
        if index not in self._stopped:
            self._stopped.add(index)
            h.part_stop(index)

    def _text_index(self, output_index: int, content_index: int, h: ir.StreamHandler) -> int:
        key = (output_index, content_index)
        index = self._text_parts.get(key)
        if index is None:
            index = self._text_parts[key] = self._new_index()
            h.part_start(index, ir.PartKind.TEXT, None)
        return index

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            try:
                obj = _json.loads(event.data)
            except _json.JSONDecodeError:
                if event.data.strip() and event.data.strip() != "[DONE]":
                    self._drop("event (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            kind = obj.get("type") or event.event
            if kind == "response.output_text.delta" or kind == "response.refusal.delta":
                index = self._text_index(
                    need_int(obj.get("output_index", 0)), need_int(obj.get("content_index", 0)), h
                )
                h.text(index, need_str(obj["delta"]))
            elif kind == "response.function_call_arguments.delta":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    self._args_seen.add(entry[1])
                    h.tool_args(entry[1], need_str(obj["delta"]))
            elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    h.reasoning(entry[1], need_str(obj["delta"]))
            elif kind == "response.custom_tool_call_input.delta":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    h.tool_args(entry[1], _escape_fragment(str(obj.get("delta", ""))))
            elif kind == "response.output_item.added":
                self._item_added(obj, h)
            elif kind == "response.output_item.done":
                self._item_done(obj, h)
            elif kind == "response.content_part.added":
                part = as_dict(obj.get("part"))
                index = self._text_index(
                    need_int(obj.get("output_index", 0)), need_int(obj.get("content_index", 0)), h
                )
                text = part.get("text") or part.get("refusal")
                if isinstance(text, str) and text:
                    h.text(index, text)
            elif kind == "response.content_part.done":
                key = (obj.get("output_index", 0), obj.get("content_index", 0))
                if key in self._text_parts:
                    self._stop(self._text_parts[key], h)
            elif kind == "response.reasoning_summary_part.added":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None and as_int(obj.get("summary_index")) > 0:
                    h.reasoning(entry[1], "\n\n")
            elif kind == "response.created":
                response = as_dict(obj.get("response"))
                # Kept for an error ending written on the unchanged (watch) path: the SDK
                # refuses a response.failed naming another response.
                self.response_id = str(response.get("id", "")) or None
                self.response_model = str(response.get("model", "")) or None
                self.created_at = opt_int(response.get("created_at"))
                h.message_start(
                    str(response.get("id", "")),
                    str(response.get("model", "")),
                    opt_int(response.get("created_at")),
                    None,
                )
            elif kind in ("response.completed", "response.incomplete"):
                response = as_dict(obj.get("response"))
                for index in list(self._text_parts.values()):
                    self._stop(index, h)
                for _, index in self._items.values():
                    self._stop(index, h)
                if isinstance(response.get("usage"), Mapping):
                    self.usage = decode_usage(response["usage"])
                    h.usage(self.usage)
                self.finished = True
                h.finish(_stop_reason(response, self._saw_calls), None)
                h.end()
            elif kind in ("response.failed", "error"):
                if self.error is not None:
                    return
                if kind == "error":
                    err = obj.get("error") if isinstance(obj.get("error"), Mapping) else obj
                else:
                    err = as_dict(as_dict(obj.get("response")).get("error"))
                err = as_dict(err)
                code = str(err.get("code") or err.get("type") or "server_error")
                status = obj.get("status_code") or obj.get("status")
                self.error = ir.StreamErrorEvent(
                    message=str(err.get("message", "upstream error")),
                    type=code,
                    status=status
                    if isinstance(status, int) and 400 <= status <= 599
                    else error_status(code),
                )
                h.error(self.error)
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _item_added(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        item = as_dict(obj.get("item"))
        output_index = as_int(obj.get("output_index"))
        kind = str(item.get("type"))
        if kind == "message":
            self._items[output_index] = (kind, -1)
        elif kind == "reasoning":
            index = self._new_index()
            self._items[output_index] = (kind, index)
            h.part_start(index, ir.PartKind.REASONING, as_str(item.get("id")))
        elif kind in ("function_call", "custom_tool_call"):
            index = self._new_index()
            self._items[output_index] = (kind, index)
            self._saw_calls = True
            custom = kind == "custom_tool_call"
            h.tool_call_start(
                index,
                str(item.get("call_id", "")),
                str(item.get("name", "")),
                ir.ToolKind.CUSTOM if custom else ir.ToolKind.FUNCTION,
                as_str(item.get("namespace")),
                as_str(item.get("id")),
            )
            if custom:
                self._custom.add(index)
                h.tool_args(index, '{"input":"' + _escape_fragment(str(item.get("input", ""))))
            elif item.get("arguments"):
                self._args_seen.add(index)
                h.tool_args(index, str(item["arguments"]))
        else:
            self._drop(f"output:{kind}")

    def _item_done(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        item = as_dict(obj.get("item"))
        entry = self._items.get(as_int(obj.get("output_index")))
        if entry is None:
            return
        kind, index = entry
        if kind == "message":
            output_index = as_int(obj.get("output_index"))
            for (oi, _), text_index in self._text_parts.items():
                if oi == output_index:
                    self._stop(text_index, h)
            return
        if index in self._stopped:
            return
        if kind == "reasoning":
            sealed = as_str(item.get("encrypted_content"))
            if sealed:
                h.reasoning_seal(index, None, sealed, None)
        elif index in self._custom:
            h.tool_args(index, '"}')
        elif index not in self._args_seen and item.get("arguments"):
            h.tool_args(index, str(item["arguments"]))
        self._stop(index, h)


class _OpenItem:
    __slots__ = (
        "call",
        "chunks",
        "delta_prefix",
        "id",
        "kind",
        "output_index",
        "seal",
        "started",
        "texts",
    )

    def __init__(self, kind: str, item_id: str, output_index: int) -> None:
        self.kind = kind
        self.id = item_id
        self.output_index = output_index
        self.chunks: list[str] = []
        self.texts: list[str] = []  # message items: the finished texts of its content parts
        self.seal: str | None = None
        self.call: ir.ToolCall | None = None
        self.started = False  # reasoning: its summary part was opened
        self.delta_prefix = b""


class StreamEncoder(EncoderBase):
    """IR stream calls → Responses SSE bytes; `take()` returns what is ready to send.

    Message and reasoning items are sequential (a new part closes the open one); tool-call items
    stay open until their own part ends, so calls whose arguments arrive interleaved (Chat
    upstreams may do that) are still delivered whole. `sse` is not used: this format always
    streams as SSE.
    """

    __slots__ = (
        "_base",
        "_calls",
        "_created",
        "_done",
        "_id",
        "_next_output",
        "_parts",
        "_seq",
        "_seq_open",
    )

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._created = created or 0
        self._seq = 0
        self._id = "resp_gateway"
        self._base = "gateway"
        self._next_output = 0
        self._done: dict[int, dict[str, Any]] = {}  # output_index → finished item
        self._seq_open: _OpenItem | None = None  # the open message or reasoning item
        self._calls: dict[int, _OpenItem] = {}  # output_index → open tool-call item
        # IR index → (item, content index within a message; -1 for other items)
        self._parts: dict[int, tuple[_OpenItem, int]] = {}

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        payload["sequence_number"] = self._seq
        self._seq += 1
        name = kind.encode()
        self._out.append(
            b"event: "
            + name
            + b'\ndata: {"type":"'
            + name
            + b'",'
            + _json.dumps(payload)[1:]
            + b"\n\n"
        )

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: ir.Usage | None
    ) -> dict[str, Any]:
        return _response_object(
            self._id, self._model, self._created, status, output, usage, self._reason
        )

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        self._id = prefixed_id("resp_", id)
        self._base = _item_base(self._id)
        if created is not None:
            self._created = created
        if usage is not None:
            self._usage = usage
        self._emit("response.created", {"response": self._response("in_progress", [], None)})
        self._emit("response.in_progress", {"response": self._response("in_progress", [], None)})

    def _new_item(self, kind: str, prefix: str) -> _OpenItem:
        self._ensure_started()
        number = self._next_output
        self._next_output += 1
        return _OpenItem(kind, f"{prefix}_{self._base}_{number}", number)

    def _item_done(self, item: _OpenItem, done: dict[str, Any]) -> None:
        self._emit("response.output_item.done", {"output_index": item.output_index, "item": done})
        self._done[item.output_index] = done

    def _finish_text(self, message: _OpenItem) -> None:
        if not message.delta_prefix:
            return
        content_index = len(message.texts) - 1
        text = "".join(message.chunks)
        message.texts[content_index] = text
        common = {
            "item_id": message.id,
            "output_index": message.output_index,
            "content_index": content_index,
        }
        self._emit("response.output_text.done", {**common, "logprobs": [], "text": text})
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        self._emit("response.content_part.done", {**common, "part": part})
        message.chunks = []
        message.delta_prefix = b""

    def _close_sequential(self) -> None:
        item = self._seq_open
        if item is None:
            return
        self._seq_open = None
        if item.kind == "message":
            self._finish_text(item)
            self._item_done(item, _message_item(item.id, item.texts, "completed"))
            return
        text = "".join(item.chunks)
        if item.started:
            common = {"item_id": item.id, "output_index": item.output_index, "summary_index": 0}
            self._emit("response.reasoning_summary_text.done", {**common, "text": text})
            self._emit(
                "response.reasoning_summary_part.done",
                {**common, "part": {"type": "summary_text", "text": text}},
            )
        self._item_done(item, _reasoning_item(item.id, text, item.seal))

    def _close_call(self, item: _OpenItem) -> None:
        self._calls.pop(item.output_index, None)
        call = item.call
        assert call is not None
        arguments = "".join(item.chunks)
        common = {"item_id": item.id, "output_index": item.output_index}
        if call.tool_kind is ir.ToolKind.CUSTOM:
            text = custom_input(arguments) if arguments else ""
            if text:
                self._emit("response.custom_tool_call_input.delta", {**common, "delta": text})
            self._emit("response.custom_tool_call_input.done", {**common, "input": text})
        else:
            self._emit("response.function_call_arguments.done", {**common, "arguments": arguments})
        self._item_done(item, _call_item(item.id, call, arguments, "completed"))

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        if self.ended or index in self._parts:
            return
        if part is ir.PartKind.REASONING:
            self._close_sequential()
            item = self._new_item("reasoning", "rs")
            if item_id and item_id.startswith("rs_"):
                item.id = item_id
            self._seq_open = item
            self._parts[index] = (item, -1)
            added = {"id": item.id, "type": "reasoning", "summary": []}
            self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": added}
            )
            return
        message = self._seq_open
        if message is None or message.kind != "message":
            self._close_sequential()
            message = self._new_item("message", "msg")
            self._seq_open = message
            self._emit(
                "response.output_item.added",
                {
                    "output_index": message.output_index,
                    "item": _message_item(message.id, [], "in_progress"),
                },
            )
        else:
            self._finish_text(message)
        content_index = len(message.texts)
        message.texts.append("")
        self._parts[index] = (message, content_index)
        message.delta_prefix = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"item_id":'
            + _json.dumps(message.id)
            + b',"output_index":'
            + str(message.output_index).encode()
            + b',"content_index":'
            + str(content_index).encode()
            + b',"logprobs":[],"delta":'
        )
        part_obj = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        self._emit(
            "response.content_part.added",
            {
                "item_id": message.id,
                "output_index": message.output_index,
                "content_index": content_index,
                "part": part_obj,
            },
        )

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        if self.ended or index in self._parts:
            return
        self._close_sequential()
        custom = tool_kind is ir.ToolKind.CUSTOM
        item = self._new_item("call", "ctc" if custom else "fc")
        if item_id and item_id.startswith("ctc_" if custom else "fc_"):
            item.id = item_id
        item.call = ir.ToolCall(id=id, name=name, tool_kind=tool_kind, namespace=namespace)
        self._parts[index] = (item, -1)
        self._calls[item.output_index] = item
        self._emit(
            "response.output_item.added",
            {
                "output_index": item.output_index,
                "item": _call_item(item.id, item.call, "", "in_progress"),
            },
        )
        item.delta_prefix = (
            b'event: response.function_call_arguments.delta\ndata: {"type":'
            b'"response.function_call_arguments.delta","item_id":'
            + _json.dumps(item.id)
            + b',"output_index":'
            + str(item.output_index).encode()
            + b',"delta":'
        )

    def text(self, index: int, text: str) -> None:
        entry = self._parts.get(index)
        if entry is None:
            if self.ended:
                return
            self.part_start(index, ir.PartKind.TEXT, None)
            entry = self._parts[index]
        item, content_index = entry
        if item is not self._seq_open or content_index != len(item.texts) - 1:
            self._late("text")
            return
        item.chunks.append(text)
        seq = self._seq
        self._seq += 1
        self._out.append(
            item.delta_prefix
            + _json.dumps(text)
            + b',"sequence_number":'
            + str(seq).encode()
            + b"}\n\n"
        )

    def _reasoning_item_for(self, index: int) -> _OpenItem | None:
        entry = self._parts.get(index)
        if entry is None:
            if self.ended:
                return None
            self.part_start(index, ir.PartKind.REASONING, None)
            entry = self._parts[index]
        if entry[0] is not self._seq_open:
            return None
        return entry[0]

    def reasoning(self, index: int, text: str) -> None:
        if not text:
            return
        item = self._reasoning_item_for(index)
        if item is None:
            self._late("reasoning")
            return
        common = {"item_id": item.id, "output_index": item.output_index, "summary_index": 0}
        if not item.started:
            item.started = True
            self._emit(
                "response.reasoning_summary_part.added",
                {**common, "part": {"type": "summary_text", "text": ""}},
            )
        item.chunks.append(text)
        self._emit("response.reasoning_summary_text.delta", {**common, "delta": text})

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        if redacted_data is not None:
            self._late("reasoning (redacted)")
        item = self._reasoning_item_for(index)
        seal = encrypted_content or signature
        if item is None:
            if seal:
                self._late("reasoning seal")
            return
        if seal:
            item.seal = seal

    def tool_args(self, index: int, arguments: str) -> None:
        entry = self._parts.get(index)
        if entry is None or not arguments:
            return
        item = entry[0]
        if item.output_index not in self._calls:
            self._late("tool_call arguments")
            return
        item.chunks.append(arguments)
        assert item.call is not None
        if item.call.tool_kind is ir.ToolKind.CUSTOM:
            return  # delivered whole when the call ends (see the module notes)
        seq = self._seq
        self._seq += 1
        self._out.append(
            item.delta_prefix
            + _json.dumps(arguments)
            + b',"sequence_number":'
            + str(seq).encode()
            + b"}\n\n"
        )

    def part_stop(self, index: int) -> None:
        entry = self._parts.get(index)
        if entry is None or self.ended:
            return
        item, content_index = entry
        if item.kind == "call":
            if item.output_index in self._calls:
                self._close_call(item)
        elif item is self._seq_open:
            if item.kind == "message":
                if content_index == len(item.texts) - 1:
                    self._finish_text(item)
            else:
                self._close_sequential()

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        self._close_sequential()
        for output_index in sorted(self._calls):
            self._close_call(self._calls[output_index])
        output = [self._done[i] for i in sorted(self._done)]
        if self._reason is None:
            has_calls = any(
                item.get("type") in ("function_call", "custom_tool_call") for item in output
            )
            self._reason = ir.StopReason.TOOL_USE if has_calls else ir.StopReason.END_TURN
        status = _final_status(self._reason)
        self._emit(
            f"response.{status}",
            {"response": self._response(status, output, usage_or_zero(self._usage))},
        )
        self.ended = True

    def _late(self, what: str) -> None:
        # A delta for an item already closed: Responses items cannot be reopened.
        self._drop(f"{what} after its item closed")

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        self._ensure_started()
        self._out.append(
            stream_error_event(
                DIALECT,
                err,
                response_id=self._id,
                model=self._model,
                sequence_number=self._seq,
                created_at=self._created,
            )
        )
        self._seq += 1


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
