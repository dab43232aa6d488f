"""The three forms of ``state.redis_url``: checked by the config (``config.url_invalid``),
read by `twserve.shared.redis.parse_url`, shown without their secrets."""

from __future__ import annotations

import anyio
import pytest
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from tests.twengine.config.test_build import build
from twengine.config import ConfigError
from twserve.shared.redis import RedisTarget, describe_url, parse_url


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    url = "redis+sentinel://app:s%40cret@10.0.0.1,10.0.0.2:26380/main/3?sentinel_password=sp"
    assert parse_url(url) == RedisTarget(
        kind="sentinel",
        nodes=(("10.0.0.1", 26379), ("10.0.0.2", 26380)),
        master="main",
        db=3,
        username="app",
        password="s@cret",
        sentinel_password="sp",
    )
    assert parse_url("redis+sentinel://[::1]:5000/m").nodes == (("::1", 5000),)
    assert parse_url("redis+sentinel://h/m").db == 0
    assert describe_url(url) == "redis+sentinel://10.0.0.1,10.0.0.2:26380/main/3"


def test_a_cluster_url_names_the_nodes_to_start_from() -> None:
    url = "redis+cluster://:pw@a:7000,b:7001,c"
    assert parse_url(url) == RedisTarget(
        kind="cluster",
        nodes=(("a", 7000), ("b", 7001), ("c", 6379)),
        password="pw",
    )
    assert describe_url(url) == "redis+cluster://a:7000,b:7001,c"
    assert parse_url("redis://h:1/2") == RedisTarget(kind="server")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h:26379", "master's name is missing"),
        ("redis+sentinel://h/m/x", "/<master>/<database number>"),
        ("redis+cluster://a:7000/1", "database 0 only"),
        ("redis+cluster://a:port", "not host[:port]"),
        ("redis+other://a", "unknown scheme"),
    ],
)
def test_a_malformed_url_is_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
        parse_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://a:26379,b:26379/mymaster/1",
        "redis+sentinel://:pw@a/mymaster?sentinel_password=x",
        "redis+cluster://a:7000,b:7001,c:7002",
        "redis+cluster://user:pw@a:7000/0",
    ],
)
def test_the_config_takes_sentinel_and_cluster_urls(url: str) -> None:
    config = build(state={"redis_url": url})
    assert config.state is not None and config.state.redis_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://a:26379", "redis+sentinel:// URL"),
        ("redis+sentinel://:secret@a:26379,/m", "redis+sentinel:// URL"),
        ("redis+cluster://a:7000/2", "database 0 only"),
        ("redis+cluster://a:7000,b:x", "redis+cluster:// URL"),
    ],
)
def test_the_config_refuses_a_malformed_sentinel_or_cluster_url(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(state={"redis_url": url})
    (problem,) = info.value.problems
    assert (problem.code, problem.path) == ("config.url_invalid", "state.redis_url")
    assert says in problem.message and "secret" not in problem.message


def test_the_tests_refuse_a_script_given_keys_of_two_slots() -> None:
    """tests/conftest.py checks every script call: keys of two hash tags fail before any
    network (the Cluster would refuse them)."""
    script = AsyncScript(Redis(), "return 1")

    async def run() -> None:
        await script(keys=["t:{a}:x", "t:{b}:y"], args=[])

    with pytest.raises(AssertionError, match="2 slots"):
        anyio.run(run)
