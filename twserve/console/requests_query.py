"""The parameters of ``GET /requests`` read into a `RequestFilter` (docs/console.md, "Traffic").

The SQL the filter becomes is the store's (`twserve.store.listing`); this is the control
plane's side: which parameters there are, how each is written, and the bounds on them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from twserve.store.listing import DEFAULT_PAGE, MAX_PAGE, RequestFilter, decode_cursor
from twserve.usage.view import parse_since

__all__ = ["MAX_TEXT_CHARS", "parse_filter"]

# A filter value longer than any key name, model name or id is refused, not searched for.
MAX_TEXT_CHARS = 200
_STATUS_CLASS = re.compile(r"([1-5])xx")


def _text(name: str, value: str) -> str | None:
    if not value:
        return None
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{name} is over {MAX_TEXT_CHARS} characters")
    return value


def parse_filter(query: Mapping[str, str], now: float) -> RequestFilter:
    """The filter of ``GET /requests``'s parameters (ValueError with the reason when one is
    wrong): ``limit``, ``key``, ``model``, ``provider``, ``status`` (``200``, ``4xx``,
    ``error``), ``since``, ``until`` (as `twserve usage` reads them), ``q``, ``id`` (a request
    id or a client's correlation id), ``before``."""
    limit = DEFAULT_PAGE
    if query.get("limit"):
        try:
            limit = int(query["limit"])
        except ValueError:
            raise ValueError(f"limit must be a whole number, not {query['limit']!r}") from None
        limit = min(max(limit, 1), MAX_PAGE)
    status: tuple[int, int] | None = None
    errors = False
    raw = query.get("status", "").strip().lower()
    if raw == "error":
        errors = True
    elif raw:
        match = _STATUS_CLASS.fullmatch(raw)
        if match is not None:
            low = int(match.group(1)) * 100
            status = (low, low + 99)
        elif raw.isdigit() and 100 <= int(raw) <= 599:
            status = (int(raw), int(raw))
        else:
            raise ValueError(f"status must be a status (200), a class (4xx) or error, not {raw!r}")
    since = parse_since(query["since"], now) if query.get("since") else None
    until = parse_since(query["until"], now) if query.get("until") else None
    before = decode_cursor(query["before"]) if query.get("before") else None
    return RequestFilter(
        limit=limit,
        key=_text("key", query.get("key", "")),
        find=_text("id", query.get("id", "")),
        model=_text("model", query.get("model", "")),
        provider=_text("provider", query.get("provider", "")),
        status=status,
        errors=errors,
        since=since,
        until=until,
        text=_text("q", query.get("q", "").strip()),
        before=before,
    )
