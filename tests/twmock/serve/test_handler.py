"""The mock's handler (twmock/serve/handler.py) with an in-memory responder: counters, profiles,
the request log, failures and pacing, no socket."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from tests.twmock.formats.test_formats import ANTHROPIC_BODY, CHAT_BODY
from twmock import (
    MockHandler,
    MockSettings,
    ScriptError,
    make_handler,
    parse_script,
)
from twserve.server.base import Request

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeResponder:
    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.times: list[float] = []
        self.ended = False
        self.aborted = False
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        assert not self._started
        self._started = True
        self.status, self.headers = status, headers

    async def send(self, data: bytes) -> None:
        assert self._started and not self.ended
        self.chunks.append(data)
        self.times.append(time.monotonic())

    async def end(self) -> None:
        self.ended = True

    async def abort(self) -> None:
        self.aborted = True

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def request(
    path: str,
    body: dict[str, Any] | bytes = b"",
    *,
    method: str = "POST",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Request:
    path, _, query = path.partition("?")
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Request(
        method=method,
        target=(path + ("?" + query if query else "")).encode(),
        path=path,
        query=query,
        headers=headers or [(b"content-type", b"application/json")],
        body=data,
    )


async def call(handler: MockHandler, req: Request) -> FakeResponder:
    responder = FakeResponder()
    await handler(req, responder)
    return responder


async def test_fail_first_counts_requests_and_logs_them() -> None:
    handler = make_handler(MockSettings(script=parse_script({"fail_first": 2, "error": 529})))
    statuses = [
        (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status for _ in "abc"
    ]
    assert statuses == [529, 529, 200]
    assert handler.count() == 3
    log = list(handler.received)
    assert [r.number for r in log] == [1, 2, 3]
    assert [r.outcome for r in log] == ["error", "error", "answer"]
    assert log[-1].json()["model"] == "claude-test-1"
    assert log[-1].header("Content-Type") == "application/json"
    handler.reset()
    assert handler.count() == 0 and not handler.received
    assert (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status == 529


async def test_fail_every_and_uncounted_requests() -> None:
    handler = make_handler(MockSettings(script=parse_script({"fail_every": 2, "error": 500})))
    statuses = []
    for _ in range(4):
        await call(handler, request("/v1/models", method="GET"))  # listings are not counted
        statuses.append((await call(handler, request("/chat/completions", CHAT_BODY))).status)
    assert statuses == [200, 500, 200, 500]
    assert handler.received[0].number == 0


async def test_fail_rate_is_seeded() -> None:
    def outcomes(seed: int) -> list[int | None]:
        settings = MockSettings(script=parse_script({"fail_rate": 0.5}), seed=seed)
        handler = make_handler(settings)
        return [handler.plan_for(request("/chat/completions", CHAT_BODY)).status for _ in range(40)]

    first = outcomes(3)
    assert first == outcomes(3)
    assert 5 < first.count(503) < 35
    assert first != outcomes(4)


async def test_profiles_have_their_own_script_and_counter() -> None:
    settings = MockSettings(profiles={"flaky": parse_script({"fail_first": 1, "error": 429})})
    handler = make_handler(settings)
    flaky = [
        (await call(handler, request("/flaky/v1/messages", ANTHROPIC_BODY))).status for _ in "ab"
    ]
    plain = (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status
    assert flaky == [429, 200] and plain == 200
    assert handler.count("flaky") == 2 and handler.count() == 1
    assert (
        handler.received[0].profile == "flaky" and handler.received[0].path == "/flaky/v1/messages"
    )


async def test_script_header_override_through_the_handler() -> None:
    handler = make_handler()
    headers = [(b"x-mock-script", b'{"text": "scripted", "chunk_size": 100}')]
    out = await call(handler, request("/v1/messages", ANTHROPIC_BODY, headers=headers))
    assert json.loads(out.body)["content"][0]["text"] == "scripted"
    off = make_handler(MockSettings(allow_script_header=False))
    out = await call(off, request("/v1/messages", ANTHROPIC_BODY, headers=headers))
    assert json.loads(out.body)["content"][0]["text"] != "scripted"


async def test_request_log_is_bounded() -> None:
    handler = make_handler(MockSettings(keep_received=3))
    for _ in range(5):
        await call(handler, request("/healthz", method="GET"))
    assert len(handler.received) == 3


async def test_unknown_shape_is_refused_up_front() -> None:
    with pytest.raises(ScriptError, match="unknown error shape"):
        make_handler(MockSettings(script=parse_script({"error": "nope"})))
    with pytest.raises(ScriptError, match="profile 'x'"):
        make_handler(MockSettings(profiles={"x": parse_script({"error": "nope"})}))


async def test_break_and_reset_abort() -> None:
    handler = make_handler(MockSettings(script=parse_script({"break_after": 1})))
    out = await call(handler, request("/v1/messages", {**ANTHROPIC_BODY, "stream": True}))
    assert out.status == 200 and out.aborted and not out.ended
    handler = make_handler(MockSettings(script=parse_script({"reset_before_head": True})))
    out = await call(handler, request("/v1/messages", ANTHROPIC_BODY))
    assert out.aborted and not out.started


async def test_silence_lasts_until_cancelled_or_the_limit() -> None:
    handler = make_handler(MockSettings(script=parse_script({"silence": True})))
    responder = FakeResponder()
    with anyio.move_on_after(0.1) as scope:
        await handler(request("/v1/messages", ANTHROPIC_BODY), responder)
    assert scope.cancelled_caught and responder.started and not responder.aborted
    limited = make_handler(
        MockSettings(script=parse_script({"silence": "before_head"}), silence_limit=0.05)
    )
    out = await call(limited, request("/v1/messages", ANTHROPIC_BODY))
    assert out.aborted and not out.started


async def test_delays_are_played() -> None:
    script = parse_script({"chunks": 3, "first_delay": 0.1, "chunk_delay": 0.05})
    handler = make_handler(MockSettings(script=script))
    start = time.monotonic()
    out = await call(handler, request("/chat/completions", {**CHAT_BODY, "stream": True}))
    assert out.ended
    content = [
        t - start
        for t, c in zip(out.times, out.chunks, strict=True)
        if b'"content":"' in c and b'"role"' not in c
    ]
    assert len(content) == 3
    assert content[0] >= 0.09 and content[2] - content[0] >= 0.09
