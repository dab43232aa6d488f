"""Two in-process gateways sharing pauses, affinity, slots and limits through a real Redis, and
losing it: requests keep flowing, the loss and the return are told as events."""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
import redis

from tests.support.servers import RedisServer, start_redis
from tests.twserve.support.live import config_yaml, live_gateway, wait_for
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script
from twserve.events import HealthChanged, RequestRouted, SharedStateChanged

pytestmark = pytest.mark.anyio


def until(check: Callable[[], bool], what: str, secs: float = 20.0) -> None:
    deadline = time.monotonic() + secs
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def _settled_count(db: redis.Redis, window: str, quiet_secs: float = 1.0) -> int:
    """The window's count once it has not changed for `quiet_secs`."""
    last, since = db.zcard(window), time.monotonic()
    deadline = since + 20.0
    while time.monotonic() - since < quiet_secs:
        if time.monotonic() > deadline:
            pytest.fail("the window never stopped changing")
        time.sleep(0.05)
        now = db.zcard(window)
        if now != last:
            last, since = now, time.monotonic()
    return int(last)


@contextmanager
def two_gateways(
    tmp: Path,
    server: RedisServer,
    *,
    config: dict[str, Any] | None = None,
    scripts: tuple[Script, Script] = (Script(), Script()),
    upstream: dict[str, Any] | None = None,
) -> Iterator[tuple[Stack, Stack, list[Any], list[Any]]]:
    """Gateways A and B sharing `server`, each over its own mock upstream named ``mock``
    (played by `scripts`); with the events each published."""
    shared = {"state": {"redis_url": server.url}} | (config or {})
    seen: tuple[list[Any], list[Any]] = ([], [])
    with ExitStack() as exits:
        stacks = []
        for i in range(2):
            up = Upstream("openai-chat", MockSettings(script=scripts[i]), extra=upstream or {})
            stack = exits.enter_context(running_stack(tmp / f"g{i}", {"mock": up}, config=shared))
            stack.app.events.listeners.append(lambda e, i=i: seen[i].append(e))
            stacks.append(stack)
        for stack in stacks:
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "connected to Redis")
        yield stacks[0], stacks[1], seen[0], seen[1]


def chat(stack: Stack, messages: list[dict[str, Any]], session: str) -> str:
    client = openai.OpenAI(
        base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10,
        default_headers={"session_id": session},
    )  # fmt: skip
    # With usage: an answer that reports none leaves no affinity behind.
    stream = client.chat.completions.create(
        model="gpt-e2e-1",
        messages=messages,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def routed(events: list[Any]) -> list[RequestRouted]:
    return [e for e in events if isinstance(e, RequestRouted)]


def paused(stack: Stack) -> bool:
    return stack.app.gateway.router.health.is_paused("mock", stack.app.gateway.clock())


def health_changes(events: list[Any]) -> list[tuple[bool, str]]:
    return [(e.paused, e.reason) for e in events if isinstance(e, HealthChanged)]


def test_a_pause_decided_on_one_instance_holds_on_the_other(tmp_path: Path) -> None:
    # A's upstream asks for 30 s of rest; B's answers.
    limited = Script(error=ErrorSpec(status=429, retry_after=30))
    with (
        start_redis() as server,
        two_gateways(tmp_path, server, scripts=(limited, Script())) as (a, b, seen_a, seen_b),
    ):
        with pytest.raises(openai.APIError):
            chat(a, [{"role": "user", "content": "hi"}], "s1")
        assert paused(a)
        until(lambda: paused(b), "B paused")
        left = b.app.gateway.router.health.paused_until("mock")
        assert left is not None and 25 < left - b.app.gateway.clock() <= 30
        assert health_changes(seen_b) == [(True, "rate_limit")]
        # Paused, but the only candidate: B tries it, it answers, and the pause ends for both.
        assert chat(b, [{"role": "user", "content": "hi"}], "s2")
        # The SDK returns at the stream's last event, which may reach it a moment before the
        # gateway has recorded the answer's end.
        until(lambda: not paused(b), "B's pause ended")
        until(lambda: not paused(a), "A's pause ended")
        assert health_changes(seen_a) == [(True, "rate_limit"), (False, "success")]


def test_deployments_on_other_databases_of_one_redis_do_not_pause_each_other(
    tmp_path: Path,
) -> None:
    """A and its twin C share database 0, B is another deployment on database 1 of the same
    server with an upstream of the same name. Pub/sub channels span databases: A's pause must
    reach C and not B."""
    limited = Script(error=ErrorSpec(status=429, retry_after=30))
    with start_redis() as server, ExitStack() as exits:
        stacks = {}
        for name, db, script in (("a", 0, limited), ("c", 0, Script()), ("b", 1, Script())):
            up = Upstream("openai-chat", MockSettings(script=script))
            url = server.url.rsplit("/", 1)[0] + f"/{db}"
            config = {"state": {"redis_url": url}}
            stacks[name] = exits.enter_context(
                running_stack(tmp_path / name, {"mock": up}, config=config)
            )
        seen_b: list[Any] = []
        stacks["b"].app.events.listeners.append(seen_b.append)
        for stack in stacks.values():
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "connected to Redis")
            # Subscribed (and read back) before the pause is announced.
            until(lambda s=sharing: s.router.channel in _channels(server), "subscribed")
        with pytest.raises(openai.APIError):
            chat(stacks["a"], [{"role": "user", "content": "hi"}], "s1")
        assert paused(stacks["a"])
        until(lambda: paused(stacks["c"]), "C paused")
        # B answers on its own upstream, never paused by the other deployment.
        assert chat(stacks["b"], [{"role": "user", "content": "hi"}], "s2")
        assert not paused(stacks["b"]) and health_changes(seen_b) == []
        # What reached C over database 0's channel: B's upstream stays unpaused after it too.
        time.sleep(0.3)
        assert not paused(stacks["b"]) and health_changes(seen_b) == []


def _channels(server: RedisServer) -> list[str]:
    db = redis.Redis(port=server.port)
    try:
        return [c.decode() for c in db.pubsub_channels()]
    finally:
        db.close()


def test_a_conversation_continues_on_its_upstream_at_the_other_instance(tmp_path: Path) -> None:
    with start_redis() as server, two_gateways(tmp_path, server) as (a, b, _, seen_b):
        # A conversation answered by A continues on the same upstream at B, within its turn.
        first = [{"role": "user", "content": "look something up"}]
        assert chat(a, first, "conv-1")
        call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        turn = [
            *first,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        ]
        until(lambda: b.app.gateway.router.conversations == 1, "B knows the conversation")
        assert chat(b, turn, "conv-1")
        assert chat(b, turn, "conv-2")  # a conversation nobody answered yet
        assert [e.sticky for e in routed(seen_b)] == ["mock", None]


async def _load(stacks: tuple[Stack, ...], total: int, server: RedisServer) -> Counter[str]:
    """`total` streamed requests over `stacks`, 12 at a time; Redis stops after 80 have been
    answered and starts again after 180."""
    clients = [
        openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        for s in stacks
    ]
    outcomes: Counter[str] = Counter()
    lock = anyio.Semaphore(12)
    answered = 0

    async def one(n: int) -> None:
        nonlocal answered
        async with lock:
            try:
                stream = await clients[n % len(clients)].chat.completions.create(
                    model="gpt-e2e-1", messages=[{"role": "user", "content": f"n{n}"}], stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )
                outcomes["ok" if text else "empty"] += 1
            except openai.APIError as exc:
                outcomes[f"error {exc.code or exc.message}"] += 1
            answered += 1

    async def restart() -> None:
        while answered < 80:
            await anyio.sleep(0.01)
        await anyio.to_thread.run_sync(server.stop)
        while answered < 180:
            await anyio.sleep(0.01)
        await anyio.to_thread.run_sync(server.start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(restart)
        for n in range(total):
            tg.start_soon(one, n)
    for client in clients:
        await client.close()
    return outcomes


def test_redis_restarted_mid_load_requests_keep_flowing(tmp_path: Path) -> None:
    config = {
        "clients": [
            {"name": "tester", "key": KEY, "limits": [{"per": "hour", "requests": 100_000}]}
        ]
    }
    with (
        start_redis() as server,
        two_gateways(tmp_path, server, config=config, upstream={"max_concurrent": 8}) as (
            a,
            b,
            seen_a,
            seen_b,
        ),
    ):
        outcomes = anyio.run(_load, (a, b), 300, server)
        assert outcomes == {"ok": 300}
        for stack, seen in ((a, seen_a), (b, seen_b)):
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "Redis back")
            changes = [(e.shared, e.code) for e in seen if isinstance(e, SharedStateChanged)]
            assert changes[:2] == [
                (False, "gw.shared_state.lost"),
                (True, "gw.shared_state.back"),
            ], changes
        # Back on Redis: the restarted server (which kept nothing) counts the requests again.
        db = redis.Redis(port=server.port)
        window = "twserve:lim:{tester}:roll:3600"
        # Settlements run in the background (`RedisState.later`): a request of the load admitted
        # in Redis just as it came back may still be booking; count from when that has settled.
        before = _settled_count(db, window)
        assert before < 300  # what was admitted while Redis was away is not in it
        assert chat(a, [{"role": "user", "content": "again"}], "s1")
        assert chat(b, [{"role": "user", "content": "again"}], "s2")
        until(lambda: db.zcard(window) == before + 2, "both counted in Redis")
        db.close()
        # Each instance's keys view shows what Redis counted, both instances' requests.
        for stack in (a, b):
            (view,) = stack.portal.call(stack.app.usage.current_key_view, "tester")
            assert (view["used"], view["reserved"]) == (before + 2, 0)


def test_a_redis_that_stops_answering_holds_one_request_for_one_call_timeout(
    tmp_path: Path,
) -> None:
    """docs/deployment.md, "When Redis is lost": a Redis that stops answering (stopped, not
    gone: no refused connection to tell) holds the request asking it for at most the call's
    1 s; that request and the next go on with the instance's own limits, without asking."""
    config = {
        "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "hour", "requests": 50}]}]
    }
    with start_redis() as server, two_gateways(tmp_path, server, config=config) as (a, _, seen, _):
        sharing = a.app.sharing
        assert sharing is not None and sharing.state.timeout == 1.0
        assert chat(a, [{"role": "user", "content": "hi"}], "s1")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            took = []
            for n in range(3):
                started = time.monotonic()
                assert chat(a, [{"role": "user", "content": f"n{n}"}], f"s{n}")
                took.append(time.monotonic() - started)
                if n == 0:
                    assert not sharing.state.up  # lost by this request's call
            lost = [e for e in seen if isinstance(e, SharedStateChanged) and not e.shared]
            assert len(lost) == 1
        finally:
            server.proc.send_signal(signal.SIGCONT)
        # The first waited for its call (1 s, plus its own answer under load); the others did
        # not ask Redis at all.
        assert took[0] < 3.0, took
        until(lambda: sharing.state.up, "Redis back")


def test_a_reload_that_changes_the_redis_url_says_it_needs_a_restart(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    state = f"\nstate:\n  redis_url: {redis_server.url}\n"
    with live_gateway(
        tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c) + state
    ) as live:
        sharing = live.app.sharing
        assert sharing is not None and sharing.state.redis_url == redis_server.url
        caplog.set_level(logging.WARNING, logger="twserve")
        live.write(config_yaml(live.mock_ports, live.control_port))  # no state: not applied
        wait_for(lambda: live.events_of("ConfigReloaded"))
        assert "state.redis_url changed: it takes effect when twserve restarts" in caplog.text
        assert live.app.sharing is sharing and live.app.config.state is None
