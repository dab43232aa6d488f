"""Fuzz target for the AWS event-stream decoder (docs/bedrock.md): it decodes, or raises its one
typed error with a registered message code; however the input is split the outcome is the same;
whatever it accepts re-encodes to the very bytes it read; and no decoded message makes the
exception classifier raise.

Random bytes almost never pass a CRC-32, so most inputs are built to reach past the checksums:
frames with correct checksums around header blocks made of the tokens the header parser
branches on, valid messages with a byte changed, cut or inserted, and plain byte soup. Under
pytest these are Hypothesis properties; run as a script they go to atheris::

    python -m tests.fuzz.test_fuzz_eventstream [atheris/libFuzzer options]
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.test_fuzz_parsers import split
from tests.support.converse_stream import converse_stream
from twengine.codes import CODES
from twproto import Failure
from twproto.eventstream import (
    EventStreamDecoder,
    EventStreamError,
    EventStreamMessage,
    classify_eventstream_message,
    encode_eventstream_message,
    eventstream_exception,
)

NOW = 1_750_000_000.0


def frame(headers: bytes, payload: bytes) -> bytes:
    """A message around any header block, with both checksums right."""
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


# --- the target (shared by Hypothesis and atheris) ---------------------------------------------


def decode_target(pieces: list[bytes], bound: int) -> tuple[list[EventStreamMessage], str | None]:
    """Decode the pieces; the messages, and the error's class, code and text if one was raised."""
    dec = EventStreamDecoder(max_message_size=bound)
    out: list[EventStreamMessage] = []
    error = None
    try:
        for piece in pieces:
            out += dec.feed(piece)
            assert dec.buffered <= max(bound, len(piece)) + len(piece)
        dec.end()
    except EventStreamError as exc:
        assert exc.code in CODES and exc.error_status_hint == 502, exc
        error = f"{type(exc).__name__} {exc.code} {exc}"
    for message in out:
        assert isinstance(message, EventStreamMessage)
        outcome = classify_eventstream_message(message, now=NOW)
        assert outcome is None or isinstance(outcome, Failure)
    if error is None:
        data = b"".join(pieces)
        again = b"".join(encode_eventstream_message(m.headers, m.payload) for m in out)
        assert again == data
    return out, error


def check(data: bytes, points: list[int], bound: int) -> None:
    assert decode_target(split(data, points), bound) == decode_target([data], bound)


# --- Hypothesis ----------------------------------------------------------------------------------

_HEADER_TOKENS = st.sampled_from(
    [
        b"\x00",
        b"\x01",
        b"\x02",
        b"\x03",
        b"\x05",
        b"\x06",
        b"\x07",
        b"\x08",
        b"\x09",
        b"\x0a",
        b"\xff",
        b"\x00\x02",
        b"\x00\x10",
        b"\x7f\xff",
        b"\x0d:message-type",
        b"\x0f:exception-type",
        b"\x0b:event-type",
        b"\x07\x00\x09exception",
        b"\x07\x00\x05event",
        b"\x07\x00\x13throttlingException",
        b"\xc3\x28",
        b"\xe6\x97\xa5",
        b"abc",
        bytes(16),
    ]
)
_HEADER_BLOCKS = st.lists(_HEADER_TOKENS, max_size=24).map(b"".join)
_PAYLOADS = st.one_of(
    st.binary(max_size=60),
    st.sampled_from([b'{"message":"Too many requests"}', b"{}", b"[]", b"null", b'"x"']),
)
_FRAMED = st.lists(st.tuples(_HEADER_BLOCKS, _PAYLOADS), min_size=1, max_size=4).map(
    lambda parts: b"".join(frame(h, p) for h, p in parts)
)
_VALID = [
    b"".join(converse_stream(3)),
    eventstream_exception("throttlingException", b'{"message":"Too many requests"}'),
    eventstream_exception("validationException", b'{"message":"Input is too long"}'),
]


@st.composite
def _damaged(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from(_VALID)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif action == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


_INPUTS = st.one_of(_FRAMED, _damaged(), st.binary(max_size=300))
_SPLITS = st.lists(st.integers(min_value=0, max_value=2000), max_size=10)
_BOUNDS = st.one_of(st.just(1 << 20), st.integers(min_value=16, max_value=400))


@settings(max_examples=400, deadline=None)
@given(data=_INPUTS, points=_SPLITS, bound=_BOUNDS)
def test_eventstream_decoder_decodes_or_raises_its_error(
    data: bytes, points: list[int], bound: int
) -> None:
    check(data, points, bound)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.tuples(_HEADER_BLOCKS, _PAYLOADS), min_size=1, max_size=3))
def test_header_blocks_are_read_or_refused_alike_in_any_stream_position(
    parts: list[tuple[bytes, bytes]],
) -> None:
    """A header block decodes the same (or fails the same way) whatever came before it, so the
    table of remembered header blocks can never serve a stale answer."""
    singles = [decode_target([frame(h, p)], 1 << 20) for h, p in parts]
    together, error = decode_target([b"".join(frame(h, p) for h, p in parts)], 1 << 20)
    expected: list[EventStreamMessage] = []
    for messages, single_error in singles:
        if single_error is not None:
            assert (
                error is not None
                and error.split(" at offset")[0] == single_error.split(" at offset")[0]
            )
            break
        expected += messages
    assert together == expected


# --- atheris ------------------------------------------------------------------------------------


def _atheris_one_input(data: bytes) -> None:  # pragma: no cover - run by atheris only
    import atheris  # type: ignore[import-not-found]

    fdp = atheris.FuzzedDataProvider(data)
    framed = fdp.ConsumeBool()
    bound = 1 << 20 if fdp.ConsumeBool() else fdp.ConsumeIntInRange(16, 4096)
    points = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    if framed:
        parts = []
        for _ in range(fdp.ConsumeIntInRange(1, 4)):
            headers = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))
            parts.append(frame(headers, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 100))))
        rest = b"".join(parts)
    else:
        rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    check(rest, points, bound)


def main() -> None:  # pragma: no cover - manual use
    from tests.fuzz.test_fuzz_parsers import fuzz_main

    fuzz_main(__file__, _atheris_one_input)


if __name__ == "__main__":
    main()
