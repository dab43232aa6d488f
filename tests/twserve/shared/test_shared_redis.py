"""Several gateway processes sharing their state through a real Redis.

Three ``twserve serve`` processes (each its own port and SQLite file) run the same config with
``state.redis_url`` over one mock upstream (``twserve mock-upstream``); the official OpenAI SDK
sends streamed requests round-robin over the three ports, as a client pool behind a load
balancer would.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpcore
import openai
import pytest
from ruamel.yaml import YAML

from tests.support.servers import RedisServer, free_port, start_redis
from twengine.balance import SmoothWeightedRoundRobin

KEY = "pool-key"


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the process on {port} exited: {log.read_text()[-2000:]}")
        try:
            if httpcore.request("GET", f"http://127.0.0.1:{port}/healthz").status == 200:
                return
        except httpcore.ConnectError:
            time.sleep(0.1)
    pytest.fail(f"nothing answered on port {port}: {log.read_text()[-2000:]}")


@contextmanager
def _process(argv: list[str], port: int, home: Path) -> Iterator[subprocess.Popen[bytes]]:
    home.mkdir(parents=True, exist_ok=True)
    log = home / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twserve.cli.main", *argv],
            env={**os.environ, "TWSERVE_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(port, proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def instances(
    tmp: Path,
    redis: RedisServer,
    count: int,
    extra: dict[str, Any] | None = None,
    *,
    upstreams: tuple[str, ...] = ("mock",),
) -> Iterator[list[int]]:
    """`count` gateway processes sharing `redis`, over one mock upstream process (configured as
    each of `upstreams`); their ports."""
    with ExitStack() as exits:
        mock_port = free_port()
        exits.enter_context(
            _process(["mock-upstream", "--port", str(mock_port)], mock_port, tmp / "mock")
        )
        config = {
            "version": 1,
            "listen": {"gateway": {"bind": "127.0.0.1"}},
            "clients": [
                {"name": "pool", "key": KEY, "limits": [{"per": "minute", "requests": 100}]}
            ],
            "providers": [
                {
                    "name": name,
                    "protocol": "openai-chat",
                    "base_url": f"http://127.0.0.1:{mock_port}/v1",
                    "key": "upstream-key",
                }
                for name in upstreams
            ],
            # A request that finds the window held by requests in flight waits at most this.
            "failover": {"wait_secs": 2},
            "state": {"redis_url": redis.url},
        } | (extra or {})
        path = tmp / "config.yaml"
        with path.open("w") as f:
            YAML().dump(config, f)
        ports = []
        for i in range(count):
            port = free_port()
            exits.enter_context(
                _process(["serve", "--config", str(path), "--port", str(port)], port, tmp / f"i{i}")
            )
            ports.append(port)
        yield ports


async def _ask(client: openai.AsyncOpenAI, n: int) -> str:
    """One streamed request: ``ok`` with its text streamed whole, else what refused it."""
    try:
        stream = await client.chat.completions.create(
            model="gpt-e2e-1",
            messages=[{"role": "user", "content": f"request {n}"}],
            stream=True,
        )
        text = ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return "ok" if text else "empty"
    except openai.RateLimitError as exc:
        return f"429 {exc.code}"
    except openai.APIStatusError as exc:
        return f"{exc.status_code} {exc.code}"
    except openai.APIError as exc:  # an error event after the stream's 200
        return f"stream {exc.code or exc.message}"


async def _load(ports: Sequence[int], total: int, parallel: int) -> Counter[str]:
    clients = [
        openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=20
        )
        for port in ports
    ]
    outcomes: Counter[str] = Counter()
    lock = anyio.Semaphore(parallel)

    async def one(n: int) -> None:
        async with lock:
            outcomes[await _ask(clients[n % len(clients)], n)] += 1

    async with anyio.create_task_group() as tg:
        for n in range(total):
            tg.start_soon(one, n)
    for client in clients:
        await client.close()
    return outcomes


def _redis_lost(tmp: Path, count: int) -> list[str]:
    """The "shared state: Redis ... failed" lines the instances logged."""
    lines = []
    for i in range(count):
        text = (tmp / f"i{i}" / "out.log").read_text(errors="replace")
        lines += [line for line in text.splitlines() if "shared state: Redis" in line]
    return lines


def _counted(home: Path) -> int:
    with closing(sqlite3.connect(home / "requests.sqlite3")) as db:
        return int(db.execute("SELECT count(*) FROM requests WHERE counted = 1").fetchone()[0])


def test_three_instances_admit_exactly_the_key_limit(tmp_path: Path) -> None:
    with start_redis() as redis, instances(tmp_path, redis, 3) as ports:
        outcomes = anyio.run(_load, ports, 1000, 48)
    lost = _redis_lost(tmp_path, 3)
    if lost:
        # A Redis call that ran out of its second (a starved machine) fails open, as documented
        # (docs/deployment.md): the instance that lost Redis counts on its own until it is back.
        # Exactness is promised while Redis answers; say so rather than pass or fail silently.
        assert 100 <= outcomes["ok"] <= 100 * 3, (outcomes, lost)
        pytest.skip(f"Redis was lost during the run, limits failed open as documented: {lost}")
    assert outcomes["ok"] == 100, outcomes
    assert outcomes["429 gw.key_limit.requests_rolling"] == 900, outcomes
    # Each instance admitted its part (round-robin), and stored what it admitted.
    counted = [_counted(tmp_path / f"i{i}") for i in range(3)]
    assert sum(counted) == 100 and all(c > 0 for c in counted), counted


def _providers(home: Path) -> list[str]:
    with closing(sqlite3.connect(home / "requests.sqlite3")) as db:
        rows = db.execute("SELECT provider FROM requests ORDER BY ts").fetchall()
    return [str(row[0]) for row in rows]


def test_three_instances_interleave_a_7_3_group_as_one_gateway(tmp_path: Path) -> None:
    """The issue's run: 20 requests alternating over three processes on a 7:3 group went
    ``33777733777733777777`` while each instance kept its own turns. Shared, the deployment's
    sequence is one gateway's (twengine.balance): never more than three of the 7 in a row."""
    pool = {
        "clients": [{"name": "pool", "key": KEY}],
        "groups": [
            {
                "name": "pool",
                "type": "load-balance",
                "providers": [{"name": "seven", "weight": 7}, {"name": "three", "weight": 3}],
            }
        ],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
    }

    async def sequential(ports: Sequence[int]) -> list[str]:
        clients = [
            openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=20
            )
            for port in ports
        ]
        outcomes = [await _ask(clients[n % 3], n) for n in range(20)]
        for client in clients:
            await client.close()
        return outcomes

    with (
        start_redis() as redis,
        instances(tmp_path, redis, 3, pool, upstreams=("seven", "three")) as ports,
    ):
        assert anyio.run(sequential, ports) == ["ok"] * 20
        homes = [tmp_path / f"i{i}" for i in range(3)]
        deadline = time.monotonic() + 20
        while [len(_providers(h)) for h in homes] != [7, 7, 6]:
            assert time.monotonic() < deadline, "the rows were never written"
            time.sleep(0.1)
        per_instance = [_providers(h) for h in homes]
    picks = "".join(per_instance[n % 3][n // 3][0] for n in range(20))  # s(even) / t(hree)
    rr = SmoothWeightedRoundRobin()
    one = "".join(rr.pick([("s", 7.0), ("t", 3.0)], {"s", "t"}) for _ in range(20))
    assert picks == one, picks
    assert max(len(run) for run in picks.replace("t", " ").split()) <= 3
