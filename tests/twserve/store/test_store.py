"""The SQLite request store: rows queue without blocking and none is lost on close."""

from __future__ import annotations

import json
import sqlite3
import stat
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from twserve.store.sqlite import RequestRow, RequestStore, StoredBody, _write_rows

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_every_queued_row_is_written_before_close_returns(tmp_path: Path) -> None:
    store = RequestStore(tmp_path / "r.sqlite3")
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for i in range(500):
            store.record(
                RequestRow(
                    id=f"r{i}",
                    ts=1000.0 + i,
                    path="/v1/messages",
                    input_tokens=i,
                    routing={"attempts": [{"provider": "a"}]},
                    translated=["x"],
                )
            )
        store.close()
    assert store.written == 500
    rows = await store.recent(limit=1000)
    assert len(rows) == 500
    newest = rows[0]
    assert newest["id"] == "r499" and newest["input_tokens"] == 499
    assert newest["routing"] == {"attempts": [{"provider": "a"}]}
    assert newest["translated"] == ["x"] and newest["stream"] is False
    store.close_db()


async def test_file_is_private_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = RequestStore(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with closing(sqlite3.connect(path)) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close_db()


async def test_reopening_keeps_history(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    for round_ in range(2):
        store = RequestStore(path)
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            store.record(RequestRow(id=f"x{round_}", ts=float(round_), path="/p"))
            store.close()
        store.close_db()
    with closing(sqlite3.connect(path)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        ids = {r[0] for r in db.execute("SELECT id FROM requests")}
    assert ids == {"x0", "x1"} and version == 5


def _ids(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as db:
        return {r[0] for r in db.execute("SELECT id FROM requests")}


async def test_an_awaited_commit_settles_once_the_row_is_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = RequestStore(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        # The writer's transaction is held: rows queue, none commits.
        await store._lock.acquire()
        commits = [
            store.record_committed(RequestRow(id=f"c{i}", ts=1.0, path="/p")) for i in range(3)
        ]
        store.record(RequestRow(id="plain", ts=1.0, path="/p"))
        assert not any(c.done for c in commits)
        assert await commits[0].wait(0.05) is False  # the store hangs: the wait gives up
        assert store.status()["commit_waits_late"] == 1
        assert _ids(path) == set()
        store._lock.release()
        for commit in commits:
            assert await commit.wait(600) is True
            assert commit.row_id in _ids(path)  # durable by the time the wait returns
        store.close()
    # The three shared one batch with the row nobody waited for.
    assert _ids(path) == {"c0", "c1", "c2", "plain"} and store.written == 4
    assert store.status()["commit_waits_late"] == 1
    store.close_db()


async def test_a_batch_larger_than_one_insert_is_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = RequestStore(path)
    rows = [
        RequestRow(
            id=f"b{i}",
            ts=float(i),
            path="/p",
            output_tokens=i,
            body=StoredBody(request=b"q%d" % i, answer=None) if i % 100 == 0 else None,
        )
        for i in range(450)  # seven INSERTs of 64 rows and one of 2
    ]
    await store._write(rows)
    with closing(sqlite3.connect(path)) as db:
        got = dict(db.execute("SELECT id, output_tokens FROM requests"))
        kept = dict(db.execute("SELECT id, request FROM bodies"))
    assert got == {f"b{i}": i for i in range(450)}
    assert kept == {f"b{i}": b"q%d" % i for i in range(0, 450, 100)}
    # Three rows go in one INSERT made for four; the padding leaves nothing behind.
    await store._write([RequestRow(id=f"t{i}", ts=1.0, path="/p") for i in range(3)])
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (453,)
    # A row id written again replaces its row (INSERT OR REPLACE).
    await store._write([RequestRow(id="b7", ts=7.0, path="/p", output_tokens=70)])
    # A batch whose last INSERT fails leaves nothing of the batch behind.
    broken = [RequestRow(id=f"z{i}", ts=1.0, path="/p") for i in range(300)]
    broken[-1].path = None  # type: ignore[assignment]  # NOT NULL
    with pytest.raises(sqlite3.IntegrityError):
        await anyio.to_thread.run_sync(
            _write_rows, store._conn, [r.as_params() for r in broken], []
        )
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT output_tokens FROM requests WHERE id = 'b7'").fetchone() == (70,)
        assert db.execute("SELECT COUNT(*) FROM requests WHERE id LIKE 'z%'").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (453,)
    # The writer then writes that batch row by row: only the row SQLite refuses is set aside.
    await store._write(broken)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT COUNT(*) FROM requests WHERE id LIKE 'z%'").fetchone() == (299,)
        assert db.execute("SELECT id FROM rejected").fetchall() == [("z299",)]
    assert store.rejected == 1
    store.close_db()


def _rejected(path: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    with closing(sqlite3.connect(path)) as db:
        found = db.execute("SELECT id, reason, row FROM rejected").fetchall()
    return {row_id: (reason, json.loads(row)) for row_id, reason, row in found}


async def test_a_row_sqlite_refuses_is_set_aside_and_the_writer_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A count past 64 bits (an upstream's usage) and a lone surrogate (a client's JSON may
    # escape one into a model name): SQLite cannot take either. Each fails its batch; the
    # writer writes the batch again one row at a time, sets those two aside, and goes on.
    path = tmp_path / "r.sqlite3"
    store = RequestStore(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        await store._lock.acquire()  # the four rows make one batch
        store.record(RequestRow(id="a", ts=1.0, path="/p", input_tokens=5))
        store.record(RequestRow(id="huge", ts=2.0, path="/p", input_tokens=2**70))
        lone = store.record_committed(RequestRow(id="lone", ts=3.0, path="/p", model="m\ud800"))
        store.record(
            RequestRow(id="b", ts=4.0, path="/p", body=StoredBody(request=b"q", answer=b"a"))
        )
        store._lock.release()
        assert await lone.wait(600) is True  # the writer is done with it: it does not hang
        # The writer is still there: a later row is written, and its commit settles.
        assert await store.record_committed(RequestRow(id="c", ts=5.0, path="/p")).wait(600)
        assert _ids(path) == {"a", "b", "c"}
        store.close()
    assert (store.written, store.rejected) == (3, 2)
    assert store.status()["rejected"] == 2
    assert await store.body("b") is not None
    kept = _rejected(path)
    assert kept["huge"][1]["input_tokens"] == 2**70 and "too large" in kept["huge"][0]
    assert kept["lone"][1]["model"] == "m\ud800" and "surrogate" in kept["lone"][0]
    logged = [r.getMessage() for r in caplog.records if "gw.store.row_set_aside" in r.getMessage()]
    assert len(logged) == 2 and "huge" in logged[0] and "table rejected" in logged[0]
    store.close_db()
