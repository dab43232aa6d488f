"""OpenAI Responses as the mock writes it (``POST /responses``, ``/v1/responses``, Codex's path).

Streams follow tests/data/fixtures/streams/openai-responses-*.sse: ``response.created`` and
``response.in_progress`` carry the whole response object (request parameters echoed back,
``output: []``, ``usage: null``); each output item is opened by ``response.output_item.added``
and closed by ``response.output_item.done``; a reasoning item streams its summary
(``reasoning_summary_part.added`` / ``reasoning_summary_text.delta``… / ``.done`` /
``reasoning_summary_part.done``) and carries ``encrypted_content`` when the request's
``include`` asks for it; a message streams ``output_text.delta`` inside a content part; a
function call streams ``function_call_arguments.delta``; ``response.completed`` (or
``response.incomplete`` at the length limit) carries the output and the usage with
``input_tokens_details.cached_tokens`` and ``output_tokens_details.reasoning_tokens``.

Every event has a ``sequence_number`` counting from 0, and its fields after ``type`` in
alphabetical order as the API writes them today. Deltas carry the ``obfuscation`` padding that
brings short deltas to 16 characters, unless ``stream_options.include_obfuscation`` is false.
An in-stream failure is an ``error`` event followed by ``response.failed``.
"""

from __future__ import annotations

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
from twmock.formats._wire import Template, compact, hole, pretty, sse, text_json
from twmock.formats.openai_chat import NOT_JSON, openai_error
from twmock.script import ErrorSpec
from twproto.dialect import Dialect
from twproto.paths import PathRoute

__all__ = ["OpenAIResponsesWriter"]


_DEFAULT_TEXT = {"format": {"type": "text"}, "verbosity": "medium"}


def _paddings(pool: str) -> list[bytes]:
    """The ``obfuscation`` value for each delta length modulo 16, as JSON strings."""
    return [b'"' + pool[: 16 - n].encode() + b'"' for n in range(16)]


def _usage(answer: Answer) -> dict[str, Any]:
    u = answer.usage
    return {
        "input_tokens": u.prompt_total,
        "input_tokens_details": {"cached_tokens": u.cache_read},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.prompt_total + u.output,
    }


class _Items:
    """The output items of one answer, with their ids, in output order."""

    def __init__(self, answer: Answer) -> None:
        ids = answer.ids
        self.reasoning_id = ids.openai_item("rs") if answer.reasoning else ""
        self.encrypted = ids.fernet(330) if answer.reasoning else ""
        # The real blobs start with the Fernet version byte and a timestamp: "gAAAAAB…".
        self.encrypted = "gAAAAAB" + self.encrypted[7:]
        self.message_id = ids.openai_item("msg") if answer.text or not answer.tools else ""
        self.calls = [(ids.openai_item("fc"), "call_" + ids.alnum(24)) for _ in answer.tools]

    def reasoning(self, answer: Answer, *, done: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.reasoning_id, "type": "reasoning"}
        if answer.facts.include_encrypted:
            item["encrypted_content"] = self.encrypted
        item["summary"] = [{"type": "summary_text", "text": answer.reasoning_text}] if done else []
        return item

    def message(self, answer: Answer, *, done: bool) -> dict[str, Any]:
        content = (
            [{"type": "output_text", "annotations": [], "logprobs": [], "text": answer.full_text}]
            if done
            else []
        )
        return {
            "id": self.message_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "content": content,
            "role": "assistant",
        }

    def call(self, answer: Answer, index: int, *, done: bool) -> dict[str, Any]:
        item_id, call_id = self.calls[index]
        call = answer.tools[index]
        return {
            "id": item_id,
            "type": "function_call",
            "status": "completed" if done else "in_progress",
            "arguments": call.arguments if done else "",
            "call_id": call_id,
            "name": call.name,
        }

    def output(self, answer: Answer) -> list[dict[str, Any]]:
        out = []
        if self.reasoning_id:
            out.append(self.reasoning(answer, done=True))
        if self.message_id:
            out.append(self.message(answer, done=True))
        out.extend(self.call(answer, i, done=True) for i in range(len(self.calls)))
        return out


def _response(
    answer: Answer,
    response_id: str,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = answer.facts.body
    reasoning = body.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    text = body.get("text")
    finished = status in ("completed", "incomplete")
    return {
        "id": response_id,
        "object": "response",
        "created_at": answer.now,
        "status": status,
        "background": bool(body.get("background", False)),
        "completed_at": answer.now + 1 if finished else None,
        "error": error,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": answer.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "reasoning": {
            "effort": reasoning.get("effort"),
            "summary": reasoning.get("summary"),
        },
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default" if finished else body.get("service_tier", "auto"),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": text if isinstance(text, dict) else _DEFAULT_TEXT,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata", {}),
    }


class OpenAIResponsesWriter:
    dialect = Dialect.OPENAI_RESPONSES
    not_json_message = NOT_JSON

    def facts(self, route: PathRoute, body: Any, *, validate: bool) -> MockRequest:
        if not isinstance(body, dict):
            raise BadRequest("Invalid type for request body: expected an object.")
        model = body.get("model")
        if validate and not isinstance(model, str):
            raise BadRequest("Missing required parameter: 'model'.")
        items = body.get("input")
        system = isinstance(body.get("instructions"), str)
        last = ""
        if isinstance(items, str):
            messages, last = 1, items
        elif isinstance(items, list):
            messages = len(items)
            for item in items:
                if isinstance(item, dict) and item.get("role") in ("system", "developer"):
                    system = True
            for item in reversed(items):
                if isinstance(item, dict) and item.get("role") == "user":
                    last = last_text(item.get("content"))
                    break
        else:
            messages = 0
        tools = body.get("tools")
        names = (
            tuple(
                t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)
            )
            if isinstance(tools, list)
            else ()
        )
        include = body.get("include")
        options = body.get("stream_options")
        max_tokens = body.get("max_output_tokens")
        return MockRequest(
            model=model if isinstance(model, str) else "unknown",
            stream=body.get("stream") is True,
            messages=messages,
            tools=names,
            system=system,
            last_user_text=last,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            include_encrypted=isinstance(include, list)
            and "reasoning.encrypted_content" in include,
            obfuscation=not (
                isinstance(options, dict) and options.get("include_obfuscation") is False
            ),
            body=body,
        )

    def whole(self, answer: Answer) -> tuple[Headers, bytes]:
        ids = answer.ids
        items = _Items(answer)
        status = "incomplete" if answer.finish is FinishKind.LENGTH else "completed"
        body = pretty(
            _response(
                answer,
                "resp_" + ids.hex(50),
                status=status,
                output=items.output(answer),
                usage=_usage(answer),
            )
        )
        headers = (
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", b"req_" + ids.hex(32).encode()),
            (b"openai-version", b"2020-10-01"),
        )
        return headers, body

    def stream(self, answer: Answer) -> Stream:
        ids = answer.ids
        items = _Items(answer)
        response_id = ids.keep("response", lambda: "resp_" + ids.hex(50))
        obfuscate = answer.facts.obfuscation
        paddings = _paddings(ids.alnum(16))
        events: list[Event] = []

        def emit(name: str, fields: dict[str, Any]) -> None:
            obj: dict[str, Any] = {"type": name}
            obj.update(sorted({**fields, "sequence_number": len(events)}.items()))
            events.append(Event(sse(name, compact(obj)), False))

        def deltas(name: str, pieces: tuple[str, ...], fields: dict[str, Any]) -> None:
            # One template per kind of delta: the text, the padding and the counter vary.
            sample: dict[str, Any] = {"delta": hole("t"), **fields, "sequence_number": hole("s")}
            holes: tuple[str, ...] = ("t", "s")
            if obfuscate:
                sample["obfuscation"] = hole("o")
                holes = ("t", "o", "s")
            obj: dict[str, Any] = {"type": name}
            obj.update(sorted(sample.items()))
            tpl = Template(sse(name, compact(obj)), holes)
            for piece in pieces:
                seq = str(len(events)).encode()
                if obfuscate:
                    data = tpl.fill(text_json(piece), paddings[len(piece) % 16], seq)
                else:
                    data = tpl.fill(text_json(piece), seq)
                events.append(Event(data, True))

        created = _response(answer, response_id, status="in_progress", output=[], usage=None)
        emit("response.created", {"response": created})
        emit("response.in_progress", {"response": created})
        index = 0
        if items.reasoning_id:
            rid = items.reasoning_id
            emit(
                "response.output_item.added",
                {"item": items.reasoning(answer, done=False), "output_index": index},
            )
            common = {"item_id": rid, "output_index": index, "summary_index": 0}
            emit(
                "response.reasoning_summary_part.added",
                {**common, "part": {"type": "summary_text", "text": ""}},
            )
            deltas("response.reasoning_summary_text.delta", answer.reasoning, common)
            emit("response.reasoning_summary_text.done", {**common, "text": answer.reasoning_text})
            emit(
                "response.reasoning_summary_part.done",
                {**common, "part": {"type": "summary_text", "text": answer.reasoning_text}},
            )
            emit(
                "response.output_item.done",
                {"item": items.reasoning(answer, done=True), "output_index": index},
            )
            index += 1
        if items.message_id:
            mid = items.message_id
            emit(
                "response.output_item.added",
                {"item": items.message(answer, done=False), "output_index": index},
            )
            common = {"content_index": 0, "item_id": mid, "output_index": index}
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            emit("response.content_part.added", {**common, "part": part})
            deltas("response.output_text.delta", answer.text, {**common, "logprobs": []})
            text = answer.full_text
            emit("response.output_text.done", {**common, "logprobs": [], "text": text})
            emit("response.content_part.done", {**common, "part": {**part, "text": text}})
            emit(
                "response.output_item.done",
                {"item": items.message(answer, done=True), "output_index": index},
            )
            index += 1
        for i, call in enumerate(answer.tools):
            item_id = items.calls[i][0]
            emit(
                "response.output_item.added",
                {"item": items.call(answer, i, done=False), "output_index": index},
            )
            common = {"item_id": item_id, "output_index": index}
            deltas("response.function_call_arguments.delta", call.pieces, common)
            emit("response.function_call_arguments.done", {**common, "arguments": call.arguments})
            emit(
                "response.output_item.done",
                {"item": items.call(answer, i, done=True), "output_index": index},
            )
            index += 1
        opening = next((i for i, e in enumerate(events) if e.content), len(events))
        status = "incomplete" if answer.finish is FinishKind.LENGTH else "completed"
        final = _response(
            answer, response_id, status=status, output=items.output(answer), usage=_usage(answer)
        )
        emit(f"response.{status}", {"response": final})
        headers = (
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", b"req_" + ids.hex(32).encode()),
            (b"openai-version", b"2020-10-01"),
        )
        return Stream(headers=headers, events=events, opening=opening)

    def stream_error(self, answer: Answer, reply: ErrorReply, *, position: int) -> bytes:
        source = reply.error
        kind = source.get("type") or "server_error"
        code = source.get("code") or kind
        message = str(source.get("message", ""))
        extra = {k: v for k, v in source.items() if k not in ("type", "code", "message", "param")}
        error = {"type": kind, "code": code, "message": message, "param": None, **extra}
        first = sse(
            "error",
            compact({"type": "error", "error": error, "sequence_number": position}),
        )
        failed = _response(
            answer,
            answer.ids.keep("response", lambda: "resp_" + answer.ids.hex(50)),
            status="failed",
            output=[],
            usage=None,
            error={"code": code, "message": message},
        )
        second = sse(
            "response.failed",
            compact(
                {"type": "response.failed", "response": failed, "sequence_number": position + 1}
            ),
        )
        return first + second

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
        return b'{"object":"response.input_tokens","input_tokens":%d}' % tokens
