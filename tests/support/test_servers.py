"""The test servers themselves answer: a Redis PING and a PostgreSQL query, through the client
libraries the gateway uses for them."""

from __future__ import annotations

import psycopg
import redis

from tests.support.servers import PostgresServer, RedisServer, start_redis


def test_redis_server_answers(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.ping() is True
        client.set("twserve:test", "1")
        assert client.get("twserve:test") == b"1"
    finally:
        client.close()


def test_redis_server_restarts_on_the_same_port() -> None:
    with start_redis() as server:
        port = server.port
        server.stop()
        server.start()
        assert server.port == port
        client = redis.Redis.from_url(server.url)
        try:
            assert client.ping() is True
        finally:
            client.close()


def test_postgres_server_answers(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn) as conn:
        row = conn.execute("select 40 + 2").fetchone()
        assert row == (42,)
