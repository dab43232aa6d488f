"""What sharing through Redis costs a request: the round trips it waits for, the ones that go in
the background, and the added time to first byte against the same gateway without Redis, on a
real redis-server on loopback (docs/deployment.md, "What Redis costs a request").

A round trip is one `RedisState.call` (what a request awaits: one command, one script or one
pipeline) or one `RedisState.later` job (done by the background task, never awaited by a
request). The counts are asserted, so a change that adds a round trip to the request's path
fails here; the timings are printed, not asserted.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import httpcore
import pytest
import redis

from tests.support.servers import RedisClusterSet, RedisServer, start_redis
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script

LIMITED = {
    "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "hour", "requests": 10**6}]}]
}
GROUP = {
    "groups": [
        {
            "name": "pool",
            "type": "load-balance",
            "providers": [{"name": "a", "weight": 7}, {"name": "b", "weight": 3}],
        }
    ],
    "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
}
BODY = json.dumps(
    {"model": "gpt-e2e-1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()
HEADERS = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]


# Set while a round trip is made by background work (a queued job, the periodic health read or
# the reservations' renewal), not by a request waiting for it.
BACKGROUND: ContextVar[bool] = ContextVar("BACKGROUND", default=False)


class Counter:
    """Counts what one gateway's `RedisState` sends: round trips a request awaits, and the
    background jobs requests queue."""

    def __init__(self, stack: Stack) -> None:
        sharing = stack.app.sharing
        assert sharing is not None
        self.awaited = 0
        self.background = 0
        # Seconds requests spent waiting for their round trips.
        self.waited = 0.0
        state = sharing.state
        call, later = state.call, state.later

        async def counted_call(fn: Any) -> Any:
            if BACKGROUND.get():
                return await call(fn)
            self.awaited += 1
            started = time.perf_counter()
            try:
                return await call(fn)
            finally:
                self.waited += time.perf_counter() - started

        def counted_later(job: Any) -> None:
            self.background += 1

            async def marked(client: Any) -> None:
                token = BACKGROUND.set(True)
                try:
                    await job(client)
                finally:
                    BACKGROUND.reset(token)

            later(marked)

        def in_background(fn: Any) -> Any:
            async def marked(*args: Any) -> Any:
                token = BACKGROUND.set(True)
                try:
                    return await fn(*args)
                finally:
                    BACKGROUND.reset(token)

            return marked

        state.call = counted_call  # type: ignore[method-assign]
        state.later = counted_later  # type: ignore[method-assign]
        sharing.health.sync = in_background(sharing.health.sync)  # type: ignore[method-assign]
        sharing.limits.renew = in_background(sharing.limits.renew)  # type: ignore[method-assign]
        # The slot leases' periodic renewal and reconciling (a request takes its own lease
        # in `SharedSlots.ready`).
        sharing.slots.renew = in_background(sharing.slots.renew)  # type: ignore[method-assign]
        sharing.slots.reconcile = in_background(sharing.slots.reconcile)  # type: ignore[method-assign]

    def reset(self) -> None:
        self.awaited = self.background = 0


@contextmanager
def gateway(
    tmp: Path,
    url: str | None,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Iterator[Stack]:
    ups = {
        name: Upstream("openai-chat", MockSettings(script=Script()), extra=dict(extra or {}))
        for name in ("a", "b")
    }
    # A Cluster's gateway shares the process with its upstreams: a patient call bound.
    shared = {"state": {"redis_url": url, "timeout_secs": 5.0}} if url is not None else {}
    with running_stack(tmp, ups, config=shared | config) as stack:
        if url is not None:
            sharing = stack.app.sharing
            assert sharing is not None
            deadline = time.monotonic() + 20
            while not sharing.state.up:
                assert time.monotonic() < deadline, "never connected to Redis"
                time.sleep(0.02)
        yield stack


def first_byte_ms(client: httpcore.ConnectionPool, stack: Stack) -> float:
    """One streamed request; milliseconds until its first body byte (read to the end)."""
    started = time.perf_counter()
    url = stack.url + "/v1/chat/completions"
    with client.stream("POST", url, headers=HEADERS, content=BODY) as reply:
        assert reply.status == 200, reply.read()
        first = None
        for _ in reply.iter_stream():
            if first is None:
                first = time.perf_counter()
    assert first is not None
    return (first - started) * 1000


def per_request(stack: Stack, counter: Counter, n: int) -> tuple[float, float]:
    """The awaited and background round trips per request, over `n` sequential requests."""
    with httpcore.ConnectionPool() as client:
        first_byte_ms(client, stack)  # warm: scripts loaded, connections open
        time.sleep(0.3)  # the warm-up's background jobs done
        counter.reset()
        for _ in range(n):
            first_byte_ms(client, stack)
        time.sleep(0.5)  # the last request's settle and health jobs queued
    return counter.awaited / n, counter.background / n


BOUNDED = {"max_concurrent": 4}

# On one server (or Sentinel's master) the key limit, the group's turn and the slot leases go in
# one script (twserve.shared.admission): one round trip, whatever the request needs of the three.
# On a Cluster they lie on different hash slots and go one after another.
CASES = [
    # (name, config, upstream settings, awaited at most: one server, a Cluster)
    ("one upstream, key without limits", {}, {}, 0, 0),
    ("one upstream, key with limits", LIMITED, {}, 1, 1),
    ("load-balance group, key without limits", GROUP, {}, 1, 1),
    ("load-balance group, key with limits", LIMITED | GROUP, {}, 1, 2),
    # A slot lease is taken where the instance holds none spare (docs/balancing.md).
    ("group with max_concurrent, key without limits", GROUP, BOUNDED, 1, 2),
    ("group with max_concurrent, key with limits", LIMITED | GROUP, BOUNDED, 1, 3),
]


def _counted(
    tmp: Path, url: str, name: str, config: dict[str, Any], extra: dict[str, Any], most: int
) -> None:
    with gateway(tmp, url, config, extra) as stack:
        awaited, background = per_request(stack, Counter(stack), 20)
    print(f"\n{name}: {awaited:.2f} awaited, {background:.2f} background round trips per request")
    assert awaited <= most, (name, awaited)
    # Settling a limited request and each attempt's health outcome go in the background.
    assert background <= 4, (name, background)


@pytest.mark.parametrize("where", ["server", "cluster"])
@pytest.mark.parametrize(
    ("name", "config", "extra", "on_server", "on_cluster"), CASES, ids=[c[0] for c in CASES]
)
def test_round_trips_a_request_waits_for(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    where: str,
    name: str,
    config: dict[str, Any],
    extra: dict[str, Any],
    on_server: int,
    on_cluster: int,
) -> None:
    if where == "server":
        server: RedisServer = request.getfixturevalue("redis_server")
        redis.Redis.from_url(server.url).flushdb()
        _counted(tmp_path, server.url, name, config, extra, on_server)
    else:
        cluster: RedisClusterSet = request.getfixturevalue("redis_cluster")
        _counted(tmp_path, cluster.url, f"{name} (Cluster)", config, extra, on_cluster)


@pytest.mark.parametrize(
    ("case", "extra"),
    [("limits + group", {}), ("limits + group + max_concurrent", BOUNDED)],
    ids=["group", "max_concurrent"],
)
def test_what_redis_adds_to_the_time_to_first_byte(
    tmp_path: Path, case: str, extra: dict[str, Any]
) -> None:
    """The same requests, alternating between a gateway sharing through Redis (a limited key,
    a load-balance group, with or without max_concurrent: one awaited round trip) and one
    without it, in one run."""
    times: dict[str, list[float]] = {"redis": [], "alone": []}
    # What each request of the Redis gateway spent waiting for Redis, ms.
    waits: list[float] = []
    with (
        start_redis() as server,
        gateway(tmp_path / "redis", server.url, LIMITED | GROUP, extra) as shared,
        gateway(tmp_path / "alone", None, LIMITED | GROUP, extra) as alone,
        httpcore.ConnectionPool() as client,
    ):
        stacks = {"redis": shared, "alone": alone}
        for stack in stacks.values():
            for _ in range(20):
                first_byte_ms(client, stack)
        counter = Counter(shared)
        for _ in range(200):
            for name, stack in stacks.items():
                before = counter.waited
                times[name].append(first_byte_ms(client, stack))
                if name == "redis":
                    waits.append((counter.waited - before) * 1000)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    p50 = {name: statistics.median(v) for name, v in times.items()}
    p99 = {name: pct(v, 0.99) for name, v in times.items()}
    print(
        f"\n{case}: time to first byte, ms: "
        f"with Redis p50 {p50['redis']:.2f} p99 {p99['redis']:.2f}; "
        f"without p50 {p50['alone']:.2f} p99 {p99['alone']:.2f}; "
        f"added p50 {p50['redis'] - p50['alone']:+.2f} p99 {p99['redis'] - p99['alone']:+.2f}; "
        f"waiting for Redis p50 {statistics.median(waits):.2f} p99 {pct(waits, 0.99):.2f} "
        f"({counter.awaited / 200:.2f} round trips per request)"
    )
    assert len(times["redis"]) == len(times["alone"]) == len(waits) == 200
