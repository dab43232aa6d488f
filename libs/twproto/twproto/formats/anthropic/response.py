"""Anthropic Messages usage and whole (non-streamed) responses ⇄ IR."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.formats._common import (
    Dropped,
    as_dict,
    as_int,
    as_list,
    as_str,
    parse_arguments,
    prefixed_id,
    usage_or_zero,
)
from twproto.formats.anthropic.request import DIALECT, STOP_FROM, STOP_TO, _decode_block, _tool_id

__all__ = (
    "decode_response",
    "decode_usage",
    "encode_response",
    "encode_usage",
)


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
    if usage.reasoning_tokens:
        # Anthropic's own count of thinking inside `output_tokens` (the SDKs'
        # `output_tokens_details.thinking_tokens`); written only when there is one to tell.
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
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
