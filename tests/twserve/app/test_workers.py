"""``twserve serve --workers 2``: two gateway processes on one port behave as one gateway, with
their state on a real Redis (docs/deployment.md, "Several workers")."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import httpcore
from ruamel.yaml import YAML

from tests.support.servers import RedisServer, free_port, start_redis

KEY, FREE = "limited-key-0123456789", "free-key-0123456789abc"


def _healthy(port: int) -> bool:
    try:
        return httpcore.request("GET", f"http://127.0.0.1:{port}/healthz").status == 200
    except (httpcore.NetworkError, httpcore.RemoteProtocolError):  # refused, or cut: draining
        return False


@contextmanager
def _running(argv: list[str], home: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    home.mkdir(parents=True, exist_ok=True)
    with (home / "out.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twserve.cli.main", *argv],
            env={**os.environ, "TWSERVE_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not _healthy(port):
            assert proc.poll() is None, (home / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (home / "out.log").read_text()[-3000:]
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _config(tmp: Path, redis: RedisServer, mock_port: int) -> Path:
    closed = free_port()  # nothing listens there: every attempt fails to connect
    config = {
        "version": 1,
        "listen": {"gateway": {"bind": "127.0.0.1"}},
        "clients": [
            {"name": "limited", "key": KEY, "limits": [{"per": "minute", "requests": 10}]},
            {"name": "free", "key": FREE},
        ],
        "providers": [
            {
                "name": "mock",
                "protocol": "openai-chat",
                "base_url": f"http://127.0.0.1:{mock_port}/v1",
                "key": "upstream-key",
                "models": ["gpt-e2e-1"],
            },
            {
                "name": "down",
                "protocol": "openai-chat",
                "base_url": f"http://127.0.0.1:{closed}/v1",
                "key": "upstream-key",
                "models": ["down-model"],
            },
        ],
        "failover": {"wait_secs": 0, "failures_to_pause": 3},
        "state": {"redis_url": redis.url},
    }
    path = tmp / "config.yaml"
    with path.open("w") as f:
        YAML().dump(config, f)
    return path


def _chat(port: int, key: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    # A connection of its own each time: the kernel spreads connections over the workers.
    with httpcore.ConnectionPool() as pool:
        answer = pool.request(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            content=json.dumps(body).encode(),
        )
    return answer.status


def _rows(home: Path) -> list[sqlite3.Row]:
    with closing(sqlite3.connect(home / "requests.sqlite3")) as db:
        db.row_factory = sqlite3.Row
        return list(db.execute("SELECT id, key_name, status, routing FROM requests ORDER BY ts"))


def _free_rows(home: Path, count: int) -> list[sqlite3.Row]:
    """The ``free`` key's rows, once all `count` of them are written."""
    deadline = time.monotonic() + 20
    while len(rows := [r for r in _rows(home) if r["key_name"] == "free"]) < count:
        assert time.monotonic() < deadline, f"{len(rows)} of {count} rows written"
        time.sleep(0.1)
    return rows


def test_two_workers_hold_one_key_limit_and_one_pause(tmp_path: Path) -> None:
    mock_port, port = free_port(), free_port()
    with (
        start_redis() as redis,
        _running(["mock-upstream", "--port", str(mock_port)], tmp_path / "mock", mock_port),
    ):
        path = _config(tmp_path, redis, mock_port)
        home = tmp_path / "gw"
        argv = ["serve", "--config", str(path), "--port", str(port), "--workers", "2"]
        with _running(argv, home, port) as supervisor:
            outcomes = Counter(_chat(port, KEY, "gpt-e2e-1") for _ in range(40))
            assert outcomes == {200: 10, 429: 30}, outcomes
            # An upstream that cannot be reached is paused, and every worker routes around the
            # pause (it is tried last, as the only candidate, and said to be paused). The kernel
            # spreads connections over the workers at random: ask until both have answered
            # after the pause (each writes request ids with a prefix of its own).
            sent = 0
            while True:
                statuses = [_chat(port, FREE, "down-model") for _ in range(12)]
                assert all(s >= 500 for s in statuses), statuses
                sent += len(statuses)
                late = _free_rows(home, sent)[12:]
                assert all("down" in json.loads(r["routing"])["paused"] for r in late), late
                if sent >= 24 and len({r["id"][:12] for r in late}) == 2:
                    break  # both workers saw it paused
                assert sent < 96, [r["id"] for r in late]
            supervisor.send_signal(signal.SIGTERM)
            assert supervisor.wait(30) == 0
        log = (home / "out.log").read_text()
        assert "2 workers on" in log
    # Both workers served (each writes request ids with a prefix of its own), into one store.
    rows = _rows(home)
    assert len({r["id"][:12] for r in rows}) == 2, [r["id"] for r in rows]
    assert sum(r["key_name"] == "limited" and r["status"] == 200 for r in rows) == 10


def test_a_worker_that_dies_is_started_again(tmp_path: Path) -> None:
    port = free_port()
    with start_redis() as redis:
        path = _config(tmp_path, redis, free_port())
        home = tmp_path / "gw"
        argv = ["serve", "--config", str(path), "--port", str(port), "--workers", "2"]
        with _running(argv, home, port):
            log = home / "out.log"
            started = re.findall(r"worker 1 started \(pid (\d+)\)", log.read_text())
            assert len(started) == 1, log.read_text()
            os.kill(int(started[0]), signal.SIGKILL)
            deadline = time.monotonic() + 20
            while len(re.findall(r"worker 1 started", log.read_text())) < 2:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
            assert "worker 1 (pid" in log.read_text() and "exited with -9" in log.read_text()
            assert _healthy(port)


def test_workers_need_shared_state(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: 1\nclients:\n  - {name: me, key: some-long-key-for-tests}\n")
    argv = ["serve", "--config", str(path), "--workers", "2", "--port", str(free_port())]
    result = subprocess.run(
        [sys.executable, "-m", "twserve.cli.main", *argv],
        env={**os.environ, "TWSERVE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "gw.workers.no_shared_state" in result.stderr


def test_a_killed_supervisor_takes_its_workers_with_it(tmp_path: Path) -> None:
    port = free_port()
    with start_redis() as redis:
        path = _config(tmp_path, redis, free_port())
        home = tmp_path / "gw"
        argv = ["serve", "--config", str(path), "--port", str(port), "--workers", "2"]
        with _running(argv, home, port) as supervisor:
            supervisor.kill()
            supervisor.wait()
            deadline = time.monotonic() + 20
            while _healthy(port):
                assert time.monotonic() < deadline, (home / "out.log").read_text()[-3000:]
                time.sleep(0.2)
