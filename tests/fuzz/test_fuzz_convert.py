"""Fuzz targets for the converters: requests, whole answers and streams, every format pair.

The contract (docs/library.md, "Errors"): whatever twproto raises about its input is a
`ProtocolError` — a request that cannot be converted is `ClientTranslationError`, an answer
`UpstreamTranslationError` — and a stream translator never raises at all; what it writes for
the client is well-formed (a whole answer is a JSON object, every SSE event's data is JSON).

Inputs are the recorded fixtures and request bodies with values anywhere inside them replaced
by hostile ones — integers beyond 64 bits, floats at the ends of their range, deep nesting, odd
text — encoded by the standard library, which writes big integers exactly; or bytes as they
come. Under pytest these are Hypothesis properties. Run as a script, the same targets go to
atheris for coverage-guided fuzzing (``pip install atheris``; docs/library.md, "Fuzzing")::

    python -m tests.fuzz.test_fuzz_convert -max_total_time=600 [libFuzzer options]
"""

from __future__ import annotations

import itertools
import json
import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twproto import (
    ClientTranslationError,
    Dialect,
    ErrorCategory,
    GatewayError,
    JSONDecodeError,
    SSEDecoder,
    UpstreamTranslationError,
    json_dumps,
    json_loads,
    new_stream_translator,
    summarize,
    translate_request,
    translate_response,
)
from twproto.ir import ReasoningLevel
from twproto.structure import check_structure

DIALECTS = tuple(Dialect)
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
ERR = GatewayError(status=502, category=ErrorCategory.UPSTREAM, code="gw.test", message="bad")

# A request of every format touching the fields each converter reads: system text with cache
# markers, images, tool calls and results, reasoning and its seals, schemas.
REQUESTS: dict[Dialect, dict[str, Any]] = {
    Dialect.ANTHROPIC: {
        "model": "m",
        "max_tokens": 10,
        "stream": True,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "r"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": True}
                ],
            },
        ],
        "tools": [
            {
                "name": "f",
                "description": "d",
                "input_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer", "minimum": 0}},
                    "required": ["a"],
                },
            }
        ],
        "tool_choice": {"type": "tool", "name": "f"},
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "temperature": 0.5,
        "top_k": 3,
        "stop_sequences": ["\n\n"],
        "metadata": {"user_id": "u"},
    },
    Dialect.OPENAI_CHAT: {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "r",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "x"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
            }
        ],
        "tool_choice": "required",
        "max_completion_tokens": 100,
        "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {}}},
        "stop": ["x"],
        "n": 1,
        "seed": 7,
    },
    Dialect.OPENAI_RESPONSES: {
        "model": "m",
        "stream": True,
        "instructions": "s",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "e"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {
                "type": "namespace",
                "name": "n",
                "description": "d",
                "tools": [{"type": "custom", "name": "g"}],
            },
        ],
        "tool_choice": "auto",
        "reasoning": {"effort": "high", "summary": "auto"},
        "max_output_tokens": 100,
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}}},
        "include": ["reasoning.encrypted_content"],
        "store": False,
    },
    Dialect.GEMINI: {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "hi"},
                    {"inlineData": {"mimeType": "image/png", "data": "AA=="}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "t", "thought": True, "thoughtSignature": "AA=="},
                    {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "AA=="},
                ],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "f", "response": {"output": "x"}}}],
            },
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "thinkingConfig": {"thinkingBudget": 100, "includeThoughts": True},
            "maxOutputTokens": 100,
            "responseMimeType": "application/json",
            "stopSequences": ["x"],
        },
    },
}


def fixture_dialect(name: str) -> Dialect:
    if name.startswith("anthropic"):
        return Dialect.ANTHROPIC
    if name.startswith("gemini"):
        return Dialect.GEMINI
    if name.startswith("openai-responses"):
        return Dialect.OPENAI_RESPONSES
    return Dialect.OPENAI_CHAT


def _answers() -> list[tuple[Dialect, Any]]:
    return [
        (fixture_dialect(p.name), json.loads(p.read_bytes()))
        for p in sorted((FIXTURES / "whole").glob("*.json"))
    ]


def _streams() -> list[tuple[Dialect, bool, list[tuple[str, Any]]]]:
    """Every recorded stream: its format, whether it is SSE, its events (name, JSON)."""
    out: list[tuple[Dialect, bool, list[tuple[str, Any]]]] = []
    for path in sorted((FIXTURES / "streams").iterdir()):
        dialect = fixture_dialect(path.name)
        if path.suffix == ".json":  # Gemini's JSON-array stream
            out.append((dialect, False, [("", e) for e in json.loads(path.read_bytes())]))
            continue
        events = []
        for event in SSEDecoder().feed(path.read_bytes() + b"\n\n"):
            try:
                events.append((event.event or "", json.loads(event.data)))
            except ValueError:
                events.append((event.event or "", event.data))  # [DONE]
        out.append((dialect, True, events))
    return out


ANSWERS = _answers()
STREAMS = _streams()


# --- mutation -------------------------------------------------------------------------------

# Values the converters meet rarely and must survive anywhere: the ends of the number ranges
# (orjson reads an integer beyond 64 bits as a float), empty and odd text, wrong kinds.
HOSTILE: tuple[Any, ...] = (
    2**64,
    2**64 - 1,
    2**63,
    -(2**63) - 1,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    1.5,
    -0.0,
    5e-324,
    -1,
    0,
    True,
    None,
    "",
    "x" * 300,
    "\u0000",
    "\U0001f600",
    "\ud800",
    [],
    {},
    [None],
    {"type": None},
    {"type": "text", "text": None},
    "[DONE]",
)


def deep(depth: int, leaf: Any = 1, *, as_list: bool = False) -> Any:
    """`leaf` nested `depth` lists deep, or twice `depth` objects (a schema's properties);
    orjson reads up to 1024 levels."""
    value = leaf
    for _ in range(depth):
        value = [value] if as_list else {"type": "object", "properties": {"a": value}}
    return value


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path to every value inside `value` (itself first), down to 40 levels (below that
    lies nothing but what `deep` made)."""
    yield prefix
    if len(prefix) >= 40:
        return
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for n, sub in enumerate(value):
            yield from paths(sub, (*prefix, n))


def replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of `value` with the value at `path` replaced by `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replace(value[head], rest, new)}
    out = list(value)
    out[head] = replace(out[head], rest, new)
    return out


def encode(value: Any) -> bytes:
    """JSON as a hostile peer may write it: big integers exactly, ``Infinity`` for inf."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except RecursionError:  # deeper than the standard library writes
        return json_dumps(value)
    return text.encode("utf-8", "surrogatepass")


def split(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def stream_bytes(sse: bool, events: list[tuple[str, Any]]) -> bytes:
    if not sse:
        return b"[" + b",".join(encode(obj) for _, obj in events) + b"]"
    out = []
    for name, obj in events:
        head = f"event: {name}\n".encode() if name else b""
        data = obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else encode(obj)
        out.append(head + b"data: " + data + b"\n\n")
    return b"".join(out)


# --- targets (shared by Hypothesis and atheris) ---------------------------------------------


def well_formed(data: bytes | str) -> Any:
    """`data` parsed (it must be JSON), or {} when it nests deeper than a parser reads: what a
    hostile peer nested that deep comes back as deep."""
    try:
        return json_loads(data)
    except JSONDecodeError as exc:
        if "depth" in str(exc):
            return {}
        raise


def request_target(
    body: bytes,
    source: Dialect,
    target: Dialect,
    *,
    reasoning: ReasoningLevel | None = None,
    max_tokens: int | None = None,
    drop_sealed: bool = False,
    continuation: str | None = None,
    prefill: bool = True,
) -> None:
    """What admission reads of a request, then its conversion: a result or its typed error."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        check_structure(source, obj)
        summarize(obj, source)
    try:
        out = translate_request(
            body,
            source,
            target,
            model="m",
            max_tokens=max_tokens,
            reasoning=reasoning,
            drop_sealed_reasoning=drop_sealed,
            continuation=continuation,
            prefill=prefill,
        )
    except ClientTranslationError as exc:
        assert exc.error_status_hint == 400
        return
    assert isinstance(well_formed(out.body), dict)


def answer_target(body: bytes, upstream: Dialect, client: Dialect) -> None:
    try:
        out = translate_response(body, upstream, client, client_model="m")
    except UpstreamTranslationError as exc:
        assert exc.error_status_hint == 502
        return
    assert isinstance(well_formed(out.body), dict)


def stream_target(
    pieces: list[bytes],
    upstream: Dialect,
    client: Dialect,
    *,
    upstream_sse: bool = True,
    client_stream: bool = True,
    client_sse: bool = True,
    relay_unchanged: bool = True,
) -> None:
    """Feed a stream in pieces and end it, or fail it if it did not finish: nothing raises, and
    what the client gets is well-formed unless the stream was relayed as it came."""
    if not upstream_sse and upstream is not Dialect.GEMINI:
        upstream_sse = True
    translator = new_stream_translator(
        upstream,
        client,
        client_model="m",
        upstream_sse=upstream_sse,
        client_stream=client_stream,
        client_sse=client_sse,
        relay_unchanged=relay_unchanged,
    )
    out = [translator.feed(piece) for piece in pieces]
    tail = translator.end()
    # As the gateway does: the closing bytes of a stream that finished, else its failure.
    out.append(tail if translator.finished else translator.fail(ERR))
    data = b"".join(out)
    client_sse = client_sse or client is not Dialect.GEMINI
    relayed = (
        relay_unchanged and client_stream and upstream is client and upstream_sse == client_sse
    )
    if relayed or not data:
        return
    if not client_stream:
        assert isinstance(well_formed(data), dict), data[:200]
    elif client_sse:
        for event in SSEDecoder().feed(data + b"\n\n"):
            if event.data != "[DONE]":
                well_formed(event.data)
    else:  # a Gemini JSON array, maybe cut short by a failure
        assert data.startswith(b"[")


# --- Hypothesis -----------------------------------------------------------------------------

_HOSTILE = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.integers(min_value=1, max_value=510).map(deep),
    st.integers(min_value=1, max_value=1020).map(lambda n: deep(n, as_list=True)),
)


def _mutated(value: Any, data: st.DataObject, rounds: int = 3) -> Any:
    for _ in range(data.draw(st.integers(min_value=1, max_value=rounds))):
        path = data.draw(st.sampled_from(list(paths(value))))
        value = replace(value, path, data.draw(_HOSTILE))
    return value


_CHECKS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_CHECKS
@given(
    source=st.sampled_from(DIALECTS),
    target=st.sampled_from(DIALECTS),
    reasoning=st.none() | st.sampled_from(list(ReasoningLevel)),
    max_tokens=st.none() | st.integers(min_value=1, max_value=100_000_000),
    drop_sealed=st.booleans(),
    continuation=st.none() | st.text(max_size=5),
    prefill=st.booleans(),
    data=st.data(),
)
def test_requests_convert_or_raise_their_error(
    source: Dialect,
    target: Dialect,
    reasoning: ReasoningLevel | None,
    max_tokens: int | None,
    drop_sealed: bool,
    continuation: str | None,
    prefill: bool,
    data: st.DataObject,
) -> None:
    body = encode(_mutated(REQUESTS[source], data))
    request_target(
        body,
        source,
        target,
        reasoning=reasoning,
        max_tokens=max_tokens,
        drop_sealed=drop_sealed,
        continuation=continuation,
        prefill=prefill,
    )


@_CHECKS
@given(which=st.integers(min_value=0, max_value=len(ANSWERS) - 1), data=st.data())
def test_answers_convert_or_raise_their_error(which: int, data: st.DataObject) -> None:
    upstream, obj = ANSWERS[which]
    body = encode(_mutated(obj, data))
    for client in DIALECTS:
        answer_target(body, upstream, client)


@_CHECKS
@given(
    which=st.integers(min_value=0, max_value=len(STREAMS) - 1),
    client=st.sampled_from(DIALECTS),
    client_stream=st.booleans(),
    client_sse=st.booleans(),
    relay_unchanged=st.booleans(),
    points=st.lists(st.integers(min_value=0, max_value=100_000), max_size=6),
    data=st.data(),
)
def test_streams_translate_without_raising(
    which: int,
    client: Dialect,
    client_stream: bool,
    client_sse: bool,
    relay_unchanged: bool,
    points: list[int],
    data: st.DataObject,
) -> None:
    upstream, sse, events = STREAMS[which]
    events = list(events)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        n = data.draw(st.integers(min_value=0, max_value=len(events) - 1))
        name, obj = events[n]
        events[n] = (name, _mutated(obj, data, rounds=1))
    stream_target(
        split(stream_bytes(sse, events), points),
        upstream,
        client,
        upstream_sse=sse,
        client_stream=client_stream,
        client_sse=client_sse,
        relay_unchanged=relay_unchanged,
    )


@settings(max_examples=100, deadline=None)
@given(
    body=st.binary(max_size=200),
    source=st.sampled_from(DIALECTS),
    target=st.sampled_from(DIALECTS),
)
def test_arbitrary_bytes_convert_or_raise_their_error(
    body: bytes, source: Dialect, target: Dialect
) -> None:
    request_target(body, source, target)
    answer_target(body, source, target)
    stream_target([body], source, target, upstream_sse=source is not Dialect.GEMINI)


# --- atheris --------------------------------------------------------------------------------


def _hostile(fdp: Any) -> Any:  # pragma: no cover - run by atheris only
    kind = fdp.ConsumeIntInRange(0, 6)
    if kind == 0:
        return HOSTILE[fdp.ConsumeIntInRange(0, len(HOSTILE) - 1)]
    if kind == 1:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 12))  # up to 96-bit integers
    if kind == 2:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 3:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    if kind == 4:
        as_list = fdp.ConsumeBool()
        return deep(fdp.ConsumeIntInRange(1, 1020 if as_list else 510), as_list=as_list)
    if kind == 5:
        try:
            return json.loads(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)))
        except (ValueError, RecursionError):
            return None
    return [_hostile(fdp)] if fdp.ConsumeBool() else {"type": _hostile(fdp)}


def _mutate(fdp: Any, value: Any) -> Any:  # pragma: no cover - run by atheris only
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        found = list(paths(value))
        value = replace(value, found[fdp.ConsumeIntInRange(0, len(found) - 1)], _hostile(fdp))
    return value


def _atheris_one_input(data: bytes) -> None:  # pragma: no cover - run by atheris only
    import atheris  # type: ignore[import-not-found]

    fdp = atheris.FuzzedDataProvider(data)
    kind = fdp.ConsumeIntInRange(0, 2)
    first = DIALECTS[fdp.ConsumeIntInRange(0, len(DIALECTS) - 1)]
    second = DIALECTS[fdp.ConsumeIntInRange(0, len(DIALECTS) - 1)]
    raw = fdp.ConsumeIntInRange(0, 7) == 0  # now and then the bytes as they come
    if kind == 0:
        levels = [None, *ReasoningLevel]
        options: dict[str, Any] = {
            "reasoning": levels[fdp.ConsumeIntInRange(0, len(levels) - 1)],
            "max_tokens": fdp.ConsumeIntInRange(0, 200_000) or None,
            "drop_sealed": fdp.ConsumeBool(),
            "continuation": fdp.ConsumeUnicodeNoSurrogates(4) or None,
            "prefill": fdp.ConsumeBool(),
        }
        body = fdp.ConsumeBytes(1 << 16) if raw else encode(_mutate(fdp, REQUESTS[first]))
        request_target(body, first, second, **options)
    elif kind == 1:
        upstream, obj = ANSWERS[fdp.ConsumeIntInRange(0, len(ANSWERS) - 1)]
        body = fdp.ConsumeBytes(1 << 16) if raw else encode(_mutate(fdp, obj))
        answer_target(body, upstream, first)
    else:
        upstream, sse, events = STREAMS[fdp.ConsumeIntInRange(0, len(STREAMS) - 1)]
        events = list(events)
        for _ in range(fdp.ConsumeIntInRange(1, 3)):
            n = fdp.ConsumeIntInRange(0, len(events) - 1)
            events[n] = (events[n][0], _mutate(fdp, events[n][1]))
        flags = [fdp.ConsumeBool() for _ in range(3)]
        points = [fdp.ConsumeIntInRange(0, 1 << 16) for _ in range(fdp.ConsumeIntInRange(0, 6))]
        body = fdp.ConsumeBytes(1 << 16) if raw else stream_bytes(sse, events)
        stream_target(
            split(body, points),
            upstream,
            first,
            upstream_sse=sse,
            client_stream=flags[0],
            client_sse=flags[1],
            relay_unchanged=flags[2],
        )


def _collecting(one_input: Any, log: str) -> Any:  # pragma: no cover - run by atheris only
    """`one_input` that writes each new kind of failure (exception and the line it came from)
    to `log` with the input, and carries on: one long run then finds every kind, not the
    first only."""
    seen: set[tuple[str, str]] = set()

    def run(data: bytes) -> None:
        try:
            one_input(data)
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = (type(exc).__name__, f"{frame.filename}:{frame.lineno}")
            if where not in seen:
                seen.add(where)
                with open(log, "a", encoding="utf-8") as out:
                    out.write(f"{where} {exc!r:.200}\n  input: {data.hex()}\n")
                    out.write("".join(traceback.format_exception(exc)[-6:]) + "\n")

    return run


def main() -> None:  # pragma: no cover - manual use
    """atheris on the converters; with ``TWPROTO_FUZZ_LOG=<file>`` failures are written there
    and the run goes on instead of stopping at the first."""
    from tests.fuzz.test_fuzz_parsers import fuzz_main

    log = os.environ.get("TWPROTO_FUZZ_LOG")
    fuzz_main(__file__, _collecting(_atheris_one_input, log) if log else _atheris_one_input)


if __name__ == "__main__":
    main()
