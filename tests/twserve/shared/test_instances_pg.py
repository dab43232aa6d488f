"""Several instances on one PostgreSQL (docs/deployment.md, "Several instances"): three
``twserve serve`` processes share a database, a mock upstream and one client pool that goes round
the three; one instance is stopped mid-load (SIGTERM; or SIGKILL with store.commit_before_end),
and every request a client saw finish has its row in the database. Then PostgreSQL itself stops
mid-load under one gateway: requests keep being answered, and when it is back every answered
request's row lands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpcore
import psycopg
import pytest

from tests.support.servers import PostgresServer, start_postgres
from tests.twserve.store.test_store_pg import new_database
from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from tests.twserve.usage.test_key_limits import T0, FakeWall, _raw, _stack
from twmock.script import MockSettings, parse_script
from twmock.serve.handler import make_handler
from twserve.server import listener
from twserve.store.postgres import PostgresStore

REQUESTS = 300
CONCURRENCY = 24
SCRIPT = {"chunks": 4, "chunk_delay": 0.02, "usage": {"input": 12, "output": 34}}
END = b'data: {"type":"message_stop"}'


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(path: Path, mock_port: int, commit_before_end: bool) -> None:
    config: dict[str, Any] = {
        "version": 1,
        "clients": [{"name": "tester", "key": KEY}],
        "providers": [
            {
                "name": "up",
                "protocol": "anthropic",
                "key": "upstream-key",
                "base_url": f"http://127.0.0.1:{mock_port}",
            }
        ],
        "store": {"postgres_dsn": "${TW_TEST_PG_DSN}"},
    }
    if commit_before_end:
        # Long enough that no answer's end goes out uncommitted while the test holds the table.
        config["store"].update(commit_before_end=True, commit_wait_secs=120)
    path.write_text(json.dumps(config))  # JSON is YAML


@contextmanager
def instances(
    tmp_path: Path, mock_port: int, dsn: str, count: int, *, commit_before_end: bool = False
) -> Iterator[list[tuple[subprocess.Popen[str], int]]]:
    """`count` gateway processes, each with its own data directory; their bound ports."""
    config = tmp_path / "config.yaml"
    _config(config, mock_port, commit_before_end)
    env = {**os.environ, "TW_TEST_PG_DSN": dsn}
    procs = []
    for n in range(count):
        argv = [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(config)]
        argv += ["--data-dir", str(tmp_path / f"i{n}"), "--port", "0"]
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    try:
        ports = []
        for proc in procs:
            assert proc.stdout is not None
            while True:
                line = proc.stdout.readline()
                assert line, f"an instance exited before listening ({proc.poll()})"
                if line.startswith("twserve listening on http://"):
                    ports.append(int(line.rsplit(":", 1)[1]))
                    break
            # Read the rest as it comes (each request writes an access line): a pipe nobody
            # reads fills up and stops the process at its next write.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield list(zip(procs, ports, strict=True))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def _body() -> bytes:
    return json.dumps(
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()


def stored_sessions(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT session, status FROM requests").fetchall()
    return {s: st for s, st in rows}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("stop", "commit_before_end"),
    [(signal.SIGTERM, False), (signal.SIGKILL, True)],
    ids=["sigterm", "sigkill-commit-before-end"],
)
async def test_an_instance_stopped_mid_load_loses_no_finished_row(
    tmp_path: Path, postgres_server: PostgresServer, stop: signal.Signals, commit_before_end: bool
) -> None:
    """SIGTERM drains the store. SIGKILL writes nothing more: the test locks the requests table
    until every instance's writer waits on it with rows in hand, then kills one; with
    ``commit_before_end`` none of those rows' answers had ended, so every answer a client read to
    its end has its row (without it, the rows of answers already read are lost)."""
    dsn = new_database(postgres_server)
    mock = make_handler(MockSettings(script=parse_script(SCRIPT)))
    finished: dict[str, int] = {}  # session -> the port that answered it
    stopped_at: list[int] = []
    third = anyio.Event()
    async with anyio.create_task_group() as tg:
        mock_port = await tg.start(
            lambda task_status: listener.serve(mock, port=0, task_status=task_status)
        )
        with instances(tmp_path, mock_port, dsn, 3, commit_before_end=commit_before_end) as running:
            ports = [port for _, port in running]
            victim, victim_port = running[1]
            next_index = iter(range(REQUESTS))

            async def client(pool: httpcore.AsyncConnectionPool) -> None:
                for n in next_index:
                    session = f"c-{n}"
                    # Round robin; a refused connection goes on to the next instance, as a load
                    # balancer does.
                    for hop in range(len(ports)):
                        port = ports[(n + hop) % len(ports)]
                        try:
                            response = await pool.request(
                                "POST",
                                f"http://127.0.0.1:{port}/v1/messages",
                                headers=[
                                    (b"x-api-key", KEY.encode()),
                                    (b"content-type", b"application/json"),
                                    (b"x-claude-code-session-id", session.encode()),
                                ],
                                content=_body(),
                                extensions={"timeout": {"connect": 5, "read": 10, "pool": 10}},
                            )
                        except (httpcore.ConnectError, httpcore.RemoteProtocolError,
                                httpcore.ReadError):  # fmt: skip
                            continue
                        if response.status == 200 and response.content.rstrip().endswith(END):
                            finished[session] = port
                        break
                    if len(finished) == REQUESTS // 3 and not stopped_at:
                        stopped_at.append(n)
                        if stop == signal.SIGKILL:
                            third.set()
                        else:
                            victim.send_signal(stop)

            async def kill_with_rows_in_flight() -> None:
                await third.wait()
                lock = await psycopg.AsyncConnection.connect(dsn)
                watch = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                async with lock, watch:
                    async with lock.transaction():
                        await lock.execute("LOCK TABLE requests IN EXCLUSIVE MODE")
                        while await _writers_waiting(watch) < 3:
                            await anyio.sleep(0.01)
                        victim.send_signal(stop)
                        await anyio.to_thread.run_sync(victim.wait)

            with anyio.fail_after(60):
                async with httpcore.AsyncConnectionPool(
                    max_connections=CONCURRENCY, retries=0
                ) as pool, anyio.create_task_group() as clients:  # fmt: skip
                    if stop == signal.SIGKILL:
                        clients.start_soon(kill_with_rows_in_flight)
                    for _ in range(CONCURRENCY):
                        clients.start_soon(client, pool)
                out, _ = await anyio.to_thread.run_sync(lambda: victim.communicate(timeout=30))
                assert victim.returncode == (0 if stop == signal.SIGTERM else -stop), out
        # The others are stopped now (SIGTERM), so every row they took is written.
        tg.cancel_scope.cancel()

    assert stopped_at, "the load ended before an instance was stopped"
    by_victim = [s for s, p in finished.items() if p == victim_port]
    assert by_victim  # it answered requests before it went
    # Nearly every request finishes: a request whose connection the stopping instance closed
    # under it is sent to the next instance, as a load balancer does.
    assert len(finished) >= REQUESTS * 0.9
    stored = stored_sessions(dsn)
    missing = sorted(set(finished) - set(stored))
    assert missing == []
    assert all(stored[s] == 200 for s in finished)


async def _writers_waiting(conn: psycopg.AsyncConnection[Any]) -> int:
    """Gateway connections waiting for a lock (a writer's insert behind the test's)."""
    cur = await conn.execute(
        "SELECT COUNT(*) FROM pg_stat_activity "
        "WHERE application_name = 'twserve' AND wait_event_type = 'Lock'"
    )
    found = await cur.fetchone()
    return int(found[0]) if found else 0


def test_requests_keep_flowing_while_postgres_is_away(tmp_path: Path) -> None:
    upstreams = {"up": Upstream("anthropic", MockSettings(script=parse_script(SCRIPT)))}
    answered: list[int] = []
    seen: list[str] = []

    async def load(url: str, count: int) -> None:
        async with httpcore.AsyncConnectionPool(max_connections=16, retries=0) as pool:

            async def one() -> None:
                response = await pool.request(
                    "POST",
                    url + "/v1/messages",
                    headers=[(b"x-api-key", KEY.encode())],
                    content=_body(),
                )
                if response.status == 200 and response.content.rstrip().endswith(END):
                    answered.append(1)

            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(one)

    with start_postgres() as server:
        config = {"store": {"postgres_dsn": "${PG}"}}
        with running_stack(
            tmp_path, upstreams, config=config, env={"PG": server.dsn}, control=True
        ) as st:
            store = st.app.store
            assert isinstance(store, PostgresStore)
            st.app.events.listeners.append(lambda event: seen.append(type(event).__name__))
            st.portal.call(load, st.url, 40)
            server.stop()
            st.portal.call(load, st.url, 60)  # answered while the database is away
            assert len(answered) == 100
            _until(lambda: "StoreUnavailable" in seen)
            assert store.written < 100 and store.held + store.journal.count > 0
            auth = [(b"authorization", b"Bearer " + CONTROL_KEY.encode())]
            away = httpcore.request("GET", st.control_url + "/requests", headers=auth)
            assert away.status == 503
            assert json.loads(away.content)["error"]["code"] == "control.store_unavailable"
            # Every answered request's row is queued by the time the answer is out, or just after.
            _until(lambda: store.held + store.journal.count + store.written == 100)
            status = json.loads(
                httpcore.request("GET", st.control_url + "/status", headers=auth).content
            )["store"]
            assert status["backend"] == "postgresql" and status["available"] is False
            assert status["held"] + status["journal"] == 100 - status["written"]
            server.start()
            _until(lambda: "StoreRecovered" in seen)
            assert store.written == 100
            assert st.app.store.status()["available"] is True
            back = httpcore.request("GET", st.control_url + "/requests?limit=5", headers=auth)
            rows = json.loads(back.content)["requests"]
            assert len(rows) == 5 and rows[0]["provider"] == "up"
        with psycopg.connect(server.dsn) as conn:
            found = conn.execute("SELECT COUNT(*), MIN(status), MAX(status) FROM requests")
            assert found.fetchone() == (len(answered), 200, 200)


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.05)


def test_limit_totals_are_rebuilt_from_every_instances_rows(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    limits = [{"per": "day", "tokens": 240}]

    def written(st: Stack, count: int) -> None:
        _until(lambda: st.app.store.written >= count)

    with start_postgres() as server:
        extra = {"store": {"postgres_dsn": server.dsn}}
        # One instance answers two requests of 120 tokens each: the day's 240 are used.
        with _stack(tmp_path / "a", limits, wall=wall, extra=extra) as st:
            assert _raw(st.url)[0] == 200
            written(st, 1)
            assert _raw(st.url)[0] == 200
            written(st, 2)
        # Another instance (its own data directory) starts while PostgreSQL is away: it cannot
        # count them, so it admits; once the database is back it rebuilds and refuses.
        server.stop()
        with _stack(tmp_path / "b", limits, wall=wall, extra=extra) as st:
            assert _raw(st.url)[0] == 200
            assert st.app.usage.rebuild_needed
            server.start()
            _until(lambda: [v["used"] for v in st.app.usage.key_view("tester")] == [360])
            status, body, _ = _raw(st.url)
            written(st, 2)
        assert status == 429 and "used 360 tokens" in body["error"]["message"]
