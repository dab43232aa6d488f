"""Shared state on a Redis Cluster (``redis+cluster://``) of three masters on loopback: two
gateways hold a key limit exactly, share a pause and conversation affinity, and a gateway that
starts later reads back the pauses and the conversations from every node."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
import redis

from tests.support.servers import RedisClusterSet
from tests.twserve.support.stack import Stack, Upstream, running_stack
from tests.twserve.topology.support import (
    OTHER_KEY,
    chat,
    clients,
    continues_elsewhere,
    gateways,
    paused,
    shared_changes,
    until,
)
from twmock.script import ErrorSpec, MockSettings, Script

pytestmark = pytest.mark.anyio

# The gateways, their upstreams and this test share one process (and its GIL): on a saturated
# machine a Redis call can take over the default second, which would count as Redis lost and let
# each gateway use its own limits. These tests are about what is shared, not about the loss.
PATIENT = 5.0


@pytest.fixture
def cluster(redis_cluster: RedisClusterSet) -> RedisClusterSet:
    """The session's Cluster, emptied (every node) for this test."""
    for node in redis_cluster.nodes:
        db = redis.Redis(port=node.port)
        try:
            db.flushall()
        finally:
            db.close()
    return redis_cluster


def _node_of(found: RedisClusterSet, key: str) -> int:
    """The port of the master that holds `key`'s slot."""
    db = redis.Redis(port=found.nodes[0].port)
    try:
        slot = int(db.execute_command("CLUSTER", "KEYSLOT", key))  # type: ignore[no-untyped-call]
        slots = db.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        for start, end, master, *_ in slots:
            if start <= slot <= end:
                return int(master[1])
    finally:
        db.close()
    raise AssertionError(f"no node holds slot {slot}")


async def _burst(stacks: list[Stack], total: int) -> Counter[str]:
    """`total` requests of the ``exact`` key, 12 at a time (as many as the limit: they race
    it), alternating over `stacks`."""
    sdk = [
        openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=OTHER_KEY, max_retries=0, timeout=20)
        for s in stacks
    ]
    outcomes: Counter[str] = Counter()
    racing = anyio.Semaphore(12)

    async def one(n: int) -> None:
        async with racing:
            await ask(n)

    async def ask(n: int) -> None:
        try:
            answer = await sdk[n % len(sdk)].chat.completions.create(
                model="gpt-e2e-1", messages=[{"role": "user", "content": f"n{n}"}]
            )
            outcomes["ok" if answer.choices[0].message.content else "empty"] += 1
        except openai.RateLimitError:
            outcomes["429"] += 1
        except openai.APIError as exc:
            outcomes[f"error {exc.code or exc.message}"] += 1

    async with anyio.create_task_group() as tg:
        for n in range(total):
            tg.start_soon(one, n)
    for client in sdk:
        await client.close()
    return outcomes


def test_two_gateways_on_a_cluster_hold_a_key_limit_exactly(
    tmp_path: Path, cluster: RedisClusterSet
) -> None:
    config = {"clients": clients(hourly=100_000, exact=12)}
    # Slots are synced too (a pipeline over keys on several nodes).
    with gateways(
        tmp_path,
        cluster.url,
        config=config,
        upstream={"max_concurrent": 8},
        timeout_secs=PATIENT,
    ) as (
        stacks,
        seen,
    ):
        outcomes = anyio.run(_burst, stacks, 36)
        assert outcomes == {"ok": 12, "429": 24}, outcomes
        # The limit's keys share the hash tag {exact}: one slot, one node.
        db = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            names = [k.decode() for k in db.scan_iter(match="twserve:lim:{exact}:*")]
        finally:
            db.close()
        assert "twserve:lim:{exact}:roll:3600" in names
        assert len({_node_of(cluster, name) for name in names}) == 1
        for stack, events in zip(stacks, seen, strict=True):
            (view,) = stack.portal.call(stack.app.usage.current_key_view, "exact")
            assert (view["used"], view["reserved"]) == (12, 0)
            assert shared_changes(events) == []  # Redis never lost


def test_a_pause_is_shared_on_a_cluster_and_read_back_by_a_later_gateway(
    tmp_path: Path, cluster: RedisClusterSet
) -> None:
    limited = Script(error=ErrorSpec(status=429, retry_after=30))
    with gateways(tmp_path, cluster.url, scripts=(limited, Script()), timeout_secs=PATIENT) as (
        stacks,
        seen,
    ):
        a, b = stacks
        with pytest.raises(openai.APIError):
            chat(a, "hi", "s1")
        assert paused(a)
        until(lambda: paused(b), "B paused")
        # A third gateway, started now, reads the pause back at (re)connecting.
        up = Upstream("openai-chat", MockSettings(script=Script()))
        config: dict[str, Any] = {"state": {"redis_url": cluster.url}}
        with running_stack(tmp_path / "late", {"mock": up}, config=config) as late:
            until(lambda: paused(late), "the later gateway paused")
        assert all(shared_changes(events) == [] for events in seen)


def test_affinity_is_shared_on_a_cluster_and_read_back_from_every_node(
    tmp_path: Path, cluster: RedisClusterSet
) -> None:
    with gateways(tmp_path, cluster.url, timeout_secs=PATIENT) as (stacks, seen):
        a, b = stacks
        continues_elsewhere(a, b, seen[1], "conv-cluster")
        for n in range(8):
            assert chat(a, f"conversation {n}", f"conv-{n}")
        known = a.app.gateway.router.conversations
        assert known == 9
        # The conversation keys lie on several nodes: a gateway started now finds them all
        # (SCAN on every master, then one GET each).
        db = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            names = [k.decode() for k in db.scan_iter(match="twserve:conv:*")]
        finally:
            db.close()
        until(lambda: len(names) == known or _refresh(cluster, names) == known, "all stored")
        assert len({_node_of(cluster, name) for name in names}) > 1
        up = Upstream("openai-chat", MockSettings(script=Script()))
        config: dict[str, Any] = {"state": {"redis_url": cluster.url}}
        with running_stack(tmp_path / "late", {"mock": up}, config=config) as late:
            until(lambda: late.app.gateway.router.conversations == known, "read back")


def _refresh(found: RedisClusterSet, names: list[str]) -> int:
    db = redis.RedisCluster(host="127.0.0.1", port=found.nodes[0].port)
    try:
        names[:] = [k.decode() for k in db.scan_iter(match="twserve:conv:*")]
    finally:
        db.close()
    return len(names)
