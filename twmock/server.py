"""The mock upstream's IO: a request handler that plays plans, and the server around it.

`make_handler(settings)` returns a `MockHandler`, an ordinary twserve handler
(``await handler(request, responder)``) that keeps the per-instance state the pure planner may
not: the request counters behind ``fail_first``/``fail_every`` (one per profile), the seeded
random generator behind ``fail_rate`` and the ids, the clock, and the log of what arrived
(`MockHandler.received`, newest last) that tests assert on. For each request it resolves the
profile, draws what the plan needs, asks `twmock.plan.plan` for the steps and carries them
out with `carry_out`: ``anyio.sleep`` for each delay, `Responder.start`/`send`/`end`, and
`Responder.abort` to break or reset the connection. A silence lasts until the client leaves —
the server cancels the handler then — or `MockSettings.silence_limit` runs out.

`serve_mock` serves a handler over twserve.server.listener, its HTTP/2 switch (h2c), the Realtime
WebSocket (twmock.realtime) and the Responses WebSocket (twmock.responses_socket); `run_mock` does
the same as an async context manager and yields the bound port and the handler, which is what
tests want.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from twmock.plan import (
    Break,
    Chunk,
    End,
    Head,
    Plan,
    RequestInfo,
    ResetBeforeHead,
    Silence,
    plan,
)
from twmock.realtime import RealtimeLog, realtime_switch
from twmock.responses_socket import SocketLog, responses_socket_switch
from twmock.script import MockSettings, Script, ScriptError
from twmock.shapes import SHAPES, known_shape
from twproto import json_loads
from twproto.paths import Operation, match_path
from twserve.server.base import Request, Responder, Switch

__all__ = [
    "MockHandler",
    "MockServer",
    "Received",
    "carry_out",
    "make_handler",
    "mock_switches",
    "run_mock",
    "serve_mock",
]

_SCRIPTED = (Operation.GENERATE, Operation.COUNT_TOKENS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """One request as it arrived, with what the mock made of it.

    `path` is the path the client sent (profile segment included); `number` is its count on
    its profile (0 for requests that are not counted: listings, health, unknown paths).
    """

    method: str
    path: str
    query: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    profile: str
    number: int
    outcome: str
    status: int | None

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    def json(self) -> Any:
        return json_loads(self.body)


class MockHandler:
    """A mock upstream instance; see the module docstring."""

    def __init__(self, settings: MockSettings) -> None:
        self.settings = settings
        self.received: deque[Received] = deque(maxlen=max(1, settings.keep_received))
        self._counts: dict[str, int] = {}
        self._rng = random.Random(settings.seed)
        # The Realtime endpoint's record (twmock.realtime).
        self.realtime = RealtimeLog()
        # The Responses WebSocket's record (twmock.responses_socket).
        self.sockets = SocketLog()

    def count(self, profile: str = "") -> int:
        """How many scripted requests (generate, count tokens) `profile` has received."""
        return self._counts.get(profile, 0)

    def reset(self) -> None:
        """Forget the counters and the request log (the random sequence goes on)."""
        self._counts.clear()
        self.received.clear()

    def profile_of(self, path: str) -> tuple[str, Script, str]:
        """The profile `path` names (its first segment, when that is a profile), the profile's
        script, and the path without that segment."""
        return self._profile(path)

    def _profile(self, path: str) -> tuple[str, Script, str]:
        profiles = self.settings.profiles
        if profiles and path.startswith("/"):
            segment, _, rest = path[1:].partition("/")
            script = profiles.get(segment)
            if script is not None:
                return segment, script, "/" + rest
        return "", self.settings.script, path

    def plan_for(self, request: Request) -> Plan:
        """Count, log and plan `request` (everything but the IO)."""
        name, script, path = self._profile(request.path)
        route = match_path(request.method, path, request.query)
        number = 0
        if route is not None and route.operation in _SCRIPTED:
            number = self._counts[name] = self._counts.get(name, 0) + 1
        headers = tuple(request.headers)
        info = RequestInfo(
            method=request.method,
            path=path,
            query=request.query,
            headers=headers,
            body=request.body,
            number=number,
            draw=self._rng.random(),
            seed=self._rng.getrandbits(64),
            now=time.time(),
        )
        result = plan(
            info,
            script,
            models=self.settings.models,
            allow_script_header=self.settings.allow_script_header,
        )
        self.received.append(
            Received(
                method=request.method,
                path=request.path,
                query=request.query,
                headers=headers,
                body=request.body,
                profile=name,
                number=number,
                outcome=result.outcome,
                status=result.status,
            )
        )
        return result

    async def __call__(self, request: Request, responder: Responder) -> None:
        await carry_out(
            self.plan_for(request), responder, silence_limit=self.settings.silence_limit
        )


def _check_shapes(script: Script, where: str) -> None:
    shape = script.error.shape if script.error is not None else None
    if shape is not None and not known_shape(shape):
        known = ", ".join(SHAPES)
        raise ScriptError(f"{where}: unknown error shape {shape!r} (known: {known})")


def mock_switches(handler: MockHandler) -> tuple[Switch, ...]:
    """The mock server's protocol switches: h2c, the Realtime WebSocket (twmock.realtime) and
    the Responses WebSocket (twmock.responses_socket)."""
    from twserve.server import http2

    return (
        http2.switch,
        realtime_switch(handler.realtime),
        responses_socket_switch(handler),
    )


def make_handler(settings: MockSettings | None = None) -> MockHandler:
    """A new mock instance (own counters, log and random sequence)."""
    settings = settings if settings is not None else MockSettings()
    _check_shapes(settings.script, "script")
    for name, script in settings.profiles.items():
        _check_shapes(script, f"profile {name!r}")
    return MockHandler(settings)


async def carry_out(plan: Plan, responder: Responder, *, silence_limit: float = 3600.0) -> None:
    """Play `plan` over `responder`."""
    for step in plan.steps:
        # Chunk first: streams are thousands of chunks and a couple of heads.
        if type(step) is Chunk:
            if step.delay > 0:
                await anyio.sleep(step.delay)
            await responder.send(step.data)
        elif type(step) is Head:
            if step.delay > 0:
                await anyio.sleep(step.delay)
            await responder.start(step.status, list(step.headers))
        elif type(step) is End:
            await responder.end()
            return
        elif type(step) is Break or type(step) is ResetBeforeHead:
            await responder.abort()
            return
        elif type(step) is Silence:
            await anyio.sleep(silence_limit)
            await responder.abort()
            return


async def serve_mock(
    settings: MockSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 9100,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a new mock instance on `host:port` until cancelled; reports the bound port.
    HTTP/1.1 and h2c alike, so a provider with ``http2: true`` can be tried against it."""
    from twserve.server import listener

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
    from twserve.server import listener

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
