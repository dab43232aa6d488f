"""The AWS event-stream codec (docs/bedrock.md): published vectors, botocore as the reference
parser, Hypothesis properties (round trip, any split, every flipped bit caught), the bounds and
the classification of exception frames."""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from pathlib import Path

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.converse_stream import converse_stream
from twengine.codes import CODES
from twproto import FailureKind
from twproto.eventstream import (
    EVENTSTREAM_MAX_HEADERS_SIZE,
    EVENTSTREAM_MAX_MESSAGE_SIZE,
    EventStreamCorrupt,
    EventStreamDecoder,
    EventStreamError,
    EventStreamHeader,
    EventStreamHeaderType,
    EventStreamMessage,
    EventStreamTooLarge,
    EventStreamTruncated,
    classify_eventstream_message,
    encode_eventstream_message,
    eventstream_event,
    eventstream_exception,
)

T = EventStreamHeaderType
NOW = 1_750_000_000.0
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"


def decode(data: bytes, pieces: list[bytes] | None = None, **kw: int) -> list[EventStreamMessage]:
    dec = EventStreamDecoder(**kw)
    out: list[EventStreamMessage] = []
    for piece in pieces if pieces is not None else [data]:
        out += dec.feed(piece)
    dec.end()
    return out


def frame(headers: bytes, payload: bytes) -> bytes:
    """A message around a raw header block, checksums right: for headers the encoder refuses."""
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def botocore_messages(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buf = EventStreamBuffer()
    buf.add_data(data)
    return [(m.headers, m.payload) for m in buf]


# --- published vectors ------------------------------------------------------------------------

# The AWS event-stream test suite (aws-c-event-stream, repeated by the SDKs): a message with
# no headers and no payload, and one with a content-type header and the payload {'foo':'bar'}.
EMPTY = bytes.fromhex("000000100000000005c248eb7d98c8ff")
ONE_HEADER = bytes.fromhex(
    "0000003d0000002007fd83960c636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e"
    "7b27666f6f273a27626172277d8d9c08b1"
)


def test_published_vectors_decode() -> None:
    assert decode(EMPTY) == [EventStreamMessage((), b"")]
    assert decode(ONE_HEADER) == [
        EventStreamMessage(
            (EventStreamHeader("content-type", T.STRING, "application/json"),), b"{'foo':'bar'}"
        )
    ]


def test_published_vectors_encode_to_the_same_bytes() -> None:
    assert encode_eventstream_message([], b"") == EMPTY
    content = EventStreamHeader.string("content-type", "application/json")
    assert encode_eventstream_message([content], b"{'foo':'bar'}") == ONE_HEADER


def test_recorded_throttling_frame() -> None:
    """The fixture's frame headers and payload, framed, read alike by botocore and by us, and
    classified as a rate limit."""
    case = json.loads(
        (
            FIXTURES / "errors" / "bedrock-converse-stream-throttling-exception-event.json"
        ).read_text()
    )
    headers = [EventStreamHeader.string(k, v) for k, v in case["headers"].items()]
    data = encode_eventstream_message(headers, case["body"].encode())
    (msg,) = decode(data)
    assert botocore_messages(data) == [(case["headers"], case["body"].encode())]
    assert msg.message_type == "exception"
    assert msg.exception_type == "throttlingException"
    failure = classify_eventstream_message(msg, now=NOW)
    assert failure is not None
    assert failure.kind is FailureKind.RATE_LIMITED
    assert failure.failover and failure.status is None
    assert failure.message.startswith("Too many requests")


ALL_TYPES = (
    EventStreamHeader("true", T.TRUE, True),
    EventStreamHeader("false", T.FALSE, False),
    EventStreamHeader("byte", T.BYTE, -128),
    EventStreamHeader("short", T.SHORT, 32767),
    EventStreamHeader("integer", T.INTEGER, -(2**31)),
    EventStreamHeader("long", T.LONG, 2**63 - 1),
    EventStreamHeader("bytes", T.BYTES, b"\x00\xffraw"),
    EventStreamHeader("string", T.STRING, "日本 ✓"),
    EventStreamHeader("timestamp", T.TIMESTAMP, 1_750_000_000_123),
    EventStreamHeader("uuid", T.UUID, bytes(range(16))),
)


def test_every_header_type_round_trips_and_botocore_agrees() -> None:
    data = encode_eventstream_message(ALL_TYPES, b"payload")
    assert decode(data) == [EventStreamMessage(ALL_TYPES, b"payload")]
    ((theirs, payload),) = botocore_messages(data)
    assert payload == b"payload"
    assert theirs == {h.name: h.value for h in ALL_TYPES}


def test_converse_stream_reads_alike_in_botocore_and_here() -> None:
    data = b"".join(converse_stream(50))
    ours = [({h.name: h.value for h in m.headers}, m.payload) for m in decode(data)]
    assert ours == botocore_messages(data)
    assert [m[0][":event-type"] for m in ours[:2]] == ["messageStart", "contentBlockDelta"]
    assert json.loads(ours[1][1])["delta"]["text"] == "The "


# --- Hypothesis properties ---------------------------------------------------------------------

_NAMES = st.text(min_size=1, max_size=12).filter(lambda s: len(s.encode()) <= 255)


def _int_header(t: EventStreamHeaderType, bits: int) -> st.SearchStrategy[EventStreamHeader]:
    values = st.integers(min_value=-(1 << (bits - 1)), max_value=(1 << (bits - 1)) - 1)
    return st.builds(EventStreamHeader, _NAMES, st.just(t), values)


_HEADER = st.one_of(
    st.builds(EventStreamHeader, _NAMES, st.just(T.TRUE), st.just(True)),
    st.builds(EventStreamHeader, _NAMES, st.just(T.FALSE), st.just(False)),
    _int_header(T.BYTE, 8),
    _int_header(T.SHORT, 16),
    _int_header(T.INTEGER, 32),
    _int_header(T.LONG, 64),
    _int_header(T.TIMESTAMP, 64),
    st.builds(EventStreamHeader, _NAMES, st.just(T.BYTES), st.binary(max_size=40)),
    st.builds(EventStreamHeader, _NAMES, st.just(T.STRING), st.text(max_size=40)),
    st.builds(EventStreamHeader, _NAMES, st.just(T.UUID), st.binary(min_size=16, max_size=16)),
)
_MESSAGE = st.builds(
    EventStreamMessage,
    st.lists(_HEADER, max_size=6, unique_by=lambda h: h.name).map(tuple),
    st.binary(max_size=200),
)
_SPLITS = st.lists(st.integers(min_value=0, max_value=5000), max_size=12)


def split(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def _encode_all(messages: list[EventStreamMessage]) -> bytes:
    return b"".join(encode_eventstream_message(m.headers, m.payload) for m in messages)


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=5))
def test_round_trip(messages: list[EventStreamMessage]) -> None:
    data = _encode_all(messages)
    assert decode(data) == messages
    assert botocore_messages(data) == [
        ({h.name: h.value for h in m.headers}, m.payload) for m in messages
    ]


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=5), points=_SPLITS)
def test_any_split_gives_the_same_messages(
    messages: list[EventStreamMessage], points: list[int]
) -> None:
    data = _encode_all(messages)
    assert decode(data, split(data, points)) == messages


def _outcome(pieces: list[bytes]) -> tuple[list[EventStreamMessage], str | None]:
    dec = EventStreamDecoder()
    out: list[EventStreamMessage] = []
    try:
        for piece in pieces:
            out += dec.feed(piece)
        dec.end()
    except EventStreamError as exc:
        return out, f"{type(exc).__name__} {exc.code} {exc}"
    return out, None


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=4),
    position=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
    points=_SPLITS,
)
def test_every_flipped_bit_is_caught_at_the_same_place_however_split(
    messages: list[EventStreamMessage], position: int, bit: int, points: list[int]
) -> None:
    data = bytearray(_encode_all(messages))
    at = position % len(data)
    data[at] ^= 1 << bit
    broken = bytes(data)
    whole = _outcome([broken])
    assert whole == _outcome(split(broken, points))
    decoded, error = whole
    # Everything before the damaged message comes out intact; the damaged one never does.
    sizes = (len(encode_eventstream_message(m.headers, m.payload)) for m in messages)
    ends = list(itertools.accumulate(sizes))
    damaged = next(i for i, end in enumerate(ends) if at < end)
    assert decoded == messages[:damaged]
    assert error is not None and error.startswith(
        "EventStreamCorrupt gw.upstream.eventstream_corrupt"
    )


# --- errors and bounds -------------------------------------------------------------------------


def test_a_bad_message_checksum_is_corrupt() -> None:
    data = bytearray(ONE_HEADER)
    data[-1] ^= 1
    with pytest.raises(EventStreamCorrupt, match="message checksum") as info:
        decode(bytes(data))
    assert info.value.code == "gw.upstream.eventstream_corrupt"
    assert info.value.error_status_hint == 502


def test_a_bad_prelude_is_refused_before_the_rest_arrives() -> None:
    data = bytearray(ONE_HEADER)
    data[3] ^= 0x40  # total length
    dec = EventStreamDecoder()
    with pytest.raises(EventStreamCorrupt, match="prelude checksum"):
        dec.feed(bytes(data[:12]))


def test_an_oversized_message_is_refused_from_its_prelude() -> None:
    """A prelude declaring 4 GiB is refused as soon as its 12 bytes are in: nothing is kept."""
    prelude = struct.pack(">II", 0xFFFFFFF0, 0)
    head = prelude + struct.pack(">I", zlib.crc32(prelude))
    dec = EventStreamDecoder()
    with pytest.raises(EventStreamTooLarge, match="larger than the limit of 1048576") as info:
        dec.feed(head)
    assert info.value.code == "gw.upstream.eventstream_too_large"
    assert dec.buffered == 0
    with pytest.raises(EventStreamTooLarge):
        dec.feed(b"more")  # spent: the same error again


def test_the_bound_is_the_whole_message() -> None:
    fits = eventstream_event("chunk", b"x" * 1000)
    assert decode(fits, max_message_size=len(fits)) == decode(fits)
    with pytest.raises(EventStreamTooLarge):
        decode(fits, max_message_size=len(fits) - 1)
    assert EVENTSTREAM_MAX_MESSAGE_SIZE == 1 << 20


def test_headers_over_128_kib_are_too_large() -> None:
    block = b"".join(
        bytes((3,)) + b"h%02d" % i + bytes((6,)) + (30000).to_bytes(2, "big") + b"v" * 30000
        for i in range(5)
    )
    assert len(block) > EVENTSTREAM_MAX_HEADERS_SIZE
    with pytest.raises(EventStreamTooLarge, match="headers"):
        decode(frame(block, b""), max_message_size=1 << 22)


def test_bytes_fed_one_at_a_time_stay_bounded() -> None:
    data = b"".join(converse_stream(20))
    dec = EventStreamDecoder()
    out: list[EventStreamMessage] = []
    most = 0
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
        most = max(most, dec.buffered)
    dec.end()
    assert out == decode(data)
    assert most < max(len(f) for f in converse_stream(20))


@settings(max_examples=100, deadline=None)
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=4), points=_SPLITS)
def test_each_message_comes_out_with_the_piece_that_completes_it(
    messages: list[EventStreamMessage], points: list[int]
) -> None:
    # A decoder waiting for the rest of a message only appends what arrives; it must still
    # hand the message out with the piece holding its last byte, never later.
    data = _encode_all(messages)
    ends = list(
        itertools.accumulate(
            len(encode_eventstream_message(m.headers, m.payload)) for m in messages
        )
    )
    dec = EventStreamDecoder()
    seen = 0
    count = 0
    for piece in split(data, points):
        seen += len(piece)
        count += len(dec.feed(piece))
        assert count == sum(1 for e in ends if e <= seen)
        assert dec.buffered == seen - max([0, *(e for e in ends if e <= seen)])
    dec.end()


def test_an_unfinished_message_at_the_end_is_truncated() -> None:
    dec = EventStreamDecoder()
    assert dec.feed(ONE_HEADER + ONE_HEADER[:20]) == decode(ONE_HEADER)
    with pytest.raises(EventStreamTruncated, match="20 bytes of it at offset 61") as info:
        dec.end()
    assert info.value.code == "gw.upstream.eventstream_truncated"
    with pytest.raises(EventStreamTruncated):
        dec.end()


def test_messages_before_a_fault_come_out_first() -> None:
    """A chunk with good messages and then a bad one: the good ones are returned, the next
    call raises."""
    bad = bytearray(ONE_HEADER)
    bad[-1] ^= 1
    dec = EventStreamDecoder()
    assert len(dec.feed(ONE_HEADER + EMPTY + bytes(bad))) == 2
    with pytest.raises(EventStreamCorrupt, match="offset 77"):
        dec.end()
    with pytest.raises(EventStreamCorrupt):
        dec.feed(EMPTY)


@pytest.mark.parametrize(
    ("block", "match"),
    [
        (b"\x01a\x0a", "unknown value type 10"),
        (b"\x01a\x00\x01a\x01", "appears twice"),
        (b"\x01a\x04\x00\x00", "runs past"),
        (b"\x01a\x07\x00\x05ab", "runs past"),
        (b"\x05ab", "runs past"),
        (b"\x00\x00", "empty name"),
        (b"\x01\xff\x00", "not UTF-8"),
        (b"\x01a\x07\x00\x02\xc3\x28", "not UTF-8"),
        (b"\x01a\x09" + bytes(15), "runs past"),
    ],
)
def test_unreadable_headers_are_corrupt(block: bytes, match: str) -> None:
    with pytest.raises(EventStreamCorrupt, match=match):
        decode(frame(block, b"{}"))


def test_impossible_lengths_are_corrupt() -> None:
    prelude = struct.pack(">II", 20, 10)  # 10 bytes of headers in a 20-byte message
    head = prelude + struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(EventStreamCorrupt, match="impossible lengths"):
        EventStreamDecoder().feed(head)


def test_foreign_buffers_are_copied() -> None:
    buf = bytearray(ONE_HEADER[:30])
    dec = EventStreamDecoder()
    assert dec.feed(memoryview(buf)) == []
    buf[:] = bytes(30)  # the caller reuses its read buffer
    assert dec.feed(ONE_HEADER[30:]) == decode(ONE_HEADER)


@pytest.mark.parametrize(
    "header",
    [
        EventStreamHeader("", T.STRING, "x"),
        EventStreamHeader("n" * 256, T.STRING, "x"),
        EventStreamHeader("b", T.BYTE, 128),
        EventStreamHeader("b", T.INTEGER, True),
        EventStreamHeader("t", T.TRUE, False),
        EventStreamHeader("u", T.UUID, b"short"),
        EventStreamHeader("s", T.STRING, b"bytes"),
        EventStreamHeader("s", T.BYTES, "text"),
        EventStreamHeader("s", T.STRING, "x" * 40000),
    ],
)
def test_the_encoder_refuses_what_cannot_be_framed(header: EventStreamHeader) -> None:
    with pytest.raises(EventStreamError, match="cannot encode") as info:
        encode_eventstream_message([header], b"")
    assert info.value.error_status_hint == 500


def test_the_encoder_refuses_duplicate_names() -> None:
    h = EventStreamHeader.string("a", "1")
    with pytest.raises(EventStreamError, match="twice"):
        encode_eventstream_message([h, h], b"")


def test_every_error_code_is_registered() -> None:
    for cls in (EventStreamError, EventStreamCorrupt, EventStreamTooLarge, EventStreamTruncated):
        assert cls.code in CODES, cls


def test_invalid_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        EventStreamDecoder(max_message_size=15)


# --- classification ------------------------------------------------------------------------------

K = FailureKind


def _exception(name: str, body: object) -> EventStreamMessage:
    (msg,) = decode(eventstream_exception(name, json.dumps(body).encode()))
    return msg


# Names from the ConverseStream / InvokeModelWithResponseStream references; messages as Bedrock
# words them (the ones in quotes of public reports), each with the kind it must give.
CASES = [
    ("throttlingException", "Too many requests, please wait before trying again.", K.RATE_LIMITED),
    # A daily token quota is a quota, not a short rate limit.
    (
        "throttlingException",
        "Too many tokens per day, please wait before trying again.",
        K.QUOTA_USED_UP,
    ),
    ("serviceUnavailableException", "Bedrock is unable to process your request.", K.OVERLOADED),
    ("internalServerException", "The server encountered an internal error.", K.SERVER),
    ("modelStreamErrorException", "Model stream error occurred.", K.SERVER),
    ("validationException", "Input is too long for requested model.", K.CONTEXT_OVERFLOW),
    (
        "validationException",
        "The model returned the following errors: "
        "prompt is too long: 200049 tokens > 200000 maximum",
        K.CONTEXT_OVERFLOW,
    ),
    ("validationException", "too many total text bytes", K.CONTEXT_OVERFLOW),
    (
        "validationException",
        "Malformed input request: #: extraneous key [foo] is not permitted, "
        "please reformat your input and try again.",
        K.CLIENT_ERROR,
    ),
    ("validationException", "The provided model identifier is invalid.", K.MODEL_UNAVAILABLE),
    (
        "accessDeniedException",
        "User: arn:aws:iam::123456789012:user/gw is not authorized to perform: "
        "bedrock:InvokeModelWithResponseStream on resource: "
        "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-sonnet-20240620-v1:0",
        K.AUTH_REJECTED,
    ),
    # Model access not granted to the account: the credentials are fine, this model is not.
    (
        "accessDeniedException",
        "You don't have access to the model with the specified model ID.",
        K.MODEL_UNAVAILABLE,
    ),
]


@pytest.mark.parametrize(("name", "text", "kind"), CASES)
def test_exception_frames_are_classified(name: str, text: str, kind: FailureKind) -> None:
    failure = classify_eventstream_message(_exception(name, {"message": text}), now=NOW)
    assert failure is not None
    assert failure.kind is kind, failure.rule
    assert failure.message == text
    assert failure.error_type == name


def test_temporary_exceptions_are_retried() -> None:
    for name in (
        "serviceUnavailableException",
        "internalServerException",
        "modelStreamErrorException",
    ):
        failure = classify_eventstream_message(_exception(name, {"message": "x"}), now=NOW)
        assert failure is not None and failure.temporary and failure.failover, name


def test_model_stream_error_with_original_status() -> None:
    body = {"message": "Stream error", "originalStatusCode": 424, "originalMessage": "boom"}
    failure = classify_eventstream_message(_exception("modelStreamErrorException", body), now=NOW)
    assert failure is not None and failure.kind is K.SERVER


def test_error_messages_are_classified_from_their_headers() -> None:
    data = encode_eventstream_message(
        [
            EventStreamHeader.string(":error-code", "InternalFailure"),
            EventStreamHeader.string(":error-message", "An internal error occurred"),
            EventStreamHeader.string(":message-type", "error"),
        ],
        b"",
    )
    (msg,) = decode(data)
    failure = classify_eventstream_message(msg, now=NOW)
    assert failure is not None and failure.kind is K.SERVER
    assert failure.message == "An internal error occurred"


def test_events_are_not_failures() -> None:
    for msg in decode(b"".join(converse_stream(3))):
        assert classify_eventstream_message(msg, now=NOW) is None
    assert classify_eventstream_message(EventStreamMessage((), b""), now=NOW) is None


@pytest.mark.parametrize("payload", [b"not json", b"", b"[1,2]", b"\xff\xfe", b'"text"'])
def test_odd_exception_payloads_do_not_raise(payload: bytes) -> None:
    (msg,) = decode(eventstream_exception("throttlingException", payload))
    failure = classify_eventstream_message(msg, now=NOW)
    assert failure is not None and failure.kind is K.RATE_LIMITED


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=4), bound=st.integers(16, 400), points=_SPLITS
)
def test_the_bound_gives_the_same_outcome_however_split(
    messages: list[EventStreamMessage], bound: int, points: list[int]
) -> None:
    data = _encode_all(messages)

    def run(pieces: list[bytes]) -> tuple[list[EventStreamMessage], str | None]:
        dec = EventStreamDecoder(max_message_size=bound)
        out: list[EventStreamMessage] = []
        try:
            for piece in pieces:
                out += dec.feed(piece)
            dec.end()
        except EventStreamTooLarge as exc:
            return out, str(exc)
        return out, None

    whole = run([data])
    assert run(split(data, points)) == whole
    fitting = list(
        itertools.takewhile(
            lambda m: len(encode_eventstream_message(m.headers, m.payload)) <= bound, messages
        )
    )
    assert whole[0] == fitting
    assert (whole[1] is None) == (fitting == messages)
