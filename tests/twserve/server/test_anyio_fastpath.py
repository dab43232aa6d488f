"""The fast lanes of twserve/server/_anyio_fastpath.py are taken, on a real loopback connection.

Every lane there falls back to anyio's public API when anyio or h11 no longer has what it reaches
for: the server stays correct, only slower, and says nothing. These tests are what says it. Each
lane is probed on a real connection to a real `Server` (`_probe`), and each probe is shown to
notice its lane switched off (the same probe with the private name gone), so a green run means
the lanes are on, not that the probe cannot see.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

import twserve.server._anyio_fastpath as fastpath
import twserve.server.h1_output as h1_output
import twserve.server.http1 as http1
from twserve.server.backpressure import Intake, Outflow
from twserve.server.base import Request, Responder, ServerLimits
from twserve.server.http1 import Connection
from twserve.server.listener import Server, listen

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]


async def _probe() -> dict[str, bool]:
    """Serve one chunked answer on loopback and report which lanes the connection took."""
    lanes: dict[str, bool] = {}
    readers: list[str] = []
    original_with_reader = Connection._dispatch_with_reader

    async def counting_reader(self: Connection, request: Request, responder: Responder) -> bool:
        readers.append(request.path)
        return await original_with_reader(self, request, responder)

    written_now: list[bytes] = []

    async def handler(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-type", b"text/plain")])
        # The upstream read's callback writes through `ready`/`send_now` only on the fast lane.
        lanes["ready"] = responder.ready()
        if responder.ready():
            responder.send_now(b"now")
            written_now.append(b"now")
        else:
            await responder.send(b"now")
        await responder.send(b"-sent")
        await responder.end()

    server = Server(handler, limits=ServerLimits(write_timeout=5.0))
    Connection._dispatch_with_reader = counting_reader  # type: ignore[method-assign]
    try:
        listener = await listen("127.0.0.1", 0)
        port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve_listener, listener)
            with anyio.fail_after(10):
                client = await anyio.connect_tcp("127.0.0.1", port)
                async with client:
                    await client.send(b"GET /probe HTTP/1.1\r\nhost: x\r\n\r\n")
                    data = b""
                    while not data.endswith(b"0\r\n\r\n"):
                        data += await client.receive()
                    (conn,) = server.connections
                    lanes["transport"] = conn._transport is not None
                    lanes["watch"] = conn._watch is not None and isinstance(
                        conn._transport.get_protocol(), fastpath.ClientWatch
                    )
                    lanes["lean_protocol"] = isinstance(
                        getattr(conn.stream, "_protocol", None), fastpath.LeanProtocol
                    )
                    # The reader of HTTP/2 and the WebSockets: the same transport, for the
                    # read-ahead and write-buffer bounds.
                    lanes["intake"] = Intake(conn.stream).transport is not None
                    lanes["outflow"] = (
                        Outflow(conn.stream, buffered=65536, max_owed=10).transport is not None
                    )
                # The client has closed its side: the connection ends, then the server.
                await server.drain(5.0)
    finally:
        Connection._dispatch_with_reader = original_with_reader  # type: ignore[method-assign]
    assert b"3\r\nnow\r\n5\r\n-sent\r\n0\r\n\r\n" in data  # the same bytes on either lane
    lanes["no_reader_task"] = readers == []
    lanes["checkpoint"] = fastpath.FAST_CHECKPOINT and (
        h1_output.checkpoint_if_cancelled is not anyio.lowlevel.checkpoint_if_cancelled
    )
    lanes["clock_and_scopes"] = (
        http1.current_time is not anyio.current_time and http1.cancel_scope is not anyio.CancelScope
    )
    return lanes


ALL_LANES = {
    "ready": True,
    "transport": True,
    "watch": True,
    "lean_protocol": True,
    "intake": True,
    "outflow": True,
    "no_reader_task": True,
    "checkpoint": True,
    "clock_and_scopes": True,
}


async def test_every_fast_lane_is_taken_on_a_loopback_connection() -> None:
    assert await _probe() == ALL_LANES


async def test_the_probe_sees_the_transport_lanes_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if anyio had renamed its asyncio socket stream: the server still answers (the same
    # bytes, checked in the probe), through anyio's API, and the probe says which lanes went.
    monkeypatch.setattr(fastpath, "_STREAM_TYPE", None)
    lanes = await _probe()
    assert {name for name, on in lanes.items() if not on} == {
        "ready",
        "transport",
        "watch",
        "lean_protocol",
        "intake",
        "outflow",
        "no_reader_task",
    }


async def test_the_probe_sees_the_chunk_framing_lane_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if h11 had renamed its chunked writer: every piece goes through h11, and the upstream
    # read's callback can no longer write (`ready` is false).
    monkeypatch.setattr(h1_output, "frames_in_chunks", lambda conn: False)
    lanes = await _probe()
    assert {name for name, on in lanes.items() if not on} == {"ready"}


async def test_the_probe_sees_the_checkpoint_lane_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    public = anyio.lowlevel.checkpoint_if_cancelled
    monkeypatch.setattr(h1_output, "checkpoint_if_cancelled", public)
    lanes = await _probe()
    assert {name for name, on in lanes.items() if not on} == {"checkpoint"}


async def test_the_probe_sees_the_clock_and_scope_lane_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "current_time", anyio.current_time)
    monkeypatch.setattr(http1, "cancel_scope", anyio.CancelScope)
    lanes = await _probe()
    assert {name for name, on in lanes.items() if not on} == {"clock_and_scopes"}


async def test_the_fast_clock_and_scopes_are_anyio_own() -> None:
    # The loop's time, and a scope anyio's task machinery knows: it cancels, and its deadline
    # ends a wait, as ``anyio.CancelScope`` does.
    assert abs(fastpath.current_time() - anyio.current_time()) < 0.1
    scope = fastpath.cancel_scope(deadline=fastpath.current_time() + 0.05)
    assert isinstance(scope, anyio.CancelScope)
    with scope:
        await anyio.sleep(5)
    assert scope.cancelled_caught
    with fastpath.cancel_scope() as cancelled:
        cancelled.cancel()
        await anyio.sleep(5)
    assert cancelled.cancelled_caught


def test_h11_still_frames_a_chunked_answer_with_the_writer_it_is_asked_about() -> None:
    import h11

    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    conn.send(h11.Response(status_code=200, headers=[]))
    assert fastpath.frames_in_chunks(conn)
    conn2 = h11.Connection(h11.SERVER)
    conn2.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    conn2.next_event()
    conn2.send(h11.Response(status_code=200, headers=[(b"content-length", b"2")]))
    assert not fastpath.frames_in_chunks(conn2)


async def test_a_memory_transport_stream_takes_the_lanes_too() -> None:
    # The in-memory seam of the tests (tests/twserve/support/memory_wire.py) builds anyio's own
    # stream over a transport of its own: the lanes must find it as they find a socket's.
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    try:
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        stream = fastpath.stream_over(transport)  # type: ignore[arg-type]
        assert fastpath.raw_transport(stream) is transport
        await stream.aclose()
    finally:
        b.close()


def _sources() -> Iterator[tuple[Path, str]]:
    for path in sorted((ROOT / "twserve").rglob("*.py")):
        yield path, path.read_text(encoding="utf-8")


def test_no_other_module_reaches_under_anyio_or_h11() -> None:
    # The reach-ins stay in one module, so that these tests watch all of them.
    allowed = ROOT / "twserve" / "server" / "_anyio_fastpath.py"
    # anyio's backends, h11's private modules, or a private attribute read by name.
    reach = re.compile(r"anyio\._|h11\._|getattr\([^,]+,\s*[\"']_[a-z]")
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path, text in _sources()
        if path != allowed
        for match in reach.finditer(text)
    ]
    assert found == []
