"""``GET /requests``'s page over the store (twserve/store/listing.py): each filter keeps exactly the
rows it says, keyset paging walks every row once even where timestamps repeat, on SQLite and on
a real PostgreSQL; and on SQLite every filter is served by an index, newest first, without
sorting the table."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests.support.servers import PostgresServer
from twserve.console.requests_query import parse_filter
from twserve.store.listing import RequestFilter, decode_cursor, next_cursor, page_sql
from twserve.store.postgres import PostgresStore
from twserve.store.sqlite import RequestRow, RequestStore, Store

pytestmark = pytest.mark.anyio

T0 = 1_790_000_000.0
ROWS = 600


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _rows() -> list[RequestRow]:
    rows = []
    for i in range(ROWS):
        failed = i % 7 == 3
        rows.append(
            RequestRow(
                id=f"r{i:05d}",
                # Every third row shares its timestamp with the one before: ties across pages.
                ts=T0 + (i - (1 if i % 3 == 2 else 0)),
                path="/v1/messages",
                key_name=f"k{i % 4}",
                model=["sonnet", "haiku", "gpt_5%"][i % 3],
                provider=["a", "b"][i % 2],
                status=503 if failed else (429 if i % 11 == 5 else 200),
                error_code="gw.upstream.status" if failed else None,
                cancelled=i % 50 == 9,
            )
        )
    return rows


def _keeps(f: RequestFilter, row: RequestRow) -> bool:
    if f.key is not None and row.key_name != f.key:
        return False
    if f.model is not None and row.model != f.model:
        return False
    if f.provider is not None and row.provider != f.provider:
        return False
    if f.status is not None and not (f.status[0] <= (row.status or 0) <= f.status[1]):
        return False
    if f.errors and not ((row.status or 0) >= 400 or row.cancelled or row.error_code):
        return False
    if f.since is not None and row.ts < f.since:
        return False
    if f.until is not None and row.ts >= f.until:
        return False
    if f.text is not None:
        fields = (row.id, row.model, row.provider, row.key_name, row.error_code)
        if not any(f.text.lower() in (v or "").lower() for v in fields):
            return False
    return True


FILTERS: dict[str, dict[str, str]] = {
    "all": {},
    "key": {"key": "k2"},
    "model": {"model": "haiku"},
    "upstream": {"provider": "b"},
    "status": {"status": "429"},
    "class": {"status": "5xx"},
    "errors": {"status": "error"},
    "time": {"since": str(T0 + 100), "until": str(T0 + 400)},
    "text": {"q": "r0012"},
    # `%` and `_` are matched as themselves, not as LIKE's wildcards.
    "text wildcard": {"q": "5%"},
    "combined": {"key": "k1", "provider": "b", "status": "error", "since": str(T0 + 50)},
    "nothing": {"model": "no-such-model"},
}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "sqlite":
        made = RequestStore(tmp_path / "requests.sqlite3")
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
        made = PostgresStore(
            server.dsn.rsplit("/", 1)[0] + "/" + name, journal=tmp_path / "journal.sqlite3"
        )
    yield made
    made.close_db()


async def _walk(store: Store, query: dict[str, str], limit: int) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(ROWS + 2):
        params = dict(query, limit=str(limit)) | ({"before": cursor} if cursor else {})
        page = await store.page(parse_filter(params, now=T0 + ROWS))
        assert len(page) <= limit
        seen += page
        cursor = next_cursor(page, limit)
        if cursor is None:
            return seen
    raise AssertionError("the pages never ended")


async def test_filters_and_paging_keep_exactly_the_rows(store: Store) -> None:
    rows = _rows()
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for row in rows:
            store.record(row)
        store.close()
    for name, query in FILTERS.items():
        f = parse_filter(query, now=T0 + ROWS)
        expected = {r.id for r in rows if _keeps(f, r)}
        for limit in (7, 50):
            seen = await _walk(store, query, limit)
            ids = [r["id"] for r in seen]
            assert len(ids) == len(set(ids)), f"{name}: a row shown twice"
            assert set(ids) == expected, name
            stamps = [r["ts"] for r in seen]
            assert stamps == sorted(stamps, reverse=True), f"{name}: not newest first"
    assert {"wildcard": len({r.id for r in rows if r.model == "gpt_5%"})} == {
        "wildcard": len(await _walk(store, {"q": "5%"}, 1000))
    }


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"status": "abc"}, "status must be"),
        ({"status": "700"}, "status must be"),
        ({"limit": "many"}, "limit must be"),
        ({"before": "bm90IGpzb24"}, "not a cursor"),
        ({"before": "WzEsMl0"}, "not a cursor"),
        ({"since": "yesterday-ish"}, "is not a time"),
        ({"q": "x" * 201}, "over 200 characters"),
    ],
)
def test_bad_parameters_say_why(query: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_filter(query, now=T0)


def test_a_page_is_clamped() -> None:
    assert parse_filter({"limit": "0"}, now=T0).limit == 1
    assert parse_filter({"limit": "5000"}, now=T0).limit == 1000
    assert parse_filter({}, now=T0).limit == 50
    cursor = decode_cursor(next_cursor([{"ts": 5.5, "id": "x"}], 1) or "")
    assert (cursor.ts, cursor.ids) == (5.5, ("x",))


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_walks_an_index_without_sorting(tmp_path: Path, name: str) -> None:
    store = RequestStore(tmp_path / "plan.sqlite3")
    store.close_db()
    f: RequestFilter = parse_filter(FILTERS[name], now=T0)
    sql, params = page_sql(f, "?")
    with closing(sqlite3.connect(tmp_path / "plan.sqlite3")) as conn:
        plan = " ; ".join(
            str(step[-1]) for step in conn.execute("EXPLAIN QUERY PLAN " + sql, params)
        )
    assert "TEMP B-TREE" not in plan, plan
    assert "USING INDEX" in plan, plan
    if FILTERS[name].keys() <= {"model", "provider"} and FILTERS[name]:
        column = next(iter(FILTERS[name]))
        assert f"requests_{column}_ts" in plan, plan
