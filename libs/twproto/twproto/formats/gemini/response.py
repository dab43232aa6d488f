"""Gemini usage and whole (non-streamed) responses ⇄ IR."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import ir
from twproto.formats._common import (
    Dropped,
    as_dict,
    as_int,
    as_list,
    flatten_call,
    is_base64,
    parse_arguments,
)
from twproto.formats.gemini.request import DIALECT, FINISH_TO, _decode_parts, _finish, _get

__all__ = (
    "decode_response",
    "decode_usage",
    "encode_response",
    "encode_usage",
)


def decode_usage(raw: Any) -> ir.Usage:
    usage = as_dict(raw)
    prompt = as_int(usage.get("promptTokenCount")) + as_int(usage.get("toolUsePromptTokenCount"))
    cached = as_int(usage.get("cachedContentTokenCount"))
    thoughts = as_int(usage.get("thoughtsTokenCount"))
    return ir.Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=as_int(usage.get("candidatesTokenCount")) + thoughts,
        cache_read_tokens=cached,
        reasoning_tokens=thoughts,
    )


def encode_usage(usage: ir.Usage) -> dict[str, int]:
    out = {
        "promptTokenCount": usage.total_input_tokens,
        "candidatesTokenCount": usage.output_tokens - usage.reasoning_tokens,
        "totalTokenCount": usage.total_tokens,
    }
    if usage.cache_read_tokens:
        out["cachedContentTokenCount"] = usage.cache_read_tokens
    if usage.reasoning_tokens:
        out["thoughtsTokenCount"] = usage.reasoning_tokens
    return out


def decode_response(obj: Mapping[str, Any]) -> ir.Answer:
    """A GenerateContentResponse as an `ir.Answer` (the first candidate)."""
    dropped = Dropped()
    answer_id = str(_get(obj, "responseId") or "")
    candidates = as_list(obj.get("candidates"))
    if len(candidates) > 1:
        dropped.add("candidates[1:]")
    candidate = as_dict(candidates[0]) if candidates else {}
    calls_seen = [0]
    parts = _decode_parts(
        as_dict(candidate.get("content")).get("parts"), answer_id, {}, (0, 0), calls_seen
    )
    if candidates:
        reason = _finish(_get(candidate, "finishReason"), calls_seen[0] > 0)
    elif as_dict(_get(obj, "promptFeedback")).get("blockReason"):
        reason = ir.StopReason.CONTENT_FILTER
    else:
        reason = ir.StopReason.OTHER
    usage_raw = _get(obj, "usageMetadata")
    return ir.Answer(
        id=answer_id,
        model=str(_get(obj, "modelVersion") or ""),
        parts=tuple(parts),
        stop_reason=reason,
        usage=decode_usage(usage_raw) if isinstance(usage_raw, Mapping) else None,
        dropped=dropped.tuple(),
    )


def _encode_answer_parts(parts: tuple[ir.Part, ...], lost: Dropped) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: str | None = None
    for part in parts:
        item: dict[str, Any]
        if isinstance(part, ir.Reasoning):
            if part.text:
                out.append({"text": part.text, "thought": True})
            if part.redacted_data is not None:
                lost.add("reasoning (redacted)")
            if part.seal and is_base64(part.seal):
                pending = part.seal
            elif part.seal:
                lost.add("reasoning.signature (not base64)")
            continue
        if isinstance(part, ir.Text):
            item = {"text": part.text}
        elif isinstance(part, ir.ToolCall):
            flat = flatten_call(part)
            args, ok = parse_arguments(flat.arguments)
            if not ok:
                lost.add("tool_call.arguments (not a JSON object)")
            item = {"functionCall": {"id": part.id, "name": flat.name, "args": args}}
        elif isinstance(part, ir.Opaque) and part.dialect is DIALECT:
            item = dict(part.raw)
        else:
            lost.add(f"content:{part.kind}")
            continue
        if pending is not None:
            item["thoughtSignature"] = pending
            pending = None
        out.append(item)
    if pending is not None:
        out.append({"text": "", "thoughtSignature": pending})
    return out


def encode_response(
    ans: ir.Answer,
    *,
    model: str,
    dropped: list[str] | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """`ans` as a GenerateContentResponse naming `model` (`created` is unused: Gemini answers
    carry no timestamp)."""
    lost = Dropped()
    parts = _encode_answer_parts(ans.parts, lost)
    if dropped is not None:
        dropped.extend(lost.tuple())
    out: dict[str, Any] = {
        "candidates": [
            {
                "content": {"parts": parts, "role": "model"},
                "finishReason": FINISH_TO[ans.stop_reason],
                "index": 0,
            }
        ],
    }
    if ans.usage is not None:
        out["usageMetadata"] = encode_usage(ans.usage)
    out["modelVersion"] = model
    out["responseId"] = ans.id
    return out


# ----------------------------------------------------------------------------------------------
# Streams
