"""Planning: from a request and a script to the exact steps the mock will play. Pure.

`plan(request_info, script)` decides everything — which API the path belongs to, whether the
body is acceptable, whether this request is one of the failing ones, and every byte to write
with the pause before it — and returns it as a `Plan`: a tuple of steps that
`twmock.serve.server` carries out over a `Responder`:

* `Head` — start the response (status, headers), after `delay` seconds;
* `Chunk` — write `data`, after `delay` seconds;
* `End` — finish the response cleanly;
* `Break` — drop the connection in the middle of the answer;
* `Silence` — write nothing more, keep the connection open until the client leaves;
* `ResetBeforeHead` — close the connection without any response.

Everything that would make a plan depend on the world is an input: the request counter
(`RequestInfo.number`, for ``fail_first``/``fail_every``), the random draw (`draw`, for
``fail_rate``), the seed ids are drawn from (`seed`) and the clock (`now`). So a plan can be
tested — and reproduced from a log line — without an event loop.

Streams are cut in units of **content events** (text, reasoning and tool-argument deltas; see
docs/streams.md, "First content"): ``break_after: N`` drops the connection after the N-th, ``N = 0``
right after the opening events (Anthropic ``message_start``/``content_block_start``/``ping``,
Chat's role chunk, Responses' ``created``/``in_progress``/``output_item.added``…; Gemini has
none). The first content event waits ``first_delay``, each later one ``chunk_delay``; the events
between content events go out at once, merged into one write.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from twmock.answer import (
    PREFILL_REFUSAL,
    BadRequest,
    ErrorReply,
    Event,
    Ids,
    MockRequest,
    Writer,
    build_answer,
    earlier_answer,
    json_object,
)
from twmock.formats._wire import compact, pretty
from twmock.formats.anthropic import AnthropicWriter
from twmock.formats.gemini import GeminiWriter
from twmock.formats.openai_chat import OpenAIChatWriter
from twmock.formats.openai_responses import OpenAIResponsesWriter
from twmock.script import DEFAULT_MODELS, ErrorSpec, Script, ScriptError, SilenceMode
from twmock.shapes import SHAPES, known_shape, named_error, shape_for
from twproto.dialect import Dialect
from twproto.paths import Operation, PathRoute, match_path

__all__ = [
    "DEFAULT_MODELS",
    "SCRIPT_HEADER",
    "WRITERS",
    "Break",
    "Chunk",
    "End",
    "Head",
    "Plan",
    "RequestInfo",
    "ResetBeforeHead",
    "Silence",
    "Step",
    "plan",
]

SCRIPT_HEADER = b"x-mock-script"

WRITERS: dict[Dialect, Writer] = {
    Dialect.ANTHROPIC: AnthropicWriter(),
    Dialect.OPENAI_CHAT: OpenAIChatWriter(),
    Dialect.OPENAI_RESPONSES: OpenAIResponsesWriter(),
    Dialect.GEMINI: GeminiWriter(),
}

HeaderList = tuple[tuple[bytes, bytes], ...]


# ---------------------------------------------------------------------------------------------
# steps


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    status: int
    headers: HeaderList
    delay: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    data: bytes
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Break:
    pass


@dataclass(frozen=True, slots=True)
class Silence:
    pass


@dataclass(frozen=True, slots=True)
class ResetBeforeHead:
    pass


@dataclass(frozen=True, slots=True)
class End:
    pass


Step = Head | Chunk | Break | Silence | ResetBeforeHead | End


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What to play. `outcome` names it for the request log: ``answer``, ``stream``,
    ``error``, ``stream_error``, ``break``, ``stall``, ``silence``, ``reset``, ``bad_request``,
    ``count_tokens``, ``listing``, ``not_found``."""

    steps: tuple[Step, ...]
    outcome: str

    @property
    def head(self) -> Head | None:
        for step in self.steps:
            if isinstance(step, Head):
                return step
        return None

    @property
    def status(self) -> int | None:
        head = self.head
        return head.status if head is not None else None

    @property
    def body(self) -> bytes:
        """Every byte the plan writes after the head."""
        return b"".join(step.data for step in self.steps if isinstance(step, Chunk))

    def header(self, name: bytes) -> bytes | None:
        head = self.head
        if head is not None:
            for key, value in head.headers:
                if key == name:
                    return value
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestInfo:
    """A request as the planner sees it, with the per-instance facts it may not look up itself.

    `number` is this request's 1-based count on its mock instance (or profile), `draw` a random
    number in [0, 1) for ``fail_rate``, `seed` what ids are drawn from, `now` epoch seconds.
    """

    method: str
    path: str
    query: str = ""
    headers: HeaderList = ()
    body: bytes = b""
    number: int = 1
    draw: float = 1.0
    seed: int = 0
    now: float = 0.0

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


# ---------------------------------------------------------------------------------------------
# planning


def plan(
    info: RequestInfo,
    script: Script,
    *,
    models: tuple[str, ...] = DEFAULT_MODELS,
    allow_script_header: bool = True,
) -> Plan:
    """The steps that answer `info` under `script`."""
    route = match_path(info.method, info.path, info.query)
    ids = Ids(info.seed)
    if route is None:
        return _not_found(info, ids)
    if route.operation is Operation.HEALTH:
        return _simple(info, 200, b"text/plain; charset=utf-8", b"ok", "listing")
    if route.operation in (Operation.LIST_MODELS, Operation.GET_MODEL):
        return _listing(info, route, models)
    assert route.dialect is not None
    writer = WRITERS[route.dialect]

    raw = info.header(SCRIPT_HEADER) if allow_script_header else None
    if raw is not None:
        try:
            script = script.merged(json_object(raw))
        except (ScriptError, ValueError) as exc:
            return _error_plan(
                writer.bad_request(f"x-mock-script: {exc}", route=route, ids=ids),
                outcome="bad_request",
            )
    try:
        body = json_object(info.body)
    except ValueError:
        return _error_plan(
            writer.bad_request(writer.not_json_message, route=route, ids=ids),
            outcome="bad_request",
        )
    try:
        facts = writer.facts(route, body, validate=script.validate)
    except BadRequest as exc:
        return _error_plan(writer.bad_request(exc.message, route=route, ids=ids), "bad_request")

    so_far, prefilled = earlier_answer(body)
    if script.refuse_prefill and prefilled:
        refusal = ErrorSpec(status=400, message=PREFILL_REFUSAL)
        return _error_plan(_error_reply(writer, refusal, facts, ids, int(info.now)), "error")
    if script.continue_repeat is not None and script.text is not None and so_far:
        earlier = so_far.rstrip()
        if earlier and script.text.startswith(earlier):
            start = max(0, len(earlier) - script.continue_repeat)
            script = replace(script, text=script.text[start:])
    if not script.fails(info.number, info.draw):
        script = script.answer_only()
    elif not script.has_failure:
        script = replace(script, error=ErrorSpec())
    shape = script.error.shape if script.error is not None else None
    if shape is not None and not known_shape(shape):
        message = f"x-mock-script: unknown error shape {shape!r} (known: {', '.join(SHAPES)})"
        return _error_plan(writer.bad_request(message, route=route, ids=ids), "bad_request")

    if script.reset_before_head:
        return Plan(steps=(ResetBeforeHead(),), outcome="reset")
    if script.silence is SilenceMode.BEFORE_HEAD:
        return Plan(steps=(Silence(),), outcome="silence")

    now = int(info.now)
    whole = route.operation is Operation.COUNT_TOKENS or not facts.stream
    error = script.error
    if error is not None and (whole or script.stream_error_after is None):
        reply = _error_reply(writer, error, facts, ids, now)
        return _error_plan(reply, "error", delay=script.head_delay + error.delay)

    if route.operation is Operation.COUNT_TOKENS:
        tokens = script.usage.input if script.usage.input is not None else _estimate(info.body)
        data = writer.count_tokens(tokens)
        content_type = b"application/json" + (
            b"; charset=UTF-8" if route.dialect is Dialect.GEMINI else b""
        )
        length = str(len(data)).encode()
        count_headers: HeaderList = ((b"content-type", content_type), (b"content-length", length))
        delay = script.head_delay
        return _whole_plan(script, count_headers, data, delay=delay, outcome="count_tokens")

    answer = build_answer(script, facts, body_size=len(info.body), now=now, ids=ids)
    if whole:
        headers, data = writer.whole(answer)
        delay = (
            script.head_delay
            + script.first_delay
            + script.chunk_delay * max(0, answer.content_count - 1)
        )
        return _whole_plan(script, headers, data, delay=delay, outcome="answer")

    stream = writer.stream(answer)
    events = stream.events
    cuts: list[tuple[int, int, str]] = []  # (event index, tie order, kind)
    if script.stream_error_after is not None:
        cuts.append((_cut_index(events, stream.opening, script.stream_error_after), 0, "error"))
    if script.break_after is not None:
        cuts.append((_cut_index(events, stream.opening, script.break_after), 1, "break"))
    if script.stall_after is not None:
        cuts.append((_cut_index(events, stream.opening, script.stall_after), 2, "stall"))

    head = Head(status=200, headers=stream.headers, delay=script.head_delay)
    if script.silence is SilenceMode.AFTER_HEAD:
        return Plan(steps=(head, Silence()), outcome="silence")
    steps: list[Step] = [head]
    if not cuts:
        steps += _chunks(events, script.first_delay, script.chunk_delay)
        steps.append(End())
        return Plan(steps=tuple(steps), outcome="stream")

    limit, _, kind = min(cuts)
    kept = events[:limit]
    steps += _chunks(kept, script.first_delay, script.chunk_delay)
    if kind == "error":
        error = error if error is not None else ErrorSpec()
        reply = _error_reply(writer, error, facts, ids, now)
        started = any(e.content for e in kept)
        data = writer.stream_error(answer, reply, position=limit)
        delay = script.chunk_delay if started else script.first_delay
        steps += [Chunk(data=data, delay=delay + error.delay), End()]
        return Plan(steps=tuple(steps), outcome="stream_error")
    if kind == "break":
        steps.append(Break())
        return Plan(steps=tuple(steps), outcome="break")
    steps.append(Silence())
    return Plan(steps=tuple(steps), outcome="stall")


def _estimate(body: bytes) -> int:
    return max(1, (len(body) + 3) // 4)


def _cut_index(events: list[Event], opening: int, after: int) -> int:
    """Index of the first event not sent when cutting after `after` content events."""
    if after == 0:
        return opening
    seen = 0
    last = opening
    for i, event in enumerate(events):
        if event.content:
            seen += 1
            last = i + 1
            if seen == after:
                return last
    # Fewer content events than asked: cut after the last one, before the closing events.
    return last


def _chunks(events: list[Event], first_delay: float, chunk_delay: float) -> list[Chunk]:
    """Writes for `events`: one per content event, the events between them merged."""
    out: list[Chunk] = []
    pending: list[bytes] = []
    delay = first_delay
    for data, content in events:
        if not content:
            pending.append(data)
            continue
        if pending:
            out.append(Chunk(data=b"".join(pending)))
            pending = []
        out.append(Chunk(data=data, delay=delay))
        delay = chunk_delay
    if pending:
        out.append(Chunk(data=b"".join(pending)))
    return out


def _whole_plan(
    script: Script, headers: HeaderList, data: bytes, *, delay: float, outcome: str
) -> Plan:
    if script.stall_after is not None:
        # Nothing of a whole answer arrives before all of it does: a stall is no response.
        return Plan(steps=(Silence(),), outcome="stall")
    head = Head(status=200, headers=headers, delay=delay)
    if script.silence is SilenceMode.AFTER_HEAD:
        return Plan(steps=(head, Silence()), outcome="silence")
    if script.break_after is not None:
        return Plan(steps=(head, Chunk(data=data[: len(data) // 2]), Break()), outcome="break")
    return Plan(steps=(head, Chunk(data=data), End()), outcome=outcome)


def _error_reply(
    writer: Writer, spec: ErrorSpec, facts: MockRequest, ids: Ids, now: int
) -> ErrorReply:
    if spec.shape is not None:
        name = shape_for(spec.shape, writer.dialect)
        return named_error(name, spec, model=facts.model, ids=ids, now=now)
    return writer.error(spec, model=facts.model, facts=facts, ids=ids, now=now)


def _error_plan(reply: ErrorReply, outcome: str, *, delay: float = 0.0) -> Plan:
    head = Head(status=reply.status, headers=reply.headers, delay=delay)
    return Plan(steps=(head, Chunk(data=reply.body), End()), outcome=outcome)


def _simple(info: RequestInfo, status: int, content_type: bytes, body: bytes, outcome: str) -> Plan:
    headers = ((b"content-type", content_type), (b"content-length", str(len(body)).encode()))
    head = Head(status=status, headers=headers)
    if info.method == "HEAD":
        return Plan(steps=(head, End()), outcome=outcome)
    return Plan(steps=(head, Chunk(data=body), End()), outcome=outcome)


def _not_found(info: RequestInfo, ids: Ids) -> Plan:
    # OpenAI's answer to an unknown URL; the other APIs answer 404 with their own bodies, but
    # a path none of them knows cannot say which API it meant.
    error = {
        "message": f"Invalid URL ({info.method} {info.path})",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    body = pretty({"error": error}) + b"\n"
    return _simple(info, 404, b"application/json", body, "not_found")


def _listing_dialect(info: RequestInfo, route: PathRoute) -> Dialect:
    if route.dialect is Dialect.GEMINI or info.header(b"x-goog-api-key") is not None:
        return Dialect.GEMINI
    if info.header(b"anthropic-version") is not None or info.header(b"x-api-key") is not None:
        return Dialect.ANTHROPIC
    return Dialect.OPENAI_CHAT


def _model_entry(dialect: Dialect, model: str) -> dict[str, object]:
    if dialect is Dialect.ANTHROPIC:
        return {
            "type": "model",
            "id": model,
            "display_name": model,
            "created_at": "2025-09-29T00:00:00Z",
        }
    if dialect is Dialect.GEMINI:
        return {
            "name": f"models/{model}",
            "version": "001",
            "displayName": model,
            "description": f"{model} (mock upstream)",
            "inputTokenLimit": 1048576,
            "outputTokenLimit": 65536,
            "supportedGenerationMethods": ["generateContent", "countTokens"],
        }
    return {"id": model, "object": "model", "created": 1700000000, "owned_by": "system"}


def _listing(info: RequestInfo, route: PathRoute, models: tuple[str, ...]) -> Plan:
    dialect = _listing_dialect(info, route)
    if route.operation is Operation.GET_MODEL:
        model = route.model or ""
        entry = _model_entry(dialect, model)
        data = compact(entry) if dialect is Dialect.ANTHROPIC else pretty(entry) + b"\n"
        return _simple(info, 200, b"application/json", data, "listing")
    entries = [_model_entry(dialect, m) for m in models]
    if dialect is Dialect.ANTHROPIC:
        data = compact(
            {
                "data": entries,
                "has_more": False,
                "first_id": models[0] if models else None,
                "last_id": models[-1] if models else None,
            }
        )
    elif dialect is Dialect.GEMINI:
        data = pretty({"models": entries}) + b"\n"
    else:
        data = pretty({"object": "list", "data": entries}) + b"\n"
    return _simple(info, 200, b"application/json", data, "listing")
