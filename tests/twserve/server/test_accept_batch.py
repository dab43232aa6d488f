"""The listener takes the connections waiting in its backlog in one loop turn, within the cap:
one accept per turn let clients time out in the backlog while a turn carried thousands of
streams."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import anyio
import pytest

from twserve.server import base, listener
from twserve.server.base import Request, Responder

pytestmark = pytest.mark.anyio
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


async def ok(request: Request, responder: Responder) -> None:
    await responder.start(200, [(b"content-length", b"2")])
    await responder.send(b"ok")
    await responder.end()


class CountingServer(listener.Server):
    batched = 0
    most_open = 0

    async def _run_accepted(self, sock: socket.socket) -> None:
        CountingServer.batched += 1
        CountingServer.most_open = max(CountingServer.most_open, self.open_count)
        await super()._run_accepted(sock)


async def _answers(port: int, count: int) -> list[bytes]:
    # Connected and written before the server's loop gets a turn: all of them wait in the
    # backlog together.
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(REQUEST)
        sock.setblocking(False)
        socks.append(sock)
    answers = []
    with anyio.fail_after(20):
        for sock in socks:
            data = b""
            while b"ok" not in data:
                await anyio.wait_readable(sock)
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            answers.append(data)
            sock.close()
    return answers


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_backlog_is_taken_in_batches_and_every_client_answered() -> None:
    CountingServer.batched = 0
    server = CountingServer(ok)
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(ok, server=server, task_status=task_status)
        )
        answers = await _answers(port, 120)
        tg.cancel_scope.cancel()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    # Most were taken beside another accept, not one per loop turn.
    assert CountingServer.batched >= 60, CountingServer.batched


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_batch_stops_at_the_connection_cap() -> None:
    CountingServer.batched = CountingServer.most_open = 0
    server = CountingServer(ok, limits=base.ServerLimits(max_connections=8))
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(ok, server=server, task_status=task_status)
        )
        answers = await _answers(port, 40)
        tg.cancel_scope.cancel()
    assert len(answers) == 40 and all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert 0 < CountingServer.most_open <= 8


class _Door:
    """A door hook that never takes anyone and keeps what the server gave it."""

    taking = False

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.accepted: Callable[[], int] = lambda: -1

    @contextmanager
    def __call__(
        self, sockets: Sequence[socket.socket], accepted: Callable[[], int]
    ) -> Iterator[_Door]:
        self.sockets, self.accepted = list(sockets), accepted
        yield self


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_beside_a_door_every_client_taken_is_counted_for_it() -> None:
    """The door reads the accept queue's wait from the server's count of accepts: one taken
    beside the door and the rest in a batch are all counted."""
    hook = _Door()
    server = listener.Server(ok, door=hook)
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(ok, server=server, task_status=task_status)
        )
        assert hook.accepted() == 0 and hook.sockets
        answers = await _answers(port, 30)
        assert hook.accepted() == 30 == server.accepted
        tg.cancel_scope.cancel()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
