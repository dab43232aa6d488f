"""Responses conversation state in the request store: each stored response's items (its input,
expanded, then its output; twproto.formats.openai_responses.state), by gateway key and id.

`SqliteResponses` keeps them in the SQLite store's file (``responses`` table, migration 5);
`PostgresResponses` in the PostgreSQL store's database (migration 4) when ``store.postgres_dsn``
is set, so every instance finds every other's responses. A record is found only under the key
that made it and until it expires (``retention.responses_secs``); saving one drops the key's
oldest records beyond ``retention.responses_per_key`` records or
``retention.responses_key_bytes`` bytes, and `prune` (the hourly clean-up) drops expired ones.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

import anyio

from twserve.store.sqlite import _connect, _migrate

__all__ = ["PostgresResponses", "ResponseRecords", "SqliteResponses"]

# The key's records beyond its count or bytes cap, newest first (both SQLite and PostgreSQL).
_OVER_CAPS = (
    "DELETE FROM responses WHERE key_name = {p} AND id IN (SELECT id FROM ("
    "SELECT id, SUM(size) OVER (ORDER BY ts DESC, id) AS run,"
    " ROW_NUMBER() OVER (ORDER BY ts DESC, id) AS n"
    " FROM responses WHERE key_name = {p}) AS ranked WHERE run > {p} OR n > {p})"
)
_INSERT = (
    "INSERT INTO responses (id, key_name, ts, expires, size, items)"
    " VALUES ({p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (key_name, id) DO UPDATE SET"
    " ts = excluded.ts, expires = excluded.expires, size = excluded.size,"
    " items = excluded.items"
)
_LOAD = "SELECT items FROM responses WHERE key_name = {p} AND id = {p} AND expires > {p}"
_PRUNE = "DELETE FROM responses WHERE expires <= {p}"

# Statements run in one transaction, each with its parameters.
_Statements = list[tuple[str, tuple[Any, ...]]]


class ResponseRecords(Protocol):
    """Where stored responses' items are kept."""

    async def save(
        self,
        key: str,
        response_id: str,
        items: bytes,
        *,
        now: float,
        expires: float,
        max_count: int,
        max_bytes: int,
    ) -> None: ...

    async def load(self, key: str, response_id: str, *, now: float) -> bytes | None: ...

    async def prune(self, now: float) -> int: ...

    async def close(self) -> None: ...


class _Records(ABC):
    """The records' statements, the same SQL on both databases but for the placeholder; each
    database's `_run` carries them out in one transaction."""

    placeholder = "?"

    @abstractmethod
    async def _run(self, statements: _Statements) -> tuple[list[Any], int]:
        """The rows of the first statement that returns rows, and the last one's row count."""

    def _sql(self, template: str) -> str:
        return template.format(p=self.placeholder)

    async def save(
        self,
        key: str,
        response_id: str,
        items: bytes,
        *,
        now: float,
        expires: float,
        max_count: int,
        max_bytes: int,
    ) -> None:
        await self._run(
            [
                (self._sql(_INSERT), (response_id, key, now, expires, len(items), items)),
                (self._sql(_OVER_CAPS), (key, key, max_bytes, max_count)),
            ]
        )

    async def load(self, key: str, response_id: str, *, now: float) -> bytes | None:
        rows, _ = await self._run([(self._sql(_LOAD), (key, response_id, now))])
        return bytes(rows[0][0]) if rows else None

    async def prune(self, now: float) -> int:
        _, dropped = await self._run([(self._sql(_PRUNE), (now,))])
        return dropped


class SqliteResponses(_Records):
    """Records in the SQLite store's file, on a connection of their own (WAL: no writer
    waits), used from a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = anyio.Lock()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = _connect(self.path)
            _migrate(self._conn)
        return self._conn

    async def _run(self, statements: _Statements) -> tuple[list[Any], int]:
        def work() -> tuple[list[Any], int]:
            db = self._db()
            db.execute("BEGIN")
            rows: list[Any] = []
            count = 0
            try:
                for sql, params in statements:
                    cursor = db.execute(sql, params)
                    if cursor.description is not None and not rows:
                        rows = cursor.fetchall()
                    count = cursor.rowcount
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return rows, count

        async with self._lock:
            return await anyio.to_thread.run_sync(work)

    async def close(self) -> None:
        # Under the lock: a worker thread still using the connection (a request cancelled at
        # stop waits for its thread) finishes first; closing it under that thread crashes.
        async with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PostgresResponses(_Records):
    """Records in the PostgreSQL store's database, on a connection of their own (opened at first
    use, the schema migrated then; opened again after the server dropped it)."""

    placeholder = "%s"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: Any = None
        self._lock = anyio.Lock()

    async def _run(self, statements: _Statements) -> tuple[list[Any], int]:
        import psycopg

        from twserve.store.postgres import CONNECT_TIMEOUT_SECS, migrate

        async with self._lock:
            for fresh in (self._conn is None, True):
                try:
                    if self._conn is None:
                        conn = await psycopg.AsyncConnection.connect(
                            self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECS
                        )
                        await migrate(conn)
                        self._conn = conn
                    rows: list[Any] = []
                    count = 0
                    async with self._conn.transaction(), self._conn.cursor() as cur:
                        for sql, params in statements:
                            await cur.execute(sql, params)
                            if cur.description is not None and not rows:
                                rows = await cur.fetchall()
                            count = cur.rowcount
                    return rows, count
                except psycopg.OperationalError:
                    await self.close()
                    if fresh:
                        raise
            raise AssertionError("unreachable")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # a connection already gone
                pass
