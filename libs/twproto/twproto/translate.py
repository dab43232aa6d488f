"""Conversion between API formats, bytes in and bytes out: requests, whole answers, streams.

Theory of operation
-------------------

This module composes the per-format converters of `twproto.formats` through the IR; it is
usable on its own as a library (no IO, no clock, no randomness).

Requests (`translate_request`): between different formats the body is decoded to an
`ir.Request` and encoded again; between the same format it passes through **byte for byte**,
except that a different ``model`` (or ``stream``) is written into the top-level field in place,
leaving every other byte alone. Gemini bodies carry neither (they are in the URL): the caller
passes them. A request converted to Anthropic without an output limit gets
``default_max_tokens`` (the caller passes the model's output limit; `DEFAULT_MAX_TOKENS`
otherwise). The result names what the conversion dropped and, in `TranslatedRequest.tool_names`,
how tool names were flattened, which the answer's conversion needs to map calls back.

Whole answers (`translate_response`): decoded and re-encoded naming the model the client asked
for; same format: only the model field changes.

Streams are `twproto.stream.translators`'s (the three translators) and
`twproto.stream.upstream`'s (the opening hold handing over to a translator).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from twproto import _json, ir
from twproto._exceptions import (
    ClientTranslationError,
    TranslationError,
    UpstreamTranslationError,
)
from twproto.dialect import Dialect
from twproto.effort import budget_for_effort, parse_effort, without_reasoning_switches
from twproto.formats import (
    get,
    new_stream_encoder,
)
from twproto.formats._common import (
    MALFORMED,
    merge_dropped,
    tool_names_for,
)
from twproto.formats.anthropic import DEFAULT_MAX_TOKENS
from twproto.stream.resume import continued_request

__all__ = (
    "DEFAULT_MAX_TOKENS",
    "ClientTranslationError",
    "TranslatedAnswer",
    "TranslatedRequest",
    "TranslationError",
    "UpstreamTranslationError",
    "answer_to_stream",
    "translate_request",
    "translate_response",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TranslatedRequest:
    """A request body ready for the upstream.

    `tool_names` maps tool names the conversion flattened back to the client's tools; pass it
    to `translate_response` / a stream translator for the answer. `hide_usage_chunk`: a Chat
    client's stream whose upstream was asked for usage the client did not ask for (see
    `_chat_stream_usage`); the stream's usage-only chunk is the gateway's, not relayed.
    `fields`: for a Responses target, the top-level object `body` holds (read it, never change
    it), so that a leg over the upstream's socket builds its ``response.create`` event without
    parsing `body` again (`twproto.sockets.ws_upstream_create`); None for other targets.
    """

    body: bytes
    stream: bool
    model: str
    dropped: tuple[str, ...] = ()
    tool_names: ir.ToolNames = field(default_factory=ir.ToolNames)
    hide_usage_chunk: bool = False
    fields: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TranslatedAnswer:
    """A whole answer in the client's format, with what the gateway records about it."""

    body: bytes
    usage: ir.Usage | None
    stop_reason: ir.StopReason
    dropped: tuple[str, ...] = ()


# The top-level field that names the model in each format's bodies.
_MODEL_FIELD = {
    Dialect.ANTHROPIC: "model",
    Dialect.OPENAI_CHAT: "model",
    Dialect.OPENAI_RESPONSES: "model",
    Dialect.GEMINI: "modelVersion",
}


def _parse_object(body: bytes, error: type[TranslationError]) -> dict[str, Any]:
    try:
        obj = _json.loads(body)
    except _json.JSONDecodeError as exc:
        raise error(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise error("body is not a JSON object")
    return obj


# ----------------------------------------------------------------------------------------------
# In-place edits of top-level fields

_STRUCTURAL = re.compile(rb'["{}\[\],]')
_STRING_END = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)
_WS = re.compile(rb"[ \t\r\n]*")


def _top_level_spans(body: bytes, keys: set[str]) -> dict[str, tuple[int, int]]:
    """Byte spans of the values of top-level `keys` in the JSON object `body` (already known to
    parse). Stops as soon as every key was found."""
    spans: dict[str, tuple[int, int]] = {}
    pos = body.index(b"{") + 1
    depth = 1
    n = len(body)
    expect_key = True
    current: str | None = None
    value_start = -1
    while pos < n and depth > 0:
        m = _STRUCTURAL.search(body, pos)
        if m is None:
            break
        p = m.start()
        c = body[p]
        if c == 0x22:  # a string
            end_match = _STRING_END.match(body, p + 1)
            end = end_match.end() if end_match else n
            if depth == 1 and expect_key:
                current = _json.loads(body[p:end])
                colon = body.index(b":", end)
                value_start = _WS.match(body, colon + 1).end()  # type: ignore[union-attr]
                expect_key = False
                pos = value_start
                continue
            pos = end
            continue
        if c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
            if depth == 0 and current is not None and not expect_key:
                if current in keys:
                    spans[current] = (value_start, len(body[:p].rstrip()))
                break
        elif c == 0x2C and depth == 1:
            if current is not None and not expect_key and current in keys:
                spans[current] = (value_start, len(body[:p].rstrip()))
                if len(spans) == len(keys):
                    break
            expect_key = True
            current = None
        pos = p + 1
    return spans


def _set_top_level(body: bytes, changes: dict[str, Any]) -> bytes:
    """`body` with the top-level `changes` written in, every other byte kept."""
    spans = _top_level_spans(body, set(changes))
    edits = sorted(
        ((spans[key], _json.dumps(value)) for key, value in changes.items() if key in spans),
        reverse=True,
    )
    out = body
    for (start, stop), value in edits:
        out = out[:start] + value + out[stop:]
    missing = [key for key in changes if key not in spans]
    if missing:
        brace = out.index(b"{") + 1
        empty = out[brace:].lstrip().startswith(b"}")
        inserted = b",".join(_json.dumps(key) + b":" + _json.dumps(changes[key]) for key in missing)
        out = out[:brace] + inserted + (b"" if empty else b",") + out[brace:]
    return out


# ----------------------------------------------------------------------------------------------
# Requests and whole answers


def translate_request(
    body: bytes,
    source: Dialect,
    target: Dialect,
    *,
    model: str | None = None,
    stream: bool | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_tokens: int | None = None,
    reasoning: ir.ReasoningLevel | None = None,
    drop_sealed_reasoning: bool = False,
    continuation: str | None = None,
    prefill: bool = True,
    parsed: dict[str, Any] | None = None,
) -> TranslatedRequest:
    """Convert a client's request body in `source` format to `target` format.

    `model` / `stream` override the body's (and are required for Gemini sources, whose body has
    neither). `default_max_tokens` fills a missing output limit for an Anthropic target.
    `max_tokens` and `reasoning` are a routing rule's ``set`` (docs/configuration.md, "`routes`"):
    the output limit to use, and a reasoning level (``off``, ``low`` … ``max``) that changes the
    effort of a request that already reasons, or with ``off`` removes reasoning; it never turns it
    on. With either set, a same-format body is rewritten through the IR instead of passed through.
    `drop_sealed_reasoning` leaves out reasoning parts that carry a seal (signature, encrypted
    content, redacted data): an upstream on another account refuses them (docs/operations.md,
    "What goes upstream"); their removal is recorded in `dropped`. `continuation` is the text of
    an answer that broke off, for the upstream to continue
    (`twproto.stream.resume.continued_request`; `prefill` False: with an instruction instead of a
    trailing assistant message).
    `parsed` is `body` already parsed (the gateway parses a request once, to admit it): it is
    read, never changed, so one parse serves every upstream; a same-format body still goes out
    as `body`'s own bytes.
    Raises `ClientTranslationError` (400) for a body that is not a JSON object.
    """
    obj = _parse_object(body, ClientTranslationError) if parsed is None else parsed
    rewrite = (
        max_tokens is not None
        or reasoning is not None
        or drop_sealed_reasoning
        or bool(continuation)
    )
    # A Chat client that streams without asking for usage: the upstream is asked anyway.
    hide_usage = (
        source is Dialect.OPENAI_CHAT
        and target is Dialect.OPENAI_CHAT
        and (obj.get("stream") is True if stream is None else stream)
        and not _asks_usage(obj.get("stream_options"))
    )
    if source is target and not rewrite:
        if target is Dialect.GEMINI:
            return TranslatedRequest(body=body, stream=bool(stream), model=model or "")
        body_model = obj.get("model")
        body_stream = obj.get("stream") is True
        changes: dict[str, Any] = {}
        if model is not None and model != body_model:
            changes["model"] = model
        if stream is not None and stream != body_stream:
            changes["stream"] = stream
        if hide_usage:
            changes["stream_options"] = _chat_stream_usage(obj.get("stream_options"))
        fields: Mapping[str, Any] | None = None
        if target is Dialect.OPENAI_RESPONSES:
            fields = {**obj, **changes} if changes else obj
        return TranslatedRequest(
            body=_set_top_level(body, changes) if changes else body,
            stream=body_stream if stream is None else stream,
            model=model if model is not None else str(body_model or ""),
            hide_usage_chunk=hide_usage,
            fields=fields,
        )
    try:
        req = get(source).decode_request(obj)
        req = replace(
            req,
            model=model if model is not None else req.model,
            stream=req.stream if stream is None else stream,
        )
        if max_tokens is not None:
            req = replace(req, max_output_tokens=max_tokens)
        if reasoning is not None:
            req = replace(req, reasoning=_set_reasoning(req.reasoning, reasoning))
            if reasoning is ir.ReasoningLevel.OFF:
                req = replace(req, extras=without_reasoning_switches(req.extras))
                if target is Dialect.ANTHROPIC:
                    req = replace(req, reasoning=None)  # no thinking field (docs/operations.md)
        if drop_sealed_reasoning:
            req = _without_sealed_reasoning(req)
        if continuation:
            req = continued_request(req, continuation, target, prefill=prefill)
        if target is Dialect.ANTHROPIC and req.max_output_tokens is None:
            req = replace(req, max_output_tokens=default_max_tokens)
        encoded, dropped = get(target).encode_request(req, model=req.model)
        if target is Dialect.OPENAI_CHAT and req.stream:
            # A same-format body carried the client's own stream_options: usage is asked for
            # on every Chat stream.
            encoded["stream_options"] = _chat_stream_usage(encoded.get("stream_options"))
    except MALFORMED as exc:
        raise ClientTranslationError(f"request body has an unexpected shape: {exc!r}") from None
    return TranslatedRequest(
        body=_json.dumps(encoded),
        stream=req.stream,
        model=req.model,
        dropped=merge_dropped(req.dropped, dropped),
        tool_names=tool_names_for(req.tools, target),
        hide_usage_chunk=hide_usage and req.stream,
        fields=encoded if target is Dialect.OPENAI_RESPONSES else None,
    )


def _asks_usage(options: Any) -> bool:
    return isinstance(options, dict) and options.get("include_usage") is True


def _chat_stream_usage(options: Any) -> dict[str, Any]:
    """A Chat stream's ``stream_options`` with ``include_usage`` on, the client's other options
    kept. Without it a Chat stream reports no usage at all, so the gateway asks on every Chat
    stream; for a client that did not ask, the answer's usage-only chunk is left out
    (`TranslatedRequest.hide_usage_chunk`, docs/conversion.md)."""
    kept = dict(options) if isinstance(options, dict) else {}
    kept["include_usage"] = True
    return kept


def _without_sealed_reasoning(req: ir.Request) -> ir.Request:
    messages = []
    removed = 0
    for message in req.messages:
        parts = tuple(
            p
            for p in message.parts
            if not (isinstance(p, ir.Reasoning) and (p.seal is not None or p.redacted_data))
        )
        removed += len(message.parts) - len(parts)
        if parts:
            messages.append(replace(message, parts=parts))
    if not removed:
        return req
    return replace(
        req, messages=tuple(messages), dropped=(*req.dropped, "reasoning:sealed_for_account")
    )


def _set_reasoning(
    current: ir.ReasoningConfig | None, level: ir.ReasoningLevel
) -> ir.ReasoningConfig | None:
    """A rule's reasoning level applied to what the client asked (docs/operations.md, "What
    goes upstream")."""
    if level is ir.ReasoningLevel.OFF:
        return None if current is None else ir.ReasoningConfig(enabled=False)
    if current is None or not current.enabled:
        return current  # a level never turns reasoning on
    effort = parse_effort(level)
    if effort is None:
        raise ValueError(f"unknown reasoning level {level!r}")
    budget = budget_for_effort(effort) if current.budget_tokens is not None else None
    return replace(current, effort=effort, budget_tokens=budget)


def _decode_answer(obj: dict[str, Any], upstream: Dialect) -> ir.Answer:
    try:
        return get(upstream).decode_response(obj)
    except MALFORMED as exc:
        raise UpstreamTranslationError(f"answer has an unexpected shape: {exc!r}") from None


def _restore_call(call: ir.ToolCall, names: ir.ToolNames) -> ir.ToolCall:
    target = names.lookup(call.name)
    if target is None:
        return call
    return replace(call, name=target.name, namespace=target.namespace, tool_kind=target.tool_kind)


def _restore_answer(answer: ir.Answer, names: ir.ToolNames | None) -> ir.Answer:
    if not names:
        return answer
    parts = tuple(
        _restore_call(p, names) if isinstance(p, ir.ToolCall) else p for p in answer.parts
    )
    return replace(answer, parts=parts)


def translate_response(
    body: bytes,
    upstream: Dialect,
    client: Dialect,
    *,
    client_model: str,
    tool_names: ir.ToolNames | None = None,
    created: int | None = None,
) -> TranslatedAnswer:
    """Convert an upstream's whole answer to the client's format, naming `client_model`.

    `created` (unix seconds) is used where the client format needs a timestamp the upstream
    did not give. Raises `UpstreamTranslationError` (502) for a body that is not a JSON object.
    """
    obj = _parse_object(body, UpstreamTranslationError)
    answer = _decode_answer(obj, upstream)
    if upstream is client:
        field = _MODEL_FIELD[client]
        out = body
        if obj.get(field) != client_model:
            out = _set_top_level(body, {field: client_model})
        return TranslatedAnswer(body=out, usage=answer.usage, stop_reason=answer.stop_reason)
    answer = _restore_answer(answer, tool_names)
    dropped: list[str] = list(answer.dropped)
    try:
        encoded = get(client).encode_response(
            answer, model=client_model, dropped=dropped, created=created
        )
    except MALFORMED as exc:
        raise UpstreamTranslationError(f"answer could not be converted: {exc!r}") from None
    return TranslatedAnswer(
        body=_json.dumps(encoded),
        usage=answer.usage,
        stop_reason=answer.stop_reason,
        dropped=merge_dropped(dropped),
    )


def answer_to_stream(
    body: bytes,
    upstream: Dialect,
    client: Dialect,
    *,
    client_model: str,
    client_sse: bool = True,
    tool_names: ir.ToolNames | None = None,
    created: int | None = None,
) -> bytes:
    """A whole upstream answer as a complete stream in the client's format (whole→stream)."""
    answer = _restore_answer(
        _decode_answer(_parse_object(body, UpstreamTranslationError), upstream), tool_names
    )
    encoder = new_stream_encoder(client, model=client_model, created=created, sse=client_sse)
    ir.answer_events(answer, encoder)
    return encoder.take()
