"""`coalesced` joins what a stream can give without waiting, and nothing else; it hands on the
source's errors after what was ready, and unwinds a source left waiting."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpcore
import pytest

from twmock import run_mock
from twmock.script import MockSettings, Script
from twserve.upstream.coalesce import coalesced

pytestmark = pytest.mark.anyio


class Source:
    """Yields pieces; ``None`` in the plan means "wait for IO here" (a real suspension)."""

    def __init__(self, plan: list[bytes | Exception | None]) -> None:
        self.plan = plan
        self.cleaned_up: BaseException | None = None
        self.finished = False

    async def pieces(self) -> AsyncIterator[bytes]:
        try:
            for item in self.plan:
                if item is None:
                    await anyio.sleep(0.01)
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
            self.finished = True
        except BaseException as exc:
            self.cleaned_up = exc
            await anyio.sleep(0)  # clean-up that itself awaits, as httpcore's does
            raise


async def _all(it: AsyncIterator[bytes]) -> list[bytes]:
    return [piece async for piece in it]


async def test_ready_pieces_are_joined_and_a_wait_splits_them() -> None:
    src = Source([b"a", b"b", b"c", None, b"d", None, None, b"e", b"f"])
    assert await _all(coalesced(src.pieces())) == [b"abc", b"d", b"ef"]
    assert src.finished


async def test_a_stream_that_always_waits_comes_out_piece_by_piece() -> None:
    src = Source([None, b"a", None, b"b", None, b"c", None])
    assert await _all(coalesced(src.pieces())) == [b"a", b"b", b"c"]


async def test_an_error_comes_after_the_pieces_that_were_ready() -> None:
    src = Source([b"a", b"b", ValueError("broken")])
    out: list[bytes] = []
    with pytest.raises(ValueError, match="broken"):
        async for piece in coalesced(src.pieces()):
            out.append(piece)
    assert out == [b"ab"]


async def test_an_error_after_a_wait_is_raised_on_the_next_read() -> None:
    src = Source([b"a", None, ValueError("late")])
    it = coalesced(src.pieces())
    assert await it.__anext__() == b"a"
    with pytest.raises(ValueError, match="late"):
        await it.__anext__()


async def test_a_reader_that_stops_unwinds_the_waiting_source() -> None:
    src = Source([b"a", None, b"b"])
    it = coalesced(src.pieces())
    assert await it.__anext__() == b"a"
    await it.aclose()  # type: ignore[attr-defined]
    assert src.cleaned_up is not None and not src.finished


async def test_cancellation_reaches_the_waiting_source() -> None:
    async def forever() -> AsyncIterator[bytes]:
        try:
            yield b"a"
            await anyio.sleep(60)
            yield b"never"
        finally:
            cleaned.append(True)

    cleaned: list[bool] = []
    got: list[bytes] = []
    it = coalesced(forever())
    with anyio.move_on_after(0.2) as scope:
        async for piece in it:
            got.append(piece)
    await it.aclose()  # type: ignore[attr-defined]
    assert scope.cancelled_caught
    assert got == [b"a"] and cleaned == [True]


async def test_a_real_upstream_stream_is_unchanged_and_the_pool_reuses_the_connection() -> None:
    settings = MockSettings(script=Script(chunks=200, chunk_size=4))
    body = (
        b'{"model":"m","max_tokens":900,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    )
    headers = [(b"content-type", b"application/json"), (b"x-api-key", b"k")]
    async with run_mock(settings) as mock, httpcore.AsyncConnectionPool() as pool:
        url = mock.url + "/v1/messages"
        expected = (await pool.request("POST", url, headers=headers, content=body)).content
        async with pool.stream("POST", url, headers=headers, content=body) as resp:
            pieces = [p async for p in coalesced(resp.aiter_stream())]
        assert len(pool.connections) == 1  # read to the end: back in the pool for the next
    assert expected.count(b"event: content_block_delta") >= 50

    # Ids and timestamps differ between two answers; the event sequence must not.
    def events(data: bytes) -> list[bytes]:
        return [line for line in data.split(b"\n") if line.startswith(b"event:")]

    assert events(b"".join(pieces)) == events(expected)
    assert 1 <= len(pieces) <= len(events(expected))
