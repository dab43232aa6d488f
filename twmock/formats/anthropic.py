"""Anthropic Messages as the mock writes it (``POST /v1/messages``, ``/v1/messages/count_tokens``).

Streams follow the recorded ones in tests/data/fixtures/streams/anthropic-*.sse:
``message_start`` (usage with the cache fields and ``output_tokens: 1``), then per block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop`` — a thinking block
ends with a ``signature_delta``, a tool_use block opens with an empty ``input_json_delta`` — a
``ping`` after the first block start, ``message_delta`` with the stop reason and the full usage,
``message_stop``. Events are compact JSON except ``ping`` and ``error``, which the API writes
with spaces (``{"type": "ping"}``). Whole answers and error bodies are compact too.
"""

from __future__ import annotations

import json
from typing import Any

from twmock.answer import (
    Answer,
    BadRequest,
    ErrorReply,
    Event,
    FinishKind,
    Headers,
    Ids,
    MockRequest,
    Stream,
    error_headers,
    last_text,
    sealed_by_openai,
    standard_base64,
)
from twmock.formats._wire import Template, compact, hole, sse, text_json
from twmock.script import ErrorSpec
from twproto import json_loads
from twproto.dialect import Dialect
from twproto.paths import Operation, PathRoute

__all__ = ["AnthropicWriter"]

_STOP = {
    FinishKind.STOP: "end_turn",
    FinishKind.LENGTH: "max_tokens",
    FinishKind.TOOLS: "tool_use",
    FinishKind.BLOCKED: "refusal",
}

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_MESSAGES = {
    400: "messages: Input should be a valid list",
    401: "invalid x-api-key",
    402: (
        "Your credit balance is too low to access the Anthropic API. "
        "Please go to Plans & Billing to upgrade or purchase credits."
    ),
    403: "Your API key does not have permission to use the specified resource.",
    404: "model: {model}",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: (
        "This request would exceed the rate limit for your organization of 50 requests per "
        "minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see "
        "the response headers for current usage. Please reduce the prompt length or the maximum "
        "tokens requested, or try again later."
    ),
    500: "Internal server error",
    504: "Request timed out",
    529: "Overloaded",
}

_PING = sse("ping", b'{"type": "ping"}')
_STREAM_HEADERS: Headers = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
)
_DELTA = '{"type":"content_block_delta","index":'


def _delta_template(index: int, kind: str, key: str) -> Template:
    data = (f'{_DELTA}{index},"delta":{{"type":"{kind}","{key}":"{hole("t")}"}}}}').encode()
    return Template(sse("content_block_delta", data), ("t",))


def _usage(answer: Answer, *, output: int) -> dict[str, Any]:
    u = answer.usage
    return {
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_write,
        "cache_read_input_tokens": u.cache_read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": u.cache_write,
            "ephemeral_1h_input_tokens": 0,
        },
        "output_tokens": output,
        # As the API reports thinking inside output_tokens (not in message_start).
        **(
            {"output_tokens_details": {"thinking_tokens": u.reasoning}}
            if u.reasoning and u.reasoning <= output
            else {}
        ),
        "service_tier": "standard",
        "inference_geo": "not_available",
    }


def _blocks(answer: Answer, tool_ids: list[str], signature: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if answer.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": answer.reasoning_text, "signature": signature}
        )
    if answer.text:
        blocks.append({"type": "text", "text": answer.full_text})
    for call, tool_id in zip(answer.tools, tool_ids, strict=True):
        arguments = json_loads(call.arguments)
        blocks.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": arguments})
    return blocks


_THINKING_TURN = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def _blocks_of(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _check_thinking(body: dict[str, Any], messages: list[Any]) -> None:
    """The API's two rules for thinking in a history, with its own words: a thinking block's
    signature must be one Anthropic made (the mock refuses what cannot be: not standard
    base64, or an OpenAI Fernet token), and with thinking on, the assistant turn of the tool
    round in progress must open with a thinking block."""
    for i, message in enumerate(messages):
        kinds = [b.get("type") if isinstance(b, dict) else None for b in _blocks_of(message)]
        thinks = {"thinking", "redacted_thinking"}
        if kinds and kinds[0] not in thinks and thinks & set(kinds):
            raise BadRequest(
                f"messages.{i}.content.0: If an assistant message contains any thinking blocks, "
                f"the first block must be thinking or redacted_thinking. Found {kinds[0]}."
            )
        for j, block in enumerate(_blocks_of(message)):
            if isinstance(block, dict) and block.get("type") == "thinking":
                seal = block.get("signature")
                if not isinstance(seal, str) or not standard_base64(seal) or sealed_by_openai(seal):
                    raise BadRequest(
                        f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                    )
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return
    # The assistant turn in progress opens after the last user message without tool results.
    opening: int | None = None
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        role = message.get("role") if isinstance(message, dict) else None
        blocks = _blocks_of(message)
        results = any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks)
        if role == "user" and not results:
            break
        if role == "assistant" and blocks:
            opening = i
    if opening is None or messages[-1].get("role") != "user":
        return
    first = _blocks_of(messages[opening])[0]
    kind = first.get("type") if isinstance(first, dict) else None
    if kind not in ("thinking", "redacted_thinking"):
        raise BadRequest(_THINKING_TURN.format(index=opening, found=kind))


def _check_tool_results(messages: list[Any]) -> None:
    """The Messages API's rule: each ``tool_result`` answers a ``tool_use`` of the message just
    before it (its own 400 text)."""
    previous: Any = None
    for number, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and message.get("role") == "user":
            before = previous.get("content") if isinstance(previous, dict) else None
            uses = {
                b.get("id")
                for b in (before if isinstance(before, list) else ())
                if isinstance(b, dict) and b.get("type") == "tool_use"
            }
            for index, block in enumerate(content):
                if not isinstance(block, dict) or block.get("type") != "tool_result":
                    continue
                if block.get("tool_use_id") not in uses:
                    raise BadRequest(
                        f"messages.{number}.content.{index}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous "
                        "message."
                    )
        previous = message


class AnthropicWriter:
    dialect = Dialect.ANTHROPIC
    not_json_message = (
        "There was an error parsing the body of your request. Please check your JSON and try again."
    )

    def facts(self, route: PathRoute, body: Any, *, validate: bool) -> MockRequest:
        if not isinstance(body, dict):
            raise BadRequest("Input should be a valid dictionary")
        model = body.get("model")
        messages = body.get("messages")
        if validate:
            if not isinstance(model, str):
                raise BadRequest("model: Field required")
            if not isinstance(messages, list):
                raise BadRequest("messages: Field required")
            generate = route.operation is Operation.GENERATE
            if generate and not isinstance(body.get("max_tokens"), int):
                raise BadRequest("max_tokens: Field required")
            _check_thinking(body, messages)
            _check_tool_results(messages)
        tools = body.get("tools")
        names = (
            tuple(
                t["name"]
                for t in tools or ()
                if isinstance(t, dict) and isinstance(t.get("name"), str)
            )
            if isinstance(tools, list)
            else ()
        )
        last = ""
        if isinstance(messages, list):
            for message in reversed(messages):
                if isinstance(message, dict) and message.get("role") == "user":
                    last = last_text(message.get("content"))
                    break
        max_tokens = body.get("max_tokens")
        return MockRequest(
            model=model if isinstance(model, str) else "unknown",
            stream=body.get("stream") is True,
            messages=len(messages) if isinstance(messages, list) else 0,
            tools=names,
            system="system" in body,
            last_user_text=last,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            body=body,
        )

    def whole(self, answer: Answer) -> tuple[Headers, bytes]:
        ids = answer.ids
        tool_ids = ["toolu_01" + ids.alnum(22) for _ in answer.tools]
        signature = ids.signature(0x12, 180) if answer.reasoning else ""
        body = compact(
            {
                "model": answer.model,
                "id": "msg_01" + ids.alnum(22),
                "type": "message",
                "role": "assistant",
                "content": _blocks(answer, tool_ids, signature),
                "stop_reason": _STOP[answer.finish],
                "stop_sequence": None,
                "usage": _usage(answer, output=answer.usage.output),
            }
        )
        headers = (
            (b"content-type", b"application/json"),
            (b"request-id", ids.request_id().encode()),
            (b"content-length", str(len(body)).encode()),
        )
        return headers, body

    def stream(self, answer: Answer) -> Stream:
        ids = answer.ids
        events: list[Event] = []
        add = events.append
        start = {
            "type": "message_start",
            "message": {
                "model": answer.model,
                "id": "msg_01" + ids.alnum(22),
                "type": "message",
                "role": "assistant",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": _usage(answer, output=1),
            },
        }
        add(Event(sse("message_start", compact(start)), False))
        index = 0
        pinged = False

        def block_start(block: bytes) -> None:
            nonlocal pinged
            add(
                Event(
                    sse(
                        "content_block_start",
                        b'{"type":"content_block_start","index":%d,"content_block":%s}'
                        % (index, block),
                    ),
                    False,
                )
            )
            if not pinged:
                add(Event(_PING, False))
                pinged = True

        def block_stop() -> None:
            add(
                Event(
                    sse("content_block_stop", b'{"type":"content_block_stop","index":%d}' % index),
                    False,
                )
            )

        if answer.reasoning:
            block_start(b'{"type":"thinking","thinking":"","signature":""}')
            tpl = _delta_template(index, "thinking_delta", "thinking")
            for piece in answer.reasoning:
                add(Event(tpl.fill(text_json(piece)), True))
            # The API closes the thinking text with an empty delta before the signature.
            add(Event(tpl.fill(b'""'), False))
            signature = _delta_template(index, "signature_delta", "signature")
            add(Event(signature.fill(text_json(ids.signature(0x12, 180))), False))
            block_stop()
            index += 1
        if answer.text:
            block_start(b'{"type":"text","text":""}')
            tpl = _delta_template(index, "text_delta", "text")
            for piece in answer.text:
                add(Event(tpl.fill(text_json(piece)), True))
            block_stop()
            index += 1
        for call in answer.tools:
            tool_id = "toolu_01" + ids.alnum(22)
            block = compact({"type": "tool_use", "id": tool_id, "name": call.name, "input": {}})
            block_start(block)
            tpl = _delta_template(index, "input_json_delta", "partial_json")
            add(Event(tpl.fill(b'""'), False))
            for piece in call.pieces:
                add(Event(tpl.fill(text_json(piece)), True))
            block_stop()
            index += 1
        if not pinged:
            add(Event(_PING, False))
        opening = next((i for i, e in enumerate(events) if e.content), len(events))
        u = answer.usage
        final: dict[str, Any] = {
            "input_tokens": u.input,
            "cache_creation_input_tokens": u.cache_write,
            "cache_read_input_tokens": u.cache_read,
            "output_tokens": u.output,
        }
        if u.reasoning:
            final["output_tokens_details"] = {"thinking_tokens": u.reasoning}
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP[answer.finish], "stop_sequence": None},
            "usage": final,
        }
        add(Event(sse("message_delta", compact(delta)), False))
        add(Event(sse("message_stop", b'{"type":"message_stop"}'), False))
        headers = (*_STREAM_HEADERS, (b"request-id", ids.request_id().encode()))
        return Stream(headers=headers, events=events, opening=opening)

    def stream_error(self, answer: Answer, reply: ErrorReply, *, position: int) -> bytes:
        # The API writes this event with spaces, unlike the others (see the fixtures).
        data = json.dumps({"type": "error", "error": reply.error}, ensure_ascii=False)
        return sse("error", data.encode())

    def error(
        self, spec: ErrorSpec, *, model: str, facts: MockRequest | None, ids: Ids, now: int
    ) -> ErrorReply:
        status = spec.status if spec.status is not None else 529
        kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        message = spec.message
        if message is None:
            fallback = "Internal server error" if status >= 500 else "Bad request"
            message = _MESSAGES.get(status, fallback).replace("{model}", model)
        return self._reply(status, kind, message, ids, error_headers(spec))

    def bad_request(self, message: str, *, route: PathRoute, ids: Ids) -> ErrorReply:
        return self._reply(400, "invalid_request_error", message, ids, ())

    def _reply(self, status: int, kind: str, message: str, ids: Ids, extra: Headers) -> ErrorReply:
        error = {"type": kind, "message": message}
        request_id = ids.request_id()
        body = compact({"type": "error", "error": error, "request_id": request_id})
        retry = b"true" if status in (408, 409, 429) or status >= 500 else b"false"
        headers = (
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"request-id", request_id.encode()),
            (b"x-should-retry", retry),
            *extra,
        )
        return ErrorReply(status=status, headers=headers, body=body, error=error)

    def count_tokens(self, tokens: int) -> bytes:
        return b'{"input_tokens":%d}' % tokens
