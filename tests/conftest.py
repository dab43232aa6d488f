"""Fixtures shared by every test package: real Redis and PostgreSQL servers
(tests/support/servers.py) — one Redis, a Redis Cluster, a Sentinel set — started once per session on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

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
