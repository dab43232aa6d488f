"""OpenAI Chat Completions as the mock writes it (``POST /chat/completions``, ``/v1/…``).

Streams follow tests/data/fixtures/streams/openai-chat-*.sse: every chunk repeats id, object,
created, model, service_tier and system_fingerprint; the first carries only the role; text
deltas are ``{"content": …}``; reasoning is DeepSeek's ``reasoning_content`` (the only Chat
dialect that streams it); a tool call opens with its id, type and name and then streams
``function.arguments`` pieces under its ``index``; a chunk with an empty delta carries the
finish reason; with ``stream_options.include_usage`` every chunk has ``"usage":null`` and a last
chunk with ``"choices":[]`` carries the usage; ``data: [DONE]`` ends the stream. Whole answers
and error bodies are indented by two spaces, as OpenAI writes them.

The error shape (``{"error": {message, type, param, code}}``) is shared with Responses.
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
)
from twmock.formats._wire import Template, compact, hole, pretty, text_json
from twmock.script import ErrorSpec
from twproto.dialect import Dialect
from twproto.paths import PathRoute

__all__ = ["NOT_JSON", "OpenAIChatWriter", "openai_error"]

NOT_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was "
    "not valid JSON. If you have trouble figuring out how to fix this, please contact us through "
    "our help center at help.openai.com.)"
)

_FINISH = {
    FinishKind.STOP: "stop",
    FinishKind.LENGTH: "length",
    FinishKind.TOOLS: "tool_calls",
    FinishKind.BLOCKED: "content_filter",
}

# status -> (type, code, message)
_ERRORS: dict[int, tuple[str, str | int | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: (
        "invalid_request_error",
        "invalid_api_key",
        "Incorrect API key provided: sk-mock************************abcd. You can find your API "
        "key at https://platform.openai.com/account/api-keys.",
    ),
    # OpenAI itself has no 402; DeepSeek's is the one OpenAI-compatible clients meet.
    402: ("unknown_error", "invalid_request_error", "Insufficient Balance"),
    403: (
        "invalid_request_error",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported",
    ),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model `{model}` does not exist or you do not have access to it.",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for {model} in organization org-mock on requests per min (RPM): "
        "Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error processing your request. Sorry about that! You can retry your "
        "request, or contact us through our help center at help.openai.com if you keep seeing "
        "this error.",
    ),
    502: ("cf_bad_gateway", 502, "Bad gateway."),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
    504: ("cf_gateway_timeout", 504, "Gateway timeout."),
    529: ("server_error", None, "The server is overloaded or not ready yet."),
}


def openai_error(
    status: int, *, model: str, ids: Ids, message: str | None = None, extra: Headers = ()
) -> ErrorReply:
    """An error in OpenAI's shape (Chat and Responses), with a status-appropriate default."""
    default = _ERRORS.get(
        status,
        ("server_error", None, "The server had an error processing your request.")
        if status >= 500
        else ("invalid_request_error", None, "Invalid request."),
    )
    kind, code, text = default
    error = {
        "message": message if message is not None else text.replace("{model}", model),
        "type": kind,
        "param": None,
        "code": code,
    }
    body = pretty({"error": error}) + b"\n"
    headers = (
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", b"req_" + ids.hex(32).encode()),
        (b"openai-version", b"2020-10-01"),
        *extra,
    )
    return ErrorReply(status=status, headers=headers, body=body, error=error)


def _usage(answer: Answer) -> dict[str, Any]:
    u = answer.usage
    return {
        "prompt_tokens": u.prompt_total,
        "completion_tokens": u.output,
        "total_tokens": u.prompt_total + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _images_only_for_users(messages: list[Any]) -> None:
    # The API's own rule and words: an image part anywhere but a user message is refused.
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") == "user":
            continue
        content = msg.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == "image_url" for p in content
        ):
            raise BadRequest(
                f"Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role "
                f"'user', but this message with role '{msg.get('role')}' contains an image URL."
            )


class OpenAIChatWriter:
    dialect = Dialect.OPENAI_CHAT
    not_json_message = NOT_JSON

    def facts(self, route: PathRoute, body: Any, *, validate: bool) -> MockRequest:
        if not isinstance(body, dict):
            raise BadRequest("Invalid type for request body: expected an object.")
        model = body.get("model")
        messages = body.get("messages")
        if validate:
            if not isinstance(model, str):
                raise BadRequest("you must provide a model parameter")
            if not isinstance(messages, list):
                raise BadRequest("Missing required parameter: 'messages'.")
            _images_only_for_users(messages)
        names: tuple[str, ...] = ()
        tools = body.get("tools")
        if isinstance(tools, list):
            names = tuple(
                t["function"]["name"]
                for t in tools
                if isinstance(t, dict)
                and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str)
            )
        last = ""
        system = False
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict) and message.get("role") in ("system", "developer"):
                    system = True
            for message in reversed(messages):
                if isinstance(message, dict) and message.get("role") == "user":
                    last = last_text(message.get("content"))
                    break
        options = body.get("stream_options")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return MockRequest(
            model=model if isinstance(model, str) else "unknown",
            stream=body.get("stream") is True,
            messages=len(messages) if isinstance(messages, list) else 0,
            tools=names,
            system=system,
            last_user_text=last,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
            body=body,
        )

    def whole(self, answer: Answer) -> tuple[Headers, bytes]:
        ids = answer.ids
        message: dict[str, Any] = {
            "role": "assistant",
            "content": answer.full_text if answer.text or not answer.tools else None,
        }
        if answer.reasoning:
            message["reasoning_content"] = answer.reasoning_text
        if answer.tools:
            message["tool_calls"] = [
                {
                    "id": "call_" + ids.alnum(24),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in answer.tools
            ]
        message["refusal"] = None
        message["annotations"] = []
        body = (
            pretty(
                {
                    "id": "chatcmpl-" + ids.alnum(29),
                    "object": "chat.completion",
                    "created": answer.now,
                    "model": answer.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "logprobs": None,
                            "finish_reason": _FINISH[answer.finish],
                        }
                    ],
                    "usage": _usage(answer),
                    "service_tier": "default",
                    "system_fingerprint": "fp_" + ids.hex(10),
                }
            )
            + b"\n"
        )
        return _headers(ids, json_body=body), body

    def stream(self, answer: Answer) -> Stream:
        ids = answer.ids
        include_usage = answer.facts.include_usage
        head: dict[str, Any] = {
            "id": "chatcmpl-" + ids.alnum(29),
            "object": "chat.completion.chunk",
            "created": answer.now,
            "model": answer.model,
            "service_tier": "default",
            "system_fingerprint": "fp_" + ids.hex(10),
        }
        chunk = {
            **head,
            "choices": [
                {"index": 0, "delta": hole("d"), "logprobs": None, "finish_reason": hole("f")}
            ],
        }
        if include_usage:
            chunk["usage"] = None
        base = Template(b"data: " + compact(chunk) + b"\n\n", ("d", "f"))

        def kind(delta: bytes) -> Template:
            return Template(base.fill(delta, b"null"), ("t",))

        t = f'"{hole("t")}"'
        events: list[Event] = []
        add = events.append
        if answer.reasoning:
            role = b'{"role":"assistant","content":null,"reasoning_content":""}'
        elif answer.text:
            role = b'{"role":"assistant","content":"","refusal":null}'
        else:
            role = b'{"role":"assistant","content":null,"refusal":null}'
        add(Event(base.fill(role, b"null"), False))
        if answer.reasoning:
            tpl = kind(f'{{"content":null,"reasoning_content":{t}}}'.encode())
            for piece in answer.reasoning:
                add(Event(tpl.fill(text_json(piece)), True))
        if answer.text:
            if answer.reasoning:
                tpl = kind(f'{{"content":{t},"reasoning_content":null}}'.encode())
            else:
                tpl = kind(f'{{"content":{t}}}'.encode())
            for piece in answer.text:
                add(Event(tpl.fill(text_json(piece)), True))
        for index, call in enumerate(answer.tools):
            opening = {
                "tool_calls": [
                    {
                        "index": index,
                        "id": "call_" + ids.alnum(24),
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
            add(Event(base.fill(compact(opening), b"null"), False))
            tpl = kind(
                f'{{"tool_calls":[{{"index":{index},"function":{{"arguments":{t}}}}}]}}'.encode()
            )
            for piece in call.pieces:
                add(Event(tpl.fill(text_json(piece)), True))
        add(Event(base.fill(b"{}", text_json(_FINISH[answer.finish])), False))
        if include_usage:
            last = {**head, "choices": [], "usage": _usage(answer)}
            add(Event(b"data: " + compact(last) + b"\n\n", False))
        add(Event(b"data: [DONE]\n\n", False))
        headers = (
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", b"req_" + ids.hex(32).encode()),
            (b"openai-version", b"2020-10-01"),
        )
        return Stream(headers=headers, events=events, opening=1)

    def stream_error(self, answer: Answer, reply: ErrorReply, *, position: int) -> bytes:
        # A bare error chunk, no [DONE] after it, as recorded (openai-chat-midstream-error.sse).
        error = {k: v for k, v in reply.error.items() if v is not None or k == "message"}
        return b"data: " + _spaced(error) + b"\n\n"

    def error(
        self, spec: ErrorSpec, *, model: str, facts: MockRequest | None, ids: Ids, now: int
    ) -> ErrorReply:
        status = spec.status if spec.status is not None else 503
        return openai_error(
            status, model=model, ids=ids, message=spec.message, extra=error_headers(spec)
        )

    def bad_request(self, message: str, *, route: PathRoute, ids: Ids) -> ErrorReply:
        return openai_error(400, model="", ids=ids, message=message)

    def count_tokens(self, tokens: int) -> bytes:
        return b'{"input_tokens":%d}' % tokens


def _spaced(error: dict[str, Any]) -> bytes:
    # The recorded in-stream error chunk is written by Python's json with default spacing.
    return json.dumps({"error": error}, ensure_ascii=False).encode()


def _headers(ids: Ids, *, json_body: bytes) -> Headers:
    return (
        (b"content-type", b"application/json"),
        (b"content-length", str(len(json_body)).encode()),
        (b"x-request-id", b"req_" + ids.hex(32).encode()),
        (b"openai-version", b"2020-10-01"),
    )
