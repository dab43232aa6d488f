"""PostgreSQL's ``requests`` and ``bodies`` tables, partitioned by day (docs/deployment.md,
"PostgreSQL").

Both tables are partitioned by range on ``ts`` (unix seconds), one partition per UTC day named
``requests_YYYYMMDD`` / ``bodies_YYYYMMDD``, bounds ``[day start, next day start)``. A body's
``ts`` is its row's, so a request and its body always sit in the same day. The primary key is
``(id, ts)`` (a partitioned table's unique keys must hold the partition key); a row's ``ts`` is
when its request started and never changes, so an upsert on ``(id, ts)`` keeps a row written
twice one row, as ``id`` alone did.

Partitions are made by `ensure_days`, under an advisory lock so instances racing for one day
make it once: by the hourly maintenance for today and `DAYS_AHEAD` days ahead, and by the
writer for any day of a batch it has not seen made (a journal replayed after days away, a clock
set back): a row never lacks its partition, so there is no DEFAULT partition (a row caught
there would keep that day's partition from being made later).

Retention (`prune_days`) drops each partition whose whole day is older than the limit: no
rows are deleted one by one, no table is left to vacuum. The day the limit falls in is kept,
and its rows older than the limit are then deleted, so retention stays exact to the second.

`MIGRATION` converts the unpartitioned tables of schema version 3: it renames them (and their
indexes), creates the partitioned tables with every index the listing filters on, makes a
partition for each day the old rows cover, copies the rows over and drops the old tables, all
in the migration's one transaction.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

import psycopg

__all__ = ["DAYS_AHEAD", "DAY_SECS", "MIGRATION", "day_of", "ensure_days", "prune_days"]

DAY_SECS = 86_400
# Days after today whose partitions the hourly maintenance makes ahead.
DAYS_AHEAD = 2
TABLES = ("requests", "bodies")

# Any 64-bit number the making of partitions is serialised on across instances.
_PARTITION_LOCK = 0x7477_7365_7276_6532

_FUNCTION = f"""
CREATE OR REPLACE FUNCTION twserve_day_partition(parent TEXT, day BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $fn$
DECLARE
    part TEXT := parent || '_' || to_char(to_timestamp(day * {DAY_SECS}) AT TIME ZONE 'UTC',
                                          'YYYYMMDD');
BEGIN
    PERFORM pg_advisory_xact_lock({_PARTITION_LOCK});
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                   part, parent, day * {DAY_SECS}, (day + 1) * {DAY_SECS});
END
$fn$;
"""

MIGRATION = f"""
{_FUNCTION}
DO $mig$
DECLARE
    r RECORD;
BEGIN
    ALTER TABLE requests RENAME TO requests_v3;
    ALTER TABLE bodies RENAME TO bodies_v3;
    FOR r IN SELECT indexname FROM pg_indexes
             WHERE schemaname = current_schema() AND tablename IN ('requests_v3', 'bodies_v3')
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.indexname, r.indexname || '_v3');
    END LOOP;
END
$mig$;
CREATE TABLE requests (LIKE requests_v3 INCLUDING DEFAULTS, PRIMARY KEY (id, ts))
    PARTITION BY RANGE (ts);
CREATE TABLE bodies (LIKE bodies_v3 INCLUDING DEFAULTS, PRIMARY KEY (id, ts))
    PARTITION BY RANGE (ts);
CREATE INDEX requests_ts ON requests (ts);
CREATE INDEX requests_key_ts ON requests (key_name, ts);
CREATE INDEX requests_model_ts ON requests (model, ts);
CREATE INDEX requests_provider_ts ON requests (provider, ts);
CREATE INDEX requests_status_ts ON requests (status, ts);
CREATE INDEX requests_settled ON requests (counted, settled_ts);
CREATE INDEX requests_correlation ON requests (correlation_id);
CREATE INDEX bodies_ts ON bodies (ts);
SELECT twserve_day_partition(t.name, d.day)
FROM (SELECT floor(ts / {DAY_SECS})::BIGINT AS day FROM requests_v3
      UNION SELECT floor(ts / {DAY_SECS})::BIGINT FROM bodies_v3) AS d,
     (VALUES ('requests'), ('bodies')) AS t(name);
INSERT INTO requests SELECT * FROM requests_v3;
INSERT INTO bodies SELECT * FROM bodies_v3;
DROP TABLE requests_v3;
DROP TABLE bodies_v3;
"""


def day_of(ts: float) -> int | None:
    """The UTC day number (days since 1970-01-01) `ts` falls in; None for NaN or infinity (such
    a row finds no partition and is set aside as data PostgreSQL refuses)."""
    return math.floor(ts / DAY_SECS) if math.isfinite(ts) else None


def _day_name(day: int) -> str:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=day)).strftime("%Y%m%d")


async def ensure_days(conn: psycopg.AsyncConnection[Any], days: Iterable[int]) -> None:
    """Make both tables' partitions for `days` where missing (one statement, its own
    transaction on an autocommit connection, so the lock is held only while making them)."""
    wanted = sorted(set(days))
    if wanted:
        await conn.execute(
            "SELECT twserve_day_partition(t.name, d.day) FROM unnest(%s::BIGINT[]) AS d(day), "
            "(VALUES ('requests'), ('bodies')) AS t(name)",
            (wanted,),
        )


async def _partitions(conn: psycopg.AsyncConnection[Any], parent: str) -> list[tuple[str, int]]:
    """`parent`'s day partitions, ``(name, day)``, oldest first."""
    cur = await conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass",
        (parent,),
    )
    found = []
    for (name,) in await cur.fetchall():
        suffix = str(name).removeprefix(parent + "_")
        try:
            when = dt.datetime.strptime(suffix, "%Y%m%d").replace(tzinfo=dt.UTC)
        except ValueError:
            continue  # not one of ours
        found.append((str(name), int(when.timestamp()) // DAY_SECS))
    return sorted(found, key=lambda p: p[1])


async def prune_days(conn: psycopg.AsyncConnection[Any], parent: str, before: float) -> int:
    """Drop `parent`'s partitions whose whole day is before `before`, then delete the rows
    before it in the day it falls in; how many rows went. Run inside a transaction."""
    gone = 0
    for name, day in await _partitions(conn, parent):
        if (day + 1) * DAY_SECS > before:
            break
        cur = await conn.execute(f'SELECT COUNT(*) FROM "{name}"')
        found = await cur.fetchone()
        gone += int(found[0]) if found else 0
        await conn.execute(f'DROP TABLE "{name}"')
    cur = await conn.execute(
        f"DELETE FROM {parent} WHERE ts < %s",
        (before,),
    )
    return gone + max(cur.rowcount, 0)
