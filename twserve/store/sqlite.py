"""The request store: one SQLite row per request, written off the forwarding path.

Handlers call `RequestStore.record(row)`, which only puts the row on an in-memory queue and never
waits. A single writer task takes whatever has queued, writes it in one transaction on a worker
thread, and goes back for more, so a burst of finished streams costs one commit rather than one
each. After each write it waits `BATCH_WINDOW` before taking the next batch, unless an answer's end
is waiting for a commit: under steady traffic the rows of that window share one transaction and one
hop to the worker thread (a row each would cost a thread hop per request); a row reaches the file at
most that much later. A batch of up to 64 rows is one multi-row INSERT (`_inserts`): the worker
thread gives up and retakes the GIL once per statement, not once per row. Each request writes its
row once, when it ends. On shutdown the writer drains the queue before the connection closes: no
finished row is lost on a clean stop. `record_committed` queues a row the same way and hands back a
`Commit` the writer settles after the row's transaction (``store.commit_before_end``: the answer's
end waits for it, twserve.gateway.responders); rows that end together share that commit.

**A row that cannot be written** (a value SQLite refuses: a count past 64 bits an upstream
reported, a lone surrogate a client's JSON escaped into a model name) fails its batch's
transaction. The batch is then written again one row at a time, in the same trip to the worker
thread; a row that fails alone is set aside (`ROW_SET_ASIDE` is logged with its id and the
reason, the row kept as JSON in the ``rejected`` table, counted in `rejected` and the
``gateway_store_rows_set_aside_total`` metric) and the writer carries on with every other row.

The database runs in WAL mode so that readers (the control plane, tests, limit rebuilds) never
block the writer. `PRAGMA user_version` carries the schema version; `_MIGRATIONS` upgrades an
older file in place and keeps its history.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from twproto import json_dumps
from twserve.store.listing import LISTING_INDEXES, RequestFilter, newest_rows, page_sql

__all__ = [
    "ROW_SET_ASIDE",
    "USAGE_GROUPS",
    "Commit",
    "Commits",
    "LimitSpend",
    "RequestRow",
    "RequestStore",
    "Store",
    "StoreReadError",
    "StoredBody",
    "usage_rows",
]

# How long the writer lets rows gather after a write before it takes the next batch.
BATCH_WINDOW = 0.02

# Logged for each row a store could not write and set aside (docs/codes.md).
ROW_SET_ASIDE = "gw.store.row_set_aside"

# `GET /usage?by=…` and `twserve usage --by …`: the column each grouping reads.
USAGE_GROUPS = {
    "key": "key_name",
    "model": "model",
    "provider": "provider",
    "day": "date(ts, 'unixepoch', 'localtime')",
    # The local hour as ``2026-12-02T08:00`` (an hour the clock repeats in autumn is one row).
    "hour": "strftime('%Y-%m-%dT%H:00', ts, 'unixepoch', 'localtime')",
}


@dataclass(slots=True, kw_only=True)
class StoredBody:
    """A request's body and the answer's bytes as sent, cut at ``retention.body_max_bytes``."""

    request: bytes | None
    answer: bytes | None
    truncated: bool = False


_COLUMNS = (
    "id",
    "ts",
    "key_name",
    "session",
    "path",
    "format",
    "model",
    "provider",
    "status",
    "stream",
    "ttfb_ms",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost_micros",
    "cost_state",
    "routing",
    "translated",
    "error_code",
    "local",
    "cancelled",
    "counted",
    "settled_ts",
    "limit_tokens",
    "limit_cache_reads",
    "limit_cost",
    "correlation_id",
)

_MIGRATIONS: tuple[str, ...] = (
    # version 1
    """
    CREATE TABLE IF NOT EXISTS requests (
        id TEXT PRIMARY KEY,
        ts REAL NOT NULL,
        key_name TEXT,
        session TEXT,
        path TEXT NOT NULL,
        format TEXT,
        model TEXT,
        provider TEXT,
        status INTEGER,
        stream INTEGER NOT NULL DEFAULT 0,
        ttfb_ms INTEGER,
        duration_ms INTEGER,
        input_tokens INTEGER,
        output_tokens INTEGER,
        cache_read_tokens INTEGER,
        cache_write_tokens INTEGER,
        reasoning_tokens INTEGER,
        cost_micros INTEGER,
        cost_state TEXT,
        routing TEXT,
        translated TEXT,
        error_code TEXT,
        local INTEGER NOT NULL DEFAULT 0,
        cancelled INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
    CREATE INDEX IF NOT EXISTS requests_key_ts ON requests (key_name, ts);
    """,
    # version 2: what each request counted toward its key's limits, so that the totals are
    # rebuilt exactly at startup; and optional request/answer bodies. Rows written before the
    # upgrade count what they recorded: a row with an upstream or usage reached an upstream.
    """
    ALTER TABLE requests ADD COLUMN counted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE requests ADD COLUMN settled_ts REAL;
    ALTER TABLE requests ADD COLUMN limit_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN limit_cache_reads INTEGER;
    ALTER TABLE requests ADD COLUMN limit_cost INTEGER;
    UPDATE requests SET
        counted = CASE WHEN (provider IS NOT NULL OR input_tokens IS NOT NULL) AND local = 0
                  THEN 1 ELSE 0 END,
        settled_ts = ts + COALESCE(duration_ms, 0) / 1000.0,
        limit_tokens = COALESCE(input_tokens, 0) + COALESCE(cache_write_tokens, 0)
                       + COALESCE(output_tokens, 0),
        limit_cache_reads = COALESCE(cache_read_tokens, 0),
        limit_cost = COALESCE(cost_micros, 0);
    CREATE INDEX IF NOT EXISTS requests_settled ON requests (counted, settled_ts);
    CREATE TABLE IF NOT EXISTS bodies (
        id TEXT PRIMARY KEY,
        ts REAL NOT NULL,
        request BLOB,
        answer BLOB,
        truncated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS bodies_ts ON bodies (ts);
    """,
    # version 3: the id the client sent in x-request-id, kept so the request is found by it.
    """
    ALTER TABLE requests ADD COLUMN correlation_id TEXT;
    CREATE INDEX IF NOT EXISTS requests_correlation ON requests (correlation_id);
    """,
    LISTING_INDEXES,  # version 4: the console's filters (twserve/store/listing.py)
    # version 5: Responses conversation state (twserve/store/responses.py)
    "CREATE TABLE IF NOT EXISTS responses (id TEXT NOT NULL, key_name TEXT NOT NULL,"
    " ts REAL NOT NULL, expires REAL NOT NULL, size INTEGER NOT NULL, items BLOB NOT NULL,"
    " PRIMARY KEY (key_name, id)); CREATE INDEX IF NOT EXISTS responses_expires"
    " ON responses (expires);",
)


@dataclass(slots=True, kw_only=True)
class RequestRow:
    """What is kept of one request. Usage fields stay None when the answer reported none."""

    id: str
    ts: float
    path: str
    key_name: str | None = None
    session: str | None = None
    format: str | None = None
    model: str | None = None
    provider: str | None = None
    status: int | None = None
    stream: bool = False
    ttfb_ms: int | None = None
    duration_ms: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_micros: int | None = None
    cost_state: str | None = None
    routing: dict[str, Any] | None = None
    translated: list[str] = field(default_factory=list)
    error_code: str | None = None
    local: bool = False
    cancelled: bool = False
    # What the request counted toward its key's limits (`counted`: it reached an upstream),
    # booked at `settled_ts`; rebuilt from these at startup.
    counted: bool = False
    settled_ts: float | None = None
    limit_tokens: int | None = None
    limit_cache_reads: int | None = None
    limit_cost: int | None = None
    # A valid id the client sent in x-request-id (the gateway answers with `id` there).
    correlation_id: str | None = None
    # Bytes of the request's body and of the answer written to the client: the access line's,
    # not stored.
    request_bytes: int = 0
    answer_bytes: int = 0
    # The client's W3C ``traceparent``, for its trace when traces are on: not stored.
    traceparent: bytes | None = None
    # Kept in the bodies table when ``retention.store_bodies`` is on.
    body: StoredBody | None = None

    def as_params(self) -> tuple[Any, ...]:
        # Plain attribute reads: dataclasses.asdict deep-copies the routing JSON for nothing.
        return (
            self.id,
            self.ts,
            self.key_name,
            self.session,
            self.path,
            self.format,
            self.model,
            self.provider,
            self.status,
            int(self.stream),
            self.ttfb_ms,
            self.duration_ms,
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.reasoning_tokens,
            self.cost_micros,
            self.cost_state,
            json_dumps(self.routing).decode() if self.routing is not None else None,
            json_dumps(self.translated).decode() if self.translated else None,
            self.error_code,
            int(self.local),
            int(self.cancelled),
            int(self.counted),
            self.settled_ts,
            self.limit_tokens,
            self.limit_cache_reads,
            self.limit_cost,
            self.correlation_id,
        )


log = logging.getLogger("twserve.store.sqlite")


class Commit:
    """One recorded row's commit (``store.commit_before_end``): `wait` returns once the writer
    made the row durable, or when `timeout` seconds passed first."""

    __slots__ = ("_done", "_owner", "row_id")

    def __init__(self, owner: Commits, row_id: str) -> None:
        self._done = anyio.Event()
        self._owner = owner
        self.row_id = row_id

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self, timeout: float) -> bool:
        """True once the row is durable; False when `timeout` ran out first (counted in the
        store's ``/status`` as ``commit_waits_late`` and logged)."""
        with anyio.move_on_after(timeout):
            await self._done.wait()
        if self._done.is_set():
            return True
        self._owner.late += 1
        log.warning(
            "gw.store.commit_late: row %s not committed within %.1f s; the answer ends anyway",
            self.row_id,
            timeout,
        )
        return False


class Commits:
    """The commits awaited, by row id; a store's writer settles them after each transaction.
    Rows nobody waits for cost one check of an empty dict per batch."""

    __slots__ = ("_waiting", "late")

    def __init__(self) -> None:
        self._waiting: dict[str, list[Commit]] = {}
        self.late = 0

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, row_id: str) -> Commit:
        commit = Commit(self, row_id)
        self._waiting.setdefault(row_id, []).append(commit)
        return commit

    def settle(self, row_ids: Iterable[str]) -> None:
        """The rows `row_ids` are durable: wake whoever waits for them."""
        if not self._waiting:
            return
        for row_id in row_ids:
            for commit in self._waiting.pop(row_id, ()):
                commit._done.set()


# One stored request's spend against its key's limits: key name, settled_ts, tokens, cache-read
# tokens, cost in micro-dollars (what `UsageKeeper.rebuild` books).
LimitSpend = tuple[str, float, int, int, int]


class StoreReadError(Exception):
    """The store cannot be read now (its database server is away)."""


class Store(Protocol):
    """What the gateway, the control plane and the maintenance task need of a request store.

    `RequestStore` (SQLite, the default) and `twserve.store.postgres.PostgresStore` implement it.
    `record` never blocks; `record_committed` queues the row the same way and returns its
    `Commit`, settled once the row is durable (a batch's transaction; on PostgreSQL also the
    local journal's). `run` is the writer task, which returns once `close` was called and
    every queued row is written; `close_db` releases the connections afterwards. A read that
    cannot reach the store's server raises `StoreReadError`.
    """

    written: int
    rejected: int  # rows set aside: they could not be written
    # Told of every batch the writer committed: its rows and the seconds its write took.
    batch_listeners: list[Callable[[int, float], None]]

    def record(self, row: RequestRow) -> None: ...

    def queued(self) -> int:
        """Rows recorded and not written yet (PostgreSQL: held in memory too)."""
        ...

    def record_committed(self, row: RequestRow) -> Commit: ...

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None: ...

    def close(self) -> None: ...

    def close_db(self) -> None: ...

    async def recent(self, limit: int = 100, find: str | None = None) -> list[dict[str, Any]]: ...

    async def page(self, f: RequestFilter) -> list[dict[str, Any]]: ...

    async def body(self, request_id: str) -> dict[str, Any] | None: ...

    async def usage(
        self, *, by: str, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]: ...

    async def prune(self, *, before_rows: float, before_bodies: float) -> tuple[int, int]: ...

    async def limit_spends(self, keys: Sequence[str], since: float) -> list[LimitSpend]: ...

    def status(self) -> dict[str, Any]: ...


# A batch's rows go in as one INSERT of up to 64 rows (more rows: one per 64, in one
# transaction). `executemany` steps once per row, and each step gives up the GIL and takes it
# back: under load the event loop holds it, and every retake waits for the interpreter's switch
# interval, so a batch of rows took tens of milliseconds of wall time in the writer thread and
# forced as many switches of the event loop's thread. One statement takes it back once.
# sqlite3 compiles and caches a statement per distinct text (one per batch size, up to 200 rows,
# held some 50 MB), so the statement takes a power of two of rows, the rest padded with NULL
# rows that its WHERE drops: seven statements in all.
_LARGEST_INSERT = 64
_ROW_MARKS = "(" + ",".join("?" for _ in _COLUMNS) + ")"
_PAD = (None,) * len(_COLUMNS)


@functools.cache
def _insert_sql(rows: int) -> str:
    """The INSERT of up to `rows` request rows (``OR REPLACE``: a row id written again wins);
    rows whose id is NULL are padding."""
    values = ",".join(itertools.repeat(_ROW_MARKS, rows))
    return (
        f"INSERT OR REPLACE INTO requests ({','.join(_COLUMNS)}) "
        f"SELECT * FROM (VALUES {values}) WHERE column1 IS NOT NULL"
    )


def _inserts(params: Sequence[tuple[Any, ...]]) -> list[tuple[str, list[Any]]]:
    """The statements writing `params` (rows as `RequestRow.as_params` gives them): 64 rows at
    a time, the last padded up to a power of two."""
    out = []
    for start in range(0, len(params), _LARGEST_INSERT):
        chunk = params[start : start + _LARGEST_INSERT]
        size = 1 << (len(chunk) - 1).bit_length()
        flat = [value for row in chunk for value in row]
        flat.extend(_PAD * (size - len(chunk)))
        out.append((_insert_sql(size), flat))
    return out


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(_MIGRATIONS, start=1):
        if version < number:
            conn.executescript(f"BEGIN; {script} PRAGMA user_version = {number}; COMMIT;")


def refusal_reason(exc: BaseException) -> str:
    """What a refused write's error says, on one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def row_json(row: RequestRow) -> str:
    """`row` as JSON, whatever its values: what is kept of a row that could not be written."""
    fields = {name: getattr(row, name) for name in _COLUMNS}
    return json.dumps(fields, default=repr)


def keep_rejected(db: sqlite3.Connection, refused: Sequence[tuple[str, str, str]]) -> None:
    """Keep rows set aside, ``(id, reason, row as JSON)``, in `db`'s ``rejected`` table (made
    on first use); they are never written to ``requests``."""
    db.execute("CREATE TABLE IF NOT EXISTS rejected (id TEXT, ts REAL, reason TEXT, row TEXT)")
    now = time.time()
    db.executemany(
        "INSERT INTO rejected (id, ts, reason, row) VALUES (?, ?, ?, ?)",
        [(row_id, now, reason, row) for row_id, reason, row in refused],
    )


def log_set_aside(row_id: str, reason: str, kept_in: Path | None) -> None:
    where = f"kept in {kept_in}, table rejected" if kept_in is not None else "not kept"
    log.error("%s: row %s could not be written (%s); %s", ROW_SET_ASIDE, row_id, reason, where)


def _write_rows(
    conn: sqlite3.Connection,
    params: Sequence[tuple[Any, ...]],
    bodies: Sequence[tuple[Any, ...]],
) -> None:
    """Write `params` (rows as `RequestRow.as_params` gives them) and `bodies` in one
    transaction; on any error nothing of them is written."""
    inserts = _inserts(params)
    if len(inserts) == 1 and not bodies:
        # One statement is its own transaction: no BEGIN and COMMIT round trips.
        conn.execute(*inserts[0])
        return
    conn.execute("BEGIN")
    try:
        for insert in inserts:
            conn.execute(*insert)
        if bodies:
            conn.executemany(
                "INSERT OR REPLACE INTO bodies (id, ts, request, answer, truncated) "
                "VALUES (?, ?, ?, ?, ?)",
                bodies,
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _write_isolated(
    conn: sqlite3.Connection,
    rows: Sequence[RequestRow],
    params: Sequence[tuple[Any, ...]] | None,
    bodies: Sequence[tuple[Any, ...]],
) -> list[tuple[str, str, str]]:
    """Write `rows` in one transaction (`params` and `bodies` are theirs; None: a row's values
    could not be listed). When that fails, each row is written alone: those that still fail
    are returned, ``(id, reason, row as JSON)``, and every other row is written."""
    if params is not None:
        try:
            _write_rows(conn, params, bodies)
            return []
        except Exception as exc:
            if len(rows) == 1:  # it was alone already
                return [(rows[0].id, refusal_reason(exc), row_json(rows[0]))]
    refused = []
    for row in rows:
        try:
            _write_rows(conn, [row.as_params()], _body_of(row))
        except Exception as exc:
            refused.append((row.id, refusal_reason(exc), row_json(row)))
    return refused


def _body_of(row: RequestRow) -> list[tuple[Any, ...]]:
    b = row.body
    return [] if b is None else [(row.id, row.ts, b.request, b.answer, int(b.truncated))]


class RequestStore:
    """SQLite request store with a background batch writer (see module docs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        self._conn = _connect(path)
        if new:
            os.chmod(path, 0o600)
        _migrate(self._conn)
        send, receive = anyio.create_memory_object_stream[RequestRow](math.inf)
        self._send: MemoryObjectSendStream[RequestRow] = send
        self._receive: MemoryObjectReceiveStream[RequestRow] = receive
        self._lock = anyio.Lock()
        self.written = 0
        self.rejected = 0  # rows set aside: they could not be written (see the module docs)
        self.commits = Commits()
        # Set when a row whose commit is awaited is queued; made by the writer in its loop.
        self._urgent: anyio.Event | None = None
        self.batch_listeners: list[Callable[[int, float], None]] = []
        self._batch = 0  # rows of the batch being written

    def record(self, row: RequestRow) -> None:
        """Queue `row` for writing; never blocks."""
        self._send.send_nowait(row)

    def queued(self) -> int:
        """Rows recorded and not written yet: the queue's and the batch being written."""
        return self._receive.statistics().current_buffer_used + self._batch

    def record_committed(self, row: RequestRow) -> Commit:
        """Queue `row` like `record`; the returned `Commit` settles when its batch commits."""
        commit = self.commits.add(row.id)
        self._send.send_nowait(row)
        if self._urgent is not None:
            self._urgent.set()
        return commit

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The writer task: runs until `close()` is called, then drains what is queued."""
        task_status.started()
        async with self._receive:
            async for row in self._receive:
                batch = [row]
                while True:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._write(batch)
                # Let rows gather for one window, unless an answer's end waits for a commit.
                urgent = self._urgent = anyio.Event()
                if not self.commits:
                    with anyio.move_on_after(BATCH_WINDOW):
                        await urgent.wait()

    async def _write(self, rows: Sequence[RequestRow]) -> None:
        conn = self._conn
        try:
            params: list[tuple[Any, ...]] | None = [r.as_params() for r in rows]
        except Exception:
            params = None  # a row's values cannot even be listed: each is tried alone below
        bodies = [body for r in rows for body in _body_of(r)]

        def write() -> tuple[list[tuple[str, str, str]], bool]:
            """The rows set aside, and whether the rejected table kept them."""
            refused = _write_isolated(conn, rows, params, bodies)
            if not refused:
                return refused, True
            try:
                keep_rejected(conn, refused)
            except Exception as exc:  # the file itself refuses (a full disk): the log is all
                log.error("%s: the rejected table cannot be written (%s)", ROW_SET_ASIDE, exc)
                return refused, False
            return refused, True

        self._batch = len(rows)
        started = time.perf_counter()
        try:
            async with self._lock:
                refused, kept = await anyio.to_thread.run_sync(write)
        finally:
            self._batch = 0
        secs = time.perf_counter() - started
        for listener in self.batch_listeners:
            listener(len(rows), secs)
        for row_id, reason, _ in refused:
            log_set_aside(row_id, reason, self.path if kept else None)
        self.rejected += len(refused)
        self.written += len(rows) - len(refused)
        # A row set aside settles too: the writer is done with it (logged, kept if it could be).
        self.commits.settle(r.id for r in rows)

    def close(self) -> None:
        """Stop accepting rows; the writer finishes what is queued and returns."""
        self._send.close()

    def status(self) -> dict[str, Any]:
        """What the control plane's ``/status`` shows of the store."""
        return {
            "backend": "sqlite",
            "path": str(self.path),
            "written": self.written,
            "rejected": self.rejected,
            "commit_waits_late": self.commits.late,
        }

    def close_db(self) -> None:
        self._send.close()
        self._receive.close()
        self._conn.close()

    recent = newest_rows

    async def page(self, f: RequestFilter) -> list[dict[str, Any]]:
        """One page of the rows `f` keeps, newest first (twserve/store/listing.py)."""
        sql, params = page_sql(f, "?")

        def read() -> list[dict[str, Any]]:
            conn = sqlite3.connect(self.path)
            try:
                conn.row_factory = sqlite3.Row
                cur = conn.execute(sql, params)
                return [_decode(dict(r)) for r in cur.fetchall()]
            finally:
                conn.close()

        return await anyio.to_thread.run_sync(read)

    async def prune(self, *, before_rows: float, before_bodies: float) -> tuple[int, int]:
        """Delete rows older than `before_rows` and bodies older than `before_bodies` (unix
        seconds); returns how many of each went. Runs beside the writer, never inside a batch."""

        def prune() -> tuple[int, int]:
            self._conn.execute("BEGIN")
            try:
                bodies = self._conn.execute(
                    "DELETE FROM bodies WHERE ts < ? OR id IN "
                    "(SELECT id FROM requests WHERE ts < ?)",
                    (before_bodies, before_rows),
                ).rowcount
                rows = self._conn.execute(
                    "DELETE FROM requests WHERE ts < ?", (before_rows,)
                ).rowcount
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return rows, bodies

        async with self._lock:
            return await anyio.to_thread.run_sync(prune)

    async def body(self, request_id: str) -> dict[str, Any] | None:
        """The stored request and answer bodies of one request, if kept."""

        def read() -> dict[str, Any] | None:
            conn = sqlite3.connect(self.path)
            try:
                found = conn.execute(
                    "SELECT request, answer, truncated FROM bodies WHERE id = ?", (request_id,)
                ).fetchone()
            finally:
                conn.close()
            if found is None:
                return None
            request, answer, truncated = found
            return {"request": request, "answer": answer, "truncated": bool(truncated)}

        return await anyio.to_thread.run_sync(read)

    async def usage(
        self, *, by: str, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """Totals per `by` (a `USAGE_GROUPS` name) over rows in [since, until)."""
        return await anyio.to_thread.run_sync(
            lambda: usage_totals(self.path, by=by, since=since, until=until)
        )

    async def limit_spends(self, keys: Sequence[str], since: float) -> list[LimitSpend]:
        """What each request of `keys` settled at or after `since` counted toward its limits."""

        def read() -> list[LimitSpend]:
            if not self.path.exists():
                return []
            conn = sqlite3.connect(self.path)
            try:
                marks = ",".join("?" for _ in keys)
                cur = conn.execute(
                    "SELECT key_name, settled_ts, limit_tokens, limit_cache_reads, limit_cost "
                    "FROM requests WHERE counted = 1 AND settled_ts >= ? "
                    f"AND key_name IN ({marks})",
                    (since, *keys),
                )
                return [
                    (k, float(ts), int(t or 0), int(r or 0), int(c or 0))
                    for k, ts, t, r, c in cur.fetchall()
                ]
            finally:
                conn.close()

        return await anyio.to_thread.run_sync(read)


def usage_totals(
    path: Path, *, by: str, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """`RequestStore.usage`, synchronously, on the database at `path` (the CLI reads it so)."""
    column = USAGE_GROUPS[by]
    where = ["1 = 1"]
    params: list[Any] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts < ?")
        params.append(until)
    sql = (
        f"SELECT {column} AS grp, COUNT(*), "
        "SUM(CASE WHEN status >= 400 OR status IS NULL OR cancelled = 1 THEN 1 ELSE 0 END), "
        "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
        "COALESCE(SUM(cache_read_tokens), 0), COALESCE(SUM(cache_write_tokens), 0), "
        "COALESCE(SUM(reasoning_tokens), 0), COALESCE(SUM(cost_micros), 0), "
        "SUM(CASE WHEN cost_state = 'unknown' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN cost_state = 'free' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN cost_state = 'estimated' THEN 1 ELSE 0 END) "
        f"FROM requests WHERE {' AND '.join(where)} GROUP BY grp ORDER BY grp"
    )
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        conn.close()
    return usage_rows(by, rows)


def usage_rows(by: str, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Usage totals as `usage` returns them, from (group, count, errors, input, output, cache
    read, cache write, reasoning, cost, unpriced, free, estimated) tuples."""
    out = []
    for row in rows:
        grp, count, errors, inp, outp, read, write, reasoning, cost, unpriced, free, guessed = row
        out.append(
            {
                by: grp,
                "requests": count,
                "errors": errors,
                "input_tokens": inp,
                "output_tokens": outp,
                "cache_read_tokens": read,
                "cache_write_tokens": write,
                "reasoning_tokens": reasoning,
                "cost_micros": cost,
                "cost_usd": round(cost / 1_000_000, 6),
                # Requests whose cost is unknown (no price): the total leaves them out.
                "unpriced_requests": unpriced,
                "free_requests": free,
                # Requests whose answer reported no usage: their input tokens and cost in the
                # totals are the gateway's estimate (cost state ``estimated``).
                "estimated_requests": guessed,
            }
        )
    return out


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in ("routing", "translated"):
        if row.get(col):
            row[col] = json.loads(row[col])
    for col in ("stream", "local", "cancelled", "counted"):
        row[col] = bool(row[col])
    return row
