"""Gemini requests ⇄ IR.

The wire vocabulary the response and stream codecs share (the dialect, the finish reasons, the
decoders of content parts) is defined here, with the request codec that uses it first; the
package docstring of `twproto.formats.gemini` tells how the format maps to the IR.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.dialect import Dialect
from twproto.effort import (
    GEMINI_LEVEL,
    budget_for_effort,
    effort_for_budget,
    gemini_budget_cap,
    gemini_uses_levels,
    parse_effort,
)
from twproto.formats._common import (
    Dropped,
    as_dict,
    as_list,
    as_str,
    builtin_tool,
    call_kinds,
    drop_cache_control,
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
from twproto.formats._schema import sanitize_schema
from twproto.formats.seals import GEMINI_PLACEHOLDER, welcome_seal

__all__ = (
    "DIALECT",
    "decode_request",
    "encode_request",
)


DIALECT = Dialect.GEMINI

#: Google's documented placeholder for a function call whose real signature is unknown.
DUMMY_SIGNATURE = GEMINI_PLACEHOLDER

FINISH_FROM: Mapping[str, ir.StopReason] = {
    "STOP": ir.StopReason.END_TURN,
    "MAX_TOKENS": ir.StopReason.MAX_TOKENS,
    "SAFETY": ir.StopReason.CONTENT_FILTER,
    "RECITATION": ir.StopReason.CONTENT_FILTER,
    "BLOCKLIST": ir.StopReason.CONTENT_FILTER,
    "PROHIBITED_CONTENT": ir.StopReason.CONTENT_FILTER,
    "SPII": ir.StopReason.CONTENT_FILTER,
    "IMAGE_SAFETY": ir.StopReason.CONTENT_FILTER,
    "LANGUAGE": ir.StopReason.CONTENT_FILTER,
    "MALFORMED_FUNCTION_CALL": ir.StopReason.ERROR,
    "UNEXPECTED_TOOL_CALL": ir.StopReason.ERROR,
    "OTHER": ir.StopReason.OTHER,
}
FINISH_TO: Mapping[ir.StopReason, str] = {
    ir.StopReason.END_TURN: "STOP",
    ir.StopReason.TOOL_USE: "STOP",
    ir.StopReason.STOP_SEQUENCE: "STOP",
    ir.StopReason.PAUSE: "STOP",
    ir.StopReason.MAX_TOKENS: "MAX_TOKENS",
    ir.StopReason.CONTENT_FILTER: "SAFETY",
    ir.StopReason.REFUSAL: "SAFETY",
    ir.StopReason.ERROR: "OTHER",
    ir.StopReason.OTHER: "OTHER",
}

_REQUEST_FIELDS = frozenset(
    {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
)
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")
_KNOWN_FIELDS = _REQUEST_FIELDS | {_SNAKE.sub("_", k).lower() for k in _REQUEST_FIELDS}


def _get(obj: Mapping[str, Any], camel: str) -> Any:
    """A field by its camelCase name, or its snake_case twin."""
    value = obj.get(camel)
    if value is None:
        value = obj.get(_SNAKE.sub("_", camel).lower())
    return value


def _finish(value: Any, saw_calls: bool) -> ir.StopReason:
    reason = FINISH_FROM.get(str(value), ir.StopReason.OTHER)
    if reason is ir.StopReason.END_TURN and saw_calls:
        return ir.StopReason.TOOL_USE
    return reason


def _attach_signature(parts: list[ir.Part], signature: str) -> None:
    last = parts[-1] if parts else None
    if isinstance(last, ir.Reasoning) and last.signature is None and last.redacted_data is None:
        parts[-1] = ir.Reasoning(text=last.text, signature=signature)
    else:
        parts.append(ir.Reasoning(signature=signature))


def _result_text(response: Any) -> str:
    if isinstance(response, Mapping) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json_text(response)


def _decode_parts(
    raw_parts: Any,
    answer_id: str | None,
    ids: dict[str, list[str]],
    position: tuple[int, int],
    calls_seen: list[int],
) -> list[ir.Part]:
    """Gemini parts → IR parts.

    `answer_id` set: ids derive from it (answers); else from `position` (requests), with `ids`
    remembering, per function name, the ids of calls awaiting their response.
    """
    out: list[ir.Part] = []
    for number, part in enumerate(as_list(raw_parts)):
        if not isinstance(part, Mapping):
            continue
        signature = as_str(_get(part, "thoughtSignature"))
        call = _get(part, "functionCall")
        response = _get(part, "functionResponse")
        inline = _get(part, "inlineData")
        file_data = _get(part, "fileData")
        if "text" in part:
            text = str(part.get("text") or "")
            if part.get("thought") is True:
                out.append(ir.Reasoning(text=text, signature=signature))
                continue
            if signature:
                _attach_signature(out, signature)
            if text:
                out.append(ir.Text(text=text))
        elif isinstance(call, Mapping):
            if signature:
                _attach_signature(out, signature)
            name = str(call.get("name", ""))
            call_id = as_str(call.get("id"))
            if not call_id:
                if answer_id is not None:
                    call_id = ir.derive_call_id(answer_id, calls_seen[0])
                else:
                    call_id = f"call_{position[0]}_{number}"
            calls_seen[0] += 1
            ids.setdefault(name, []).append(call_id)
            out.append(
                ir.ToolCall(id=call_id, name=name, arguments=json_text(call.get("args") or {}))
            )
        elif isinstance(response, Mapping):
            name = str(response.get("name", ""))
            call_id = as_str(response.get("id"))
            pending = ids.get(name)
            if not call_id:
                call_id = pending.pop(0) if pending else f"call_{name}_{position[0]}_{number}"
            elif pending and call_id in pending:
                pending.remove(call_id)
            value = response.get("response")
            structured = dict(value) if isinstance(value, Mapping) else None
            is_error = isinstance(value, Mapping) and set(value) == {"error"}
            out.append(
                ir.ToolResult(
                    call_id=call_id,
                    name=name,
                    content=(ir.Text(text=_result_text(value)),),
                    structured=structured,
                    is_error=is_error,
                )
            )
        elif isinstance(inline, Mapping) and isinstance(inline.get("data"), str):
            out.append(
                ir.Image(
                    data=standard_base64(inline["data"]),
                    media_type=as_str(_get(inline, "mimeType")),
                )
            )
        elif isinstance(file_data, Mapping) and isinstance(_get(file_data, "fileUri"), str):
            out.append(
                ir.Image(
                    url=_get(file_data, "fileUri"), media_type=as_str(_get(file_data, "mimeType"))
                )
            )
        else:
            out.append(ir.Opaque(dialect=DIALECT, raw=dict(part)))
    return out


# ----------------------------------------------------------------------------------------------
# Requests


def _decode_reasoning(config: Mapping[str, Any]) -> ir.ReasoningConfig | None:
    thinking = _get(config, "thinkingConfig")
    if not isinstance(thinking, Mapping):
        return None
    budget = opt_int(_get(thinking, "thinkingBudget"))
    level = parse_effort(_get(thinking, "thinkingLevel"))
    include = opt_bool(_get(thinking, "includeThoughts"))
    if budget == 0:
        return ir.ReasoningConfig(enabled=False, budget_tokens=0, include_thoughts=include)
    if budget is not None and budget < 0:
        return ir.ReasoningConfig(adaptive=True, effort=level, include_thoughts=include)
    return ir.ReasoningConfig(budget_tokens=budget, effort=level, include_thoughts=include)


def decode_request(obj: Mapping[str, Any]) -> ir.Request:
    """A Gemini generateContent body (parsed JSON) as an `ir.Request` (model and stream empty:
    they are in the URL)."""
    dropped = Dropped()
    extras = {k: v for k, v in obj.items() if k not in _KNOWN_FIELDS}
    system_raw = as_dict(_get(obj, "systemInstruction"))
    system = tuple(
        ir.Text(text=str(p.get("text", "")))
        for p in as_list(system_raw.get("parts"))
        if isinstance(p, Mapping) and "text" in p
    )
    messages: list[ir.Message] = []
    ids: dict[str, list[str]] = {}
    for number, content in enumerate(as_list(_get(obj, "contents"))):
        if not isinstance(content, Mapping):
            continue
        role = ir.Role.ASSISTANT if content.get("role") == "model" else ir.Role.USER
        parts = _decode_parts(content.get("parts"), None, ids, (number, 0), [0])
        messages.append(ir.Message(role=role, parts=tuple(parts)))

    tools: list[ir.Tool] = []
    for tool in as_list(_get(obj, "tools")):
        if not isinstance(tool, Mapping):
            continue
        declarations = _get(tool, "functionDeclarations")
        if isinstance(declarations, list):
            for decl in declarations:
                if not isinstance(decl, Mapping):
                    continue
                params = _get(decl, "parametersJsonSchema") or decl.get("parameters")
                tools.append(
                    ir.Tool(
                        name=str(decl.get("name", "")),
                        description=as_str(decl.get("description")),
                        parameters=dict(params) if isinstance(params, Mapping) else None,
                    )
                )
            rest = {
                k: v
                for k, v in tool.items()
                if k not in ("functionDeclarations", "function_declarations")
            }
        else:
            rest = dict(tool)
        if rest:
            name = next(iter(rest))
            tools.append(ir.Tool(name=name, kind=ir.ToolKind.BUILTIN, raw=rest, dialect=DIALECT))

    choice = None
    calling = as_dict(_get(as_dict(_get(obj, "toolConfig")), "functionCallingConfig"))
    mode = str(calling.get("mode", "")).upper()
    allowed = [n for n in as_list(_get(calling, "allowedFunctionNames")) if isinstance(n, str)]
    if mode in ("ANY", "VALIDATED") and len(allowed) == 1:
        choice = ir.ToolChoice(mode=ir.ToolChoiceMode.NAMED, name=allowed[0])
    elif mode == "ANY":
        choice = ir.ToolChoice(mode=ir.ToolChoiceMode.REQUIRED)
    elif mode == "NONE":
        choice = ir.ToolChoice(mode=ir.ToolChoiceMode.NONE)
    elif mode == "AUTO":
        choice = ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO)
    if len(allowed) > 1:
        dropped.add("toolConfig.allowedFunctionNames")

    config = as_dict(_get(obj, "generationConfig"))
    output_format = None
    if _get(config, "responseMimeType") == "application/json":
        schema = _get(config, "responseJsonSchema") or _get(config, "responseSchema")
        if isinstance(schema, Mapping):
            output_format = ir.OutputFormat(type="json_schema", schema=dict(schema))
        else:
            output_format = ir.OutputFormat(type="json_object")
    known_config = {
        "temperature",
        "topP",
        "topK",
        "maxOutputTokens",
        "stopSequences",
        "thinkingConfig",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
    }
    config_extras = {
        k: v
        for k, v in config.items()
        if k not in known_config and _to_camel(k) not in known_config
    }
    if config_extras:
        extras["generationConfig"] = config_extras
    return ir.Request(
        model="",
        system=system,
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=choice,
        temperature=opt_float(config.get("temperature")),
        top_p=opt_float(_get(config, "topP")),
        top_k=opt_int(_get(config, "topK")),
        stop=tuple(s for s in as_list(_get(config, "stopSequences")) if isinstance(s, str)),
        max_output_tokens=opt_int(_get(config, "maxOutputTokens")),
        reasoning=_decode_reasoning(config),
        output_format=output_format,
        origin=DIALECT,
        extras=extras,
        dropped=dropped.tuple(),
    )


def _to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


# An image URL's type from its file name, where the source format gave none (Chat, Responses):
# Gemini reads `fileData` as the type it is told, so a PNG sent as image/jpeg fails to decode.
_URL_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".heic": "image/heic",
    ".heif": "image/heif",
    ".pdf": "application/pdf",
}


def _url_media_type(url: str | None) -> str | None:
    """The media type an image URL's path names by its extension (None when it names none)."""
    if not url:
        return None
    path = url.split("?", 1)[0].split("#", 1)[0].lower()
    dot = path.rfind(".")
    if dot < 0 or "/" in path[dot:]:
        return None
    return _URL_TYPES.get(path[dot:])


def _encode_image(image: ir.Image) -> dict[str, Any]:
    if image.data is not None:
        return {"inlineData": {"mimeType": image.media_type or "image/png", "data": image.data}}
    mime = image.media_type or _url_media_type(image.url) or "image/jpeg"
    return {"fileData": {"mimeType": mime, "fileUri": image.url}}


def _thinking_config(req: ir.Request, model: str) -> dict[str, Any] | None:
    reasoning = req.reasoning
    if reasoning is None:
        return None
    same = req.origin is DIALECT
    levels = gemini_uses_levels(model)
    cap = gemini_budget_cap(model)
    if not reasoning.enabled or reasoning.effort is ir.Effort.NONE:
        if same and reasoning.budget_tokens == 0:
            return {"thinkingBudget": 0}
        # Off: only Flash-class 2.x models can stop thinking (budget 0).
        if not levels and "flash" in model.lower():
            return {"thinkingBudget": 0}
        return None
    config: dict[str, Any] = {}
    if reasoning.include_thoughts is not None:
        config["includeThoughts"] = reasoning.include_thoughts
    elif not same:
        config["includeThoughts"] = True
    if same and reasoning.budget_tokens is not None:
        config["thinkingBudget"] = reasoning.budget_tokens
    elif same and reasoning.adaptive:
        config["thinkingBudget"] = -1
        if reasoning.effort is not None:
            config["thinkingLevel"] = GEMINI_LEVEL.get(reasoning.effort, "high")
    elif same and reasoning.effort is not None:
        config["thinkingLevel"] = GEMINI_LEVEL.get(reasoning.effort, "high")
    elif levels:
        effort: ir.Effort | None = reasoning.effort
        if effort is None and reasoning.budget_tokens:
            effort = effort_for_budget(reasoning.budget_tokens)
        if effort is not None:
            config["thinkingLevel"] = GEMINI_LEVEL[effort]
    else:
        budget = reasoning.budget_tokens
        if budget is None and reasoning.effort is not None:
            budget = budget_for_effort(reasoning.effort)
        if budget is None and reasoning.adaptive:
            budget = -1
        if budget is not None:
            config["thinkingBudget"] = min(budget, cap) if budget > 0 else budget
    return config or None


def _messages(req: ir.Request, out: dict[str, Any], dropped: Dropped, *, model: str) -> None:
    same = req.origin is DIALECT
    calls = call_kinds(req.messages)
    needs_signature = gemini_uses_levels(model)
    contents: list[dict[str, Any]] = []
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            continue  # its text goes to the system instruction (`_system`)
        model_turn = message.role is ir.Role.ASSISTANT
        parts: list[dict[str, Any]] = []
        pending: str | None = None
        first_call = True
        trailing: list[dict[str, Any]] = []
        for part in message.parts:
            part_out: dict[str, Any] | None = None
            if isinstance(part, ir.Reasoning):
                if part.text and same:
                    thought: dict[str, Any] = {"text": part.text, "thought": True}
                    parts.append(thought)
                elif part.text:
                    dropped.add("reasoning text")
                seal = part.signature or part.encrypted_content
                refused = welcome_seal(seal, DIALECT) if seal else None
                if refused is not None:
                    dropped.add(refused)  # Gemini: "Corrupted thought signature."
                elif seal and is_base64(seal):
                    pending = seal
                elif seal:
                    dropped.add("reasoning.signature (not base64)")
                continue
            if isinstance(part, ir.Text):
                part_out = {"text": part.text}
            elif isinstance(part, ir.Image):
                part_out = _encode_image(part)
            elif isinstance(part, ir.ToolCall):
                flat = flatten_call(part)
                args, ok = parse_arguments(flat.arguments)
                if not ok:
                    dropped.add("tool_call.arguments (not a JSON object)")
                part_out = {"functionCall": {"name": flat.name, "args": args}}
                if pending is None and first_call and model_turn and needs_signature:
                    pending = DUMMY_SIGNATURE
                first_call = False
            elif isinstance(part, ir.ToolResult):
                call = calls.get(part.call_id)
                name = part.name or (flat_name(call.name, call.namespace) if call else None)
                if name is None:
                    dropped.add("tool_result (no matching call)")
                    name = part.call_id
                if part.structured is not None:
                    response = part.structured
                elif part.is_error:
                    response = {"error": part.text}
                else:
                    response = {"output": part.text}
                # A result's images follow the function responses in the same user turn, as
                # inline or file parts (every Gemini model reads those; `functionResponse.parts`
                # is Gemini 3's only).
                trailing.extend(_encode_image(p) for p in part.content if isinstance(p, ir.Image))
                part_out = {"functionResponse": {"name": name, "response": response}}
            elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
                part_out = dict(part.raw)
            else:
                dropped.add(
                    f"content:{part.raw.get('type') if isinstance(part, ir.Opaque) else part.kind}"
                )
            if part_out is None:
                continue
            if pending is not None and model_turn:
                part_out["thoughtSignature"] = pending
                pending = None
            parts.append(part_out)
        if pending is not None and model_turn:
            parts.append({"text": "", "thoughtSignature": pending})
        parts.extend(trailing)
        if not parts:
            continue
        role = "model" if model_turn else "user"
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    out["contents"] = contents


def _system(req: ir.Request, out: dict[str, Any]) -> None:
    # The system prompt, then the text of every system message (Gemini has one instruction).
    system_parts = [{"text": t.text} for t in req.system]
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            system_parts.extend({"text": p.text} for p in message.parts if isinstance(p, ir.Text))
    if system_parts:
        out["systemInstruction"] = {"parts": system_parts}


def _tools(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> bool:
    # Returns whether there are function declarations (what a tool choice can name).
    declarations: list[dict[str, Any]] = []
    builtin: list[dict[str, Any]] = []
    removed: set[str] = set()
    for tool in req.tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            raw = builtin_tool(tool, DIALECT, dropped)
            if raw is not None:
                builtin.append(raw)
            continue
        flat_tool = flatten_tool(tool)
        decl: dict[str, Any] = {"name": flat_tool.name}
        if flat_tool.description:
            decl["description"] = flat_tool.description
        if flat_tool.parameters:
            schema, lost = sanitize_schema(flat_tool.parameters)
            removed.update(lost)
            if schema.get("properties") or schema.get("type") not in (None, "object"):
                decl["parameters"] = schema
        declarations.append(decl)
    if removed:
        dropped.add("tool schema keywords: " + ", ".join(sorted(removed)))
    tools_out: list[dict[str, Any]] = []
    if declarations:
        tools_out.append({"functionDeclarations": declarations})
    tools_out.extend(builtin)
    if tools_out:
        out["tools"] = tools_out
    return bool(declarations)


def _tool_choice(req: ir.Request, out: dict[str, Any], dropped: Dropped, *, tools: bool) -> None:
    if req.tool_choice is not None and (tools or req.tool_choice.mode is ir.ToolChoiceMode.NONE):
        mode = req.tool_choice.mode
        calling: dict[str, Any]
        if mode is ir.ToolChoiceMode.NAMED:
            name = flat_name(req.tool_choice.name or "", req.tool_choice.namespace)
            calling = {"mode": "ANY", "allowedFunctionNames": [name]}
        else:
            calling = {
                "mode": {
                    ir.ToolChoiceMode.AUTO: "AUTO",
                    ir.ToolChoiceMode.NONE: "NONE",
                    ir.ToolChoiceMode.REQUIRED: "ANY",
                }[mode]
            }
        out["toolConfig"] = {"functionCallingConfig": calling}
    if req.parallel_tool_calls is False:
        dropped.add("parallel_tool_calls")


# The sampling, output-limit, stop, output-format and reasoning sections all write into
# generationConfig (`config` below).


def _sampling(req: ir.Request, config: dict[str, Any]) -> None:
    if req.temperature is not None:
        config["temperature"] = req.temperature
    if req.top_p is not None:
        config["topP"] = req.top_p
    if req.top_k is not None:
        config["topK"] = req.top_k


def _output_limit(req: ir.Request, config: dict[str, Any]) -> None:
    if req.max_output_tokens is not None:
        config["maxOutputTokens"] = req.max_output_tokens


def _stop_sequences(req: ir.Request, config: dict[str, Any]) -> None:
    if req.stop:
        config["stopSequences"] = list(req.stop)


def _output_format(req: ir.Request, config: dict[str, Any], dropped: Dropped) -> None:
    if req.output_format is not None:
        config["responseMimeType"] = "application/json"
        if req.output_format.schema is not None:
            schema, lost = sanitize_schema(req.output_format.schema)
            if lost:
                dropped.add("response schema keywords: " + ", ".join(lost))
            config["responseSchema"] = schema


def _reasoning(req: ir.Request, config: dict[str, Any], *, model: str) -> None:
    thinking = _thinking_config(req, model)
    if thinking is not None:
        config["thinkingConfig"] = thinking


def _options(req: ir.Request, dropped: Dropped) -> None:
    # The end user, metadata, the prompt-cache key and storage: Gemini has none of them (the
    # stream is chosen by the URL).
    if req.user is not None:
        dropped.add("user")
    if req.metadata:
        dropped.add("metadata")
    if req.cache_key is not None:
        dropped.add("prompt_cache_key")
    if req.store is not None:
        dropped.add("store")


def _extras(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> None:
    # `carry_extras`, except that generationConfig was merged field by field (`encode_request`).
    same = req.origin is DIALECT
    for key, value in req.extras.items():
        if key == "generationConfig":
            if not same:
                dropped.extend(f"generationConfig.{k}" for k in as_dict(value))
        elif same:
            out.setdefault(key, value)
        else:
            dropped.add(key)


def encode_request(req: ir.Request, *, model: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`req` as a Gemini generateContent body (the model goes in the URL; `model` picks
    model-specific settings), and what could not be carried."""
    # One section helper per part of the body, called in the order the body's fields are
    # written (the same helper names in every format module).
    dropped = Dropped()
    same = req.origin is DIALECT
    out: dict[str, Any] = {}
    _messages(req, out, dropped, model=model)
    _system(req, out)
    tools = _tools(req, out, dropped)
    _tool_choice(req, out, dropped, tools=tools)
    config: dict[str, Any] = {}
    _sampling(req, config)
    _output_limit(req, config)
    _stop_sequences(req, config)
    _output_format(req, config, dropped)
    _reasoning(req, config, model=model)
    if same:
        config = {**as_dict(req.extras.get("generationConfig")), **config}
    if config:
        out["generationConfig"] = config
    _options(req, dropped)
    drop_cache_control(req, same=same, dropped=dropped)
    _extras(req, out, dropped)
    return out, dropped.tuple()


# ----------------------------------------------------------------------------------------------
# Whole answers
