"""OpenAI Responses usage and whole (non-streamed) responses ⇄ IR."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.formats._common import (
    Dropped,
    as_dict,
    as_int,
    as_list,
    custom_input,
    opt_int,
    prefixed_id,
)
from twproto.formats.openai_responses.request import (
    DIALECT,
    INCOMPLETE_FROM,
    INCOMPLETE_TO,
    _decode_call_item,
    _decode_reasoning_item,
)

__all__ = (
    "decode_response",
    "decode_usage",
    "encode_response",
    "encode_usage",
)


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
