"""Running out of file descriptors, and the connection cap.

A gateway under ``ulimit -n 64`` given 80 idle connections used to die: accept() failed with
EMFILE, the error escaped anyio's ``Listener.serve`` and took the process with it. The gateway
now runs in a subprocess whose hard limit is 64 too (so raising the soft limit cannot help),
and must keep serving once connections free up.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpcore
import pytest

from twserve.server import base, listener
from twserve.server.base import Request, Responder

FD_LIMIT = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _healthy(port: int, timeout: float = 5.0) -> bool:
    try:
        reply = httpcore.request(
            "GET",
            f"http://127.0.0.1:{port}/healthz",
            extensions={"timeout": {"connect": timeout, "read": timeout, "pool": timeout}},
        )
    except httpcore.TimeoutException:
        return False
    return reply.status == 200


def test_the_gateway_survives_running_out_of_descriptors(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"version: 1\nlisten:\n  gateway:\n    port: {port}\n"
        "clients:\n  - {name: me, key: some-long-key-for-tests}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(config)],
        env={**os.environ, "TWSERVE_HOME": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_low_fd_limit,
    )
    idle: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 20
        while not _healthy_quietly(port):
            assert time.monotonic() < deadline, "the gateway did not come up"
            time.sleep(0.1)
        for _ in range(80):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1.0)  # let it accept until descriptors run out, and fail to accept more
        assert proc.poll() is None, "the gateway exited"
        for sock in idle[:40]:
            sock.close()
        del idle[:40]
        # Descriptors are back: a new client is served (after the back-off, at most 1 s).
        assert _healthy(port)
        assert proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "gw.listen.fd_exhausted" in out
    assert "Traceback" not in out


def _healthy_quietly(port: int) -> bool:
    try:
        return _healthy(port, timeout=1.0)
    except httpcore.ConnectError:
        return False


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_at_the_connection_cap_new_clients_wait_until_one_ends() -> None:
    async def handler(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-length", b"2")])
        await responder.send(b"ok")
        await responder.end()

    server = listener.Server(handler, limits=base.ServerLimits(max_connections=2))
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(handler, server=server, task_status=task_status)
        )
        first = await anyio.connect_tcp("127.0.0.1", port)
        second = await anyio.connect_tcp("127.0.0.1", port)
        third = await anyio.connect_tcp("127.0.0.1", port)
        await third.send(request)
        # Two connections are open: the third waits in the backlog, unanswered.
        with anyio.move_on_after(0.5) as waited:
            await third.receive()
        assert waited.cancelled_caught
        assert server.open_count == 2
        await first.aclose()
        with anyio.fail_after(2):
            answer = await third.receive()
        assert answer.startswith(b"HTTP/1.1 200")
        await second.aclose()
        await third.aclose()
        tg.cancel_scope.cancel()


def test_serve_raises_the_soft_descriptor_limit_to_the_hard_one() -> None:
    def soft_below_hard() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 512))

    probe = (
        "import resource; from twserve.app.process import raise_fd_limit; raise_fd_limit(); "
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=soft_below_hard,
    )
    assert out.stdout.strip() == "512", out.stderr
