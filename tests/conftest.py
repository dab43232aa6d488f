"""Fixtures shared by every test package: real Redis and PostgreSQL servers
(tests/support/servers.py), started once per session on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import PostgresServer, RedisServer, start_postgres, start_redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with start_redis() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with start_postgres() as server:
        yield server
