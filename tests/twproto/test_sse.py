"""SSE decoder/encoder and the JSON-array stream decoder.

Every transcript is fed whole, byte by byte and at chosen split points, and must decode to what
the one-shot feed gives (docs/streams.md, "SSE decoding").
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twproto.sse import (
    JSONArrayDecoder,
    JSONArrayError,
    SSEDecoder,
    SSEError,
    SSEEvent,
    SSEEventTooLarge,
    encode,
    encode_comment,
    encode_event,
)

STREAMS = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "streams"
SSE_FIXTURES = sorted(STREAMS.glob("*.sse"))
ARRAY_FIXTURES = sorted(STREAMS.glob("gemini-jsonarray-*.json"))


def decode(pieces: Iterable[bytes], **kw: int) -> list[SSEEvent]:
    dec = SSEDecoder(**kw)
    out: list[SSEEvent] = []
    for piece in pieces:
        out += dec.feed(piece)
    return out + dec.end()


def decode_array(pieces: Iterable[bytes], **kw: int) -> list[object]:
    dec = JSONArrayDecoder(**kw)
    out: list[object] = []
    for piece in pieces:
        out += dec.feed(piece)
    return out + dec.end()


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def line_ends(data: bytes, end: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", end)


# --- recorded transcripts -------------------------------------------------------------------


def test_fixtures_are_present() -> None:
    assert len(SSE_FIXTURES) >= 20
    assert len(ARRAY_FIXTURES) == 2


@pytest.mark.parametrize("path", SSE_FIXTURES, ids=lambda p: p.name)
def test_transcript_decodes_the_same_however_it_is_split(path: Path) -> None:
    raw = path.read_bytes()
    whole = decode([raw])
    assert whole, "every fixture holds events"
    # What the bytes say, checked independently: one event per blank-line-separated block
    # holding a data line.
    blocks = line_ends(raw, b"\n").split(b"\n\n")
    assert len(whole) == sum(1 for b in blocks if b"data:" in b)
    assert decode(bytewise(raw)) == whole
    # Every split point for short transcripts, an even sample of them for long ones.
    step = max(1, len(raw) // 400)
    for cut in range(0, len(raw) + 1, step):
        assert decode([raw[:cut], raw[cut:]]) == whole, cut


@pytest.mark.parametrize("end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("path", SSE_FIXTURES, ids=lambda p: p.name)
def test_transcript_with_other_line_ends(path: Path, end: bytes) -> None:
    raw = path.read_bytes()
    whole = decode([raw])
    rewritten = line_ends(raw, end)
    assert decode([rewritten]) == whole
    if len(rewritten) < 20_000:
        assert decode(bytewise(rewritten)) == whole
    step = max(1, len(rewritten) // 150)
    for cut in range(0, len(rewritten) + 1, step):
        assert decode([rewritten[:cut], rewritten[cut:]]) == whole, cut


def test_gemini_fixture_keeps_crlf_and_decodes() -> None:
    raw = (STREAMS / "gemini-sse-text.sse").read_bytes()
    assert b"\r\n\r\n" in raw
    events = decode([raw])
    assert [json.loads(e.data)["candidates"][0]["content"]["parts"][0]["text"] for e in events] == [
        "The",
        " capital of France",
        " is Paris.\n",
    ]


def test_anthropic_fixture_fields() -> None:
    events = decode([(STREAMS / "anthropic-text.sse").read_bytes()])
    assert events[0].event == "message_start"
    assert json.loads(events[0].data)["type"] == "message_start"
    assert [e.event for e in events[-2:]] == ["message_delta", "message_stop"]
    assert all(e.id is None and e.retry is None for e in events)


def test_comments_dropped_in_relay_fixture() -> None:
    events = decode([(STREAMS / "openrouter-chat-midstream-error.sse").read_bytes()])
    assert all(not e.data.startswith("OPENROUTER") for e in events)
    assert events[-1].data == "[DONE]"


@settings(max_examples=100, deadline=None)
@given(
    path=st.sampled_from(SSE_FIXTURES),
    points=st.lists(st.integers(min_value=0, max_value=100_000), max_size=12),
    end=st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
def test_transcript_random_splits(path: Path, points: list[int], end: bytes) -> None:
    raw = line_ends(path.read_bytes(), end)
    assert decode(split_at(raw, points)) == decode([raw])


# --- WHATWG rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"data: a\n\n", [SSEEvent("a")]),
        (b"data:a\n\n", [SSEEvent("a")]),
        (b"data:  a\n\n", [SSEEvent(" a")]),  # only one leading space is removed
        (b"data: a\ndata: b\n\n", [SSEEvent("a\nb")]),
        (b"data\n\n", [SSEEvent("")]),  # field without colon: empty value
        (b"data:\n\n", [SSEEvent("")]),  # a data field makes an event, even empty
        (b"data\ndata\n\n", [SSEEvent("\n")]),
        (b"event: ping\n\n", []),  # no data field: nothing dispatched
        (b": comment\n\n", []),
        (b":\n\n", []),
        (b"data: a\n: comment inside\ndata: b\n\n", [SSEEvent("a\nb")]),
        (b"event: x\ndata: 1\n\n", [SSEEvent("1", event="x")]),
        (b"event:x\nevent:y\ndata: 1\n\n", [SSEEvent("1", event="y")]),
        (b"id: 7\ndata: 1\n\n", [SSEEvent("1", id="7")]),
        (b"id\ndata: 1\n\n", [SSEEvent("1", id="")]),
        (b"id: a\x00b\ndata: 1\n\n", [SSEEvent("1")]),  # id with NUL ignored
        (b"retry: 3000\ndata: 1\n\n", [SSEEvent("1", retry=3000)]),
        (b"retry: 30x\ndata: 1\n\n", [SSEEvent("1")]),
        (b"retry: -1\ndata: 1\n\n", [SSEEvent("1")]),
        (b"retry:\ndata: 1\n\n", [SSEEvent("1")]),
        (b"retry: " + b"9" * 40 + b"\ndata: 1\n\n", [SSEEvent("1")]),
        (b"DATA: a\nEvent: b\nfoo: c\n\n", []),  # field names are case-sensitive
        (b"data: a\r\n\r\n", [SSEEvent("a")]),
        (b"data: a\r\rdata: b\r\r", [SSEEvent("a"), SSEEvent("b")]),
        (b"data: a\n\rdata: b\r\n\n", [SSEEvent("a"), SSEEvent("b")]),
        (b"\xef\xbb\xbfdata: a\n\n", [SSEEvent("a")]),
        (b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n", []),  # only one BOM is stripped
        (b"\n\n\ndata: a\n\n\n\n", [SSEEvent("a")]),
        (b"data: caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x8e\x89\n\n", [SSEEvent("café 日🎉")]),
        (b"data: \xff\xfe\n\n", [SSEEvent("\ufffd\ufffd")]),  # invalid UTF-8 is replaced
        (b"event: \xe6\x97\xa5\ndata: x\n\n", [SSEEvent("x", event="日")]),
        (b"data: a:b: c\n\n", [SSEEvent("a:b: c")]),
    ],
)
def test_whatwg_rules(stream: bytes, expected: list[SSEEvent]) -> None:
    assert decode([stream]) == expected
    assert decode(bytewise(stream)) == expected
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]]) == expected


def test_id_and_retry_belong_to_their_event_and_persist_on_the_decoder() -> None:
    dec = SSEDecoder()
    events = dec.feed(b"id: 1\nretry: 50\ndata: a\n\ndata: b\n\nid\ndata: c\n\n")
    assert events == [SSEEvent("a", id="1", retry=50), SSEEvent("b"), SSEEvent("c", id="")]
    assert dec.last_event_id == ""
    assert dec.reconnection_time == 50
    dec.feed(b"id: 9\n\n")  # no data: nothing dispatched, but the running id moves
    assert dec.last_event_id == "9"


def test_end_dispatches_a_final_event_without_its_blank_line() -> None:
    assert decode([b"data: [DONE]\n"]) == [SSEEvent("[DONE]")]
    assert decode([b"data: [DONE]"]) == [SSEEvent("[DONE]")]
    assert decode([b"event: x\ndata: 1\ndata: 2"]) == [SSEEvent("1\n2", event="x")]
    assert decode([b"event: x\n"]) == []
    assert decode([b""]) == []
    assert decode([]) == []
    assert decode([b"\xef\xbb"]) == []  # a lone BOM prefix is not a field
    assert decode([b"\xef"]) == []


def test_bom_split_across_chunks() -> None:
    assert decode([b"\xef", b"\xbb", b"\xbf", b"data: x\n\n"]) == [SSEEvent("x")]
    assert decode([b"\xef\xbb", b"data: x\n\n"]) == []  # not a BOM: a line "\xef\xbbdata..."


def test_cr_at_chunk_end_then_lf() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\n\r") == [SSEEvent("a")]
    assert dec.feed(b"\n") == []  # the CRLF's LF, not a second blank line
    assert dec.feed(b"data: b\n\n") == [SSEEvent("b")]


def test_utf8_multibyte_split_at_every_byte() -> None:
    text = "héllo 日本語 🎉🎉 ∑"
    stream = b"data: " + text.encode() + b"\n\n"
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]]) == [SSEEvent(text)]
    assert decode(bytewise(stream)) == [SSEEvent(text)]


def test_empty_chunks_are_harmless() -> None:
    assert decode([b"", b"data: a", b"", b"\n", b"", b"\n", b""]) == [SSEEvent("a")]


def test_bytearray_chunks() -> None:
    assert decode([bytearray(b"data: a\n"), bytearray(b"\n")]) == [SSEEvent("a")]


# --- bounds -----------------------------------------------------------------------------------


def test_event_over_the_bound_raises_however_split() -> None:
    stream = b"data: " + b"x" * 200 + b"\n\n"
    for pieces in ([stream], bytewise(stream), [stream[:50], stream[50:]]):
        with pytest.raises(SSEEventTooLarge):
            decode(pieces, max_event_size=100)


def test_many_lines_over_the_bound_raise() -> None:
    stream = b"data: 0123456789\n" * 20 + b"\n"
    with pytest.raises(SSEEventTooLarge):
        decode([stream], max_event_size=100)
    with pytest.raises(SSEEventTooLarge):
        decode(bytewise(stream), max_event_size=100)


def test_events_under_the_bound_pass() -> None:
    stream = (b"data: " + b"x" * 90 + b"\n\n") * 50
    assert len(decode(bytewise(stream), max_event_size=100)) == 50


def test_endless_line_is_refused_early() -> None:
    dec = SSEDecoder(max_event_size=1000)
    fed = 0
    with pytest.raises(SSEEventTooLarge):
        while True:
            dec.feed(b"y" * 7)
            fed += 7
    assert fed <= 1000
    with pytest.raises(SSEError):
        dec.feed(b"\n\n")
    with pytest.raises(SSEError):
        dec.end()


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from([b"data: ", b"data:", b"event: e", b": c", b"", b"id: 1"]).flatmap(
            lambda head: st.binary(max_size=40).map(
                lambda tail: head + tail.replace(b"\n", b"").replace(b"\r", b"")
            )
        ),
        max_size=20,
    ),
    bound=st.integers(min_value=1, max_value=120),
    points=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_whether_the_bound_trips_does_not_depend_on_splits(
    lines: list[bytes], bound: int, points: list[int]
) -> None:
    stream = b"\n".join(lines) + b"\n\n"

    def run(pieces: list[bytes]) -> list[SSEEvent] | str:
        try:
            return decode(pieces, max_event_size=bound)
        except SSEEventTooLarge:
            return "too large"

    one_shot = run([stream])
    assert run(split_at(stream, points)) == one_shot
    assert run(bytewise(stream)) == one_shot


def test_bad_bound() -> None:
    with pytest.raises(ValueError):
        SSEDecoder(max_event_size=0)
    with pytest.raises(ValueError):
        JSONArrayDecoder(max_element_size=0)


# --- encoding ---------------------------------------------------------------------------------


def test_encode_fast_paths() -> None:
    assert encode(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert encode('{"a":"é"}') == 'data: {"a":"é"}\n\n'.encode()
    assert encode(b"x", event="ping") == b"event: ping\ndata: x\n\n"
    assert encode(b"a\nb") == b"data: a\ndata: b\n\n"
    assert encode(b"a\r\nb\rc") == b"data: a\ndata: b\ndata: c\n\n"
    assert encode(b"") == b"data: \n\n"
    assert encode_comment("keep-alive") == b": keep-alive\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"


def test_encode_event_fields() -> None:
    ev = SSEEvent("1\n2", event="x", id="7", retry=10)
    framed = encode_event(ev)
    assert framed == b"event: x\nid: 7\nretry: 10\ndata: 1\ndata: 2\n\n"
    assert decode([framed]) == [ev]
    assert encode_event(SSEEvent("d")) == b"data: d\n\n"


@pytest.mark.parametrize(
    "bad",
    [
        SSEEvent("x", event="a\nb"),
        SSEEvent("x", event="a\rb"),
        SSEEvent("x", id="1\n"),
        SSEEvent("x", id="1\x00"),
        SSEEvent("x", retry=-1),
    ],
)
def test_encode_refuses_what_cannot_be_framed(bad: SSEEvent) -> None:
    with pytest.raises(SSEError):
        encode_event(bad)


def test_encode_refuses_bad_event_name() -> None:
    with pytest.raises(SSEError):
        encode(b"x", event="a\nb")


_field_text = st.text(st.characters(exclude_characters="\r\n\x00", exclude_categories=("Cs",)))
_events = st.builds(
    SSEEvent,
    data=st.text(st.characters(exclude_characters="\r", exclude_categories=("Cs",))),
    event=_field_text,
    id=st.none() | _field_text,
    retry=st.none() | st.integers(min_value=0, max_value=10**18 - 1),
)


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(_events, max_size=12),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10),
    end=st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
def test_encoded_events_decode_to_themselves_however_split(
    events: list[SSEEvent], points: list[int], end: bytes
) -> None:
    stream = line_ends(b"".join(encode_event(e) for e in events), end)
    assert decode(split_at(stream, points)) == events


@settings(max_examples=100, deadline=None)
@given(data=st.text(st.characters(exclude_categories=("Cs",))))
def test_cr_in_data_comes_back_as_lf(data: str) -> None:
    expected = data.replace("\r\n", "\n").replace("\r", "\n")
    assert decode([encode(data)]) == [SSEEvent(expected)]


# --- JSON-array streams ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ARRAY_FIXTURES, ids=lambda p: p.name)
def test_gemini_json_array_fixture(path: Path) -> None:
    raw = path.read_bytes()
    expected = json.loads(raw)
    assert decode_array([raw]) == expected
    assert decode_array(bytewise(raw)) == expected
    for cut in range(len(raw) + 1):
        assert decode_array([raw[:cut], raw[cut:]]) == expected


def test_json_array_elements_come_out_as_soon_as_complete() -> None:
    dec = JSONArrayDecoder()
    assert dec.feed(b'[{"a": 1}') == [{"a": 1}]
    assert dec.feed(b"\n,\r\n") == []
    assert dec.feed(b'{"b": "x]}\\"{"') == []
    assert dec.feed(b"}") == [{"b": 'x]}"{'}]
    assert dec.feed(b"]") == []
    assert dec.end() == []


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"[]", []),
        (b"  [ ]  ", []),
        (b"[1, 2.5, -3e2, true, false, null]", [1, 2.5, -300.0, True, False, None]),
        (b'["a", "b\\\\", "c\\"]"]', ["a", "b\\", 'c"]']),
        (b'[[1, [2]], {"x": [{"y": "}"}]}]', [[1, [2]], {"x": [{"y": "}"}]}]),
        (b'[{"t": "\xe6\x97\xa5\xf0\x9f\x8e\x89"}]', [{"t": "日🎉"}]),
        (b'[{"a":"\\u005d"}]', [{"a": "]"}]),
    ],
)
def test_json_array_shapes(stream: bytes, expected: list[object]) -> None:
    assert decode_array([stream]) == expected
    assert decode_array(bytewise(stream)) == expected
    for cut in range(len(stream) + 1):
        assert decode_array([stream[:cut], stream[cut:]]) == expected


@pytest.mark.parametrize(
    "stream",
    [
        b'{"error": {}}',  # an object, not an array
        b"x[]",
        b"[1,]",
        b"[,1]",
        b"[1 2]",
        b"[1]]",
        b"[1] x",
        b'[{"a": }]',
        b"[{]",
        b"[tru]",
        b"[}",
        b"[:",
    ],
)
def test_json_array_malformed(stream: bytes) -> None:
    with pytest.raises(JSONArrayError):
        decode_array([stream])
    with pytest.raises(JSONArrayError):
        decode_array(bytewise(stream))


@pytest.mark.parametrize("stream", [b"", b"  ", b"[", b'[{"a": 1}', b'[{"a": 1},', b'[{"a": "'])
def test_json_array_truncated(stream: bytes) -> None:
    with pytest.raises(JSONArrayError):
        decode_array([stream])


def test_json_array_decoder_is_spent_after_an_error() -> None:
    dec = JSONArrayDecoder()
    with pytest.raises(JSONArrayError):
        dec.feed(b"nope")
    with pytest.raises(SSEError):
        dec.feed(b"[]")
    with pytest.raises(SSEError):
        dec.end()


def test_json_array_bound() -> None:
    big = b'[{"a": "' + b"x" * 500 + b'"}]'
    with pytest.raises(SSEEventTooLarge):
        decode_array([big], max_element_size=100)
    with pytest.raises(SSEEventTooLarge):
        decode_array(bytewise(big), max_element_size=100)
    small = b"[" + b",".join([b'{"a": 1}'] * 200) + b"]"
    assert len(decode_array(bytewise(small), max_element_size=100)) == 200


def test_json_array_memory_holds_only_the_pending_element() -> None:
    dec = JSONArrayDecoder(max_element_size=64)
    dec.feed(b"[")
    for _ in range(1000):
        dec.feed(b'{"k": "v"}, ')
    assert len(dec._buf) < 64


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    elements=st.lists(_json_values, max_size=6),
    separator=st.sampled_from([",", "\n,\r\n", " , ", ",\n"]),
    indent=st.sampled_from([None, 2]),
    points=st.lists(st.integers(min_value=0, max_value=5000), max_size=10),
)
def test_json_array_roundtrip_any_split(
    elements: list[object], separator: str, indent: int | None, points: list[int]
) -> None:
    body = "[" + separator.join(json.dumps(e, indent=indent) for e in elements) + "]"
    raw = body.encode()
    assert decode_array(split_at(raw, points)) == elements
