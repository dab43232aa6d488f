"""The mock upstream's server: a `MockHandler` (twmock.serve.handler) served over twserve's
HTTP/1.1 server with its protocol switches.

`serve_mock` serves a handler over twserve.server.http1, its HTTP/2 switch (h2c), the Realtime
WebSocket (twmock.serve.realtime) and the Responses WebSocket (twmock.serve.responses_socket);
`run_mock` does the same as an async context manager and yields the bound port and the handler,
which is what tests want.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc

from twmock.script import MockSettings
from twmock.serve.handler import MockHandler, Received, make_handler
from twmock.serve.realtime import realtime_switch
from twmock.serve.responses_socket import responses_socket_switch
from twserve.server import http2, listener
from twserve.server.base import Switch

__all__ = ["MockServer", "mock_switches", "run_mock", "serve_mock"]


def mock_switches(handler: MockHandler) -> tuple[Switch, ...]:
    """The mock server's protocol switches: h2c, the Realtime WebSocket (twmock.serve.realtime) and
    the Responses WebSocket (twmock.serve.responses_socket)."""
    return (
        http2.switch,
        realtime_switch(handler.realtime),
        responses_socket_switch(handler),
    )


async def serve_mock(
    settings: MockSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 9100,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a new mock instance on `host:port` until cancelled; reports the bound port.
    HTTP/1.1 and h2c alike, so a provider with ``http2: true`` can be tried against it."""
    handler = make_handler(settings)
    server = listener.Server(handler, switches=mock_switches(handler))
    await listener.serve(handler, host=host, port=port, server=server, task_status=task_status)


@dataclass(frozen=True, slots=True, kw_only=True)
class MockServer:
    host: str
    port: int
    handler: MockHandler

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def received(self) -> deque[Received]:
        return self.handler.received


@asynccontextmanager
async def run_mock(
    settings: MockSettings | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[MockServer]:
    """Run a mock instance on loopback for the duration of the block (port 0: any free one),
    speaking HTTP/1.1 and h2c."""
    handler = make_handler(settings)
    server = listener.Server(handler, switches=mock_switches(handler))

    async def serve(*, task_status: anyio.abc.TaskStatus[int]) -> None:
        await listener.serve(handler, host=host, port=port, server=server, task_status=task_status)

    # The task group is entered by hand so that an exception raised in the caller's block
    # reaches the caller as itself, not wrapped in an ExceptionGroup by the group's exit.
    tg = anyio.create_task_group()
    await tg.__aenter__()
    try:
        bound = await tg.start(serve)
        yield MockServer(host=host, port=bound, handler=handler)
    finally:
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
