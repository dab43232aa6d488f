"""What the gateway needs to know about a request before routing it, read in one pass.

Routing rules look at a request's size, tools, images and reasoning; conversation affinity
needs the system prompt, the first user message and the kind of the last message. These are
read straight from the client's JSON body in its own format, without converting it, because
every request is summarised and most are passed through unchanged.

Token figures here are estimates for routing (about four ASCII characters a token, one token a
CJK character, a small cost per message and per image), not billing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twproto import _json
from twproto.dialect import Dialect

__all__ = ("RequestSummary", "count_tokens_body", "estimate_text_tokens", "summarize")

PER_MESSAGE_TOKENS = 4
PER_IMAGE_TOKENS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSummary:
    """Facts of one request. `last_kind` is ``user``, ``tool_result``, ``assistant``,
    ``system`` or None (no messages), as `twengine.affinity.MessageKind` reads it."""

    max_tokens: int | None = None
    tool_count: int = 0
    image: bool = False
    thinking: bool = False
    system_text: str = ""
    first_user_text: str = ""
    last_kind: str | None = None
    input_tokens: int = 0
    prompt_cache_key: str | None = None


def estimate_text_tokens(text: str) -> int:
    """About four ASCII characters a token; every other character (CJK) a token of its own."""
    if text.isascii():
        return (len(text) + 3) // 4
    ascii_count = sum(1 for ch in text if ch < "\x80")
    return (ascii_count + 3) // 4 + (len(text) - ascii_count)


class _Reader:
    """Collects text and counts while walking one format's message parts."""

    def __init__(self) -> None:
        self.tokens = 0
        self.images = 0

    def text(self, value: object) -> str:
        if type(value) is str and value.isascii():  # the usual case, without a call
            self.tokens += (len(value) + 3) // 4
            return value
        if isinstance(value, str):
            self.tokens += estimate_text_tokens(value)
            return value
        return ""

    def other(self, value: object) -> None:
        # Tool calls, tool results with structure, schemas: counted by their JSON size.
        if value is not None:
            self.tokens += len(_json.dumps(value)) // 4


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _blocks_text(reader: _Reader, content: object, keep: bool = True) -> tuple[str, bool, bool]:
    """(text, has tool result, has other content) of Anthropic/Chat/Responses content; with
    `keep` false the text is counted but not joined ("": once the first user text is found, no
    later message's text is read)."""
    if isinstance(content, str):
        return reader.text(content), False, bool(content)
    texts: list[str] | None = [] if keep else None
    tool_result = False
    other = False
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            text = reader.text(block.get("text"))
            if texts is not None:
                texts.append(text)
            other = True
        elif kind in ("image", "image_url", "input_image"):
            reader.images += 1
            other = True
        elif kind == "tool_result":
            tool_result = True
            inner = block.get("content")
            if isinstance(inner, str):
                reader.text(inner)
            else:
                _blocks_text(reader, inner, keep=False)
        else:
            reader.other(block)
            other = True
    return ("\n".join(t for t in texts if t) if texts else ""), tool_result, other


def _anthropic(body: dict[str, Any], r: _Reader) -> RequestSummary:
    system = body.get("system")
    system_text = _blocks_text(r, system)[0] if system is not None else ""
    first_user = ""
    last_kind: str | None = None
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        r.tokens += PER_MESSAGE_TOKENS
        role = message.get("role")
        text, tool_result, other = _blocks_text(r, message.get("content"), not first_user)
        if role == "user":
            last_kind = "tool_result" if tool_result and not other else "user"
            if not first_user and text:
                first_user = text
        elif role == "system":
            last_kind = "system"
        else:
            last_kind = "assistant"
    tools = body.get("tools")
    r.other(tools)
    thinking = body.get("thinking")
    return RequestSummary(
        max_tokens=_int(body.get("max_tokens")),
        tool_count=len(tools) if isinstance(tools, list) else 0,
        thinking=isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"),
        system_text=system_text,
        first_user_text=first_user,
        last_kind=last_kind,
    )


def _chat(body: dict[str, Any], r: _Reader) -> RequestSummary:
    system: list[str] = []
    first_user = ""
    last_kind: str | None = None
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        r.tokens += PER_MESSAGE_TOKENS
        role = message.get("role")
        text, _, _ = _blocks_text(r, message.get("content"), not first_user)
        if role in ("system", "developer"):
            if first_user == "" and last_kind is None:
                system.append(text)
            last_kind = "system" if last_kind is not None else None
        elif role == "user":
            last_kind = "user"
            if not first_user and text:
                first_user = text
        elif role in ("tool", "function"):
            last_kind = "tool_result"
        else:
            r.other(message.get("tool_calls"))
            last_kind = "assistant"
    tools = body.get("tools")
    r.other(tools)
    return RequestSummary(
        max_tokens=_int(body.get("max_completion_tokens")) or _int(body.get("max_tokens")),
        tool_count=len(tools) if isinstance(tools, list) else 0,
        thinking=bool(body.get("reasoning_effort")) and body.get("reasoning_effort") != "none",
        system_text="\n".join(system),
        first_user_text=first_user,
        last_kind=last_kind,
    )


def _responses(body: dict[str, Any], r: _Reader) -> RequestSummary:
    system: list[str] = [r.text(body.get("instructions"))] if body.get("instructions") else []
    first_user = ""
    last_kind: str | None = None
    items = body.get("input")
    if isinstance(items, str):
        first_user = r.text(items)
        last_kind = "user"
        items = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            r.tokens += PER_MESSAGE_TOKENS
            role = item.get("role")
            text, _, _ = _blocks_text(r, item.get("content"), not first_user)
            if role in ("system", "developer"):
                if not first_user:
                    system.append(text)
                if last_kind is not None:
                    last_kind = "system"
            elif role == "user":
                last_kind = "user"
                if not first_user and text:
                    first_user = text
            else:
                last_kind = "assistant"
        elif kind in ("function_call_output", "custom_tool_call_output"):
            r.text(item.get("output")) if isinstance(item.get("output"), str) else r.other(item)
            last_kind = "tool_result"
        else:
            r.other(item)
            last_kind = "assistant"
    tools = body.get("tools")
    r.other(tools)
    reasoning = body.get("reasoning")
    cache_key = body.get("prompt_cache_key")
    return RequestSummary(
        max_tokens=_int(body.get("max_output_tokens")),
        tool_count=len(tools) if isinstance(tools, list) else 0,
        thinking=isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none"),
        system_text="\n".join(system),
        first_user_text=first_user,
        last_kind=last_kind,
        prompt_cache_key=cache_key if isinstance(cache_key, str) else None,
    )


def _gemini_parts(r: _Reader, parts: object) -> tuple[str, bool, bool]:
    texts: list[str] = []
    result = False
    other = False
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        if "text" in part:
            texts.append(r.text(part.get("text")))
            other = True
        elif "inlineData" in part or "fileData" in part:
            r.images += 1
            other = True
        elif "functionResponse" in part:
            r.other(part)
            result = True
        else:
            r.other(part)
            other = True
    return "\n".join(t for t in texts if t), result, other


def _gemini(body: dict[str, Any], r: _Reader) -> RequestSummary:
    instruction = body.get("systemInstruction") or body.get("system_instruction")
    system_text = (
        _gemini_parts(r, instruction.get("parts"))[0] if isinstance(instruction, dict) else ""
    )
    first_user = ""
    last_kind: str | None = None
    contents = body.get("contents")
    for content in contents if isinstance(contents, list) else ():
        if not isinstance(content, dict):
            continue
        r.tokens += PER_MESSAGE_TOKENS
        text, result, other = _gemini_parts(r, content.get("parts"))
        if content.get("role", "user") == "user":
            last_kind = "tool_result" if result and not other else "user"
            if not first_user and text:
                first_user = text
        else:
            last_kind = "assistant"
    tools = body.get("tools")
    r.other(tools)
    count = 0
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            declarations = tool.get("functionDeclarations") or tool.get("function_declarations")
            count += len(declarations) if isinstance(declarations, list) else 0
    config = body.get("generationConfig")
    config = config if isinstance(config, dict) else {}
    thinking = config.get("thinkingConfig")
    return RequestSummary(
        max_tokens=_int(config.get("maxOutputTokens")),
        tool_count=count,
        thinking=isinstance(thinking, dict) and thinking.get("thinkingBudget") != 0,
        system_text=system_text,
        first_user_text=first_user,
        last_kind=last_kind,
    )


_READERS = {
    Dialect.ANTHROPIC: _anthropic,
    Dialect.OPENAI_CHAT: _chat,
    Dialect.OPENAI_RESPONSES: _responses,
    Dialect.GEMINI: _gemini,
}


def summarize(body: dict[str, Any], dialect: Dialect) -> RequestSummary:
    """Read `body` (a request in `dialect`'s format) for routing and affinity; never raises on
    unexpected shapes — what cannot be read is left out."""
    reader = _Reader()
    partial = _READERS[dialect](body, reader)
    return RequestSummary(
        max_tokens=partial.max_tokens,
        tool_count=partial.tool_count,
        image=reader.images > 0,
        thinking=partial.thinking,
        system_text=partial.system_text,
        first_user_text=partial.first_user_text,
        last_kind=partial.last_kind,
        input_tokens=reader.tokens + reader.images * PER_IMAGE_TOKENS,
        prompt_cache_key=partial.prompt_cache_key,
    )


def count_tokens_body(dialect: Dialect, input_tokens: int) -> bytes:
    """A token-count answer in the client's format, for a count answered locally."""
    if dialect is Dialect.GEMINI:
        return _json.dumps({"totalTokens": input_tokens})
    if dialect is Dialect.OPENAI_RESPONSES:
        return _json.dumps({"object": "response.input_tokens", "input_tokens": input_tokens})
    return _json.dumps({"input_tokens": input_tokens})
