"""What the mock answers, before any format: the `Answer`, the request facts it depends on, ids.

The four format writers (`anthropic`, `openai_chat`, `openai_responses`, `gemini`) all render
the same `Answer`: reasoning pieces, text pieces, tool calls with their arguments cut into
pieces, a finish kind and resolved token counts. Building it is pure: the request's facts, the
script, the time and an id seed go in, so a plan is reproducible from its inputs.

Each writer implements `Writer`: it reads its own request body into `MockRequest` (raising
`BadRequest` where the real API would answer 400), and turns an `Answer` into a whole body or a
list of stream `Event`s, an error into its own error body, and so on.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from twmock.script import ErrorSpec, Script
from twproto import json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.paths import PathRoute

__all__ = [
    "FERNET_STAMP",
    "Answer",
    "BadRequest",
    "ErrorReply",
    "Event",
    "FinishKind",
    "Ids",
    "MockRequest",
    "Stream",
    "TokenCounts",
    "ToolCall",
    "Writer",
    "build_answer",
    "echo_line",
    "error_headers",
    "sealed_by_openai",
    "split_text",
    "standard_base64",
]

Headers = tuple[tuple[bytes, bytes], ...]

# Text the generated answers are cut from: plain ASCII words so any chunk size cuts cleanly.
_FILLER = (
    "The quick brown fox jumps over the lazy dog while the mock upstream streams its answer "
    "one small piece at a time, exactly as a real model would. "
)


class BadRequest(Exception):
    """The request is one the real API refuses with 400; `message` is the API's wording."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FinishKind(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOLS = "tools"
    # The prompt itself was blocked (Gemini's promptFeedback.blockReason, no candidates).
    BLOCKED = "blocked"


@dataclass(frozen=True, slots=True, kw_only=True)
class MockRequest:
    """What the writers and ``echo`` need to know about a request, whatever its format."""

    model: str
    stream: bool = False
    sse: bool = True  # Gemini: SSE (alt=sse) or a JSON array
    messages: int = 0
    tools: tuple[str, ...] = ()
    system: bool = False
    last_user_text: str = ""
    max_tokens: int | None = None
    include_usage: bool = False  # Chat: stream_options.include_usage
    include_encrypted: bool = False  # Responses: include has reasoning.encrypted_content
    obfuscation: bool = True  # Responses: stream_options.include_obfuscation
    body: dict[str, Any] = field(default_factory=dict)


# The timestamp in the mock's Fernet tokens (fixed, so answers depend on the seed alone).
FERNET_STAMP = 1_760_000_000


def sealed_by_openai(seal: str) -> bool:
    """Whether `seal` decodes (either base64 alphabet) to a Fernet token: OpenAI's
    ``encrypted_content``, which neither Anthropic nor Gemini accepts as a signature."""
    try:
        raw = base64.urlsafe_b64decode(seal.replace("+", "-").replace("/", "_") + "==")
    except ValueError:
        return False
    return raw[:1] == b"\x80"


def standard_base64(seal: str) -> bool:
    """Whether `seal` is standard base64 (what Anthropic's signatures are)."""
    try:
        base64.b64decode(seal, validate=True)
    except ValueError:
        return False
    return True


class Ids:
    """Ids and opaque blobs for one answer, drawn from a seeded generator.

    Shapes follow the real ones: Anthropic ``msg_01…``/``toolu_01…``, Chat ``chatcmpl-…`` and
    ``call_…``, Responses ``resp_``/``msg_``/``rs_``/``fc_`` + 50 hex sharing a prefix, Gemini
    responseId, signatures and encrypted content as base64.
    """

    __slots__ = ("_counter", "_hex_prefix", "_kept", "_seed")

    def __init__(self, seed: int) -> None:
        # BLAKE2b in counter mode over the seed: reproducible from the seed alone, and no
        # `random` import, so this module stays as pure as the planner that calls it.
        self._seed = (seed & (2**64 - 1)).to_bytes(8, "little")
        self._counter = 0
        self._hex_prefix = self.hex(16)
        self._kept: dict[str, str] = {}

    def _bytes(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            block = hashlib.blake2b(
                self._counter.to_bytes(8, "little"), digest_size=64, key=self._seed
            ).digest()
            self._counter += 1
            out += block
        return bytes(out[:n])

    def keep(self, key: str, make: Callable[[], str]) -> str:
        """The id named `key`, made once: an error event must repeat the stream's response id."""
        value = self._kept.get(key)
        if value is None:
            value = self._kept[key] = make()
        return value

    def hex(self, n: int) -> str:
        return self._bytes((n + 1) // 2).hex()[:n]

    def alnum(self, n: int) -> str:
        raw = base64.b64encode(self._bytes(n)).decode()
        # base64 has 2 non-alphanumeric symbols; map them onto letters rather than retry.
        return raw.replace("+", "x").replace("/", "Q")[:n]

    def b64(self, n_bytes: int) -> str:
        return base64.b64encode(self._bytes(n_bytes)).decode()

    def b64url(self, n_bytes: int) -> str:
        return base64.urlsafe_b64encode(self._bytes(n_bytes)).decode()

    def signature(self, first: int, n_bytes: int) -> str:
        """A thinking signature: base64 of protobuf-framed bytes, as Anthropic's (first byte
        0x12) and Gemini's (0x0a or 0x12) are."""
        return base64.b64encode(bytes((first,)) + self._bytes(n_bytes - 1)).decode()

    def fernet(self, n_bytes: int) -> str:
        """A Responses ``encrypted_content``: a Fernet token (version byte 0x80, a 64-bit
        timestamp, then the sealed bytes), URL-safe base64, so it opens with ``gAAAAA``."""
        stamp = FERNET_STAMP.to_bytes(8, "big")
        return base64.urlsafe_b64encode(b"\x80" + stamp + self._bytes(n_bytes - 9)).decode()

    def openai_item(self, prefix: str) -> str:
        """A Responses id: items of one response share their first 16 hex digits."""
        return f"{prefix}_{self._hex_prefix}{self.hex(34)}"

    def request_id(self) -> str:
        return "req_011C" + self.alnum(20)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    name: str
    arguments: str  # the whole JSON object text
    pieces: tuple[str, ...]  # `arguments` cut for streaming


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCounts:
    """Resolved usage; `input` excludes the cache, `output` includes `reasoning`."""

    input: int
    output: int
    cache_read: int
    cache_write: int
    reasoning: int

    @property
    def prompt_total(self) -> int:
        return self.input + self.cache_read + self.cache_write


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    model: str
    facts: MockRequest
    reasoning: tuple[str, ...]
    text: tuple[str, ...]
    tools: tuple[ToolCall, ...]
    finish: FinishKind
    usage: TokenCounts
    now: int
    ids: Ids

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    @property
    def content_count(self) -> int:
        """How many content events a stream of this answer has (the unit of break_after…)."""
        return len(self.reasoning) + len(self.text) + sum(len(t.pieces) for t in self.tools)


class Event(NamedTuple):
    """One stream event, already framed; `content` marks text, reasoning and argument deltas."""

    data: bytes
    content: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Stream:
    """A stream's head and events. `opening` counts the events sent before any content."""

    headers: Headers
    events: list[Event]
    opening: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """An error answer in one format: the HTTP response, and what an in-stream event carries.

    `error` is the error object of the body (``{"type", "message"}``, ``{"code", "message",
    "status"}``…), which the writer's in-stream error event is made from.
    """

    status: int
    headers: Headers
    body: bytes
    error: dict[str, Any]


class Writer(Protocol):
    dialect: Dialect
    not_json_message: str  # the API's 400 message for a body that is not JSON

    def facts(self, route: PathRoute, body: Any, *, validate: bool) -> MockRequest: ...

    def whole(self, answer: Answer) -> tuple[Headers, bytes]: ...

    def stream(self, answer: Answer) -> Stream: ...

    def stream_error(self, answer: Answer, reply: ErrorReply, *, position: int) -> bytes:
        """The in-stream error event(s); `position` is how many events were sent before."""
        ...

    def error(
        self, spec: ErrorSpec, *, model: str, facts: MockRequest | None, ids: Ids, now: int
    ) -> ErrorReply:
        """An error in this format's own shape (no named shape)."""
        ...

    def bad_request(self, message: str, *, route: PathRoute, ids: Ids) -> ErrorReply: ...

    def count_tokens(self, tokens: int) -> bytes: ...


def split_text(text: str, size: int) -> tuple[str, ...]:
    """`text` in pieces of `size` characters (the last may be shorter)."""
    return tuple(text[i : i + size] for i in range(0, len(text), size))


def _filler(chunks: int, size: int) -> tuple[str, ...]:
    total = chunks * size
    repeat = _FILLER * (total // len(_FILLER) + 1)
    return split_text(repeat[:total], size)


def _cut(text: str, pieces: int) -> tuple[str, ...]:
    """`text` in `pieces` nearly equal, non-empty parts (fewer if the text is shorter)."""
    pieces = max(1, min(pieces, len(text)))
    step, extra = divmod(len(text), pieces)
    out = []
    start = 0
    for i in range(pieces):
        end = start + step + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return tuple(out)


def echo_line(facts: MockRequest) -> str:
    """The ``echo`` answer: facts of the request as ``key=value`` pairs, the user text last."""
    names = ",".join(facts.tools) if facts.tools else "-"
    max_tokens = "-" if facts.max_tokens is None else str(facts.max_tokens)
    return (
        f"[echo] model={facts.model} stream={'true' if facts.stream else 'false'} "
        f"messages={facts.messages} tools={len(facts.tools)} names={names} "
        f"system={'true' if facts.system else 'false'} max_tokens={max_tokens} "
        f"last={facts.last_user_text[:200]}"
    )


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def build_answer(
    script: Script, facts: MockRequest, *, body_size: int, now: int, ids: Ids
) -> Answer:
    """The answer `script` gives to a request with `facts`."""
    size = script.chunk_size
    if script.echo:
        text = split_text(echo_line(facts), size)
    elif script.text is not None:
        text = split_text(script.text, size)
    else:
        chunks = script.chunks if script.chunks is not None else (0 if script.tool_calls else 10)
        text = _filler(chunks, size)
    reasoning = split_text(script.reasoning, size) if script.reasoning else ()

    tools: list[ToolCall] = []
    for i in range(script.tool_calls):
        if script.tool_name is not None:
            name = script.tool_name
        elif facts.tools:
            name = facts.tools[i % len(facts.tools)]
        else:
            name = "get_weather"
        if script.tool_arguments is not None:
            arguments = script.tool_arguments
        else:
            arguments = json_dumps(
                {"location": "Paris, France", "unit": "celsius", "call": i}
            ).decode()
        tools.append(
            ToolCall(name=name, arguments=arguments, pieces=_cut(arguments, script.tool_pieces))
        )

    if script.finish == "length":
        finish = FinishKind.LENGTH
    elif script.finish == "blocked":
        finish = FinishKind.BLOCKED
    elif tools:
        finish = FinishKind.TOOLS
    else:
        finish = FinishKind.STOP

    u = script.usage
    reasoning_chars = sum(len(p) for p in reasoning)
    out_chars = reasoning_chars + sum(len(p) for p in text) + sum(len(t.arguments) for t in tools)
    reasoning_tokens = u.reasoning if u.reasoning is not None else _tokens(reasoning_chars)
    output = u.output if u.output is not None else max(1, _tokens(out_chars))
    usage = TokenCounts(
        input=u.input if u.input is not None else max(1, _tokens(body_size)),
        output=max(output, reasoning_tokens) if u.output is None else output,
        cache_read=u.cache_read,
        cache_write=u.cache_write,
        reasoning=reasoning_tokens,
    )
    return Answer(
        model=facts.model,
        facts=facts,
        reasoning=reasoning,
        text=text,
        tools=tuple(tools),
        finish=finish,
        usage=usage,
        now=now,
        ids=ids,
    )


def error_headers(spec: ErrorSpec, *, retry_header: bool = True) -> Headers:
    """Headers every error carries from its spec: retry hints and the spec's own headers."""
    out: list[tuple[bytes, bytes]] = []
    if retry_header and spec.retry_after is not None:
        # Retry-After takes whole seconds; round up so a client never retries too early.
        out.append((b"retry-after", str(-int(-spec.retry_after // 1)).encode()))
    if spec.retry_after_ms is not None:
        out.append((b"retry-after-ms", str(spec.retry_after_ms).encode()))
    out.extend((k.encode(), v.encode()) for k, v in spec.headers)
    return tuple(out)


def json_object(body: bytes) -> Any:
    """Parse a request body; raises ValueError when it is not JSON."""
    return json_loads(body)


def earlier_answer(body: Any) -> tuple[str, bool]:
    """The text of the last assistant (Gemini: model) message in a request body of any format,
    and whether that message ends the conversation (a prefill)."""
    if not isinstance(body, dict):
        return "", False
    for key in ("messages", "input", "contents"):
        items = body.get(key)
        if isinstance(items, list):
            break
    else:
        return "", False
    for position in range(len(items) - 1, -1, -1):
        item = items[position]
        if isinstance(item, dict) and item.get("role") in ("assistant", "model"):
            content = item.get("content", item.get("parts"))
            if isinstance(content, str):
                text = content
            elif isinstance(content, list):
                texts = [b for b in content if isinstance(b, dict) and not b.get("thought")]
                text = "".join(b["text"] for b in texts if isinstance(b.get("text"), str))
            else:
                text = ""
            return text, position == len(items) - 1
    return "", False


PREFILL_REFUSAL = (
    "This model does not support assistant message prefill. "
    "The conversation must end with a user message."
)


def last_text(value: Any) -> str:
    """Text of a content value that is a string or a list of text-bearing blocks/parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [
            b["text"]
            for b in value
            if isinstance(b, dict) and isinstance(b.get("text"), str) and not b.get("thought")
        ]
        return texts[-1] if texts else ""
    return ""
