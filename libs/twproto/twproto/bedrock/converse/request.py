"""IR → a Converse / ConverseStream request body (bedrock-runtime's ``ConverseRequest``).

The model id is in the path (``/model/{id}/converse`` or ``/converse-stream``), so the body has
no model and no stream flag. Field names are bedrock-runtime's service model's:

* ``messages``: ``{"role": "user" | "assistant", "content": [ContentBlock]}``, roles alternating
  (consecutive turns of one role are merged, as Bedrock refuses two in a row), a tool result
  opening the user turn that answers the calls. A ContentBlock is one of ``text``,
  ``image`` (``{"format": "png", "source": {"bytes": <base64>}}``), ``toolUse``
  (``toolUseId``, ``name``, ``input`` as JSON), ``toolResult`` (``toolUseId``, ``content``
  of ``text`` / ``json`` / ``image`` blocks, ``status`` ``success`` or ``error``) and
  ``reasoningContent`` (``reasoningText: {text, signature}`` or ``redactedContent``);
* ``system``: ``[{"text": ...}]`` — the system prompt and every in-conversation system message;
* ``inferenceConfig``: ``maxTokens``, ``temperature``, ``topP``, ``stopSequences``;
* ``toolConfig``: ``tools: [{"toolSpec": {name, description, inputSchema: {json}}}]`` and
  ``toolChoice`` (``{"auto": {}}``, ``{"any": {}}``, ``{"tool": {"name"}}``; Converse has no
  "none": the tools stay, the choice is left out and reported dropped). Bedrock refuses a
  conversation holding tool blocks without a ``toolConfig``, so tools named only by past calls
  are declared with an empty schema;
* ``additionalModelRequestFields``: what is the model's own. Reasoning is Anthropic's
  ``thinking`` (``{"type": "enabled", "budget_tokens": N}``), which Claude models take through
  Converse; other models take other fields (or none), so reasoning goes only to a model id
  naming ``anthropic``, else it is reported dropped. ``top_k`` goes the same way.

An image only given by URL cannot be sent (Converse takes bytes or S3), and is dropped.
"""

from __future__ import annotations

from typing import Any

from twproto import ir
from twproto.effort import ANTHROPIC_MIN_BUDGET, budget_for_effort
from twproto.formats._common import Dropped, flat_name, flatten_call, flatten_tool, parse_arguments

__all__ = ("CONVERSE_DEFAULT_MAX_TOKENS", "encode_converse_request", "is_claude_model")

#: The output limit sent when the request has none and reasoning needs one to budget within.
CONVERSE_DEFAULT_MAX_TOKENS = 8192

_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}


def is_claude_model(model: str) -> bool:
    """Whether the Bedrock model id (or inference profile) is an Anthropic model."""
    return "anthropic." in model or model.startswith("anthropic")


def _image(image: ir.Image, dropped: Dropped) -> dict[str, Any] | None:
    fmt = _FORMATS.get(image.media_type or "image/png")
    if image.data is None or fmt is None:
        dropped.add("image (by URL or of a type Converse does not take)")
        return None
    return {"image": {"format": fmt, "source": {"bytes": image.data}}}


def _tool_result(part: ir.ToolResult, dropped: Dropped) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if part.structured is not None:
        content.append({"json": dict(part.structured)})
    for sub in part.content:
        if isinstance(sub, ir.Text):
            if sub.text and part.structured is None:
                content.append({"text": sub.text})
        else:
            block = _image(sub, dropped)
            if block is not None:
                content.append(block)
    if not content:
        content.append({"text": ""})
    return {
        "toolResult": {
            "toolUseId": part.call_id,
            "content": content,
            "status": "error" if part.is_error else "success",
        }
    }


def _block(part: ir.Part, dropped: Dropped) -> dict[str, Any] | None:
    if isinstance(part, ir.Text):
        return {"text": part.text} if part.text else None
    if isinstance(part, ir.Image):
        return _image(part, dropped)
    if isinstance(part, ir.ToolCall):
        call = flatten_call(part)
        args, ok = parse_arguments(call.arguments)
        if not ok:
            dropped.add("tool_call.arguments (not a JSON object)")
        return {"toolUse": {"toolUseId": call.id, "name": call.name, "input": args}}
    if isinstance(part, ir.ToolResult):
        return _tool_result(part, dropped)
    if isinstance(part, ir.Reasoning):
        if part.redacted_data is not None:
            return {"reasoningContent": {"redactedContent": part.redacted_data}}
        if not part.signature:
            dropped.add("reasoning (no signature)")
            return None
        return {
            "reasoningContent": {"reasoningText": {"text": part.text, "signature": part.signature}}
        }
    dropped.add(f"content:{part.raw.get('type', 'unknown')}")
    return None


def _messages(req: ir.Request, out: dict[str, Any], dropped: Dropped) -> set[str]:
    messages: list[dict[str, Any]] = []
    called: set[str] = set()
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            continue  # its text is in `system`
        role = "assistant" if message.role is ir.Role.ASSISTANT else "user"
        blocks = [b for b in (_block(p, dropped) for p in message.parts) if b is not None]
        for part in message.parts:
            if isinstance(part, ir.ToolCall):
                called.add(flatten_call(part).name)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message_out in messages:
        if message_out["role"] == "user":
            message_out["content"].sort(key=lambda b: "toolResult" not in b)
    out["messages"] = messages
    return called


def _system(req: ir.Request, out: dict[str, Any]) -> None:
    system = [{"text": t.text} for t in req.system if t.text]
    for message in req.messages:
        if message.role is ir.Role.SYSTEM:
            system += [{"text": p.text} for p in message.parts if isinstance(p, ir.Text) and p.text]
    if system:
        out["system"] = system


def _inference(req: ir.Request, out: dict[str, Any], dropped: Dropped, *, thinking: bool) -> None:
    config: dict[str, Any] = {}
    if req.max_output_tokens is not None or thinking:
        config["maxTokens"] = req.max_output_tokens or CONVERSE_DEFAULT_MAX_TOKENS
    if req.temperature is not None:
        if thinking:
            dropped.add("temperature (not allowed with thinking)")
        else:
            config["temperature"] = req.temperature
    if req.top_p is not None:
        if thinking and req.top_p < 0.95:
            dropped.add("top_p (not allowed with thinking)")
        else:
            config["topP"] = req.top_p
    if req.stop:
        config["stopSequences"] = list(req.stop)
    if config:
        out["inferenceConfig"] = config


def _tools(req: ir.Request, out: dict[str, Any], dropped: Dropped, called: set[str]) -> None:
    tools: list[dict[str, Any]] = []
    names: set[str] = set()
    for tool in req.tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            dropped.add(f"tool:{tool.name} (a provider's own tool)")
            continue
        flat = flatten_tool(tool)
        schema = dict(flat.parameters) if flat.parameters else {"type": "object", "properties": {}}
        schema.setdefault("type", "object")
        spec: dict[str, Any] = {"name": flat.name, "inputSchema": {"json": schema}}
        if flat.description:
            spec["description"] = flat.description
        tools.append({"toolSpec": spec})
        names.add(flat.name)
    for name in sorted(called - names):
        tools.append({"toolSpec": {"name": name, "inputSchema": {"json": {"type": "object"}}}})
    if not tools:
        return
    config: dict[str, Any] = {"tools": tools}
    choice = req.tool_choice
    if choice is not None and names:
        if choice.mode is ir.ToolChoiceMode.NAMED:
            config["toolChoice"] = {
                "tool": {"name": flat_name(choice.name or "", choice.namespace)}
            }
        elif choice.mode is ir.ToolChoiceMode.REQUIRED:
            config["toolChoice"] = {"any": {}}
        elif choice.mode is ir.ToolChoiceMode.AUTO:
            config["toolChoice"] = {"auto": {}}
        else:
            dropped.add("tool_choice none (Converse has none)")
    out["toolConfig"] = config


def _reasoning(req: ir.Request, model: str, extra: dict[str, Any], dropped: Dropped) -> bool:
    reasoning = req.reasoning
    if reasoning is None or not reasoning.enabled or reasoning.effort is ir.Effort.NONE:
        return False
    if not is_claude_model(model):
        dropped.add("reasoning (this model's fields are not known)")
        return False
    limit = req.max_output_tokens or CONVERSE_DEFAULT_MAX_TOKENS
    budget = reasoning.budget_tokens or budget_for_effort(reasoning.effort or ir.Effort.MEDIUM)
    budget = min(budget, limit - 1)
    if budget < ANTHROPIC_MIN_BUDGET:
        dropped.add("reasoning (max_tokens below the smallest thinking budget)")
        return False
    extra["thinking"] = {"type": "enabled", "budget_tokens": budget}
    return True


def encode_converse_request(
    req: ir.Request, *, model: str
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`req` as a Converse body for the Bedrock model `model`, and what could not be carried."""
    dropped = Dropped(req.dropped)
    out: dict[str, Any] = {}
    called = _messages(req, out, dropped)
    _system(req, out)
    extra: dict[str, Any] = {}
    thinking = _reasoning(req, model, extra, dropped)
    _inference(req, out, dropped, thinking=thinking)
    _tools(req, out, dropped, called)
    if req.top_k is not None:
        if is_claude_model(model) and not thinking:
            extra["top_k"] = req.top_k
        else:
            dropped.add("top_k")
    if extra:
        out["additionalModelRequestFields"] = extra
    if req.output_format is not None:
        dropped.add(f"output_format:{req.output_format.type}")
    if req.user is not None:
        dropped.add("user")
    if req.parallel_tool_calls is False:
        dropped.add("parallel_tool_calls")
    return out, dropped.tuple()
