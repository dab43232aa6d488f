"""The PostgreSQL request store (docs/deployment.md, "PostgreSQL") against a real server: the same
reads as the SQLite store over the same rows, migrations, and no row lost while the database is
away — held in memory, spilled to the journal, written when it returns."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests.support.servers import PostgresServer, start_postgres
from twserve.cli.main import main
from twserve.store.postgres import MIGRATIONS, PostgresStore, StoreBack, StoreLost, _item, migrate
from twserve.store.sqlite import RequestRow, RequestStore, Store, StoredBody

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def new_database(server: PostgresServer) -> str:
    """A fresh, empty database on `server`; its DSN."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return server.dsn.rsplit("/", 1)[0] + "/" + name


def count_rows(dsn: str, table: str = "requests") -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()  # type: ignore[arg-type]
    assert found is not None
    return int(found[0])


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server: PostgresServer
) -> Iterator[Callable[[], Store]]:
    """A factory of stores of one backend; every store it makes shares one database."""
    made: list[Store] = []
    dsn = new_database(postgres_server) if request.param == "postgres" else ""

    def make() -> Store:
        store: Store
        if request.param == "sqlite":
            store = RequestStore(tmp_path / "requests.sqlite3")
        else:
            store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
        made.append(store)
        return store

    yield make
    for store in made:
        store.close_db()


@asynccontextmanager
async def writing(store: Store) -> AsyncIterator[Store]:
    """`store` with its writer running; every row recorded in the block is written on exit."""
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        yield store
        store.close()


T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC).timestamp()
DAY = 86_400.0


def sample(i: int) -> RequestRow:
    return RequestRow(
        id=f"r{i:04d}",
        ts=T0 + i * 3600.0,
        path="/v1/messages",
        key_name=("alice", "bob")[i % 2],
        model=("m-a", "m-b", "m-c")[i % 3],
        provider="up",
        status=(200, 200, 200, 529)[i % 4],
        stream=bool(i % 2),
        input_tokens=10 + i,
        output_tokens=20,
        cache_read_tokens=i % 5,
        cost_micros=1000 + i,
        cost_state=("known", "unknown", "free")[i % 3],
        routing={"attempts": [{"provider": "up", "n": i}]},
        translated=["thinking"] if i % 7 == 0 else [],
        counted=i % 4 != 3,
        settled_ts=T0 + i * 3600.0 + 1.5,
        limit_tokens=30 + i,
        limit_cache_reads=i % 5,
        limit_cost=1000 + i,
        body=StoredBody(request=b'{"x":%d}' % i, answer=b"\x00\xffanswer", truncated=i % 2 == 0)
        if i % 10 == 0
        else None,
    )


ROWS = 120


async def test_rows_are_written_and_read_back_the_same_on_both_backends(
    make_store: Callable[[], Store],
) -> None:
    async with writing(make_store()) as store:
        for i in range(ROWS):
            store.record(sample(i))
    assert store.written == ROWS
    newest = await store.recent(limit=5)
    assert [r["id"] for r in newest] == [f"r{i:04d}" for i in range(ROWS - 1, ROWS - 6, -1)]
    row = next(r for r in await store.recent(limit=ROWS) if r["id"] == "r0070")
    assert row["routing"] == {"attempts": [{"provider": "up", "n": 70}]}
    assert row["translated"] == ["thinking"] and row["stream"] is False
    assert (row["status"], row["input_tokens"], row["cost_micros"], row["counted"]) == (
        529 if 70 % 4 == 3 else 200,
        80,
        1070,
        True,
    )
    assert row["ts"] == T0 + 70 * 3600.0
    body = await store.body("r0010")
    assert body == {"request": b'{"x":10}', "answer": b"\x00\xffanswer", "truncated": True}
    assert await store.body("r0011") is None

    by_key = await store.usage(by="key", since=T0, until=T0 + DAY)
    assert [(r["key"], r["requests"], r["errors"]) for r in by_key] == [
        ("alice", 12, 0),
        ("bob", 12, 6),
    ]
    alice = by_key[0]
    assert alice["input_tokens"] == sum(10 + i for i in range(0, 24, 2))
    assert alice["cost_micros"] == sum(1000 + i for i in range(0, 24, 2))
    assert alice["unpriced_requests"] + alice["free_requests"] == 8
    by_model = await store.usage(by="model")
    assert [r["requests"] for r in by_model] == [40, 40, 40]
    by_day = await store.usage(by="day")
    days = [dt.datetime.fromtimestamp(T0 + i * 3600.0).date().isoformat() for i in range(ROWS)]
    assert [(r["day"], r["requests"]) for r in by_day] == [
        (d, days.count(d)) for d in sorted(set(days))
    ]
    by_hour = await store.usage(by="hour", since=T0, until=T0 + DAY)
    hours = [
        dt.datetime.fromtimestamp(T0 + i * 3600.0).strftime("%Y-%m-%dT%H:00") for i in range(24)
    ]
    assert [(r["hour"], r["requests"]) for r in by_hour] == [
        (h, hours.count(h)) for h in sorted(set(hours))
    ]
    assert sum(r["requests"] for r in by_hour) == 24

    spends = await store.limit_spends(["alice"], T0 + 10 * 3600.0)
    assert sorted(spends)[0] == ("alice", T0 + 10 * 3600.0 + 1.5, 40, 0, 1010)
    assert len(spends) == len([i for i in range(10, ROWS, 2) if i % 4 != 3])

    # Retention: rows before day 2, bodies before day 4.
    pruned = await store.prune(before_rows=T0 + 2 * DAY, before_bodies=T0 + 4 * DAY)
    assert pruned == (48, 10)
    assert len(await store.recent(limit=1000)) == ROWS - 48
    assert await store.body("r0090") is None and await store.body("r0100") is not None
    assert await store.prune(before_rows=T0 + 2 * DAY, before_bodies=T0 + 4 * DAY) == (0, 0)


async def test_a_row_recorded_again_stays_one_row(make_store: Callable[[], Store]) -> None:
    async with writing(make_store()) as store:
        store.record(sample(1))
        store.record(RequestRow(id="r0001", ts=T0, path="/v1/messages", status=499))
    async with writing(make_store()) as again:
        again.record(RequestRow(id="r0001", ts=T0, path="/v1/messages", status=503))
    rows = await again.recent()
    assert [(r["id"], r["status"]) for r in rows] == [("r0001", 503)]


async def test_a_request_is_found_by_its_id_or_correlation_id(
    make_store: Callable[[], Store],
) -> None:
    async with writing(make_store()) as store:
        store.record(RequestRow(id="r1", ts=T0, path="/v1/messages", correlation_id="trace-1"))
        store.record(RequestRow(id="r2", ts=T0 + 1, path="/v1/messages", correlation_id="r1"))
        store.record(RequestRow(id="r3", ts=T0 + 2, path="/v1/messages"))
    assert [r["id"] for r in await store.recent(find="trace-1")] == ["r1"]
    # An id that is also another request's correlation id finds both, newest first.
    assert [r["id"] for r in await store.recent(find="r1")] == ["r2", "r1"]
    assert [r["id"] for r in await store.recent(find="r1", limit=1)] == ["r2"]
    assert await store.recent(find="nothing") == []
    assert (await store.recent(find="trace-1"))[0]["correlation_id"] == "trace-1"


async def test_a_nul_in_text_is_stored_replaced(make_store: Callable[[], Store]) -> None:
    # JSON lets a client put U+0000 in a model name; PostgreSQL text cannot hold it.
    async with writing(make_store()) as store:
        store.record(RequestRow(id="nul", ts=T0, path="/v1/messages", model="a\x00b"))
    (row,) = await store.recent()
    assert row["model"] in ("a\x00b", "a\ufffdb")


async def test_migrations_run_on_an_empty_database_once(postgres_server: PostgresServer) -> None:
    dsn = new_database(postgres_server)
    # Instances starting together: each migrates, the advisory lock lets one apply.
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(3)]
    try:
        versions: list[int] = []

        async def one(conn: psycopg.AsyncConnection[Any]) -> None:
            versions.append(await migrate(conn))

        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(one, conn)
        assert versions == [len(MIGRATIONS)] * 3
        assert await migrate(conns[0]) == len(MIGRATIONS)  # idempotent
        cur = await conns[0].execute("SELECT version FROM twserve_schema")
        assert await cur.fetchall() == [(v,) for v in range(1, len(MIGRATIONS) + 1)]
        cur = await conns[0].execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' ORDER BY table_name"
        )
        assert [r[0] for r in await cur.fetchall()] == [
            "bodies",
            "requests",
            "responses",
            "twserve_schema",
        ]
    finally:
        for conn in conns:
            await conn.close()


async def wait_for(check: Callable[[], bool], secs: float = 20.0) -> None:
    with anyio.fail_after(secs):
        while not check():
            await anyio.sleep(0.02)


async def test_rows_wait_while_postgres_is_away_and_all_land_when_it_returns(
    tmp_path: Path,
) -> None:
    changes: list[StoreLost | StoreBack] = []
    with start_postgres() as server:
        journal = tmp_path / "journal.sqlite3"
        store = PostgresStore(server.dsn, journal=journal, held_rows=50)
        store.listeners.append(changes.append)
        try:
            async with writing(store):
                for i in range(20):
                    store.record(sample(i))
                await wait_for(lambda: store.written == 20)
                await anyio.to_thread.run_sync(server.stop)
                for i in range(20, 200):
                    store.record(sample(i))
                    await anyio.sleep(0)
                await wait_for(lambda: store.journaled >= 150)
                assert store.written == 20 and store.down_since is not None
                assert isinstance(changes[0], StoreLost) and len(changes) == 1
                assert store.journal.count + store.held == 180
                await anyio.to_thread.run_sync(server.start)
                await wait_for(lambda: store.written == 200)
            assert [type(c) for c in changes] == [StoreLost, StoreBack]
            back = changes[1]
            assert isinstance(back, StoreBack) and back.rows == 180
            assert store.journal.count == 0 and store.held == 0
            assert count_rows(server.dsn) == 200
            assert count_rows(server.dsn, "bodies") == 20
        finally:
            store.close_db()


async def test_a_stop_while_postgres_is_away_journals_and_the_next_start_replays(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.sqlite3"
    with start_postgres() as server:
        await anyio.to_thread.run_sync(server.stop)
        store = PostgresStore(server.dsn, journal=journal)
        try:
            async with writing(store):
                for i in range(30):
                    store.record(sample(i))
            assert store.written == 0 and store.journaled == 30
        finally:
            store.close_db()
        await anyio.to_thread.run_sync(server.start)
        store = PostgresStore(server.dsn, journal=journal)
        assert store.journal.count == 30
        try:
            async with writing(store):
                await wait_for(lambda: store.written == 30)
            assert store.journal.count == 0
            assert count_rows(server.dsn) == 30
            assert await store.body("r0020") is not None
        finally:
            store.close_db()


def test_usage_cli_reads_postgres_when_the_config_names_it(
    tmp_path: Path,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = new_database(postgres_server)

    async def fill() -> list[dict[str, Any]]:
        store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
        try:
            async with writing(store):
                for i in range(ROWS):
                    store.record(sample(i))
            return await store.usage(by="model", since=0)
        finally:
            store.close_db()

    expected = anyio.run(fill)
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\nstore:\n  postgres_dsn: ${TW_USAGE_PG}\n")
    monkeypatch.setenv("TW_USAGE_PG", dsn)
    argv = ["usage", "--config", str(config), "--data-dir", str(tmp_path)]
    assert main([*argv, "--by", "model", "--since", "0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rows"] == expected and shown["total"]["requests"] == ROWS
    monkeypatch.delenv("TW_USAGE_PG")
    assert main([*argv, "--json"]) == 1
    assert "TW_USAGE_PG" in capsys.readouterr().err


async def test_limit_spends_count_rows_still_waiting_for_postgres_once(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
    try:
        async with writing(store):
            store.record(sample(0))
            store.record(sample(2))
        # Rows the writer holds in memory and in the journal are spent already; a row held
        # and committed at the same moment counts once.
        store._held.append(_item(sample(4)))
        store._held.append(_item(sample(2)))
        store.journal.add([_item(sample(6)), _item(sample(7))])
        spends = await store.limit_spends(["alice"], 0)
    finally:
        store.close_db()
    assert sorted(s[2] for s in spends) == [30, 32, 34, 36]  # r0007 is bob's


async def test_a_row_postgres_refuses_is_kept_aside_and_holds_nothing_back(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    journal = tmp_path / "journal.sqlite3"
    store = PostgresStore(dsn, journal=journal)
    later = PostgresStore(dsn, journal=journal)
    try:
        async with writing(store):
            store.record(sample(1))
            # A count past 64 bits: PostgreSQL refuses the row, not the connection.
            store.record(RequestRow(id="huge", ts=T0, path="/v1/messages", input_tokens=2**70))
            store.record(sample(2))
        async with writing(later):
            later.record(sample(3))
    finally:
        store.close_db()
        later.close_db()
    assert (store.written, store.rejected, store.down_since) == (2, 1, None)
    assert later.written == 1
    assert count_rows(dsn) == 3
    with closing(sqlite3.connect(journal)) as db:
        ((request_id, reason, row),) = db.execute("SELECT id, reason, row FROM rejected")
        assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (0,)
    assert request_id == "huge" and "out of range" in reason
    assert json.loads(row)["input_tokens"] == 2**70


async def test_a_row_that_cannot_be_sent_is_set_aside_and_the_writer_carries_on(
    make_store: Callable[[], Store],
) -> None:
    # A lone surrogate, as a client's JSON may escape one into a model name: neither SQLite
    # nor PostgreSQL's client encoding can take it. The row is set aside; the rows around it,
    # and every later one, are written.
    async with writing(make_store()) as store:
        store.record(sample(1))
        store.record(RequestRow(id="lone", ts=T0, path="/v1/messages", model="m\ud800"))
        store.record(sample(2))
        await wait_for(lambda: store.written + store.rejected == 3)
        assert await store.record_committed(sample(3)).wait(600) is True
    assert {r["id"] for r in await store.recent()} == {"r0001", "r0002", "r0003"}
    assert (store.written, store.rejected) == (3, 1)
    assert store.status()["rejected"] == 1


async def test_a_row_the_journal_refuses_is_set_aside_and_the_rest_journaled(
    tmp_path: Path,
) -> None:
    # PostgreSQL is away at the stop, so the held rows go to the SQLite journal, which cannot
    # take a count past 64 bits: that row is set aside in the journal, the others kept.
    journal = tmp_path / "journal.sqlite3"
    with start_postgres() as server:
        await anyio.to_thread.run_sync(server.stop)
        store = PostgresStore(server.dsn, journal=journal)
        try:
            async with writing(store):
                store.record(sample(1))
                store.record(RequestRow(id="huge", ts=T0, path="/v1/messages", input_tokens=2**70))
                store.record(sample(2))
        finally:
            store.close_db()
    assert (store.journaled, store.rejected) == (2, 1)
    with closing(sqlite3.connect(journal)) as db:
        assert {r[0] for r in db.execute("SELECT id FROM requests")} == {"r0001", "r0002"}
        ((request_id, reason, row),) = db.execute("SELECT id, reason, row FROM rejected")
    assert request_id == "huge" and "too large" in reason
    assert json.loads(row)["input_tokens"] == 2**70


async def test_an_awaited_commit_settles_once_the_row_can_be_read_on_both_backends(
    make_store: Callable[[], Store],
) -> None:
    async with writing(make_store()) as store:
        commits = [store.record_committed(sample(i)) for i in range(5)]
        store.record(sample(5))
        for commit in commits:
            assert await commit.wait(600) is True
        # Committed: another reader sees every awaited row.
        seen = {r["id"] for r in await store.recent(limit=100)}
        assert {c.row_id for c in commits} <= seen
    assert store.written == 6 and store.status()["commit_waits_late"] == 0


async def test_while_postgres_is_away_an_awaited_row_is_journaled_at_once(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.sqlite3"
    with start_postgres() as server:
        # held_rows far above what is recorded: only a waiting answer sends rows to the journal.
        store = PostgresStore(server.dsn, journal=journal, held_rows=10_000)
        try:
            async with writing(store):
                assert await store.record_committed(sample(0)).wait(600) is True
                assert store.written == 1 and count_rows(server.dsn) == 1
                await anyio.to_thread.run_sync(server.stop)
                store.record(sample(1))  # nobody waits for it
                # The write that finds the database gone journals the rows held with it.
                assert await store.record_committed(sample(2)).wait(600) is True
                assert store.down_since is not None
                with closing(sqlite3.connect(journal)) as db:
                    ids = {r[0] for r in db.execute("SELECT id FROM requests")}
                assert {"r0001", "r0002"} <= ids
                # While the writer waits out its backoff, a waiting row goes to the journal too.
                assert await store.record_committed(sample(3)).wait(600) is True
                with closing(sqlite3.connect(journal)) as db:
                    ids = {r[0] for r in db.execute("SELECT id FROM requests")}
                assert "r0003" in ids and store.held == 0
                assert store.written == 1
                await anyio.to_thread.run_sync(server.start)
                await wait_for(lambda: store.written == 4)
            assert store.journal.count == 0 and count_rows(server.dsn) == 4
            assert store.status()["commit_waits_late"] == 0
        finally:
            store.close_db()
