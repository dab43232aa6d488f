"""OpenAI Chat Completions usage and whole (non-streamed) responses ⇄ IR."""

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
    flatten_call,
    opt_int,
    prefixed_id,
)
from twproto.formats.openai_chat.request import FINISH_TO, _content_parts, _decode_call, _finish

__all__ = (
    "decode_response",
    "decode_usage",
    "encode_response",
    "encode_usage",
)


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
