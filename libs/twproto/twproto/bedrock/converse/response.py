"""A Converse answer (bedrock-runtime's ``ConverseResponse``) → IR.

``output.message.content`` holds ``text``, ``toolUse`` (``toolUseId``, ``name``, ``input``)
and ``reasoningContent`` blocks (``reasoningText: {text, signature}``, or ``redactedContent``);
``stopReason`` and ``usage`` (``inputTokens``, ``outputTokens``, ``cacheReadInputTokens``,
``cacheWriteInputTokens``) sit beside it. Converse has no answer id: the caller names one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.formats._common import as_dict, as_int, as_list, as_str, json_text

__all__ = (
    "CONVERSE_STOP_REASONS",
    "decode_converse_answer",
    "decode_converse_block",
    "decode_converse_usage",
)

#: Converse's stop reasons, as the IR's.
CONVERSE_STOP_REASONS: Mapping[str, ir.StopReason] = {
    "end_turn": ir.StopReason.END_TURN,
    "tool_use": ir.StopReason.TOOL_USE,
    "max_tokens": ir.StopReason.MAX_TOKENS,
    "stop_sequence": ir.StopReason.STOP_SEQUENCE,
    "guardrail_intervened": ir.StopReason.CONTENT_FILTER,
    "content_filtered": ir.StopReason.CONTENT_FILTER,
    "malformed_model_output": ir.StopReason.ERROR,
    "malformed_tool_use": ir.StopReason.ERROR,
    "model_context_window_exceeded": ir.StopReason.MAX_TOKENS,
}


def decode_converse_usage(raw: Any) -> ir.Usage:
    """Converse's ``TokenUsage``. Its ``inputTokens`` leaves out the cached tokens (as
    Anthropic's ``input_tokens`` does), which the IR keeps apart as well."""
    usage = as_dict(raw)
    return ir.Usage(
        input_tokens=as_int(usage.get("inputTokens", 0)),
        output_tokens=as_int(usage.get("outputTokens", 0)),
        cache_read_tokens=as_int(usage.get("cacheReadInputTokens", 0)),
        cache_write_tokens=as_int(usage.get("cacheWriteInputTokens", 0)),
    )


def decode_converse_block(block: Any) -> ir.Part | None:
    """One ContentBlock of an answer; None for a kind the IR does not carry."""
    block = as_dict(block)
    if "text" in block:
        return ir.Text(text=str(block["text"]))
    if "toolUse" in block:
        use = as_dict(block["toolUse"])
        return ir.ToolCall(
            id=str(use.get("toolUseId", "")),
            name=str(use.get("name", "")),
            arguments=json_text(use.get("input") if use.get("input") is not None else {}),
        )
    if "reasoningContent" in block:
        content = as_dict(block["reasoningContent"])
        if "redactedContent" in content:
            return ir.Reasoning(redacted_data=str(content["redactedContent"]))
        text = as_dict(content.get("reasoningText"))
        return ir.Reasoning(
            text=str(text.get("text", "")), signature=as_str(text.get("signature")) or None
        )
    return None


def decode_converse_answer(obj: Mapping[str, Any], *, id: str = "", model: str = "") -> ir.Answer:
    """A Converse answer as an `ir.Answer` named `id`, from `model`."""
    message = as_dict(as_dict(obj.get("output")).get("message"))
    parts = [
        p
        for p in (decode_converse_block(b) for b in as_list(message.get("content")))
        if p is not None
    ]
    reason = CONVERSE_STOP_REASONS.get(str(obj.get("stopReason")), ir.StopReason.END_TURN)
    return ir.Answer(
        id=id,
        model=model,
        parts=tuple(parts),
        stop_reason=reason,
        usage=decode_converse_usage(obj["usage"]) if "usage" in obj else None,
    )
