"""Fuzz target for the ConverseStream reader (twproto.bedrock.converse, docs/bedrock.md): any
event-stream input — ConverseStream events with payloads of any shape, valid answers with a byte
changed, cut or inserted, exception frames, byte soup — is reframed without raising, the same
however it is split; what comes out is Anthropic SSE that the gateway's Anthropic stream
translator reads without raising; and once an error event is written nothing follows it.

Under pytest these are Hypothesis properties; run as a script they go to atheris::

    python -m tests.fuzz.test_fuzz_converse [atheris/libFuzzer options]
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.test_fuzz_parsers import split
from tests.twproto.test_bedrock_converse import stream_frames
from twproto import Dialect, new_stream_translator
from twproto.bedrock.converse import ConverseStreamReframer
from twproto.eventstream import eventstream_event, eventstream_exception

_EVENT_TYPES = st.sampled_from(
    [
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
        "somethingNew",
    ]
)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "contentBlockIndex",
                    "delta",
                    "start",
                    "toolUse",
                    "text",
                    "input",
                    "reasoningContent",
                    "signature",
                    "redactedContent",
                    "stopReason",
                    "usage",
                    "inputTokens",
                    "toolUseId",
                    "name",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
_EVENTS = st.lists(
    st.tuples(
        _EVENT_TYPES, st.one_of(_JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=20))
    ),
    min_size=1,
    max_size=8,
).map(lambda events: b"".join(eventstream_event(t, p) for t, p in events))
_VALID = b"".join(stream_frames(["Hel", "lo"], ['{"a":', "1}"], "hm"))
_THROTTLED = eventstream_exception("throttlingException", b'{"message":"Too many requests"}')


@st.composite
def _damaged(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from([_VALID, _VALID[:300] + _THROTTLED])))
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


def reframe_target(pieces: list[bytes]) -> bytes:
    """Reframe the pieces; the SSE out, which the Anthropic translator must read."""
    reframer = ConverseStreamReframer(model="anthropic.claude")
    out = b"".join(reframer.feed(p, now=5.0) for p in pieces) + reframer.end()
    translator = new_stream_translator(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    translator.feed(out)
    translator.end()
    if b"event: error" in out:
        assert out.count(b"event: error") == 1
        assert out.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].startswith(b"event: error")
    return out


def check(data: bytes, points: list[int]) -> None:
    assert reframe_target(split(data, points)) == reframe_target([data])


_INPUTS = st.one_of(_EVENTS, _damaged(), st.binary(max_size=200))
_SPLITS = st.lists(st.integers(min_value=0, max_value=3000), max_size=10)


@settings(max_examples=400, deadline=None)
@given(data=_INPUTS, points=_SPLITS)
def test_converse_stream_reframes_anything_without_raising(data: bytes, points: list[int]) -> None:
    check(data, points)


# --- atheris ------------------------------------------------------------------------------------


def _atheris_one_input(data: bytes) -> None:  # pragma: no cover - run by atheris only
    import atheris  # type: ignore[import-not-found]

    fdp = atheris.FuzzedDataProvider(data)
    points = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    events = []
    for _ in range(fdp.ConsumeIntInRange(1, 6)):
        name = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(1, 20)) or "x"
        events.append(eventstream_event(name, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 100))))
    check(b"".join(events) + fdp.ConsumeBytes(fdp.remaining_bytes()), points)


def main() -> None:  # pragma: no cover - manual use
    from tests.fuzz.test_fuzz_parsers import fuzz_main

    fuzz_main(__file__, _atheris_one_input)


if __name__ == "__main__":
    main()
