"""Fuzz targets: every parser of untrusted bytes parses, or raises its one typed error
(docs/library.md, "Errors").

Run under pytest, these are Hypothesis properties over arbitrary bytes and arbitrary splits. Run
as a script, the same targets go to atheris for coverage-guided fuzzing when it is installed::

    python -m tests.fuzz.test_fuzz_parsers [atheris/libFuzzer options]

Without atheris the script runs the Hypothesis properties instead.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.shedding import overloaded
from twproto.dialect import Dialect
from twproto.errors import error_body, error_headers
from twproto.failures import Failure, classify_response, classify_stream_error
from twproto.paths import guess_client_dialect
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEError, SSEEvent
from twproto.stream import (
    EventRole,
    FailedBeforeContent,
    Holding,
    OpeningHold,
    Released,
    classify_event,
    classify_payload,
)
from twserve.app import door
from twserve.server.base import HeadRefusal

NOW = 1_750_000_000.0
DIALECTS = list(Dialect)


def split(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


# --- targets (shared by Hypothesis and atheris) -----------------------------------------------


def sse_target(pieces: list[bytes], bound: int) -> list[SSEEvent] | None:
    """Decode; None when the one typed error was raised."""
    dec = SSEDecoder(max_event_size=bound)
    out: list[SSEEvent] = []
    try:
        for piece in pieces:
            out += dec.feed(piece)
        out += dec.end()
    except SSEError:
        return None
    assert all(isinstance(e, SSEEvent) and isinstance(e.data, str) for e in out)
    return out


def array_target(pieces: list[bytes], bound: int) -> list[object] | None:
    dec = JSONArrayDecoder(max_element_size=bound)
    out: list[object] = []
    try:
        for piece in pieces:
            out += dec.feed(piece)
        out += dec.end()
    except SSEError:
        return None
    return out


def hold_target(pieces: list[bytes], dialect: Dialect, sse: bool, limit: int) -> None:
    hold = OpeningHold(dialect, sse=sse, limit=limit)
    fed = b""
    for piece in pieces:
        outcome = hold.feed(piece, now=NOW)
        fed += piece
        if isinstance(outcome, Released):
            assert outcome.data == fed
            return
        if isinstance(outcome, FailedBeforeContent):
            assert isinstance(outcome.failure, Failure)
            return
        assert isinstance(outcome, Holding)
        assert hold.held_bytes == len(fed)
    outcome = hold.end(now=NOW)
    assert isinstance(outcome, Released | FailedBeforeContent)
    if isinstance(outcome, Released):
        assert outcome.data == fed


def response_target(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    failure = classify_response(status, headers, body, now=NOW)
    assert isinstance(failure, Failure)
    for value in (failure.pause_secs, failure.reset_at, failure.retry_after_secs):
        assert value is None or value >= 0


DOOR_REFUSAL = overloaded("event loop 300 ms behind, shed_loop_lag_ms")


def door_target(data: bytes) -> None:
    """A client's first bytes at the door (twserve/app/door.py): its head parsed or None, and
    the answer a whole HTTP/1.1 503 that h11 reads as a client would."""
    request = door.parse_head(data, ("127.0.0.1", 5))
    dialect = guess_client_dialect(
        request.path if request else None, request.headers if request else None
    )
    refusal = HeadRefusal(
        status=503, headers=error_headers(DOOR_REFUSAL), body=error_body(dialect, DOOR_REFUSAL)
    )
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", "gw")]))
    client.send(h11.EndOfMessage())
    client.receive_data(door.http1_answer(refusal))
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 503
    body = client.next_event()
    assert isinstance(body, h11.Data) and b"shed_loop_lag_ms" in bytes(body.data)
    assert isinstance(client.next_event(), h11.EndOfMessage)


def stream_error_target(dialect: Dialect, payload: object) -> None:
    assert isinstance(classify_stream_error(dialect, payload, now=NOW), Failure)


# --- Hypothesis ---------------------------------------------------------------------------------

# Byte soup biased towards the tokens the parsers branch on, so random input reaches deep states.
_SSE_TOKENS = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"event:",
        b"id:",
        b"retry:",
        b"retry: 12",
        b":",
        b" ",
        b"\n",
        b"\r",
        b"\r\n",
        b"x",
        b"\xef\xbb\xbf",
        b"\x00",
        b"\xe6\x97",
        b"\xa5",
        b"{",
        b"}",
        b"[DONE]",
    ]
)
_SSE_BYTES = st.one_of(st.binary(max_size=300), st.lists(_SSE_TOKENS, max_size=60).map(b"".join))
_JSON_TOKENS = st.sampled_from(
    [
        b"[",
        b"]",
        b"{",
        b"}",
        b'"',
        b"\\",
        b",",
        b":",
        b" ",
        b"\n",
        b"1",
        b"-2.5e3",
        b"true",
        b"null",
        b'"a"',
        b'"\\""',
        b"\xe6\x97\xa5",
    ]
)
_JSON_BYTES = st.one_of(st.binary(max_size=300), st.lists(_JSON_TOKENS, max_size=60).map(b"".join))
_SPLITS = st.lists(st.integers(min_value=0, max_value=1000), max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "error",
                    "type",
                    "code",
                    "status",
                    "message",
                    "details",
                    "@type",
                    "retryDelay",
                    "violations",
                    "quotaId",
                    "resets_at",
                    "resets_in_seconds",
                    "headers",
                    "status_code",
                    "response",
                    "metadata",
                    "raw",
                    "choices",
                    "delta",
                    "candidates",
                    "parts",
                    "x",
                ]
            )
            | st.text(max_size=8),
            c,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(data=_SSE_BYTES, points=_SPLITS, bound=st.integers(min_value=1, max_value=400))
def test_sse_decoder_parses_or_raises_its_error(data: bytes, points: list[int], bound: int) -> None:
    whole = sse_target([data], bound)
    assert sse_target(split(data, points), bound) == whole


@settings(max_examples=200, deadline=None)
@given(data=_JSON_BYTES, points=_SPLITS, bound=st.integers(min_value=1, max_value=400))
def test_json_array_decoder_parses_or_raises_its_error(
    data: bytes, points: list[int], bound: int
) -> None:
    whole = array_target([data], bound)
    assert array_target(split(data, points), bound) == whole
    if whole is not None:
        assert whole == json.loads(data)


@settings(max_examples=200, deadline=None)
@given(
    data=st.one_of(
        _SSE_BYTES, _JSON_BYTES, _JSON.map(lambda v: b"data: " + json.dumps(v).encode())
    ),
    points=_SPLITS,
    dialect=st.sampled_from(DIALECTS),
    sse=st.booleans(),
    limit=st.integers(min_value=1, max_value=500),
)
def test_opening_hold_never_raises(
    data: bytes, points: list[int], dialect: Dialect, sse: bool, limit: int
) -> None:
    hold_target(split(data, points), dialect, sse, limit)


# Payloads shaped like the four formats' stream events, with hostile values where the
# classifier looks: a "type" that is a list, a delta that is a string, parts that are numbers.
_TYPES = st.sampled_from(
    [
        "content_block_delta",
        "content_block_start",
        "message_delta",
        "message_start",
        "error",
        "ping",
        "text_delta",
        "input_json_delta",
        "thinking_delta",
        "signature_delta",
        "text",
        "response.created",
        "response.output_text.delta",
        "response.output_item.done",
        "response.failed",
        "response.completed",
        "message",
        "reasoning",
        "function_call",
    ]
)
_KEYS = st.sampled_from(
    [
        "type",
        "delta",
        "content_block",
        "choices",
        "candidates",
        "content",
        "parts",
        "functionCall",
        "tool_calls",
        "function",
        "name",
        "arguments",
        "text",
        "item",
        "part",
        "finish_reason",
        "finishReason",
        "error",
        "promptFeedback",
        "blockReason",
        "summary",
        "response",
        "stop_reason",
        "thought",
        "partial_json",
        "role",
    ]
)
_PROTOCOL = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | _TYPES,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_KEYS, c, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    payload=_PROTOCOL,
    name=st.sampled_from(["", "error", "response.failed", "content_block_delta", "ping"]),
)
def test_classifiers_never_raise(payload: object, name: str) -> None:
    data = json.dumps(payload)
    for dialect in DIALECTS:
        assert isinstance(classify_payload(dialect, payload, event=name), EventRole)
        assert isinstance(classify_event(dialect, SSEEvent(data, event=name)), EventRole)
        stream = (f"event: {name}\n" if name else "").encode() + b"data: " + data.encode()
        hold_target([stream + b"\n\n"], dialect, True, 1 << 20)
        hold_target([b"[" + data.encode() + b"]"], dialect, False, 1 << 20)


# Real events from the recorded streams, with one value anywhere inside replaced by something
# hostile: reaches every place a classifier looks into, which random JSON rarely does.
_STREAMS = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "streams"
_PREFIXES = {
    "anthropic": Dialect.ANTHROPIC,
    "openai-responses": Dialect.OPENAI_RESPONSES,
    "openai-chat": Dialect.OPENAI_CHAT,
    "openrouter": Dialect.OPENAI_CHAT,
    "gemini": Dialect.GEMINI,
}


def _recorded() -> list[tuple[Dialect, str, object]]:
    out: list[tuple[Dialect, str, object]] = []
    for path in sorted(_STREAMS.glob("*.sse")):
        dialect = next(d for p, d in _PREFIXES.items() if path.name.startswith(p))
        for event in SSEDecoder().feed(path.read_bytes())[:12]:
            try:
                out.append((dialect, event.event, json.loads(event.data)))
            except ValueError:
                continue
    return out


def _paths(obj: object, prefix: tuple[object, ...] = ()) -> Iterator[tuple[object, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:3]):
            yield from _paths(value, (*prefix, i))


def _replace(obj: object, path: tuple[object, ...], value: object) -> object:
    if not path:
        return value
    obj = copy.deepcopy(obj)
    node = obj
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return obj


_RECORDED = _recorded()
_HOSTILE = st.one_of(
    st.lists(st.integers(), min_size=1, max_size=2),
    st.dictionaries(st.sampled_from(["type", "text", "x"]), st.integers(), min_size=1, max_size=2),
    st.integers(),
    st.none(),
    st.just(""),
    st.text(max_size=4),
    st.booleans(),
)
_MUTATED = st.sampled_from(_RECORDED).flatmap(
    lambda rec: st.tuples(st.just(rec), st.sampled_from(list(_paths(rec[2]))), _HOSTILE)
)


@settings(max_examples=300, deadline=None)
@given(mutation=_MUTATED)
def test_classifiers_survive_mutated_recorded_events(
    mutation: tuple[tuple[Dialect, str, object], tuple[object, ...], object],
) -> None:
    (dialect, name, payload), path, value = mutation
    mutated = _replace(payload, path, value)
    assert isinstance(classify_payload(dialect, mutated, event=name), EventRole)
    hold_target(
        [f"event: {name}\ndata: {json.dumps(mutated)}\n\n".encode()], dialect, True, 1 << 20
    )
    stream_error_target(dialect, mutated)


def _recorded_errors() -> list[tuple[int, list[tuple[bytes, bytes]], object]]:
    out = []
    for path in sorted((_STREAMS.parent / "errors").glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        headers = [(k.encode(), v.encode()) for k, v in case["headers"].items()]
        out.append((case["status"], headers, json.loads(case["body"])))
    return out


_MUTATED_ERRORS = st.sampled_from(_recorded_errors()).flatmap(
    lambda rec: st.tuples(st.just(rec), st.sampled_from(list(_paths(rec[2]))), _HOSTILE)
)


@settings(max_examples=300, deadline=None)
@given(mutation=_MUTATED_ERRORS)
def test_classify_response_survives_mutated_recorded_errors(
    mutation: tuple[tuple[int, list[tuple[bytes, bytes]], object], tuple[object, ...], object],
) -> None:
    (status, headers, body), path, value = mutation
    mutated = _replace(body, path, value)
    response_target(status, headers, json.dumps(mutated).encode())
    stream_error_target(Dialect.OPENAI_RESPONSES, mutated)


_HEADER_NAMES = st.sampled_from(
    [
        b"retry-after",
        b"retry-after-ms",
        b"x-codex-primary-used-percent",
        b"x-codex-primary-reset-at",
        b"x-codex-primary-reset-after-seconds",
        b"anthropic-ratelimit-tokens-remaining",
        b"anthropic-ratelimit-tokens-reset",
        b"x-ratelimit-remaining-tokens",
        b"x-ratelimit-reset-tokens",
        b"x-amzn-errortype",
    ]
) | st.binary(max_size=20)
_HEADER_VALUES = st.sampled_from(
    [
        b"0",
        b"100",
        b"1e309",
        b"-5",
        b"NaN",
        b"6m0s",
        b"20ms",
        b"99999999999999999999",
        b"Wed, 21 Oct 2015 07:28:00 GMT",
        b"Mon, 99 Foo 9999 99:99:99 GMT",
        b"2025-06-02T15:15:48Z",
        b"9999-12-31T23:59:59+14:00",
        b"ThrottlingException:http://x",
    ]
) | st.binary(max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    status=st.integers(min_value=0, max_value=999),
    headers=st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=6),
    body=st.one_of(st.binary(max_size=500), _JSON.map(lambda v: json.dumps(v).encode())),
)
def test_classify_response_never_raises(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    response_target(status, headers, body)


@settings(max_examples=200, deadline=None)
@given(
    dialect=st.sampled_from(DIALECTS),
    payload=st.one_of(_JSON, st.text(max_size=100), st.binary(max_size=100)),
)
def test_classify_stream_error_never_raises(dialect: Dialect, payload: object) -> None:
    stream_error_target(dialect, payload)


DOOR_HEADS = st.one_of(
    st.binary(max_size=600),
    st.builds(
        lambda method, path, headers, cut: (
            f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
            + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
            + b"\r\n"
        )[: cut or None],
        st.sampled_from(["POST", "GET", "PRI", "G\x00T"]),
        st.sampled_from(["/v1/messages", "/v1/chat/completions", "/v1beta/models/m:x", "*", ""]),
        st.lists(
            st.tuples(
                st.sampled_from([b"x-api-key", b"host", b"anthropic-version", b"bad name"]),
                st.binary(max_size=20),
            ),
            max_size=4,
        ),
        st.integers(min_value=0, max_value=200),
    ),
)


@settings(max_examples=300, deadline=None)
@given(DOOR_HEADS)
def test_any_bytes_at_the_door_get_a_whole_answer(data: bytes) -> None:
    door_target(data)


# --- atheris --------------------------------------------------------------------------------------


def _atheris_one_input(data: bytes) -> None:  # pragma: no cover - run by atheris only
    import atheris  # type: ignore[import-not-found]

    fdp = atheris.FuzzedDataProvider(data)
    target = fdp.ConsumeIntInRange(0, 5)
    points = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    bound = fdp.ConsumeIntInRange(1, 4096)
    dialect = DIALECTS[fdp.ConsumeIntInRange(0, len(DIALECTS) - 1)]
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    pieces = split(rest, points)
    if target == 0:
        sse_target(pieces, bound)
    elif target == 1:
        array_target(pieces, bound)
    elif target == 2:
        hold_target(pieces, dialect, bound % 2 == 0, bound)
    elif target == 3:
        response_target(bound % 1000, [(b"retry-after", rest[:32])], rest)
    elif target == 4:
        stream_error_target(dialect, rest.decode("utf-8", "replace"))
    else:
        door_target(rest)


def fuzz_main(path: str, one_input: Callable[[bytes], None]) -> None:  # pragma: no cover
    """Run `one_input` under atheris; without it, the Hypothesis properties of `path`."""
    try:
        import atheris
    except ImportError:
        import subprocess

        print("atheris is not installed; running the Hypothesis fuzz targets instead")
        # A fresh interpreter: pytest must start before Hypothesis is imported.
        code = subprocess.call([sys.executable, "-m", "pytest", path, "-q"])
        raise SystemExit(code) from None
    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


def main() -> None:  # pragma: no cover - manual use
    fuzz_main(__file__, _atheris_one_input)


if __name__ == "__main__":
    main()
