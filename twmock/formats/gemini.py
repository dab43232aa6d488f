"""Gemini as the mock writes it (``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` with and without ``alt=sse``, ``:countTokens``).

Every streamed chunk is a whole GenerateContentResponse with one part: thought parts
(``"thought": true``) first, then text, then one chunk per function call — Gemini does not
stream arguments in pieces. The first part after the thoughts (or the first function call)
carries a ``thoughtSignature``, and so does the first function call; the last chunk carries
``finishReason`` (and, after function calls, ``finishMessage``) and the full ``usageMetadata``
with ``candidatesTokenCount``, ``cachedContentTokenCount`` and ``thoughtsTokenCount``.

Framing copies Google byte for byte (see tests/data/fixtures/streams/gemini-*):

* SSE (``alt=sse``): ``data: <json>`` with ``": "`` after keys and bare ``,`` between members,
  events separated by CRLF CRLF.
* Without ``alt=sse``: one JSON array written as it is produced — ``[`` + the first object,
  ``\\n,\\r\\n`` + each next object, ``\\n]`` at the end — objects indented by two spaces.

Whole answers and error bodies are indented by two spaces and end with a newline; an error on a
JSON-array stream request is itself wrapped in an array, as Google's streaming endpoint does.
"""

from __future__ import annotations

import math
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
)
from twmock.formats._wire import Template, google_compact, hole, pretty, text_json
from twmock.script import ErrorSpec
from twproto import json_loads
from twproto.dialect import Dialect
from twproto.paths import PathRoute

__all__ = ["GeminiWriter", "gemini_status"]

NOT_JSON = "Invalid JSON payload received. Unexpected token."

_JSON_TYPE = b"application/json; charset=UTF-8"
_FINISH = {
    FinishKind.STOP: "STOP",
    FinishKind.LENGTH: "MAX_TOKENS",
    FinishKind.TOOLS: "STOP",
    FinishKind.BLOCKED: "SAFETY",
}


def _blocked(answer: Answer, response_id: str) -> Any:
    """What Gemini answers for a prompt it blocks: no candidates, the reason in
    ``promptFeedback``, the prompt's tokens only (whole, and as a stream's one chunk)."""
    prompt = answer.usage.input
    return {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt},
        "modelVersion": answer.model,
        "responseId": response_id,
    }


_SSE_END = b"\r\n\r\n"
_ARRAY_NEXT = b"\n,\r\n"

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    529: "UNAVAILABLE",
}
_MESSAGES = {
    400: "Request contains an invalid argument.",
    401: (
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
        "cookie or other valid authentication credential."
    ),
    403: "The caller does not have permission",
    404: (
        "models/{model} is not found for API version v1beta, or is not supported for "
        "generateContent. Call ListModels to see the list of available models and their "
        "supported methods."
    ),
    429: (
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. "
        "To monitor your current usage, head to: https://ai.dev/rate-limit. "
    ),
    500: (
        "An internal error has occurred. Please retry or report in "
        "https://developers.generativeai.google/guide/troubleshooting"
    ),
    503: "The model is overloaded. Please try again later.",
    504: "Deadline expired before operation could complete.",
    529: "The model is overloaded. Please try again later.",
}
_HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}


def gemini_status(status: int) -> str:
    return _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _usage(answer: Answer, *, final: bool) -> dict[str, Any]:
    u = answer.usage
    prompt = u.prompt_total
    cached = u.cache_read
    thoughts = u.reasoning
    candidates = max(0, u.output - thoughts)
    out: dict[str, Any] = {"promptTokenCount": prompt}
    if final:
        out["candidatesTokenCount"] = candidates
    out["totalTokenCount"] = prompt + thoughts + (candidates if final else 0)
    if cached:
        out["cachedContentTokenCount"] = cached
    out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if cached:
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    return out


def _candidate(parts: list[Any], finish: str | None, tools: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    if finish is not None and tools:
        candidate["finishMessage"] = "Model generated function call(s)."
    return candidate


def _response(answer: Answer, response_id: str, candidate: dict[str, Any], *, final: bool) -> Any:
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(answer, final=final),
        "modelVersion": answer.model,
        "responseId": response_id,
    }


# Google's documented placeholder for a function call whose signature is unknown.
_PLACEHOLDER = "skip_thought_signature_validator"


def _check_signatures(contents: list[Any]) -> None:
    """Gemini refuses a thoughtSignature it did not make with 400 "Corrupted thought
    signature."; the mock refuses what cannot be Gemini's: an OpenAI Fernet token (the
    placeholder is accepted, as the API does)."""
    for content in contents:
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            seal = part.get("thoughtSignature") if isinstance(part, dict) else None
            if isinstance(seal, str) and seal != _PLACEHOLDER and sealed_by_openai(seal):
                raise BadRequest("Corrupted thought signature.")


def _stream_head(sse: bool) -> Headers:
    content_type = b"text/event-stream" if sse else _JSON_TYPE
    return ((b"content-type", content_type), (b"server", b"scaffolding on HTTPServer2"))


class GeminiWriter:
    dialect = Dialect.GEMINI
    not_json_message = NOT_JSON

    def facts(self, route: PathRoute, body: Any, *, validate: bool) -> MockRequest:
        if not isinstance(body, dict):
            raise BadRequest("Invalid JSON payload received. Expected an object.")
        contents = body.get("contents")
        if validate and not isinstance(contents, list) and "generateContentRequest" not in body:
            raise BadRequest("* GenerateContentRequest.contents: contents is not specified\n")
        if validate and isinstance(contents, list):
            _check_signatures(contents)
        names: list[str] = []
        tools = body.get("tools")
        for tool in tools if isinstance(tools, list) else ():
            if not isinstance(tool, dict):
                continue
            declarations = tool.get("functionDeclarations", tool.get("function_declarations"))
            for declaration in declarations if isinstance(declarations, list) else ():
                if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                    names.append(declaration["name"])
        last = ""
        if isinstance(contents, list):
            for content in reversed(contents):
                if isinstance(content, dict) and content.get("role", "user") == "user":
                    last = last_text(content.get("parts"))
                    break
        config = body.get("generationConfig", body.get("generation_config"))
        max_tokens = config.get("maxOutputTokens") if isinstance(config, dict) else None
        return MockRequest(
            model=route.model or "unknown",
            stream=route.stream,
            sse=route.sse,
            messages=len(contents) if isinstance(contents, list) else 0,
            tools=tuple(names),
            system="systemInstruction" in body or "system_instruction" in body,
            last_user_text=last,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            body=body,
        )

    def _parts(self, answer: Answer, signature: str) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if answer.reasoning:
            parts.append({"text": answer.reasoning_text, "thought": True})
        signed = False
        if answer.text:
            part: dict[str, Any] = {"text": answer.full_text}
            if answer.reasoning:
                part["thoughtSignature"] = signature
                signed = True
            parts.append(part)
        for i, call in enumerate(answer.tools):
            part = {"functionCall": {"name": call.name, "args": json_loads(call.arguments)}}
            if i == 0:
                # Gemini 3 refuses a replayed function call whose first part lost this.
                part["thoughtSignature"] = signature
                signed = True
            parts.append(part)
        if answer.reasoning and not signed:
            parts.append({"text": "", "thoughtSignature": signature})
        return parts

    def whole(self, answer: Answer) -> tuple[Headers, bytes]:
        ids = answer.ids
        parts = self._parts(answer, ids.signature(0x0A, 160))
        candidate = _candidate(parts, _FINISH[answer.finish], bool(answer.tools))
        if answer.finish is FinishKind.BLOCKED:
            body = pretty(_blocked(answer, ids.alnum(23))) + b"\n"
        else:
            body = pretty(_response(answer, ids.alnum(23), candidate, final=True)) + b"\n"
        headers = (
            (b"content-type", _JSON_TYPE),
            (b"content-length", str(len(body)).encode()),
            (b"server", b"scaffolding on HTTPServer2"),
        )
        return headers, body

    def stream(self, answer: Answer) -> Stream:
        ids = answer.ids
        sse = answer.facts.sse
        encode = google_compact if sse else pretty
        response_id = ids.alnum(23)
        signature = ids.signature(0x0A, 160)
        finish = _FINISH[answer.finish]
        tools = bool(answer.tools)
        events: list[Event] = []

        def frame(obj_bytes: bytes) -> bytes:
            if sse:
                return b"data: " + obj_bytes + _SSE_END
            return (_ARRAY_NEXT if events else b"[") + obj_bytes

        def template(part: dict[str, Any]) -> Template:
            sample = _response(answer, response_id, _candidate([part], None, tools), final=False)
            return Template(encode(sample), ("t",))

        def final(part: dict[str, Any]) -> bytes:
            obj = _response(answer, response_id, _candidate([part], finish, tools), final=True)
            return frame(encode(obj))

        if answer.finish is FinishKind.BLOCKED:
            events.append(Event(frame(encode(_blocked(answer, response_id))), False))
            if not sse:
                events.append(Event(b"\n]", False))
            return Stream(headers=_stream_head(sse), events=events, opening=0)
        # (part, is content) in order; the last one is written with the finish and full usage.
        plan: list[tuple[dict[str, Any], bool]] = []
        plan.extend(({"text": piece, "thought": True}, True) for piece in answer.reasoning)
        signed = False
        for i, piece in enumerate(answer.text):
            part: dict[str, Any] = {"text": piece}
            if i == 0 and answer.reasoning:
                part["thoughtSignature"] = signature
                signed = True
            plan.append((part, True))
        for i, call in enumerate(answer.tools):
            part = {"functionCall": {"name": call.name, "args": json_loads(call.arguments)}}
            if i == 0:
                part["thoughtSignature"] = signature
                signed = True
            plan.append((part, True))
        if (answer.reasoning and not signed) or not plan:
            part = {"text": ""}
            if answer.reasoning:
                part["thoughtSignature"] = signature
            plan.append((part, False))

        thought_tpl = template({"text": hole("t"), "thought": True})
        text_tpl = template({"text": hole("t")})
        last = len(plan) - 1
        for i, (part, content) in enumerate(plan):
            if i == last:
                data = final(part)
            elif part.get("thought") is True:
                data = frame(thought_tpl.fill(text_json(part["text"])))
            elif len(part) == 1 and "text" in part:
                data = frame(text_tpl.fill(text_json(part["text"])))
            else:
                obj = _response(answer, response_id, _candidate([part], None, tools), final=False)
                data = frame(encode(obj))
            events.append(Event(data, content))
        if not sse:
            events.append(Event(b"\n]", False))
        return Stream(headers=_stream_head(sse), events=events, opening=0)

    def stream_error(self, answer: Answer, reply: ErrorReply, *, position: int) -> bytes:
        obj = {"error": reply.error}
        if answer.facts.sse:
            return b"data: " + google_compact(obj) + _SSE_END
        return (_ARRAY_NEXT if position else b"[") + pretty(obj) + b"\n]"

    def error(
        self, spec: ErrorSpec, *, model: str, facts: MockRequest | None, ids: Ids, now: int
    ) -> ErrorReply:
        status = spec.status if spec.status is not None else 503
        message = spec.message
        if message is None:
            message = _MESSAGES.get(
                status, "An internal error has occurred." if status >= 500 else "Bad request."
            ).replace("{model}", model)
        details: list[Any] = []
        if status == 429:
            details.append(_HELP)
            if spec.retry_after is not None:
                message += f"\nPlease retry in {_seconds(spec.retry_after)}."
                details.append(
                    {
                        "@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{math.ceil(spec.retry_after)}s",
                    }
                )
        array = facts is not None and facts.stream and not facts.sse
        # Google puts the retry delay in the body, not in a Retry-After header.
        return self._reply(status, message, details, error_headers(spec, retry_header=False), array)

    def bad_request(self, message: str, *, route: PathRoute, ids: Ids) -> ErrorReply:
        return self._reply(400, message, [], (), route.stream and not route.sse)

    def _reply(
        self, status: int, message: str, details: list[Any], extra: Headers, array: bool
    ) -> ErrorReply:
        error: dict[str, Any] = {
            "code": status,
            "message": message,
            "status": gemini_status(status),
        }
        if details:
            error["details"] = details
        body = pretty({"error": error}) + b"\n"
        if array:
            body = b"[" + body + b"]"
        headers = (
            (b"content-type", _JSON_TYPE),
            (b"content-length", str(len(body)).encode()),
            (b"server", b"scaffolding on HTTPServer2"),
            *extra,
        )
        return ErrorReply(status=status, headers=headers, body=body, error=error)

    def count_tokens(self, tokens: int) -> bytes:
        obj = {
            "totalTokens": tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}],
        }
        return pretty(obj) + b"\n"
