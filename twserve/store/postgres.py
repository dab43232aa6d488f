"""The request store on PostgreSQL (``store.postgres_dsn``): the SQLite store's rows, in one
database that every instance writes to and reads from.

Theory of operation
-------------------
`PostgresStore.record` puts the row on an in-memory queue and never waits, as the SQLite store
does. One writer task per instance takes whatever has queued and writes it in one transaction:
a ``COPY`` into a per-connection temporary table, then one ``INSERT … SELECT … ON CONFLICT (id,
ts) DO UPDATE`` into ``requests`` (and the same for ``bodies``), so a batch costs two statements
whatever its size and a row written twice (a journal replayed after a commit whose answer was
lost) stays one row.

**PostgreSQL away.** A write or connection that fails marks the database lost: the listeners
hear `StoreLost` once, and the writer keeps the rows it holds and tries again after a backoff
(0.5 s doubling to 30 s), taking newly queued rows meanwhile. At most `HELD_ROWS` rows wait in
memory; when more would, all of them are appended to the journal, a SQLite file in the data
directory with the SQLite store's schema (`JOURNAL_FILE`). When a write succeeds again the rows
held in memory go first, then the journal is replayed in batches, each batch deleted from the
journal once PostgreSQL committed it; when nothing is held any more the listeners hear
`StoreBack`. A journal left by an earlier run is replayed at startup the same way. Only a
failed connection counts as the database being away: a batch PostgreSQL refuses for its data (or
whose values cannot even be sent: a lone surrogate in a text) is written row by row, and a row it
still refuses is set aside rather than holding every later row back: kept in the journal's
``rejected`` table, logged as ``gw.store.row_set_aside`` and counted (``rejected``, the
``gateway_store_rows_set_aside_total`` metric). The journal itself sets aside the same way a row
SQLite refuses (a count past 64 bits), and so does the writer a row whose values it cannot
list.

**Stopping.** `close` ends the queue; the writer makes one last attempt to write what it holds
and puts whatever PostgreSQL did not take into the journal, so a graceful stop loses no row
whether or not the database answers. A killed process loses what was queued and not yet
committed (the journal is only written when memory is full or on the way out), unless
``store.commit_before_end`` is on: then each answer's end waits for its row's `Commit`, which
the writer settles once PostgreSQL committed the batch, or, while PostgreSQL is away, once the
held rows went to the journal (moved there at once while any answer waits, not when memory is
full): a row in the journal's committed SQLite file counts as durable.

**Schema.** ``twserve_schema`` lists the applied versions of `MIGRATIONS`; they are applied at
startup in one transaction under an advisory lock, so instances starting together apply each
once. Both tables are partitioned by day (`twserve/store/pg_partitions.py`): the writer
makes a missing day's partitions before a batch needs them, retention drops whole days. Reads
(recent rows, a body, usage totals, the spends key limits are rebuilt from, the retention
clean-up) use a second connection, so they never wait behind a batch.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import psycopg
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from psycopg.rows import dict_row

from twserve.store.listing import LISTING_INDEXES, RequestFilter, newest_rows, page_sql
from twserve.store.pg_partitions import DAYS_AHEAD, day_of, ensure_days, prune_days
from twserve.store.pg_partitions import MIGRATION as PARTITIONS
from twserve.store.pg_usage import usage_query, usage_result
from twserve.store.sqlite import (
    _COLUMNS,
    Commit,
    Commits,
    LimitSpend,
    RequestRow,
    StoreReadError,
    _connect,
    _decode,
    _migrate,
    keep_rejected,
    log_set_aside,
    refusal_reason,
    row_json,
)

__all__ = [
    "HELD_ROWS",
    "JOURNAL_FILE",
    "MIGRATIONS",
    "PostgresStore",
    "StoreBack",
    "StoreLost",
    "migrate",
    "usage_totals_pg",
]

log = logging.getLogger("twserve.store.sqlite")

# The journal's file name in the data directory.
JOURNAL_FILE = "store-journal.sqlite3"
# Rows held in memory while PostgreSQL is away before they go to the journal.
HELD_ROWS = 10_000
# Rows per transaction when a backlog (held rows, the journal) is written.
BATCH_ROWS = 2_000
CONNECT_TIMEOUT_SECS = 5
RETRY_FIRST_SECS = 0.5
RETRY_MAX_SECS = 30.0

MIGRATIONS: tuple[str, ...] = (
    # version 1: the SQLite store's version 2, column for column.
    """
    CREATE TABLE IF NOT EXISTS requests (
        id TEXT PRIMARY KEY,
        ts DOUBLE PRECISION NOT NULL,
        key_name TEXT,
        session TEXT,
        path TEXT NOT NULL,
        format TEXT,
        model TEXT,
        provider TEXT,
        status INTEGER,
        stream INTEGER NOT NULL DEFAULT 0,
        ttfb_ms BIGINT,
        duration_ms BIGINT,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cache_read_tokens BIGINT,
        cache_write_tokens BIGINT,
        reasoning_tokens BIGINT,
        cost_micros BIGINT,
        cost_state TEXT,
        routing TEXT,
        translated TEXT,
        error_code TEXT,
        local INTEGER NOT NULL DEFAULT 0,
        cancelled INTEGER NOT NULL DEFAULT 0,
        counted INTEGER NOT NULL DEFAULT 0,
        settled_ts DOUBLE PRECISION,
        limit_tokens BIGINT,
        limit_cache_reads BIGINT,
        limit_cost BIGINT
    );
    CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
    CREATE INDEX IF NOT EXISTS requests_key_ts ON requests (key_name, ts);
    CREATE INDEX IF NOT EXISTS requests_settled ON requests (counted, settled_ts);
    CREATE TABLE IF NOT EXISTS bodies (
        id TEXT PRIMARY KEY,
        ts DOUBLE PRECISION NOT NULL,
        request BYTEA,
        answer BYTEA,
        truncated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS bodies_ts ON bodies (ts);
    """,
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS correlation_id TEXT;"  # 2: SQLite's 3
    " CREATE INDEX IF NOT EXISTS requests_correlation ON requests (correlation_id);",
    LISTING_INDEXES,  # version 3: the console's filters (twserve/store/listing.py)
    # version 4: Responses conversation state (twserve/store/responses.py)
    "CREATE TABLE IF NOT EXISTS responses (id TEXT NOT NULL, key_name TEXT NOT NULL,"
    " ts DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL, size INTEGER NOT NULL,"
    " items BYTEA NOT NULL, PRIMARY KEY (key_name, id)); CREATE INDEX IF NOT EXISTS"
    " responses_expires ON responses (expires);",
    PARTITIONS,  # version 5: both tables partitioned by day (twserve/store/pg_partitions.py)
)

# Any 64-bit number the schema's migrations are serialised on across instances.
_MIGRATION_LOCK = 0x7477_7365_7276_6531

_COLS = ",".join(_COLUMNS)
_BODY_COLS = "id,ts,request,answer,truncated"
_UPSERT_ROWS = (
    f"INSERT INTO requests ({_COLS}) SELECT {_COLS} FROM requests_in "
    "ON CONFLICT (id, ts) DO UPDATE SET "
    + ",".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS if c not in ("id", "ts"))
)
_UPSERT_BODIES = (
    f"INSERT INTO bodies ({_BODY_COLS}) SELECT {_BODY_COLS} FROM bodies_in "
    "ON CONFLICT (id, ts) DO UPDATE SET request = EXCLUDED.request, "
    "answer = EXCLUDED.answer, truncated = EXCLUDED.truncated"
)
# Usage by local day: totals per quarter hour (every time zone's offset is a whole number of
# quarter hours), put on this process's calendar afterwards, as SQLite's 'localtime' does.

_T = TypeVar("_T")

# What a failed write means the database is away (not that it refused a row's data).
_AWAY = (psycopg.OperationalError, psycopg.InterfaceError, OSError)

# Where a row's key, `counted`, `settled_ts` and its three limit figures sit in its columns.
_KEY = _COLUMNS.index("key_name")
_COUNTED = _COLUMNS.index("counted")
_SETTLED = _COLUMNS.index("settled_ts")
_LIMITS = _COLUMNS.index("limit_tokens")
assert _COLUMNS[_LIMITS : _LIMITS + 3] == ("limit_tokens", "limit_cache_reads", "limit_cost")


def _spend(key: str, settled: float, tokens: Any, reads: Any, cost: Any) -> LimitSpend:
    return (key, float(settled), int(tokens or 0), int(reads or 0), int(cost or 0))


# A row as written: the requests columns, and the bodies columns when a body was kept.
_Item = tuple[tuple[Any, ...], tuple[Any, ...] | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreLost:
    """PostgreSQL stopped answering; `held` rows wait in memory and `journal` in the file."""

    reason: str
    held: int
    journal: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreBack:
    """PostgreSQL took every row held while it was away: `rows`, after `down_secs`."""

    rows: int
    down_secs: float


StoreChange = StoreLost | StoreBack


def _text(value: Any) -> Any:
    # PostgreSQL text cannot hold NUL, which a JSON string can carry into a model name.
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def _as_json(params: tuple[Any, ...]) -> str:
    return json.dumps(dict(zip(_COLUMNS, params, strict=True)), default=repr)


def _refusal(item: _Item, exc: BaseException) -> tuple[str, str, str]:
    return str(item[0][0]), refusal_reason(exc), _as_json(item[0])


def _item(row: RequestRow) -> _Item:
    params = tuple(_text(v) for v in row.as_params())
    body = None
    if row.body is not None:
        b = row.body
        body = (params[0], row.ts, b.request, b.answer, int(b.truncated))
    return params, body


async def migrate(conn: psycopg.AsyncConnection[Any]) -> int:
    """Apply the `MIGRATIONS` the database lacks; the schema version afterwards."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS twserve_schema ("
            "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM twserve_schema")
        found = await cur.fetchone()
        version = int(found[0]) if found else 0
        for number, script in enumerate(MIGRATIONS, start=1):
            if version < number:
                await conn.execute(script)
                await conn.execute("INSERT INTO twserve_schema (version) VALUES (%s)", (number,))
                version = number
    return version


class _Journal:
    """The local SQLite file rows go to while PostgreSQL is away and memory is full."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self.count = self._open_count() if path.exists() else 0

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            new = not self.path.exists()
            self._conn = _connect(self.path)
            if new:
                self.path.chmod(0o600)
            _migrate(self._conn)
        return self._conn

    def _open_count(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM requests").fetchone()[0])

    def add(self, items: Sequence[_Item]) -> list[tuple[str, str, str]]:
        """Keep `items` for PostgreSQL. When SQLite refuses the batch, each row goes in alone;
        those it still refuses are set aside in the ``rejected`` table and returned, ``(id,
        reason, row as JSON)``."""
        try:
            self._add(items)
            return []
        except Exception as exc:
            refused = []
            if len(items) == 1:
                refused.append(_refusal(items[0], exc))
            else:
                for item in items:
                    try:
                        self._add([item])
                    except Exception as one:
                        refused.append(_refusal(item, one))
            keep_rejected(self._db(), refused)
            return refused
        finally:
            self.count = self._open_count()

    def _add(self, items: Sequence[_Item]) -> None:
        db = self._db()
        marks = ",".join("?" for _ in _COLUMNS)
        db.execute("BEGIN")
        try:
            db.executemany(
                f"INSERT OR REPLACE INTO requests ({_COLS}) VALUES ({marks})",
                [p for p, _ in items],
            )
            db.executemany(
                f"INSERT OR REPLACE INTO bodies ({_BODY_COLS}) VALUES (?, ?, ?, ?, ?)",
                [b for _, b in items if b is not None],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def take(self, limit: int) -> list[_Item]:
        db = self._db()
        rows = db.execute(f"SELECT {_COLS} FROM requests ORDER BY ts LIMIT ?", (limit,)).fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        marks = ",".join("?" for _ in ids)
        bodies = {
            b[0]: tuple(b)
            for b in db.execute(f"SELECT {_BODY_COLS} FROM bodies WHERE id IN ({marks})", ids)
        }
        return [(tuple(r), bodies.get(r[0])) for r in rows]

    def reject(self, refused: Sequence[tuple[str, str, str]]) -> None:
        """Keep rows set aside, ``(id, reason, row as JSON)``; they are not replayed."""
        keep_rejected(self._db(), refused)

    def params(self) -> list[tuple[Any, ...]]:
        """Every row's columns, bodies left out, read on a connection of its own (the writer
        may be using the journal's meanwhile)."""
        conn = sqlite3.connect(self.path)
        try:
            return [tuple(r) for r in conn.execute(f"SELECT {_COLS} FROM requests")]
        finally:
            conn.close()

    def remove(self, ids: Sequence[str]) -> None:
        db = self._db()
        marks = ",".join("?" for _ in ids)
        db.execute("BEGIN")
        db.execute(f"DELETE FROM bodies WHERE id IN ({marks})", list(ids))
        db.execute(f"DELETE FROM requests WHERE id IN ({marks})", list(ids))
        db.execute("COMMIT")
        self.count = self._open_count()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresStore:
    """The request store in PostgreSQL with a batching writer (see the module docs)."""

    def __init__(
        self,
        dsn: str,
        *,
        journal: Path,
        held_rows: int = HELD_ROWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.held_rows = held_rows
        self.clock = clock
        journal.parent.mkdir(parents=True, exist_ok=True)
        self.journal = _Journal(journal)
        send, receive = anyio.create_memory_object_stream[RequestRow](math.inf)
        self._send: MemoryObjectSendStream[RequestRow] = send
        self._receive: MemoryObjectReceiveStream[RequestRow] = receive
        self._held: list[_Item] = []
        self._writer: psycopg.AsyncConnection[Any] | None = None
        self._reader: psycopg.AsyncConnection[Any] | None = None
        self._read_lock = anyio.Lock()
        self._migrated = False
        # Set while PostgreSQL is away: since when, and when the writer tries next.
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = 0.0
        self._recovering = 0
        self.listeners: list[Callable[[StoreChange], None]] = []
        # Rows committed to PostgreSQL, and rows put in the journal, by this process.
        self.written = 0
        self.journaled = 0
        # Rows set aside (PostgreSQL or the journal refused their data, not the connection):
        # kept in the journal file's rejected table.
        self.rejected = 0
        # Rows whose values could not be listed, to set aside on the writer's next turn.
        self._unlisted: list[tuple[str, str, str]] = []
        # Rows whose answer's end waits for them (store.commit_before_end).
        self.commits = Commits()
        self.batch_listeners: list[Callable[[int, float], None]] = []
        # The days whose partitions the writer made or found (twserve/store/pg_partitions.py).
        self._days: set[int] = set()
        self.wall = time.time

    # -- the writer --------------------------------------------------------------------------

    def record(self, row: RequestRow) -> None:
        """Queue `row` for writing; never blocks."""
        self._send.send_nowait(row)

    def queued(self) -> int:
        """Rows recorded and not in PostgreSQL yet: queued and held in memory (the journal's
        rows are on disk, counted in `status`)."""
        return self._receive.statistics().current_buffer_used + len(self._held)

    def record_committed(self, row: RequestRow) -> Commit:
        """Queue `row` like `record`; the returned `Commit` settles when PostgreSQL committed
        it, or the local journal did (while PostgreSQL is away, see the module docs)."""
        commit = self.commits.add(row.id)
        self._send.send_nowait(row)
        return commit

    def close(self) -> None:
        """Stop accepting rows; the writer writes (or journals) what is queued and returns."""
        self._send.close()

    def status(self) -> dict[str, Any]:
        """What the control plane's ``/status`` shows of the store."""
        return {
            "backend": "postgresql",
            "available": self.down_since is None,
            "down_secs": None
            if self.down_since is None
            else round(self.clock() - self.down_since, 3),
            "held": len(self._held),
            "journal": self.journal.count,
            "written": self.written,
            "journaled": self.journaled,
            "rejected": self.rejected,
            "commit_waits_late": self.commits.late,
        }

    @property
    def held(self) -> int:
        """Rows waiting in memory for PostgreSQL."""
        return len(self._held)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The writer task: runs until `close()` is called, then drains what is queued."""
        task_status.started()
        try:
            async with self._receive:
                if self.journal.count:
                    await self._flush()
                closing = False
                while not closing:
                    closing = await self._gather()
                    if self._unlisted:
                        await self._set_aside_unlisted()
                    if self._held or self.journal.count:
                        await self._flush()
                if self._held:
                    count = len(self._held)
                    await self._journal_held()
                    log.warning(
                        "gw.store.unavailable: %d rows kept in %s for the next start",
                        count,
                        self.journal.path,
                    )
        finally:
            with anyio.CancelScope(shield=True):
                await self._drop_writer()
                await self._drop_reader()

    async def _gather(self) -> bool:
        """Take queued rows: wait for one when nothing is pending; while PostgreSQL is away,
        until the next retry. True once the queue is closed and empty."""
        try:
            if not self._held and not self.journal.count:
                self._hold(await self._receive.receive())
            elif self.down_since is not None:
                with anyio.move_on_after(max(self._retry_at - self.clock(), 0.0)):
                    while True:
                        self._hold(await self._receive.receive())
                        self._hold_ready()
                        await self._spill_if_full()
            while True:
                self._hold(self._receive.receive_nowait())
        except anyio.WouldBlock:
            return False
        except anyio.EndOfStream:
            return True

    def _hold(self, row: RequestRow) -> None:
        try:
            self._held.append(_item(row))
        except Exception as exc:  # its values cannot be listed: set aside, the rest goes on
            self._unlisted.append((row.id, refusal_reason(exc), row_json(row)))

    async def _set_aside_unlisted(self) -> None:
        refused, self._unlisted = self._unlisted, []
        await anyio.to_thread.run_sync(self.journal.reject, refused)
        self._set_aside(refused)
        self.commits.settle(row_id for row_id, _, _ in refused)

    def _set_aside(self, refused: Sequence[tuple[str, str, str]]) -> None:
        self.rejected += len(refused)
        for row_id, reason, _ in refused:
            log_set_aside(row_id, reason, self.journal.path)

    async def _journal_held(self) -> None:
        """Move every held row to the journal (a row SQLite refuses is set aside there)."""
        held, self._held = self._held, []
        refused = await anyio.to_thread.run_sync(self.journal.add, held)
        self._set_aside(refused)
        self.journaled += len(held) - len(refused)
        self.commits.settle(p[0] for p, _ in held)

    def _hold_ready(self) -> None:
        """Hold every row queued now (a closed, empty queue raises EndOfStream)."""
        while True:
            try:
                self._hold(self._receive.receive_nowait())
            except anyio.WouldBlock:
                return

    async def _spill_if_full(self) -> None:
        """While PostgreSQL is away: move the held rows to the journal when memory is full,
        or at once when an answer's end waits for one of them (store.commit_before_end)."""
        if len(self._held) < self.held_rows and not self.commits:
            return
        if not self._held:
            return
        count = len(self._held)
        with anyio.CancelScope(shield=True):
            await self._journal_held()
        log.warning("PostgreSQL is away: %d rows moved to %s", count, self.journal.path)

    async def _flush(self) -> None:
        """Write what is held, then the journal; on failure keep both and schedule a retry."""
        try:
            conn = await self._writer_conn()
            while self._held:
                batch = self._held[:BATCH_ROWS]
                await self._write(conn, batch)
                self.commits.settle(p[0] for p, _ in batch)
                del self._held[: len(batch)]
            while self.journal.count:
                batch = await anyio.to_thread.run_sync(self.journal.take, BATCH_ROWS)
                if not batch:
                    break
                await self._write(conn, batch)
                await anyio.to_thread.run_sync(self.journal.remove, [p[0] for p, _ in batch])
        except _AWAY as exc:
            await self._lost(exc)
            await self._spill_if_full()
            return
        if self.down_since is not None:
            down = self.clock() - self.down_since
            rows, self._recovering = self._recovering, 0
            self.down_since = None
            self._backoff = 0.0
            log.warning(
                "gw.store.recovered: PostgreSQL is back after %.1f s; %d held rows written",
                down,
                rows,
            )
            self._tell(StoreBack(rows=rows, down_secs=round(down, 3)))

    async def _write(self, conn: psycopg.AsyncConnection[Any], batch: Sequence[_Item]) -> None:
        """Write `batch`. When PostgreSQL refuses its data (not its connection), or a value
        cannot be sent, the rows are written one by one and each one that still fails is set
        aside in the journal's ``rejected`` table with the reason, instead of holding every
        later row back."""
        started = time.perf_counter()
        await self._write_batch(conn, batch)
        secs = time.perf_counter() - started
        for listener in self.batch_listeners:
            listener(len(batch), secs)

    async def _write_batch(
        self, conn: psycopg.AsyncConnection[Any], batch: Sequence[_Item]
    ) -> None:
        try:
            await self._copy(conn, batch)
        except Exception as exc:
            if isinstance(exc, _AWAY) or conn.closed:
                raise
            self._days.clear()  # a partition dropped meanwhile is made again
            refused: list[tuple[str, str, str]] = []
            for item in batch:
                try:
                    await self._copy(conn, [item])
                except Exception as one:
                    if isinstance(one, _AWAY) or conn.closed:
                        raise
                    refused.append(_refusal(item, one))
            if refused:
                await anyio.to_thread.run_sync(self.journal.reject, refused)
                self._set_aside(refused)
            self._wrote(len(batch) - len(refused))
            return
        self._wrote(len(batch))

    def _wrote(self, count: int) -> None:
        self.written += count
        if self.down_since is not None:
            self._recovering += count

    async def _lost(self, exc: BaseException) -> None:
        await self._drop_writer()
        self._backoff = min(max(self._backoff * 2, RETRY_FIRST_SECS), RETRY_MAX_SECS)
        self._retry_at = self.clock() + self._backoff
        if self.down_since is not None:
            log.debug("PostgreSQL still away (%s); next try in %.1f s", exc, self._backoff)
            return
        self.down_since = self.clock()
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "gw.store.unavailable: PostgreSQL is away (%s); %d rows held, retrying", reason,
            len(self._held),
        )  # fmt: skip
        self._tell(StoreLost(reason=reason, held=len(self._held), journal=self.journal.count))

    def _tell(self, change: StoreChange) -> None:
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:
                log.exception("store listener failed")

    async def _copy(self, conn: psycopg.AsyncConnection[Any], items: Sequence[_Item]) -> None:
        # One row per id: an upsert may not touch the same row twice in one statement.
        unique = list({p[0]: (p, b) for p, b in items}.values())
        days = {d for p, _ in unique if (d := day_of(p[1])) is not None} - self._days
        if days:
            await ensure_days(conn, days)
            self._days |= days
        async with conn.transaction():
            async with conn.cursor() as cur:
                async with cur.copy(f"COPY requests_in ({_COLS}) FROM STDIN") as copy:
                    for params, _ in unique:
                        await copy.write_row(params)
                await cur.execute(_UPSERT_ROWS)
                bodies = [b for _, b in unique if b is not None]
                if bodies:
                    async with cur.copy(f"COPY bodies_in ({_BODY_COLS}) FROM STDIN") as copy:
                        for body in bodies:
                            await copy.write_row(body)
                    await cur.execute(_UPSERT_BODIES)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECS,
            application_name="twserve",
        )

    async def _writer_conn(self) -> psycopg.AsyncConnection[Any]:
        if self._writer is None:
            conn = await self._connect()
            try:
                if not self._migrated:
                    await migrate(conn)
                    self._migrated = True
                for table in ("requests", "bodies"):
                    await conn.execute(
                        f"CREATE TEMP TABLE IF NOT EXISTS {table}_in "
                        f"(LIKE {table}) ON COMMIT DELETE ROWS"
                    )
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await conn.close()
                raise
            self._writer = conn
        return self._writer

    async def _drop_writer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            try:
                await conn.close()
            except (psycopg.Error, OSError):
                pass

    # -- reads -------------------------------------------------------------------------------

    async def _read(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]) -> _T:
        """`work` on the reader connection. A connection the server dropped since its last use
        (a restart) is opened again once; a server that is away raises."""
        async with self._read_lock:
            for fresh in (self._reader is None, True):
                try:
                    return await work(await self._reader_conn())
                except psycopg.OperationalError as exc:
                    await self._drop_reader()
                    if fresh:
                        raise StoreReadError(f"PostgreSQL cannot be read: {exc}") from exc
            raise AssertionError("unreachable")

    async def _query(
        self, sql: str, params: Sequence[Any] = (), *, dicts: bool = False
    ) -> list[Any]:
        async def query(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            if dicts:
                async with conn.cursor(row_factory=dict_row) as dcur:
                    await dcur.execute(sql, params)
                    return await dcur.fetchall()
            async with conn.cursor() as cur:
                await cur.execute(sql, params)
                return await cur.fetchall()

        return await self._read(query)

    async def _reader_conn(self) -> psycopg.AsyncConnection[Any]:
        if self._reader is None:
            conn = await self._connect()
            if not self._migrated:
                try:
                    await migrate(conn)
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await conn.close()
                    raise
                self._migrated = True
            self._reader = conn
        return self._reader

    async def _drop_reader(self) -> None:
        conn, self._reader = self._reader, None
        if conn is not None:
            try:
                await conn.close()
            except (psycopg.Error, OSError):
                pass

    recent = newest_rows

    async def page(self, f: RequestFilter) -> list[dict[str, Any]]:
        sql, params = page_sql(f, "%s")  # every instance's rows: store/listing.py
        return [_decode(dict(r)) for r in await self._query(sql, params, dicts=True)]

    async def body(self, request_id: str) -> dict[str, Any] | None:
        """The stored request and answer bodies of one request, if kept."""
        rows = await self._query(
            "SELECT request, answer, truncated FROM bodies WHERE id = %s", (request_id,)
        )
        if not rows:
            return None
        request, answer, truncated = rows[0]
        return {
            "request": bytes(request) if request is not None else None,
            "answer": bytes(answer) if answer is not None else None,
            "truncated": bool(truncated),
        }

    async def usage(
        self, *, by: str, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """Totals per `by` (a `USAGE_GROUPS` name) over rows in [since, until)."""
        sql, params = usage_query(by, since, until)
        return usage_result(by, await self._query(sql, params))

    async def limit_spends(self, keys: Sequence[str], since: float) -> list[LimitSpend]:
        """What each request of `keys` settled at or after `since` counted toward its limits:
        the rows in PostgreSQL and the rows still waiting for it (held, journal)."""
        wanted = set(keys)
        spends: dict[str, LimitSpend] = {}
        # Waiting rows first: one written meanwhile is then found twice, and counted once.
        waiting = [p for p, _ in self._held]
        if self.journal.count:
            waiting += await anyio.to_thread.run_sync(self.journal.params)
        for p in waiting:
            key, counted, settled = p[_KEY], p[_COUNTED], p[_SETTLED]
            if key in wanted and counted and settled is not None and settled >= since:
                spends[p[0]] = _spend(key, settled, *p[_LIMITS : _LIMITS + 3])
        rows = await self._query(
            "SELECT id, key_name, settled_ts, limit_tokens, limit_cache_reads, limit_cost "
            "FROM requests WHERE counted = 1 AND settled_ts >= %s AND key_name = ANY(%s)",
            (since, list(keys)),
        )
        for request_id, key, settled, *limits in rows:
            spends[request_id] = _spend(key, settled, *limits)
        return list(spends.values())

    async def prune(self, *, before_rows: float, before_bodies: float) -> tuple[int, int]:
        """Apply retention, whichever instance wrote the rows: drop the day partitions older
        than `before_rows` / `before_bodies` (unix seconds), delete the older rows of the day
        each falls in, and make the partitions of today and `DAYS_AHEAD` days ahead; returns
        how many rows and bodies went."""
        today = day_of(self.wall()) or 0

        async def prune(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
            await ensure_days(conn, range(today, today + DAYS_AHEAD + 1))
            async with conn.transaction():
                # A body's ts is its row's: a row gone takes its body with it.
                bodies = await prune_days(conn, "bodies", max(before_bodies, before_rows))
                return await prune_days(conn, "requests", before_rows), bodies

        return await self._read(prune)

    def close_db(self) -> None:
        """Release what `run` has not: the queue, the journal file, a reader opened since."""
        self._send.close()
        self._receive.close()
        self.journal.close()
        for conn in (self._writer, self._reader):
            if conn is not None and not conn.closed:
                conn.pgconn.finish()
        self._writer = self._reader = None


def usage_totals_pg(
    dsn: str, *, by: str, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """`PostgresStore.usage`, synchronously, on the database at `dsn` (``twserve usage``)."""
    sql, params = usage_query(by, since, until)
    with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_SECS) as conn:
        return usage_result(by, conn.execute(sql, params).fetchall())
