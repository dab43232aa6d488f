"""Fixtures shared by every test package: real Redis and PostgreSQL servers
(tests/support/servers.py) — one Redis, a Redis Cluster, a Sentinel set — started once per
session on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.servers import (
    PostgresServer,
    RedisClusterSet,
    RedisServer,
    SentinelSet,
    start_cluster,
    start_postgres,
    start_redis,
    start_sentinels,
)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with start_redis() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterSet]:
    """Three masters as one Redis Cluster."""
    with start_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinels() -> Iterator[SentinelSet]:
    """A master, its replica and three sentinels (a test that kills the master takes a
    `start_sentinels` of its own)."""
    with start_sentinels() as found:
        yield found


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with start_postgres() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def scripts_keep_keys_in_one_slot() -> Iterator[None]:
    """Every Lua script a test runs on Redis is given keys of one hash slot, as a Redis
    Cluster requires (docs/deployment.md, "The hash-tag rule"): checked on each call, on a
    single server too, so a script whose keys would be refused by a Cluster fails here.

    The one exception is `twserve.shared.admission.ADMISSION`, which chains scripts of
    different slots in one round trip and is a single-server script: each of its parts is
    given keys of one slot (as that script on its own would be), and it is never sent to a
    Cluster."""
    try:
        from redis.asyncio.cluster import ClusterPipeline, RedisCluster
        from redis.cluster import key_slot
        from redis.commands.core import AsyncScript

        from twserve.shared.admission import ADMISSION
    except ImportError:  # the redis extra is not installed: nothing runs scripts
        yield
        return
    call = AsyncScript.__call__

    def one_slot(names: list[bytes]) -> None:
        slots = {key_slot(k) for k in names}
        assert len(slots) <= 1, f"a script's keys lie in {len(slots)} slots: {names}"

    async def checked(self: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        names = [k.encode() if isinstance(k, str) else bytes(k) for k in keys or []]
        if self.script != ADMISSION:
            one_slot(names)
            return await call(self, keys, args, client)
        target = client if client is not None else self.registered_client
        assert not isinstance(target, RedisCluster | ClusterPipeline), "ADMISSION on a Cluster"
        n, taken = int(args[0]), 0
        for i in range(n):
            count = int(args[2 + 3 * i])
            one_slot(names[taken : taken + count])
            taken += count
        assert taken == len(names), "ADMISSION's parts do not account for its keys"
        return await call(self, keys, args, client)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AsyncScript, "__call__", checked)
        yield
