"""PostgreSQL's day partitions (twserve/store/pg_partitions.py, docs/deployment.md "PostgreSQL")
against a real server: rows land in their day's partition, retention drops whole days and keeps
the rest exactly, a populated schema-3 database converts keeping every row, the listing's
filters prune partitions and walk the indexes, and rows journalled while PostgreSQL is away
replay into the right partitions, made on demand."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests.support.servers import PostgresServer, start_postgres
from tests.twserve.store.test_store_pg import (
    DAY,
    T0,
    count_rows,
    new_database,
    sample,
    wait_for,
    writing,
)
from twserve.store.listing import RequestFilter, page_sql
from twserve.store.pg_partitions import DAYS_AHEAD
from twserve.store.postgres import MIGRATIONS, PostgresStore, _item, migrate
from twserve.store.sqlite import _COLUMNS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def day_name(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y%m%d")


def placement(dsn: str, table: str) -> dict[str, str]:
    """Each row's id → the partition it sits in."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT id, tableoid::regclass::text FROM {table}"  # type: ignore[arg-type]
        ).fetchall()
    return {str(i): str(p) for i, p in rows}


def partitions(dsn: str, parent: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY 1",
            (parent,),
        ).fetchall()
    return [str(r[0]) for r in rows]


ROWS = 96  # one an hour from T0 (12:00 UTC): five UTC days


async def test_rows_over_several_days_land_in_their_days_partitions(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
    rows = [sample(i) for i in range(ROWS)]
    try:
        async with writing(store):
            for row in rows:
                store.record(row)
        assert store.written == ROWS
        assert placement(dsn, "requests") == {r.id: f"requests_{day_name(r.ts)}" for r in rows}
        assert placement(dsn, "bodies") == {
            r.id: f"bodies_{day_name(r.ts)}" for r in rows if r.body is not None
        }
        days = sorted({day_name(r.ts) for r in rows})
        assert len(days) == 5
        assert partitions(dsn, "requests") == [f"requests_{d}" for d in days]
        # Reads see every partition: a page across days, a body, the same row written again.
        page = await store.page(RequestFilter(limit=ROWS + 1))
        assert [r["id"] for r in page] == [r.id for r in reversed(rows)]
        assert await store.body("r0090") is not None
        again = PostgresStore(dsn, journal=tmp_path / "journal2.sqlite3")
        try:
            async with writing(again):
                again.record(sample(3))
            assert count_rows(dsn) == ROWS
        finally:
            again.close_db()
    finally:
        store.close_db()


async def test_retention_drops_whole_days_and_deletes_exactly_in_the_boundary_day(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
    store.wall = lambda: T0 + 4 * DAY  # "today" is the last day of the rows
    rows = [sample(i) for i in range(ROWS)]
    before_rows = T0 + 2 * DAY + 3 * 3600  # 2026-03-03 15:00 UTC
    before_bodies = T0 + DAY  # 2026-03-02 12:00 UTC
    try:
        async with writing(store):
            for row in rows:
                store.record(row)
        went = await store.prune(before_rows=before_rows, before_bodies=before_bodies)
        kept = [r for r in rows if r.ts >= before_rows]
        kept_bodies = [r for r in kept if r.body is not None and r.ts >= before_bodies]
        assert went == (ROWS - len(kept), sum(r.body is not None for r in rows) - len(kept_bodies))
        assert set(placement(dsn, "requests")) == {r.id for r in kept}
        assert set(placement(dsn, "bodies")) == {r.id for r in kept_bodies}
        # 03-01 and 03-02 dropped whole; 03-03 kept (its rows before 15:00 deleted); today and
        # DAYS_AHEAD days ahead made.
        ahead = [day_name(T0 + (4 + n) * DAY) for n in range(DAYS_AHEAD + 1)]
        assert partitions(dsn, "requests") == [
            f"requests_{d}" for d in ["20260303", "20260304", *ahead]
        ]
        # A row gone takes its body: bodies went up to the rows' limit, the later of the two.
        assert partitions(dsn, "bodies")[0] == "bodies_20260303"
        # Nothing more to drop: a second clean-up deletes nothing.
        assert await store.prune(before_rows=before_rows, before_bodies=before_bodies) == (0, 0)
    finally:
        store.close_db()


async def test_a_populated_schema_3_database_converts_keeping_every_row(
    postgres_server: PostgresServer,
) -> None:
    dsn = new_database(postgres_server)
    rows = [_item(sample(i)) for i in range(ROWS)]
    cols = ",".join(_COLUMNS)
    marks = ",".join("%s" for _ in _COLUMNS)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # The schema as the previous release left it: versions 1 to 3, rows in plain tables.
        await conn.execute(
            "CREATE TABLE twserve_schema ("
            "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for number, script in enumerate(MIGRATIONS[:3], start=1):
            await conn.execute(script)
            await conn.execute("INSERT INTO twserve_schema (version) VALUES (%s)", (number,))
        async with conn.cursor() as cur:
            await cur.executemany(
                f"INSERT INTO requests ({cols}) VALUES ({marks})",
                [p for p, _ in rows],
            )
            await cur.executemany(
                "INSERT INTO bodies (id, ts, request, answer, truncated) VALUES (%s,%s,%s,%s,%s)",
                [b for _, b in rows if b is not None],
            )
        before = await (await conn.execute("SELECT * FROM requests ORDER BY id")).fetchall()
        bodies = await (await conn.execute("SELECT * FROM bodies ORDER BY id")).fetchall()
        assert len(before) == ROWS

        assert await migrate(conn) == len(MIGRATIONS)

        assert await (await conn.execute("SELECT * FROM requests ORDER BY id")).fetchall() == before
        assert await (await conn.execute("SELECT * FROM bodies ORDER BY id")).fetchall() == bodies
        kinds = await conn.execute(
            "SELECT relname, relkind FROM pg_class WHERE relname IN "
            "('requests', 'bodies', 'requests_v3', 'bodies_v3') ORDER BY 1"
        )
        assert await kinds.fetchall() == [("bodies", "p"), ("requests", "p")]
    days = {day_name(p[1]) for p, _ in rows}
    assert partitions(dsn, "requests") == sorted(f"requests_{d}" for d in days)
    assert Counter(placement(dsn, "requests").values()) == Counter(
        f"requests_{day_name(p[1])}" for p, _ in rows
    )


def plan(conn: psycopg.Connection[Any], f: RequestFilter) -> str:
    sql, params = page_sql(f, "%s")
    found = conn.execute("EXPLAIN " + sql, params).fetchall()
    return "\n".join(str(r[0]) for r in found)


async def test_listing_filters_prune_partitions_and_walk_the_indexes(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    store = PostgresStore(dsn, journal=tmp_path / "journal.sqlite3")
    try:
        async with writing(store):
            store.record(sample(0))  # migrates and makes 2026-03-01
        # 20 000 rows a day over five days, written in SQL so the planner has figures to weigh;
        # each filter's value is in one row of several hundred, as a key or model of many is.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT twserve_day_partition('requests', d) "
                "FROM generate_series(%s::BIGINT, %s::BIGINT) d",
                (int(T0 // DAY), int(T0 // DAY) + 5),
            )
            conn.execute(
                "INSERT INTO requests (id, ts, path, key_name, model, provider, status) "
                "SELECT 'g' || n, %s + n * 4.32, '/v1/messages', 'k' || (n %% 500), "
                "'m' || (n %% 400), 'p' || (n %% 300), 200 + (n %% 200) "
                "FROM generate_series(0, 99999) n",
                (T0,),
            )
            conn.execute("ANALYZE requests")
            day2 = float(int(T0 // DAY) + 2) * DAY
            by_time = plan(conn, RequestFilter(since=day2 + 3600, until=day2 + 7200))
            assert "requests_20260303" in by_time
            assert "requests_20260301" not in by_time and "requests_20260304" not in by_time
            assert "Index" in by_time
            for f, column in (
                (RequestFilter(key="k7", since=day2, until=day2 + DAY), "key_name"),
                (RequestFilter(model="m3", since=day2, until=day2 + DAY), "model"),
                (RequestFilter(provider="p3", since=day2, until=day2 + DAY), "provider"),
                (RequestFilter(status=(303, 303), since=day2, until=day2 + DAY), "status"),
            ):
                text = plan(conn, f)
                assert f"requests_20260303_{column}_ts_idx" in text, text
                assert "requests_20260302" not in text, text
            # Without a time filter a key's newest page walks every day's (key_name, ts) index.
            text = plan(conn, RequestFilter(key="k7"))
            assert "_key_name_ts_idx" in text and "Seq Scan" not in text, text
    finally:
        store.close_db()


async def test_rows_journalled_while_postgres_is_away_replay_into_their_partitions(
    tmp_path: Path,
) -> None:
    with start_postgres() as server:
        store = PostgresStore(server.dsn, journal=tmp_path / "journal.sqlite3", held_rows=10)
        rows = [sample(i) for i in range(ROWS)]
        try:
            async with writing(store):
                for row in rows[:12]:  # day one
                    store.record(row)
                await wait_for(lambda: store.written == 12)
                await anyio.to_thread.run_sync(server.stop)
                for row in rows[12:]:  # four more days, none with a partition yet
                    store.record(row)
                    await anyio.sleep(0)
                await wait_for(lambda: store.journaled >= ROWS - 12 - 10)
                assert store.written == 12 and store.journal.count > 0
                await anyio.to_thread.run_sync(server.start)
                await wait_for(lambda: store.written == ROWS)
            assert store.journal.count == 0 and store.held == 0
            assert placement(server.dsn, "requests") == {
                r.id: f"requests_{day_name(r.ts)}" for r in rows
            }
            assert placement(server.dsn, "bodies") == {
                r.id: f"bodies_{day_name(r.ts)}" for r in rows if r.body is not None
            }
        finally:
            store.close_db()
