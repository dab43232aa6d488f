"""PostgreSQL's usage totals (``GET /usage``, ``twserve usage``) as SQL: the same groups and
figures as the SQLite store's, with days summed from quarter-hour totals on this process's
local calendar (the database's time zone is not the operator's)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from twserve.store.sqlite import USAGE_GROUPS, usage_rows

__all__ = ("usage_query", "usage_result")

_QUARTER = 900
_PG_GROUPS = {
    **USAGE_GROUPS,
    "day": f"floor(ts / {_QUARTER})::bigint",
    "hour": f"floor(ts / {_QUARTER})::bigint",
}
# How a quarter hour's start is named on this process's local calendar, per grouping.
_LOCAL_NAMES = {"day": "%Y-%m-%d", "hour": "%Y-%m-%dT%H:00"}


def usage_query(by: str, since: float | None, until: float | None) -> tuple[str, list[Any]]:
    column = _PG_GROUPS[by]
    where = ["TRUE"]
    params: list[Any] = []
    if since is not None:
        where.append("ts >= %s")
        params.append(since)
    if until is not None:
        where.append("ts < %s")
        params.append(until)
    sums = ", ".join(
        f"COALESCE(SUM({c}), 0)::bigint"
        for c in (
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "reasoning_tokens",
            "cost_micros",
        )
    )
    sql = (
        f"SELECT {column} AS grp, COUNT(*), "
        "SUM(CASE WHEN status >= 400 OR status IS NULL OR cancelled = 1 THEN 1 ELSE 0 END), "
        f"{sums}, "
        "SUM(CASE WHEN cost_state = 'unknown' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN cost_state = 'free' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN cost_state = 'estimated' THEN 1 ELSE 0 END) "
        f"FROM requests WHERE {' AND '.join(where)} GROUP BY grp ORDER BY grp"
    )
    return sql, params


def usage_result(by: str, found: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    rows = [tuple(int(v) if i else v for i, v in enumerate(r)) for r in found]
    if by in _LOCAL_NAMES:
        rows = _by_local_time(rows, _LOCAL_NAMES[by])
    return usage_rows(by, rows)


def _by_local_time(rows: list[tuple[Any, ...]], name: str) -> list[tuple[Any, ...]]:
    """Quarter-hour totals summed per day or hour (`name`, a strftime format) on this
    process's local calendar."""
    days: dict[str, list[int]] = {}
    for quarter, *figures in rows:
        day = dt.datetime.fromtimestamp(quarter * _QUARTER).strftime(name)
        sums = days.setdefault(day, [0] * len(figures))
        for i, v in enumerate(figures):
            sums[i] += v
    return [(day, *sums) for day, sums in sorted(days.items())]
