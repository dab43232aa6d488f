"""Reading usage back: ``GET /usage`` on the control plane and ``twserve usage`` in a terminal.

Both group the stored rows (`twserve.store.sqlite.usage_totals`) by key, model, upstream or local
day over a time range, and add a total. `parse_since` reads the range's ends as people write them:
unix seconds, an ISO date or date-time (local time when it names no zone), or a span back from now
such as ``24h``, ``7d``, ``30m``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from twserve.store.sqlite import USAGE_GROUPS

__all__ = ["parse_since", "render_table", "totals"]

_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_SPAN_SECS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SUMMED = (
    "requests",
    "errors",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost_micros",
    "unpriced_requests",
    "free_requests",
    "estimated_requests",
)


def parse_since(text: str, now: float) -> float:
    """A time written as unix seconds, an ISO date/date-time, or a span back from `now`."""
    text = text.strip()
    m = _SPAN.fullmatch(text)
    if m is not None:
        return now - float(m.group(1)) * _SPAN_SECS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: write unix seconds, an ISO date such as 2026-12-01, "
            "or a span back from now such as 24h or 7d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time
    return moment.timestamp()


def check_group(by: str) -> str:
    if by not in USAGE_GROUPS:
        raise ValueError(f"by must be one of {', '.join(USAGE_GROUPS)}, not {by!r}")
    return by


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of every group."""
    out: dict[str, Any] = {name: sum(int(r.get(name) or 0) for r in rows) for name in _SUMMED}
    out["cost_usd"] = round(out["cost_micros"] / 1_000_000, 6)
    return out


def render_table(by: str, rows: Sequence[Mapping[str, Any]], *, title: str) -> Any:
    """A `rich` table of the rows and their total (imported here: only the CLI draws one)."""
    from rich.table import Table

    table = Table(title=title, show_footer=True)
    total = totals(rows)
    columns = (
        (by, by, "TOTAL"),
        ("requests", "requests", str(total["requests"])),
        ("errors", "errors", str(total["errors"])),
        ("input_tokens", "input", f"{total['input_tokens']:,}"),
        ("cache_read_tokens", "cache read", f"{total['cache_read_tokens']:,}"),
        ("cache_write_tokens", "cache write", f"{total['cache_write_tokens']:,}"),
        ("output_tokens", "output", f"{total['output_tokens']:,}"),
        ("cost_micros", "cost (USD)", f"{total['cost_micros'] / 1_000_000:,.4f}"),
        ("unpriced_requests", "unpriced", str(total["unpriced_requests"])),
        ("estimated_requests", "estimated", str(total["estimated_requests"])),
    )
    for key, header, footer in columns:
        table.add_column(header, footer=footer, justify="left" if key == by else "right")
    for r in rows:
        cells = []
        for key, _, _ in columns:
            value = r.get(key)
            if key == by:
                cells.append("—" if value is None else str(value))
            elif key == "cost_micros":
                cells.append(f"{int(value or 0) / 1_000_000:,.4f}")
            else:
                cells.append(f"{int(value or 0):,}")
        table.add_row(*cells)
    return table
