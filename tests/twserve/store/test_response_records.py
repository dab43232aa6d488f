"""The stored Responses records (twserve.store.responses) on both databases, the same cases on
each: a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.servers import PostgresServer
from tests.twserve.store.test_store_pg import new_database
from twserve.store.responses import PostgresResponses, ResponseRecords, SqliteResponses

pytestmark = pytest.mark.anyio
T0 = 1_800_000_000.0
HOUR = 3600.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
async def records(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResponseRecords]:
    found: ResponseRecords
    if request.param == "sqlite":
        found = SqliteResponses(tmp_path / "requests.sqlite3")
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        found = PostgresResponses(new_database(server))
    try:
        yield found
    finally:
        await found.close()


async def _save(
    records: ResponseRecords, key: str, rid: str, items: bytes, ts: float, **caps: int
) -> None:
    await records.save(
        key,
        rid,
        items,
        now=ts,
        expires=ts + HOUR,
        max_count=caps.get("max_count", 100),
        max_bytes=caps.get("max_bytes", 1 << 20),
    )


async def test_a_record_is_found_under_its_key_until_it_expires(records: ResponseRecords) -> None:
    await _save(records, "alice", "resp_1", b'[{"type":"message"}]', T0)
    assert await records.load("alice", "resp_1", now=T0 + 1) == b'[{"type":"message"}]'
    assert await records.load("bob", "resp_1", now=T0 + 1) is None
    assert await records.load("alice", "resp_2", now=T0 + 1) is None
    assert await records.load("alice", "resp_1", now=T0 + HOUR) is None
    # Saved again under the same id: the newer items replace the older.
    await _save(records, "alice", "resp_1", b"[2]", T0 + 10)
    assert await records.load("alice", "resp_1", now=T0 + 11) == b"[2]"


async def test_the_oldest_records_beyond_either_cap_are_dropped(records: ResponseRecords) -> None:
    for n in range(4):
        await _save(records, "alice", f"resp_{n}", b"x" * 100, T0 + n, max_count=3)
    await _save(records, "bob", "resp_b", b"y", T0)
    found = [await records.load("alice", f"resp_{n}", now=T0 + 5) for n in range(4)]
    assert [f is not None for f in found] == [False, True, True, True]
    # 250 bytes hold the two newest of alice's 100-byte records; bob's is another key's.
    await _save(records, "alice", "resp_4", b"x" * 100, T0 + 4, max_bytes=250)
    found = [await records.load("alice", f"resp_{n}", now=T0 + 5) for n in range(5)]
    assert [f is not None for f in found] == [False, False, False, True, True]
    assert await records.load("bob", "resp_b", now=T0 + 5) == b"y"


async def test_prune_drops_the_expired_and_says_how_many(records: ResponseRecords) -> None:
    for n in range(3):
        await _save(records, "alice", f"resp_{n}", b"[]", T0 + n * HOUR)
    assert await records.prune(T0 + 2 * HOUR) == 2
    assert await records.prune(T0 + 2 * HOUR) == 0
    assert await records.load("alice", "resp_2", now=T0 + 2 * HOUR) == b"[]"
