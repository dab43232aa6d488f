"""A page of request rows: the filters of ``GET /requests`` as one SQL query both backends run.

A listing is newest first and paged by *keyset*, not by offset: the next page starts below the
last row shown (``ts`` less than the cursor's, or equal to it and not among the ids the cursor
names), so page 100 costs what page 1 costs and a row arriving meanwhile does not shift the
pages. Every filter is an equality or range that an index of the store serves together with
``ts`` (``(key_name, ts)``, ``(model, ts)``, ``(provider, ts)``, ``(status, ts)``, ``(ts)``),
so the database walks the rows newest first and stops after a page; the free text ``q`` is
matched while walking (a rare word therefore reads more rows; docs/console.md has the figures).

The cursor is opaque to callers: base64url of ``[ts, [ids at that ts on the page]]``. The ids
are there because timestamps can repeat (two requests in the same microsecond).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_PAGE",
    "LISTING_INDEXES",
    "MAX_PAGE",
    "Cursor",
    "RequestFilter",
    "decode_cursor",
    "newest_rows",
    "next_cursor",
    "page_sql",
]

DEFAULT_PAGE = 50
MAX_PAGE = 1000

# The indexes the filters walk, as a schema migration both backends run (the same SQL).
LISTING_INDEXES = """
    CREATE INDEX IF NOT EXISTS requests_model_ts ON requests (model, ts);
    CREATE INDEX IF NOT EXISTS requests_provider_ts ON requests (provider, ts);
    CREATE INDEX IF NOT EXISTS requests_status_ts ON requests (status, ts);
"""


@dataclass(frozen=True, slots=True)
class Cursor:
    ts: float
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFilter:
    """What a listing keeps: each field None (or empty) keeps every row."""

    limit: int = DEFAULT_PAGE
    key: str | None = None
    model: str | None = None
    provider: str | None = None
    # An exact status, or a range [low, high] (``4xx``), or ``error`` (`errors`).
    status: tuple[int, int] | None = None
    errors: bool = False
    since: float | None = None
    until: float | None = None
    text: str | None = None
    # A request's id (the answer's x-request-id) or the correlation id its client sent.
    find: str | None = None
    before: Cursor | None = None


class _Pages(Protocol):
    async def page(self, f: RequestFilter) -> list[dict[str, Any]]: ...


async def newest_rows(
    store: _Pages, limit: int = 100, find: str | None = None
) -> list[dict[str, Any]]:
    """A store's `recent`: the newest `limit` rows, as the first page of no filter (with
    `find`: of the rows whose id or correlation id it is)."""
    return await store.page(RequestFilter(limit=limit, find=find))


def decode_cursor(text: str) -> Cursor:
    try:
        raw = json.loads(base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4)))
        ts, ids = raw
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise ValueError
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError
        return Cursor(float(ts), tuple(ids))
    except (ValueError, TypeError, UnicodeDecodeError):
        raise ValueError(f"before={text!r} is not a cursor this gateway wrote") from None


def next_cursor(rows: list[dict[str, Any]], limit: int) -> str | None:
    """The cursor of the page after `rows` (None when it was the last page)."""
    if len(rows) < limit or not rows:
        return None
    last = rows[-1]["ts"]
    ids = [r["id"] for r in rows if r["ts"] == last]
    data = json.dumps([last, ids], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def page_sql(f: RequestFilter, mark: str) -> tuple[str, list[Any]]:
    """The listing's ``SELECT`` and its parameters; `mark` is the backend's placeholder (``?``
    for SQLite, ``%s`` for psycopg)."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("key_name", f.key), ("model", f.model), ("provider", f.provider)):
        if value is not None:
            clauses.append(f"{column} = {mark}")
            params.append(value)
    if f.status is not None:
        low, high = f.status
        if low == high:
            clauses.append(f"status = {mark}")
            params.append(low)
        else:
            # A class (5xx) is matched while walking ts newest first: `+status` keeps the
            # planner off the (status, ts) index, which would have to sort the whole range.
            clauses.append(f"+status BETWEEN {mark} AND {mark}")
            params += [low, high]
    if f.errors:
        clauses.append("(status >= 400 OR cancelled = 1 OR error_code IS NOT NULL)")
    if f.since is not None:
        clauses.append(f"ts >= {mark}")
        params.append(f.since)
    if f.until is not None:
        clauses.append(f"ts < {mark}")
        params.append(f.until)
    if f.find is not None:
        clauses.append(f"(id = {mark} OR correlation_id = {mark})")
        params += [f.find, f.find]
    if f.text is not None:
        like = _like(f.text)
        searched = ("id", "model", "provider", "key_name", "error_code")
        clauses.append("(" + " OR ".join(f"{c} LIKE {mark} ESCAPE '\\'" for c in searched) + ")")
        params += [like] * len(searched)
    if f.before is not None:
        clause = f"ts < {mark}"
        params.append(f.before.ts)
        if f.before.ids:
            marks = ",".join(mark for _ in f.before.ids)
            clause = f"({clause} OR (ts = {mark} AND id NOT IN ({marks})))"
            params += [f.before.ts, *f.before.ids]
        clauses.append(clause)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    params.append(f.limit)
    return f"SELECT * FROM requests{where} ORDER BY ts DESC LIMIT {mark}", params
