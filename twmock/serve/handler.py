"""The mock upstream's request handler: the per-instance state the pure planner may not keep,
and the loop that plays a plan over a twserve `Responder`.

`make_handler(settings)` returns a `MockHandler`, an ordinary twserve handler
(``await handler(request, responder)``) that keeps the request counters behind
``fail_first``/``fail_every`` (one per profile), the seeded random generator behind ``fail_rate``
and the ids, the clock, and the log of what arrived (`MockHandler.received`, newest last) that
tests assert on. For each request it resolves the profile, draws what the plan needs, asks
`twmock.plan.plan` for the steps and carries them out with `carry_out`: ``anyio.sleep`` for each
delay, `Responder.start`/`send`/`end`, and `Responder.abort` to break or reset the connection. A
silence lasts until the client leaves — the server cancels the handler then — or
`MockSettings.silence_limit` runs out.

The transports import this module, never the other way round: the Responses WebSocket
(twmock.serve.responses_socket) plays each turn through `MockHandler.plan_for` and `carry_out`,
so `SocketLog`, the record of those sockets the handler keeps, is defined here too.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from twmock.formats.bedrock import bedrock_plan, count_plan
from twmock.formats.converse import converse_plan
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
from twmock.script import MockSettings, Script, ScriptError
from twmock.serve.bedrock import (
    BedrockCall,
    as_anthropic,
    as_anthropic_count,
    as_converse,
    bedrock_call,
    bedrock_refusal,
    validation_plan,
)
from twmock.serve.cloud import (
    CloudCall,
    GoogleTokenLog,
    as_first_party,
    cloud_call,
    cloud_refusal,
    token_plan,
    with_azure_filter_chunk,
)
from twmock.serve.realtime import RealtimeLog
from twmock.shapes import SHAPES, known_shape
from twproto import json_loads
from twproto.paths import Operation, match_path
from twserve.server.base import Request, Responder

__all__ = ["MockHandler", "Received", "SocketLog", "carry_out", "make_handler"]

_SCRIPTED = (Operation.GENERATE, Operation.COUNT_TOKENS)


@dataclass(slots=True)
class SocketLog:
    """What the mock's Responses socket saw: each upgrade, and per socket (in upgrade order) the
    number of turns it carried."""

    upgrades: list[Request] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    open: int = 0
    # Test knobs: answer upgrades with this HTTP status instead of switching (an upstream
    # without the socket, or one refusing it); close each socket with this code after its turn;
    # close a socket that carried a turn with this code when its next turn arrives, unplayed
    # (its lifetime ended while it was idle, and the client finds out by sending).
    refuse_status: int | None = None
    close_after_turn: int | None = None
    close_before_next_turn: int | None = None


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
        # The Realtime endpoint's record (twmock.serve.realtime).
        self.realtime = RealtimeLog()
        # The Responses WebSocket's record (twmock.serve.responses_socket writes it).
        self.sockets = SocketLog()
        # The access tokens the Vertex token endpoint issued (twmock.serve.cloud).
        self.google_tokens = GoogleTokenLog()
        # Requests being answered now, and the most there ever were at once (`reset` restarts
        # it): what a gateway's max_concurrent is checked against.
        self.in_flight = 0
        self.peak_in_flight = 0

    def count(self, profile: str = "") -> int:
        """How many scripted requests (generate, count tokens) `profile` has received."""
        return self._counts.get(profile, 0)

    def reset(self) -> None:
        """Forget the counters and the request log (the random sequence goes on)."""
        self._counts.clear()
        self.received.clear()
        self.peak_in_flight = self.in_flight

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
        bedrock = bedrock_call(request.method, path)
        cloud = cloud_call(request.method, path)
        route = match_path(request.method, path, request.query)
        number = 0
        if (
            bedrock is not None
            or cloud is not None
            or (route is not None and route.operation in _SCRIPTED)
        ):
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
        if bedrock is not None:
            result = self._bedrock(request, info, script, bedrock)
        elif cloud is not None:
            result = self._cloud(info, script, cloud)
        elif request.method == "POST" and path == "/token":
            result = token_plan(self.settings, self.google_tokens, info)
        else:
            result = self._plan(info, script)
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

    def _plan(self, info: RequestInfo, script: Script) -> Plan:
        return plan(
            info,
            script,
            models=self.settings.models,
            allow_script_header=self.settings.allow_script_header,
        )

    def _bedrock(
        self, request: Request, info: RequestInfo, script: Script, call: BedrockCall
    ) -> Plan:
        refusal = bedrock_refusal(
            self.settings, request.target, info.headers, request.body, info.now
        )
        if refusal is not None:
            return refusal
        if call.count:
            counted = as_anthropic_count(info, call)
            if isinstance(counted, str):
                return validation_plan(counted)
            return count_plan(self._plan(counted, script))
        if call.converse:
            conversed = as_converse(info, call)
            if isinstance(conversed, str):
                return validation_plan(conversed)
            return converse_plan(self._plan(conversed, script), stream=call.stream)
        wrapped = as_anthropic(info, call)
        if isinstance(wrapped, str):
            return validation_plan(wrapped)
        return bedrock_plan(self._plan(wrapped, script), stream=call.stream)

    def _cloud(self, info: RequestInfo, script: Script, call: CloudCall) -> Plan:
        refusal = cloud_refusal(self.settings, self.google_tokens, info, call)
        if refusal is not None:
            return refusal
        wrapped = as_first_party(info, call)
        if isinstance(wrapped, Plan):
            return wrapped
        result = self._plan(wrapped, script)
        return with_azure_filter_chunk(result, call) if call.platform == "azure" else result

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await carry_out(
                self.plan_for(request), responder, silence_limit=self.settings.silence_limit
            )
        finally:
            self.in_flight -= 1


def _check_shapes(script: Script, where: str) -> None:
    shape = script.error.shape if script.error is not None else None
    if shape is not None and not known_shape(shape):
        known = ", ".join(SHAPES)
        raise ScriptError(f"{where}: unknown error shape {shape!r} (known: {known})")


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
