"""Each format's watch table (``WATCH``) is complete: a stream relayed unchanged, which parses
only the events its needles point at, ends up with the usage, finish and error that decoding
every event gives. Checked over the recorded streams as they came, with their ``event:`` lines
removed (unnamed events are found by the data needles alone), with CRLF line ends, and fed one
event per chunk (the framer's plain-delta shortcut)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.twproto.conftest import DIALECTS, FIXTURES, fixture, fixture_dialect, stream_events
from twproto.dialect import Dialect
from twproto.formats import FORMATS, WatchNeedles, new_stream_decoder
from twproto.stream import new_stream_translator

SSE_STREAMS = sorted(p.name for p in (FIXTURES / "streams").iterdir() if p.suffix == ".sse")


def _unnamed(data: bytes) -> bytes:
    return b"".join(line + b"\n" for line in data.split(b"\n") if not line.startswith(b"event:"))


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


VARIANTS = {"as recorded": lambda data: data, "unnamed": _unnamed, "crlf": _crlf}


def _decoded(dialect: Dialect, data: bytes) -> tuple[Any, bool, Any]:
    decoder = new_stream_decoder(dialect)
    for event in stream_events(dialect, data):
        decoder.feed(event)
    return decoder.usage, decoder.finished, decoder.error


def _one_event_per_chunk(data: bytes) -> list[bytes]:
    blank = b"\r\n\r\n" if b"\r\n" in data else b"\n\n"
    return [block + blank for block in data.split(blank) if block.strip()]


@pytest.mark.parametrize("dialect", DIALECTS, ids=str)
def test_every_format_has_one_watch_table(dialect: Dialect) -> None:
    fmt = FORMATS[dialect]
    assert isinstance(fmt.WATCH, WatchNeedles)
    assert fmt.WATCH.chunk_markers
    assert type(fmt.new_stream_decoder()).needles is fmt.WATCH


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", SSE_STREAMS)
def test_watching_finds_what_decoding_finds(name: str, variant: str) -> None:
    dialect = fixture_dialect(name)
    data = VARIANTS[variant](fixture(f"streams/{name}").replace(b"\r\n", b"\n"))
    usage, finished, error = _decoded(dialect, data)

    # Each event through the decoder's watch: what the needles let through is enough.
    watcher = new_stream_decoder(dialect)
    for event in stream_events(dialect, data):
        watcher.watch(event)
    assert (watcher.usage, watcher.finished, watcher.error) == (usage, finished, error)

    # The relayed stream, whole and one event per chunk: the framer's markers are enough too.
    for chunks in ([data], _one_event_per_chunk(data)):
        relayed = new_stream_translator(dialect, dialect, client_model="client")
        assert b"".join(relayed.feed(chunk) for chunk in chunks) + relayed.end() == b"".join(chunks)
        assert relayed.usage == usage
        assert relayed.error == error
        assert relayed.finished == (finished and error is None)
