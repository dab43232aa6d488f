"""Anthropic Messages (``POST /v1/messages``) ⇄ IR.

Theory of operation
-------------------

Requests: ``system`` (a string or text blocks with ``cache_control``) becomes `Request.system`;
messages keep their blocks as parts. A ``{role: "system"}`` message inside ``messages`` (Claude
Code sends one for model names it does not know) is a `Role.SYSTEM` message; encoding to
Anthropic folds every such message into the top-level ``system`` after the real system prompt,
which is where the API without the beta accepts it. ``thinking`` (enabled with a budget,
adaptive, disabled) and ``output_config.effort`` become `ReasoningConfig`. Top-level fields the
IR has no slot for (``context_management``, ``container``, ``mcp_servers``…) travel in
`Request.extras` and are re-emitted only to Anthropic.

Encoding from another format: a request without ``max_tokens`` gets `DEFAULT_MAX_TOKENS` (the
translator passes the model's real limit); thinking is turned on with a budget from the effort
table, clamped below ``max_tokens`` (OpenAI counts reasoning inside its output limit, so does
Anthropic) and left off, recorded, when ``max_tokens`` cannot hold the minimum budget; with
thinking on, ``temperature``/``top_k`` are dropped because the API refuses them. Thinking blocks
go out only with a signature (the API refuses unsigned ones); a Responses reasoning item's
``encrypted_content`` serves as the signature, so a Codex conversation served by Anthropic
keeps its reasoning. Tool-use ids are reduced to the characters the API accepts, the same way
for a call and its result.

Streams: the decoder maps ``content_block_*`` events one to one (Anthropic's block index is the
IR index); ``message_start`` and ``message_delta`` carry usage (cumulative: the delta's fields
override). The encoder writes the same events; it keeps one block open at a time, as the API
does, and writes ``message_delta`` + ``message_stop`` when the stream ends, with the final usage
and stop reason. Mid-stream errors are ``event: error``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twproto import _json, ir
from twproto.dialect import Dialect
from twproto.effort import ANTHROPIC_EFFORT, ANTHROPIC_MIN_BUDGET, budget_for_effort, parse_effort
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
    error_status,
    flat_name,
    flatten_call,
    flatten_tool,
    is_base64,
    json_text,
    need_int,
    need_str,
    opt_bool,
    opt_float,
    opt_int,
    parse_arguments,
    prefixed_id,
    standard_base64,
    usage_or_zero,
)
from twproto.sse import SSEEvent

__all__ = (
    "DEFAULT_MAX_TOKENS",
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
    out["messages"] = messages


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


def decode_usage(raw: Any, base: ir.Usage | None = None) -> ir.Usage:
    """Anthropic usage; fields absent from `raw` keep their value in `base` (stream deltas)."""
    usage = as_dict(raw)
    prev = base or ir.Usage()

    def pick(key: str, old: int) -> int:
        value = usage.get(key)
        return old if value is None else as_int(value)

    details = as_dict(usage.get("output_tokens_details"))
    reasoning = details.get("thinking_tokens")
    creation = as_dict(usage.get("cache_creation"))
    hour = creation.get("ephemeral_1h_input_tokens")
    return ir.Usage(
        input_tokens=pick("input_tokens", prev.input_tokens),
        output_tokens=pick("output_tokens", prev.output_tokens),
        cache_read_tokens=pick("cache_read_input_tokens", prev.cache_read_tokens),
        cache_write_tokens=pick("cache_creation_input_tokens", prev.cache_write_tokens),
        reasoning_tokens=prev.reasoning_tokens if reasoning is None else as_int(reasoning),
        cache_write_1h_tokens=prev.cache_write_1h_tokens if hour is None else as_int(hour),
    )


def encode_usage(usage: ir.Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "output_tokens": usage.output_tokens,
    }
    if usage.cache_write_1h_tokens:
        # Only when there is a split to tell: the plain form stays as it was.
        out["cache_creation"] = {
            "ephemeral_5m_input_tokens": usage.cache_write_tokens - usage.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
        }
    return out


def decode_response(obj: Mapping[str, Any]) -> ir.Answer:
    """An Anthropic message (non-streamed answer) as an `ir.Answer`."""
    parts = []
    for block in as_list(obj.get("content")):
        part = _decode_block(block)
        if part is not None:
            parts.append(part)
    reason = STOP_FROM.get(str(obj.get("stop_reason")), ir.StopReason.END_TURN)
    return ir.Answer(
        id=str(obj.get("id", "")),
        model=str(obj.get("model", "")),
        parts=tuple(parts),
        stop_reason=reason,
        stop_sequence=as_str(obj.get("stop_sequence")),
        usage=decode_usage(obj.get("usage")) if "usage" in obj else None,
    )


def encode_response(
    ans: ir.Answer,
    *,
    model: str,
    dropped: list[str] | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """`ans` as an Anthropic message naming `model`; what it cannot carry goes to `dropped`
    (`created` is unused: Anthropic messages carry no timestamp)."""
    lost = Dropped()
    content: list[dict[str, Any]] = []
    for part in ans.parts:
        if isinstance(part, ir.Text):
            if part.text:
                content.append({"type": "text", "text": part.text})
        elif isinstance(part, ir.Reasoning):
            if part.redacted_data is not None:
                content.append({"type": "redacted_thinking", "data": part.redacted_data})
            else:
                content.append(
                    {"type": "thinking", "thinking": part.text, "signature": part.seal or ""}
                )
        elif isinstance(part, ir.ToolCall):
            args, ok = parse_arguments(part.arguments)
            if not ok:
                lost.add("tool_call.arguments (not a JSON object)")
            content.append(
                {"type": "tool_use", "id": _tool_id(part.id), "name": part.name, "input": args}
            )
        elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
            content.append(dict(part.raw))
        else:
            lost.add(f"content:{part.kind}")
    if dropped is not None:
        dropped.extend(lost.tuple())
    return {
        "id": prefixed_id("msg_", ans.id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_TO[ans.stop_reason],
        "stop_sequence": ans.stop_sequence,
        "usage": encode_usage(usage_or_zero(ans.usage)),
    }


# ----------------------------------------------------------------------------------------------
# Streams


# The watch path's needles: usage, the stop reason and errors come in the message_* events and
# `error`; a chunk of nothing but content_block_delta (or ping) events carries none of them.
WATCH = WatchNeedles(
    chunk_markers=(b"message_", b"error"),
    delta_starts=(b"event: content_block_delta\n", b"event: ping\n"),
    event_names=frozenset({"message_start", "message_delta", "message_stop", "error"}),
    data_needles=('"message_', '"error"'),
)


class StreamDecoder(DecoderBase):
    """Anthropic SSE events → IR stream calls.

    `feed` returns event objects; `feed_into` calls a handler directly (the translator's hot
    path); `watch` only follows usage, the stop reason and errors, parsing nothing else.
    """

    __slots__ = ("_skipped",)
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self._skipped: set[int] = set()

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            try:
                obj = _json.loads(event.data)
            except _json.JSONDecodeError:
                if event.data.strip():
                    self._drop("event (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            kind = obj.get("type") or event.event
            if kind == "content_block_delta":
                index = need_int(obj.get("index", 0))
                if index in self._skipped:
                    return
                delta = obj["delta"]
                dkind = delta.get("type")
                if dkind == "text_delta":
                    h.text(index, need_str(delta["text"]))
                elif dkind == "input_json_delta":
                    h.tool_args(index, need_str(delta["partial_json"]))
                elif dkind == "thinking_delta":
                    h.reasoning(index, need_str(delta["thinking"]))
                elif dkind == "signature_delta":
                    h.reasoning_seal(index, need_str(delta["signature"]), None, None)
                elif dkind != "citations_delta":
                    self._drop(f"delta:{dkind}")
            elif kind == "content_block_start":
                self._block_start(obj, h)
            elif kind == "content_block_stop":
                index = need_int(obj.get("index", 0))
                if index not in self._skipped:
                    h.part_stop(index)
            elif kind == "message_start":
                message = as_dict(obj.get("message"))
                usage = decode_usage(message["usage"]) if "usage" in message else None
                self.usage = usage
                h.message_start(
                    str(message.get("id", "")), str(message.get("model", "")), None, usage
                )
            elif kind == "message_delta":
                delta = as_dict(obj.get("delta"))
                if "usage" in obj:
                    self.usage = decode_usage(obj["usage"], self.usage)
                    h.usage(self.usage)
                reason = delta.get("stop_reason")
                if reason is not None:
                    self.finished = True
                    h.finish(
                        STOP_FROM.get(str(reason), ir.StopReason.END_TURN),
                        as_str(delta.get("stop_sequence")),
                    )
            elif kind == "message_stop":
                self.finished = True
                h.end()
            elif kind == "error":
                err = as_dict(obj.get("error"))
                etype = str(err.get("type", "api_error"))
                self.error = ir.StreamErrorEvent(
                    message=str(err.get("message", "upstream error")),
                    type=etype,
                    status=error_status(etype),
                )
                h.error(self.error)
            elif kind != "ping":
                self._drop(f"event:{kind}")
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _block_start(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        index = need_int(obj.get("index", 0))
        block = as_dict(obj.get("content_block"))
        kind = block.get("type")
        if kind == "text":
            h.part_start(index, ir.PartKind.TEXT, None)
            if block.get("text"):
                h.text(index, need_str(block["text"]))
        elif kind == "thinking":
            h.part_start(index, ir.PartKind.REASONING, None)
            if block.get("thinking"):
                h.reasoning(index, need_str(block["thinking"]))
            if block.get("signature"):
                h.reasoning_seal(index, need_str(block["signature"]), None, None)
        elif kind == "redacted_thinking":
            h.part_start(index, ir.PartKind.REASONING, None)
            h.reasoning_seal(index, None, None, str(block.get("data", "")))
        elif kind == "tool_use":
            h.tool_call_start(
                index,
                str(block.get("id", "")),
                str(block.get("name", "")),
                ir.ToolKind.FUNCTION,
                None,
                None,
            )
            if block.get("input"):
                h.tool_args(index, json_text(block["input"]))
        else:
            self._skipped.add(index)
            self._drop(f"content:{kind}")


class StreamEncoder(EncoderBase):
    """IR stream calls → Anthropic SSE bytes; `take()` returns what is ready to send.

    `created` is not used (Anthropic messages carry no timestamp), nor `sse` (this format always
    streams as SSE).
    """

    __slots__ = (
        "_blocks",
        "_id",
        "_kinds",
        "_next",
        "_open",
        "_pending_reasoning",
        "_stop_sequence",
        "_templates",
    )

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._id = ""
        self._blocks: dict[int, int] = {}  # IR index → Anthropic block index
        self._kinds: dict[int, ir.PartKind] = {}
        self._templates: dict[int, tuple[bytes, bytes, bytes]] = {}
        self._next = 0
        self._open: int | None = None
        # A reasoning part whose block start waits for its first delta: it may turn out to be
        # redacted thinking, which is a different block type.
        self._pending_reasoning: set[int] = set()
        self._stop_sequence: str | None = None

    def _emit(self, name: bytes, obj: Any) -> None:
        self._out.append(b"event: " + name + b"\ndata: " + _json.dumps(obj) + b"\n\n")

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        self._id = prefixed_id("msg_", id)
        if usage is not None:
            self._usage = usage
        start_usage = encode_usage(usage_or_zero(usage))
        self._emit(
            b"message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self._id,
                    "type": "message",
                    "role": "assistant",
                    "model": self._model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )

    def _close_open(self) -> None:
        if self._open is not None:
            self._emit(b"content_block_stop", {"type": "content_block_stop", "index": self._open})
            self._open = None

    def _open_block(self, index: int, kind: ir.PartKind, block: dict[str, Any]) -> int:
        self._ensure_started()
        self._close_open()
        number = self._next
        self._next += 1
        self._blocks[index] = number
        self._kinds[index] = kind
        self._open = number
        prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(number).encode()
        )
        self._templates[index] = (
            prefix + b',"delta":{"type":"text_delta","text":',
            prefix + b',"delta":{"type":"thinking_delta","thinking":',
            prefix + b',"delta":{"type":"input_json_delta","partial_json":',
        )
        self._emit(
            b"content_block_start",
            {"type": "content_block_start", "index": number, "content_block": block},
        )
        return number

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        if self.ended or index in self._blocks:
            return
        if part is ir.PartKind.REASONING:
            self._pending_reasoning.add(index)
            self._kinds[index] = part
        else:
            self._open_block(index, ir.PartKind.TEXT, {"type": "text", "text": ""})

    def _flush_reasoning(self, index: int) -> None:
        self._pending_reasoning.discard(index)
        self._open_block(
            index, ir.PartKind.REASONING, {"type": "thinking", "thinking": "", "signature": ""}
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
        if self.ended or index in self._blocks:
            return
        self._open_block(
            index,
            ir.PartKind.TOOL_CALL,
            {"type": "tool_use", "id": _tool_id(id), "name": name, "input": {}},
        )

    def text(self, index: int, text: str) -> None:
        templates = self._templates.get(index)
        if templates is None:
            if self.ended:
                return
            self.part_start(index, ir.PartKind.TEXT, None)
            templates = self._templates[index]
        self._out.append(templates[0] + _json.dumps(text) + b"}}\n\n")

    def reasoning(self, index: int, text: str) -> None:
        if index in self._pending_reasoning:
            self._flush_reasoning(index)
        templates = self._templates.get(index)
        if templates is None:
            if self.ended:
                return
            self._flush_reasoning(index)
            templates = self._templates[index]
        if text:
            self._out.append(templates[1] + _json.dumps(text) + b"}}\n\n")

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        if self.ended:
            return
        if redacted_data is not None and index not in self._blocks:
            self._pending_reasoning.discard(index)
            self._open_block(
                index, ir.PartKind.REASONING, {"type": "redacted_thinking", "data": redacted_data}
            )
            return
        if index in self._pending_reasoning or index not in self._blocks:
            self._flush_reasoning(index)
        seal = signature or encrypted_content
        if seal:
            self._emit(
                b"content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._blocks[index],
                    "delta": {"type": "signature_delta", "signature": seal},
                },
            )

    def tool_args(self, index: int, arguments: str) -> None:
        templates = self._templates.get(index)
        if templates is None:
            return
        if arguments:
            self._out.append(templates[2] + _json.dumps(arguments) + b"}}\n\n")

    def part_stop(self, index: int) -> None:
        if index in self._pending_reasoning:
            self._flush_reasoning(index)
        number = self._blocks.get(index)
        if number is not None and number == self._open:
            self._close_open()

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        self._reason = reason
        self._stop_sequence = stop_sequence

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        for index in list(self._pending_reasoning):
            self._flush_reasoning(index)
        self._close_open()
        reason = self._reason
        if reason is None:
            has_calls = ir.PartKind.TOOL_CALL in self._kinds.values()
            reason = ir.StopReason.TOOL_USE if has_calls else ir.StopReason.END_TURN
        self._emit(
            b"message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": STOP_TO[reason], "stop_sequence": self._stop_sequence},
                "usage": encode_usage(usage_or_zero(self._usage)),
            },
        )
        self._emit(b"message_stop", {"type": "message_stop"})
        self.ended = True

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        if upstream_type and upstream_type.endswith("_error"):
            # Keep the upstream's own Anthropic error type (overloaded_error…) when it has one.
            body = {"type": "error", "error": {"type": upstream_type, "message": err.message}}
            self._out.append(b"event: error\ndata: " + _json.dumps(body) + b"\n\n")
        else:
            self._out.append(stream_error_event(DIALECT, err))


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
