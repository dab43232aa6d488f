"""`UpstreamStream`: the opening hold hands over to a translator without decoding the held bytes
again, and what the client gets is exactly what a translator fed the whole stream gives.

Every recorded stream, to every client format, fed whole, byte by byte and at Hypothesis-chosen
splits; plus CR line ends, an end that decides, and the hold's limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.twproto.conftest import DIALECTS, FIXTURES, bytewise, fixture_dialect, pieces
from twproto.dialect import Dialect
from twproto.sse import SSEDecoder
from twproto.stream import (
    CollectedStream,
    ConvertedStream,
    FailedBeforeContent,
    FirstContent,
    Holding,
    RelayedStream,
    UpstreamStream,
    new_stream_translator,
)

STREAMS = sorted(p for p in (FIXTURES / "streams").iterdir() if p.suffix in (".sse", ".json"))
NOW = 1_700_000_000.0


def _kw(path: Path, client: Dialect) -> dict[str, Any]:
    return {
        "client_model": "client-model",
        "upstream_sse": path.suffix == ".sse",
        "client_sse": True,
        "created": 7,
    }


def _through_stream(
    upstream: Dialect, client: Dialect, chunks: list[bytes], **kw: Any
) -> tuple[str, bytes, Any]:
    """Feed `chunks` through an UpstreamStream and then its translator."""
    stream = UpstreamStream(upstream, client, **kw)
    out: list[bytes] = []
    translator = None
    for chunk in chunks:
        if translator is not None:
            out.append(translator.feed(chunk))
            continue
        outcome = stream.feed(chunk, now=NOW)
        if isinstance(outcome, FailedBeforeContent):
            return "failed", b"", outcome.failure.kind
        if isinstance(outcome, FirstContent):
            out.append(outcome.data)
            translator = outcome.translator
        else:
            assert isinstance(outcome, Holding)
    if translator is None:
        ending = stream.end(now=NOW)
        if isinstance(ending, FailedBeforeContent):
            return "failed", b"", ending.failure.kind
        out.append(ending.data)
        translator = ending.translator
    out.append(translator.end())
    return "content", b"".join(out), (translator.finished, translator.usage, translator.dropped)


def _fresh(upstream: Dialect, client: Dialect, data: bytes, **kw: Any) -> tuple[bytes, Any]:
    translator = new_stream_translator(upstream, client, **kw)
    out = translator.feed(data) + translator.end()
    return out, (translator.finished, translator.usage, translator.dropped)


@pytest.mark.parametrize("client", DIALECTS, ids=str)
@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
def test_hand_over_matches_one_translator(path: Path, client: Dialect) -> None:
    upstream = fixture_dialect(path.name)
    data = path.read_bytes()
    kw = _kw(path, client)
    whole = _through_stream(upstream, client, [data], **kw)
    if whole[0] == "failed":
        assert _through_stream(upstream, client, bytewise(data), **kw) == whole
        return
    expected = _fresh(upstream, client, data, **kw)
    assert whole[1:] == expected
    assert _through_stream(upstream, client, bytewise(data), **kw)[1:] == expected
    if upstream is client and path.suffix == ".sse":
        assert whole[1] == data  # relayed unchanged, byte for byte


@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(min_value=0, max_value=len(STREAMS) - 1),
    client=st.sampled_from(DIALECTS),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=12),
)
def test_hand_over_at_any_split(index: int, client: Dialect, cuts: list[int]) -> None:
    path = STREAMS[index]
    upstream = fixture_dialect(path.name)
    data = path.read_bytes()
    kw = _kw(path, client)
    whole = _through_stream(upstream, client, [data], **kw)
    assert _through_stream(upstream, client, pieces(data, cuts), **kw) == whole


def test_held_bytes_are_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    data = (FIXTURES / "streams" / "anthropic-text.sse").read_bytes()
    cut = len(data) // 2
    fed: list[int] = []
    real = SSEDecoder.feed

    def counting(self: SSEDecoder, chunk: bytes) -> list[Any]:
        fed.append(len(chunk))
        return real(self, chunk)

    monkeypatch.setattr(SSEDecoder, "feed", counting)
    first, second = data[:cut], data[cut:]
    _through_stream(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, [first, second], client_model="m")
    assert fed == [len(first), len(second)]  # the hold's decoder reads on
    fed.clear()
    _through_stream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, [first, second], client_model="m")
    # The relay's framer decodes at most the second chunk and the event it completes.
    partial = first[first.rfind(b"\n\n") + 2 :]
    assert fed[0] == len(first)
    assert sum(fed[1:]) <= len(partial) + len(second)


def test_cr_line_ends_hand_over_to_the_decoder() -> None:
    data = (FIXTURES / "streams" / "anthropic-text.sse").read_bytes().replace(b"\n", b"\r\n")
    kw = {"client_model": "m"}
    for chunks in ([data], bytewise(data)):
        _, out, record = _through_stream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, chunks, **kw)
        assert out == data
        assert record == _fresh(Dialect.ANTHROPIC, Dialect.ANTHROPIC, data, **kw)[1]
        assert record[0]  # finished


def test_an_end_that_decides_hands_over_too() -> None:
    # A Chat stream whose only decisive event is its last, without the final blank line.
    data = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}'
    )
    for client in DIALECTS:
        kind, out, record = _through_stream(Dialect.OPENAI_CHAT, client, [data], client_model="m")
        assert kind == "content"
        assert (out, record) == _fresh(Dialect.OPENAI_CHAT, client, data, client_model="m")


def test_translator_kinds() -> None:
    def kind(**kw: Any) -> type:
        return type(
            new_stream_translator(Dialect.ANTHROPIC, kw.pop("client"), client_model="m", **kw)
        )

    assert kind(client=Dialect.ANTHROPIC) is RelayedStream
    assert kind(client=Dialect.ANTHROPIC, relay_unchanged=False) is ConvertedStream
    assert kind(client=Dialect.OPENAI_CHAT) is ConvertedStream
    assert kind(client=Dialect.OPENAI_CHAT, client_stream=False) is CollectedStream
    assert kind(client=Dialect.ANTHROPIC, client_stream=False) is CollectedStream


def test_an_error_before_content_fails_without_a_translator() -> None:
    data = (FIXTURES / "streams" / "anthropic-error-overloaded-docs.sse").read_bytes()
    stream = UpstreamStream(Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, client_model="m")
    outcome = stream.feed(data, now=NOW)
    assert isinstance(outcome, FailedBeforeContent)
    assert outcome.failure.kind.value == "overloaded"
