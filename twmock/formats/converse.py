"""Bedrock's Converse and ConverseStream as the mock speaks them, from and to Anthropic's.

The mock plans a Converse request as the Anthropic Messages request it amounts to
(`anthropic_request`, after Bedrock's own validation of the conversation), then `converse_plan`
writes the Anthropic plan's answer the way Converse does, keeping every pause, cut and stall of
the script:

* a whole answer is ``{"output": {"message": {"role": "assistant", "content": [...]}},
  "stopReason", "usage", "metrics"}`` with ``text``, ``toolUse`` and ``reasoningContent``
  blocks;
* a stream is ``application/vnd.amazon.eventstream``: ``messageStart``, ``contentBlockStart``
  (tool calls only), ``contentBlockDelta`` (``text``, ``toolUse.input``,
  ``reasoningContent.text`` / ``signature``), ``contentBlockStop``, ``messageStop`` and
  ``metadata`` (usage and ``metrics.latencyMs``); an in-stream error is the exception frame
  Bedrock sends (`twmock.formats.bedrock`), before or after content;
* an error status is Bedrock's ``{"message": ...}`` with ``x-amzn-ErrorType``.

Field names are bedrock-runtime's service model's (``ConverseRequest``, ``ConverseStreamOutput``).
"""

from __future__ import annotations

from typing import Any

from twmock.formats._wire import compact
from twmock.formats.bedrock import STREAM_EXCEPTIONS, bedrock_plan
from twmock.plan import Chunk, Head, Plan, Step
from twproto import json_dumps, json_loads
from twproto.eventstream import EVENTSTREAM_CONTENT_TYPE, eventstream_event, eventstream_exception

__all__ = ("START_WITH_USER", "anthropic_request", "converse_answer", "converse_plan")

#: Bedrock's refusals of a conversation's shape (ValidationException), word for word.
START_WITH_USER = (
    "A conversation must start with a user message. Try again with a conversation that starts "
    "with a user message."
)
ALTERNATE = (
    "A conversation must alternate between user and assistant roles. Make sure the conversation "
    "alternates between user and assistant roles and try again."
)
TOOL_CONFIG = (
    "The toolConfig field must be defined when using toolUse and toolResult content blocks."
)
_MAX_TOKENS = 4096


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": f"image/{block.get('format', 'png')}",
            "data": source.get("bytes", ""),
        },
    }


def _result_content(content: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in content:
        if "text" in item:
            out.append({"type": "text", "text": item["text"]})
        elif "json" in item:
            out.append({"type": "text", "text": json_dumps(item["json"]).decode()})
        elif "image" in item:
            out.append(_image(item["image"]))
    return out


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    if "text" in block:
        return {"type": "text", "text": block["text"]}
    if "image" in block:
        return _image(block["image"])
    if "toolUse" in block:
        use = block["toolUse"]
        return {
            "type": "tool_use",
            "id": use["toolUseId"],
            "name": use["name"],
            "input": use.get("input", {}),
        }
    if "toolResult" in block:
        result = block["toolResult"]
        out = {
            "type": "tool_result",
            "tool_use_id": result["toolUseId"],
            "content": _result_content(result.get("content", [])),
        }
        if result.get("status") == "error":
            out["is_error"] = True
        return out
    if "reasoningContent" in block:
        content = block["reasoningContent"]
        if "redactedContent" in content:
            return {"type": "redacted_thinking", "data": content["redactedContent"]}
        text = content.get("reasoningText", {})
        return {
            "type": "thinking",
            "thinking": text.get("text", ""),
            "signature": text.get("signature", ""),
        }
    return None


def anthropic_request(body: bytes, model: str, *, stream: bool) -> dict[str, Any] | str:
    """A Converse body as the Anthropic Messages request it amounts to, or the validation
    message Bedrock answers it with."""
    try:
        obj = json_loads(body)
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            return "Malformed input request, please reformat your input and try again."
        out_messages: list[dict[str, Any]] = []
        uses_tools = False
        for i, message in enumerate(messages):
            role = message["role"]
            if i == 0 and role != "user":
                return START_WITH_USER
            if i and role == messages[i - 1]["role"]:
                return ALTERNATE
            blocks = [b for b in (_block(c) for c in message["content"]) if b is not None]
            uses_tools = uses_tools or any(b["type"] in ("tool_use", "tool_result") for b in blocks)
            out_messages.append({"role": role, "content": blocks})
    except (ValueError, KeyError, TypeError, AttributeError):
        return "Malformed input request, please reformat your input and try again."
    tool_config = obj.get("toolConfig")
    if uses_tools and not tool_config:
        return TOOL_CONFIG
    inference = obj.get("inferenceConfig") or {}
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": inference.get("maxTokens", _MAX_TOKENS),
        "messages": out_messages,
    }
    if stream:
        out["stream"] = True
    if obj.get("system"):
        out["system"] = [{"type": "text", "text": s["text"]} for s in obj["system"] if "text" in s]
    for theirs, ours in (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("stopSequences", "stop_sequences"),
    ):
        if theirs in inference:
            out[ours] = inference[theirs]
    if tool_config:
        out["tools"] = [
            {
                "name": t["toolSpec"]["name"],
                "description": t["toolSpec"].get("description", ""),
                "input_schema": t["toolSpec"]
                .get("inputSchema", {})
                .get("json", {"type": "object"}),
            }
            for t in tool_config.get("tools", [])
            if "toolSpec" in t
        ]
        choice = tool_config.get("toolChoice") or {}
        if "any" in choice:
            out["tool_choice"] = {"type": "any"}
        elif "tool" in choice:
            out["tool_choice"] = {"type": "tool", "name": choice["tool"]["name"]}
    extra = obj.get("additionalModelRequestFields") or {}
    if "thinking" in extra:
        out["thinking"] = extra["thinking"]
    return out


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    read = int(usage.get("cache_read_input_tokens") or 0)
    write = int(usage.get("cache_creation_input_tokens") or 0)
    inp, out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return {
        "inputTokens": inp,
        "outputTokens": out,
        "totalTokens": inp + out + read + write,
        "cacheReadInputTokens": read,
        "cacheWriteInputTokens": write,
    }


def _answer_block(block: dict[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return {"text": block["text"]}
    if kind == "tool_use":
        return {
            "toolUse": {
                "toolUseId": block["id"],
                "name": block["name"],
                "input": block.get("input", {}),
            }
        }
    if kind == "thinking":
        text = {"text": block.get("thinking", ""), "signature": block.get("signature", "")}
        return {"reasoningContent": {"reasoningText": text}}
    if kind == "redacted_thinking":
        return {"reasoningContent": {"redactedContent": block.get("data", "")}}
    return None


def converse_answer(anthropic_message: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic message as Converse's whole answer."""
    content = [b for b in map(_answer_block, anthropic_message.get("content", [])) if b is not None]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": anthropic_message.get("stop_reason") or "end_turn",
        "usage": _usage(anthropic_message.get("usage") or {}),
        "metrics": {"latencyMs": 0},
    }


class _StreamWriter:
    """Anthropic SSE events in, ConverseStream frames out (state kept across chunks)."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}

    def frames(self, sse: bytes) -> bytes:
        out: list[bytes] = []
        for block in sse.split(b"\n\n"):
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
            )
            if data:
                out += self._event(json_loads(data))
        return b"".join(out)

    def _event(self, obj: dict[str, Any]) -> list[bytes]:
        kind = obj.get("type")
        if kind == "message_start":
            self.usage.update(obj.get("message", {}).get("usage") or {})
            return [_frame("messageStart", {"role": "assistant"})]
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") == "tool_use":
                start = {"toolUse": {"toolUseId": block["id"], "name": block["name"]}}
                return [
                    _frame("contentBlockStart", {"contentBlockIndex": obj["index"], "start": start})
                ]
            return []
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            dtype = delta.get("type")
            converse: dict[str, Any]
            if dtype == "text_delta":
                converse = {"text": delta["text"]}
            elif dtype == "input_json_delta":
                converse = {"toolUse": {"input": delta["partial_json"]}}
            elif dtype == "thinking_delta":
                converse = {"reasoningContent": {"text": delta["thinking"]}}
            elif dtype == "signature_delta":
                converse = {"reasoningContent": {"signature": delta["signature"]}}
            else:
                return []
            return [
                _frame("contentBlockDelta", {"contentBlockIndex": obj["index"], "delta": converse})
            ]
        if kind == "content_block_stop":
            return [_frame("contentBlockStop", {"contentBlockIndex": obj["index"]})]
        if kind == "message_delta":
            self.usage.update(obj.get("usage") or {})
            reason = (obj.get("delta") or {}).get("stop_reason") or "end_turn"
            return [_frame("messageStop", {"stopReason": reason})]
        if kind == "message_stop":
            return [_frame("metadata", {"usage": _usage(self.usage), "metrics": {"latencyMs": 0}})]
        if kind == "error":
            error = obj.get("error") or {}
            name = STREAM_EXCEPTIONS.get(error.get("type", ""), "modelStreamErrorException")
            return [eventstream_exception(name, compact({"message": error.get("message", "")}))]
        return []


def _frame(event_type: str, body: dict[str, Any]) -> bytes:
    return eventstream_event(event_type, compact(body))


def converse_plan(plan: Plan, *, stream: bool) -> Plan:
    """The Anthropic `plan` as Converse answers it (see the module docstring)."""
    head = plan.head
    if head is None or head.status != 200:
        return bedrock_plan(plan, stream=stream)
    if not stream:
        body = compact(converse_answer(json_loads(plan.body)))
        headers = (
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        )
        rest = [s for s in plan.steps if not isinstance(s, (Head, Chunk))]
        return Plan(
            steps=(Head(status=200, headers=headers, delay=head.delay), Chunk(data=body), *rest),
            outcome=plan.outcome,
        )
    writer = _StreamWriter()
    steps: list[Step] = []
    for step in plan.steps:
        if isinstance(step, Head):
            head_out = ((b"content-type", EVENTSTREAM_CONTENT_TYPE.encode()),)
            steps.append(Head(status=200, headers=head_out, delay=step.delay))
        elif isinstance(step, Chunk):
            steps.append(Chunk(data=writer.frames(step.data), delay=step.delay))
        else:
            steps.append(step)
    return Plan(steps=tuple(steps), outcome=plan.outcome)
