"""First content: which stream events mean the upstream is really answering, and the opening hold.

Theory of operation
-------------------

A streamed answer opens with bookkeeping — Anthropic's ``message_start``, Responses'
``response.created``, a Chat chunk carrying only the role — before the model produces anything.
Until the first *content* the gateway can still move the request to another upstream without the
client noticing, so it holds the stream back (docs/streams.md).

`classify_event` (SSE) and `classify_payload` (a parsed object, e.g. a Gemini JSON-array element)
give each event an `EventRole`:

* ``CONTENT`` — text, reasoning (thinking, signature, reasoning summary/text), a tool-call delta
  (non-empty arguments, or in Chat and Gemini a tool call carrying its name), and anything not
  recognised: an event this module does not know is assumed to be the model answering, because
  holding a real answer back is worse than releasing early. Payload JSON that does not parse is
  likewise content. Empty deltas are not content.
* ``OPENING`` — the bookkeeping listed above, pings, block starts and stops without text, a Chat
  chunk with only the role or ``""`` content, a usage-only chunk without choices.
* ``ERROR`` — an error event: Anthropic ``error``, Responses ``response.failed`` and ``error``, a
  Chat chunk with a top-level ``error``, a Gemini object with ``error``.
* ``END`` — a proper terminal event: Anthropic ``message_stop`` or a ``message_delta`` with a stop
  reason, Responses ``response.completed`` / ``response.incomplete``, a Chat chunk with a finish
  reason or ``[DONE]``, a Gemini chunk with a ``finishReason`` (or a blocked prompt). An END
  before any content is a proper empty answer, not a failure.

SSE comments never reach the classifier: the decoder drops them.

`OpeningHold` decodes the upstream bytes itself and keeps every byte it was given. Each `feed`
returns `Holding` while only opening events have arrived; `Released` — every byte held plus the
chunk just fed, byte for byte — at the first content or end event, or once more than ``limit``
bytes were held without content; `FailedBeforeContent` for an error event before content
(classified as an HTTP error would be), and, from `end` or a framing error, for a stream that
ended or broke with only its opening (``stream_ended_early``). The first decisive event wins,
even inside one chunk. After `Released` or `FailedBeforeContent` the hold is finished; feeding it
again is a caller bug (`RuntimeError`).

At the end of input the SSE decoder dispatches a final event that lacked its blank line; the hold
counts such a last event as content only if its data parses, since a line cut off mid-JSON is far
more likely a broken connection than an answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from twproto import _json
from twproto.dialect import Dialect
from twproto.failures import Failure, classify_stream_error, stream_ended_early
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEError, SSEEvent, SSEEventTooLarge

__all__ = (
    "EventRole",
    "FailedBeforeContent",
    "HoldOutcome",
    "Holding",
    "OpeningHold",
    "Released",
    "classify_event",
    "classify_payload",
)


class EventRole(StrEnum):
    OPENING = "opening"
    CONTENT = "content"
    ERROR = "error"
    END = "end"


OPENING = EventRole.OPENING
CONTENT = EventRole.CONTENT
ERROR = EventRole.ERROR
END = EventRole.END


# Payloads are parsed JSON, so objects are plain dicts; ``isinstance(x, dict)`` is several times
# cheaper than an ABC check against ``Mapping``, and this runs for every event while holding.

# --- Anthropic ------------------------------------------------------------------------------

# The field of each delta type that carries its content; an unknown delta type is content.
_ANTHROPIC_DELTA_FIELDS: Mapping[str, str] = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
    "input_json_delta": "partial_json",
    "compaction_delta": "content",
}
_ANTHROPIC_OPENING = frozenset(
    {"message_start", "content_block_start", "content_block_stop", "ping"}
)
# content_block_start is opening unless it already carries text (docs/streams.md: "without text").
_ANTHROPIC_START_TEXT: Mapping[str, str] = {"text": "text", "thinking": "thinking"}


def _str(value: object) -> str:
    # Untrusted JSON: a "type" may be a list or an object, which cannot key a table lookup.
    return value if isinstance(value, str) else ""


def _anthropic(name: str, p: object) -> EventRole:
    if not isinstance(p, dict):
        return ERROR if name == "error" else CONTENT
    kind = p.get("type") or name
    if not isinstance(kind, str):
        return CONTENT
    if kind == "content_block_delta":
        delta = p.get("delta")
        if not isinstance(delta, dict):
            return CONTENT
        field = _ANTHROPIC_DELTA_FIELDS.get(_str(delta.get("type")))
        if field is None:
            return CONTENT  # citations_delta and anything newer
        return CONTENT if delta.get(field) else OPENING
    if kind in _ANTHROPIC_OPENING:
        if kind == "content_block_start":
            block = p.get("content_block")
            if isinstance(block, dict):
                field = _ANTHROPIC_START_TEXT.get(_str(block.get("type")))
                if field is not None and block.get(field):
                    return CONTENT
        return OPENING
    if kind == "message_delta":
        delta = p.get("delta")
        return END if isinstance(delta, dict) and delta.get("stop_reason") else OPENING
    if kind == "message_stop":
        return END
    if kind == "error" or name == "error":
        return ERROR
    return CONTENT


# --- OpenAI Responses -------------------------------------------------------------------------

_RESPONSES_OPENING = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
    }
)
_RESPONSES_END = frozenset({"response.completed", "response.incomplete"})
_RESPONSES_ERROR = frozenset({"response.failed", "error"})


def _text_in(value: object) -> bool:
    """Whether a Responses part/item (or list of them) carries any text, arguments or data."""
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, list):
        return any(_text_in(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "refusal", "arguments", "input", "encrypted_content"):
            if value.get(key):
                return True
        return _text_in(value.get("content")) or _text_in(value.get("summary"))
    return False


def _responses(name: str, p: object) -> EventRole:
    if not isinstance(p, dict):
        return ERROR if name in _RESPONSES_ERROR else CONTENT
    kind = p.get("type") or name
    if not isinstance(kind, str):
        return CONTENT
    if kind.endswith(".delta"):
        if "delta" not in p:
            return CONTENT
        return CONTENT if p.get("delta") else OPENING
    if kind in _RESPONSES_OPENING:
        return OPENING
    if kind in _RESPONSES_END:
        return END
    if kind in _RESPONSES_ERROR:
        return ERROR
    if kind.endswith(".done"):
        # Normally preceded by deltas; a done event is content only if it carries something
        # (a relay may send a finished item without deltas).
        for key in ("text", "arguments", "part", "item"):
            if key in p:
                return CONTENT if _text_in(p.get(key)) else OPENING
        return CONTENT
    return CONTENT


# --- OpenAI Chat Completions ----------------------------------------------------------------


def _chat_delta_has_content(delta: dict[str, object]) -> bool:
    for key, value in delta.items():
        if key == "role":
            continue
        if key == "tool_calls":
            if isinstance(value, list):
                for call in value:
                    if not isinstance(call, dict):
                        return True
                    fn = call.get("function")
                    if isinstance(fn, dict) and (fn.get("name") or fn.get("arguments")):
                        return True
            elif value:
                return True
            continue
        # content, reasoning_content, reasoning, reasoning_details, refusal, function_call, and
        # any field not known here: content when non-empty.
        if value:
            return True
    return False


def _chat(name: str, p: object) -> EventRole:
    if p == "[DONE]":
        return END
    if not isinstance(p, dict):
        return CONTENT
    if p.get("error"):
        return ERROR
    choices = p.get("choices")
    if not choices:
        return OPENING  # usage-only or empty chunk
    if not isinstance(choices, list):
        return CONTENT
    end = False
    for choice in choices:
        if not isinstance(choice, dict):
            return CONTENT
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if _chat_delta_has_content(delta):
                return CONTENT
        elif delta is not None:
            return CONTENT
        if choice.get("finish_reason"):
            end = True
    return END if end else OPENING


# --- Gemini -----------------------------------------------------------------------------------


def _gemini_part_has_content(part: object) -> bool:
    if not isinstance(part, dict):
        return True
    for key, value in part.items():
        if key == "thought":
            continue  # the flag marking a part as reasoning; its text decides
        if key == "functionCall":
            if isinstance(value, dict) and value.get("name"):
                return True
            continue
        if value:
            return True  # text, thoughtSignature, inlineData, executableCode, ...
    return False


def _gemini(name: str, p: object) -> EventRole:
    if isinstance(p, list):
        # An array-wrapped object (the error form of the streaming endpoint).
        roles = [_gemini(name, item) for item in p[:16]]
        for role in (ERROR, CONTENT, END):
            if role in roles:
                return role
        return OPENING
    if not isinstance(p, dict):
        return CONTENT
    if p.get("error"):
        return ERROR
    candidates = p.get("candidates")
    if not candidates:
        feedback = p.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            return END  # a blocked prompt is a complete (empty) answer
        return OPENING
    if not isinstance(candidates, list):
        return CONTENT
    end = False
    for cand in candidates:
        if not isinstance(cand, dict):
            return CONTENT
        content = cand.get("content")
        if isinstance(content, dict):
            parts = content.get("parts")
            if isinstance(parts, list):
                if any(_gemini_part_has_content(part) for part in parts):
                    return CONTENT
            elif parts:
                return CONTENT
        elif content:
            return CONTENT
        if cand.get("finishReason"):
            end = True
    return END if end else OPENING


# Dispatch by dict: comparing against enum members attribute by attribute costs more than the
# classification itself.
_ROLES = {
    Dialect.ANTHROPIC: _anthropic,
    Dialect.OPENAI_RESPONSES: _responses,
    Dialect.OPENAI_CHAT: _chat,
    Dialect.GEMINI: _gemini,
}
_CHAT = Dialect.OPENAI_CHAT
_RESPONSES = Dialect.OPENAI_RESPONSES


def _role(dialect: Dialect, name: str, payload: object) -> EventRole:
    return _ROLES[dialect](name, payload)


def classify_payload(dialect: Dialect, payload: object, *, event: str = "") -> EventRole:
    """The role of one parsed stream payload (a Gemini JSON-array element, an event's data).

    `event` is the SSE event name, used when the payload has no ``type`` of its own.
    """
    return _role(dialect, event, payload)


def classify_event(dialect: Dialect, event: SSEEvent) -> EventRole:
    """The role of one decoded SSE event in `dialect`'s stream. Never raises."""
    return _classify_data(dialect, event)[0]


def _classify_data(dialect: Dialect, event: SSEEvent) -> tuple[EventRole, object]:
    data = event.data
    if dialect is _CHAT and data[:1] != "{" and data.strip() == "[DONE]":
        return END, "[DONE]"
    try:
        payload = _json.loads(data)
    except ValueError:
        if event.event == "error" or (dialect is _RESPONSES and event.event == "response.failed"):
            return ERROR, data
        return CONTENT, data
    return _ROLES[dialect](event.event, payload), payload


# --- the opening hold ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """Nothing decisive yet: keep feeding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Released:
    """Send `data` (every byte held, unchanged) onward; stop feeding the hold.

    `reason` is ``"content"``, ``"end"`` (a proper empty answer) or ``"limit"``. `events` are
    the events (or JSON-array elements) decoded from `data` so far and `framing` the decoder
    that read them, positioned after them: whoever reads the stream on takes both over instead
    of decoding the held bytes again (`twproto.stream.upstream`). `framing` is None when the
    decoder gave up (an event past the limit): the bytes must then be read afresh.
    """

    __match_args__ = ("data", "reason")

    data: bytes
    reason: str
    # SSE events or parsed JSON-array elements, as the decoder gave them.
    events: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)
    framing: SSEDecoder | JSONArrayDecoder | None = dataclasses.field(
        default=None, compare=False, repr=False
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedBeforeContent:
    """The upstream failed before any content; the client has seen nothing.

    `payload` is the error event's parsed data (its text if it did not parse), or ``None`` when
    the stream ended or broke.
    """

    __match_args__ = ("failure", "payload")

    failure: Failure
    payload: object


HoldOutcome = Holding | Released | FailedBeforeContent

_HOLDING = Holding()


class OpeningHold:
    """Hold an upstream stream until its first content (docs/streams.md).

    `sse=False` reads Gemini's JSON-array stream instead of SSE. `limit` bounds the bytes held
    without content; past it the stream is released as it is. `max_event_size` bounds one event
    (default `limit`): the translator the hold hands its decoder to reads on under that bound.
    """

    __slots__ = ("_chunks", "_decoder", "_dialect", "_done", "_events", "_held", "_limit")

    def __init__(
        self,
        dialect: Dialect,
        *,
        sse: bool = True,
        limit: int = 1 << 20,
        max_event_size: int | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be positive")
        self._dialect = dialect
        self._limit = limit
        # The decoder goes on to the translator, so it is bounded as the stream's events are
        # (`max_event_size`, default `limit`); holding more than `limit` releases all the same.
        # An event larger than that bound is released undecoded, for the translator to refuse.
        bound = limit if max_event_size is None else max_event_size
        self._decoder: SSEDecoder | JSONArrayDecoder = (
            SSEDecoder(max_event_size=bound) if sse else JSONArrayDecoder(max_element_size=bound)
        )
        self._chunks: list[bytes] = []
        self._events: list[Any] = []
        self._held = 0
        self._done = False

    @property
    def held_bytes(self) -> int:
        """Bytes received and held so far."""
        return self._held

    @property
    def finished(self) -> bool:
        """Whether `Released` or `FailedBeforeContent` has been returned."""
        return self._done

    def feed(self, chunk: bytes, *, now: float) -> HoldOutcome:
        """Take the next upstream bytes; see the module docstring for the outcomes."""
        if self._done:
            raise RuntimeError("the opening hold has already released or failed")
        chunk = bytes(chunk)
        self._chunks.append(chunk)
        self._held += len(chunk)
        try:
            items = self._decoder.feed(chunk)
        except SSEEventTooLarge:
            return self._release("limit", decoded=False)
        except SSEError as exc:
            return self._broken(str(exc))
        self._events += items
        outcome = self._decide(items, now=now, final=False)
        if outcome is not None:
            return outcome
        if self._held > self._limit:
            return self._release("limit")
        return _HOLDING

    def end(self, *, now: float) -> HoldOutcome:
        """The upstream stream ended: release a last decisive event, else `stream_ended_early`."""
        if self._done:
            raise RuntimeError("the opening hold has already released or failed")
        try:
            items = self._decoder.end()
        except SSEError as exc:
            return self._broken(str(exc))
        self._events += items
        outcome = self._decide(items, now=now, final=True)
        if outcome is not None:
            return outcome
        return self._broken("the upstream stream ended before any content")

    def _decide(self, items: Sequence[object], *, now: float, final: bool) -> HoldOutcome | None:
        dialect = self._dialect
        for item in items:
            if isinstance(item, SSEEvent):
                role, payload = _classify_data(dialect, item)
                if final and role is CONTENT and payload is item.data:
                    continue  # an unterminated last line that does not parse: a cut, not content
            else:
                role, payload = _role(dialect, "", item), item
            if role is OPENING:
                continue
            if role is ERROR:
                self._done = True
                self._chunks = []
                self._events = []
                failure = classify_stream_error(dialect, payload, now=now)
                return FailedBeforeContent(failure=failure, payload=payload)
            return self._release("content" if role is CONTENT else "end")
        return None

    def _release(self, reason: str, *, decoded: bool = True) -> Released:
        self._done = True
        data = b"".join(self._chunks)
        events = tuple(self._events) if decoded else ()
        self._chunks = []
        self._events = []
        return Released(
            data=data, reason=reason, events=events, framing=self._decoder if decoded else None
        )

    def _broken(self, message: str) -> FailedBeforeContent:
        self._done = True
        self._chunks = []
        self._events = []
        failure = dataclasses.replace(stream_ended_early(), message=message)
        return FailedBeforeContent(failure=failure, payload=None)
