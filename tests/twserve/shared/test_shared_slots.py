"""Upstream slots exact across instances (twserve.shared.slots), against a real redis-server:
three gateways over one mock upstream with ``max_concurrent: 2``."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpcore
import pytest
import redis
from ruamel.yaml import YAML

from tests.support.servers import RedisServer, free_port, start_redis
from tests.twserve.shared.test_shared_redis import _process
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twengine.config import build_config
from twengine.router import Router
from twmock.script import MockSettings, Script
from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisDown, RedisState
from twserve.shared.slots import SharedSlots

# A stream of 8 chunks 0.1 s apart: about 0.8 s at the upstream.
SLOW = Script(chunks=8, chunk_delay=0.1)


def until(check: Callable[[], bool], what: str, secs: float = 20.0) -> None:
    deadline = time.monotonic() + secs
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def _db_url(server: RedisServer, db: int) -> str:
    url = f"redis://127.0.0.1:{server.port}/{db}"
    redis.Redis.from_url(url).flushdb()
    return url


@contextmanager
def three_gateways(
    tmp: Path, url: str, *, wait_secs: float, limit: int = 2
) -> Iterator[list[Stack]]:
    """Gateways A, B, C sharing Redis at `url`, each with upstream ``a`` (``max_concurrent:
    limit``) at A's mock: one real upstream behind three instances."""
    config = {"state": {"redis_url": url}, "failover": {"wait_secs": wait_secs}}
    with ExitStack() as exits:
        first = Upstream("openai-chat", MockSettings(script=SLOW), extra={"max_concurrent": limit})
        a = exits.enter_context(running_stack(tmp / "A", {"a": first}, config=config))
        (provider,) = a.app.gateway.config.providers
        stacks = [a]
        for name in ("B", "C"):
            same = Upstream(
                "openai-chat",
                MockSettings(),
                extra={"max_concurrent": limit, "base_url": provider.base_url},
            )
            stacks.append(
                exits.enter_context(running_stack(tmp / name, {"a": same}, config=config))
            )
        for stack in stacks:
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "connected to Redis")
        yield stacks


def stream(stack: Stack) -> tuple[int, dict[str, str], bytes]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    response = httpcore.request(
        "POST",
        stack.url + "/v1/chat/completions",
        headers=[(b"authorization", f"Bearer {KEY}".encode())],
        content=json.dumps(body).encode(),
        extensions={"timeout": {"read": 60}},
    )
    headers = {k.decode().lower(): v.decode() for k, v in response.headers}
    return response.status, headers, response.content


def fire(stacks: list[Stack], count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`count` streamed requests at once, round-robin over the gateways."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda i: stream(stacks[i % len(stacks)]), range(count)))


def test_three_instances_never_send_more_than_max_concurrent_and_serve_every_waiter(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 10)
    with three_gateways(tmp_path, url, wait_secs=60) as stacks:
        mock = stacks[0].mock("a")
        results = fire(stacks, 12)
        assert [status for status, _, _ in results] == [200] * 12
        assert all(b"data: [DONE]" in content for _, _, content in results)
        assert len(mock.received) == 12
        # Never more than 2 at the upstream at once, and 2 were used.
        assert mock.peak_in_flight == 2
        # Every lease was given back once the streams ended.
        db = redis.Redis.from_url(url)
        until(lambda: db.zcard("twserve:{slots:a}") == 0, "leases given back")


def test_a_waiter_past_wait_secs_gets_429_with_retry_after(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 11)
    with three_gateways(tmp_path, url, wait_secs=0.3) as stacks:
        mock = stacks[0].mock("a")
        results = fire(stacks, 9)
        statuses = sorted(status for status, _, _ in results)
        served = statuses.count(200)
        # Two slots, streams of ~0.8 s, a 0.3 s wait: two served, the rest told to come back.
        assert served >= 2 and statuses.count(429) == 9 - served and served < 9
        assert mock.peak_in_flight <= 2
        for status, headers, content in results:
            if status == 429:
                assert int(headers["retry-after"]) >= 1
                assert json.loads(content)["error"]["code"] == "gw.busy_all"


CONFIG = {
    "version": 1,
    "providers": [
        {"name": "a", "base_url": "http://127.0.0.1:9/v1", "key": "k", "max_concurrent": 2},
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "key": "k"},
    ],
}


async def _instance(url: str, prefix: str, lease_secs: float) -> SharedSlots:
    state = RedisState(url, prefix=prefix)
    assert await state.connect()
    hooks = RouterHooks(Router(build_config(CONFIG)))
    return SharedSlots(
        state, hooks, instance=uuid.uuid4().hex, clock=time.monotonic, lease_secs=lease_secs
    )


@pytest.mark.anyio
async def test_a_dead_instances_slots_come_back_when_its_leases_lapse(
    redis_server: RedisServer,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    one = await _instance(redis_server.url, prefix, lease_secs=1.0)
    two = await _instance(redis_server.url, prefix, lease_secs=1.0)
    # `one` takes both slots (a lease each, then the slot under it); an unlimited upstream
    # costs no lease.
    for owner in ("r1", "r2"):
        await one.ready(["a", "b"], owner)
        assert one.hooks.acquire("a", owner) is not None
    assert len(one.leases["a"]) == 2 and "b" not in one.leases
    # `two` finds no room: its request waits, and no lease is to be had.
    await two.ready(["a"], "s1")
    assert two.hooks.acquire("a", "s1") is None
    granted: list[Any] = []
    two.hooks.wait(("a",), "s1", deadline=1e12, deliver=lambda p: granted.append(p) or True)
    assert await two.reconcile() and not granted
    # `one` dies holding both (no release, no renewal): within the lease, two's waiter is served.
    started = time.monotonic()
    with anyio.fail_after(10):
        while not granted:
            await anyio.sleep(0.05)
            await two.reconcile()
    assert 0.5 < time.monotonic() - started < 3.0
    assert [p.owner for p in granted] == ["s1"] and len(two.leases["a"]) == 1
    for shared in (one, two):
        await shared.state.aclose()


@pytest.mark.anyio
async def test_a_slot_given_back_reaches_a_waiter_on_another_instance(
    redis_server: RedisServer,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    one = await _instance(redis_server.url, prefix, lease_secs=30.0)
    two = await _instance(redis_server.url, prefix, lease_secs=30.0)
    held = []
    for owner in ("r1", "r2"):
        await one.ready(["a"], owner)
        held.append(one.hooks.acquire("a", owner))
    await two.ready(["a"], "s1")
    assert two.hooks.acquire("a", "s1") is None
    granted: list[Any] = []
    two.hooks.wait(("a",), "s1", deadline=1e12, deliver=lambda p: granted.append(p) or True)
    assert await two.reconcile()
    # One stream ends on `one`: its lease goes back (one round trip), and `two` takes it.
    permit = held[0]
    assert permit is not None
    one.hooks.release(permit)
    assert not await one.reconcile()
    assert len(one.leases["a"]) == 1
    assert not await two.reconcile()
    assert [p.owner for p in granted] == ["s1"]
    # Exact: neither instance has room now.
    assert one.hooks.router.slots.is_full("a") and two.hooks.router.slots.is_full("a")
    for shared in (one, two):
        await shared.state.aclose()


def test_an_instance_killed_mid_stream_frees_its_slots_when_its_leases_lapse(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 12)
    # Streams of about 3 s: the killed instance's two are cut in the middle.
    up = Upstream(
        "openai-chat",
        MockSettings(script=Script(chunks=30, chunk_delay=0.1)),
        extra={"max_concurrent": 2},
    )
    config = {"state": {"redis_url": url}, "failover": {"wait_secs": 20}}
    with running_stack(tmp_path / "A", {"a": up}, config=config) as a:
        mock = a.mock("a")
        (provider,) = a.app.gateway.config.providers
        sharing = a.app.sharing
        assert sharing is not None
        until(lambda: sharing.state.up, "A connected to Redis")
        # B: a `twserve serve` process over the same upstream, to be killed with SIGKILL.
        port = free_port()
        path = tmp_path / "b.yaml"
        with path.open("w") as f:
            YAML().dump(
                {
                    "version": 1,
                    "listen": {"gateway": {"bind": "127.0.0.1"}},
                    "clients": [{"name": "tester", "key": KEY}],
                    "providers": [
                        {
                            "name": "a",
                            "protocol": "openai-chat",
                            "base_url": provider.base_url,
                            "key": "upstream-key-a",
                            "max_concurrent": 2,
                        }
                    ],
                    **config,
                },
                f,
            )
        db = redis.Redis.from_url(url)
        argv = ["serve", "--config", str(path), "--port", str(port)]
        with ThreadPoolExecutor(3) as pool, _process(argv, port, tmp_path / "B") as proc:
            b = Stack(portal=a.portal, app=a.app, port=port, mocks={}, data_dir=tmp_path / "B")
            cut = [pool.submit(stream, b) for _ in range(2)]
            until(lambda: mock.in_flight == 2, "B's two streams at the upstream")
            assert db.zcard("twserve:{slots:a}") == 2
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed = time.monotonic()
            # A's request waits: B's leases stay until they lapse (5 s), then it is served.
            status, _, content = stream(a)
            waited = time.monotonic() - killed
        assert status == 200 and b"data: [DONE]" in content
        # B's leases had 3.3-5 s left (renewed every 1.7 s), then A's ~3 s stream.
        print(f"killed instance: waited {waited:.2f} s for its slots and a 3 s stream")
        assert 5.5 < waited < 12.0
        assert mock.peak_in_flight == 2
        for future in cut:
            assert future.exception() is not None or future.result()[0] == 200


@pytest.mark.anyio
async def test_with_redis_away_each_instance_counts_its_slots_alone() -> None:
    with start_redis() as server:
        one = await _instance(server.url, "away:", lease_secs=30.0)
        await one.ready(["a"], "r1")
        assert one.hooks.acquire("a", "r1") is not None
        slots = one.hooks.router.slots
        assert slots.outside("a") == 1  # the lease not held here counts as held elsewhere
        server.stop()
        with pytest.raises(RedisDown):
            await one.renew()  # the batch renewal finds Redis gone
        # Lost: leases forgotten, the full limit counted here alone (documented overshoot).
        assert not one.state.up and one.leases == {} and slots.outside("a") == 0
        await one.ready(["a"], "r2")  # no round trip while Redis is lost
        assert one.hooks.acquire("a", "r2") is not None and slots.is_full("a")
        server.start()
        assert await one.state.connect()
        await one.reconcile()
        # Back: leases for both slots in flight, taken in Redis again.
        assert len(one.leases["a"]) == 2
        assert redis.Redis.from_url(server.url).zcard("away:{slots:a}") == 2
        await one.state.aclose()
