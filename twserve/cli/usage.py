"""``twserve usage`` and ``twserve prices``: spend in a terminal, and refreshing the prices.

* ``twserve usage [--by key|model|provider|day|hour] [--since 7d] [--until …] [--json]`` reads the
  request store — PostgreSQL when the config (``--config``, else the data directory's) sets
  ``store.postgres_dsn``, else the SQLite file in the data directory — and prints a table
  (`rich`) with a total row.
* ``twserve prices update --from FILE_OR_URL`` converts a LiteLLM model price list (the same
  conversion that built the shipped table) and saves it as the data directory's ``prices.json``,
  which a gateway started afterwards prices with. ``twserve prices show`` says which table is in
  use and can look a model up.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from twserve.config.files import data_dir

__all__ = ["add_commands", "cmd_prices_show", "cmd_prices_update", "cmd_usage"]


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir).expanduser() if args.data_dir else data_dir()


def _postgres_dsn(args: argparse.Namespace) -> str | None:
    """``store.postgres_dsn`` of the config (``--config``, else the data directory's), with its
    ``${VAR}`` read from the environment; None when the store is the SQLite file. A config
    that does not load leaves the SQLite file (the gateway would not start on it either),
    unless its problem is the DSN itself: that raises `TemplateError`."""
    from twengine.config import ConfigError, TemplateError, resolve_template
    from twserve.config.files import load_config

    path = Path(args.config).expanduser() if args.config else _data_dir(args) / "config.yaml"
    try:
        config = load_config(path)
    except OSError:
        return None
    except ConfigError as err:
        store = [p for p in err.problems if p.path.startswith("store")]
        if store:
            raise TemplateError(store[0].code, store[0].message) from None
        return None
    dsn = config.store.postgres_dsn if config.store is not None else None
    return resolve_template(dsn, os.environ) if dsn else None


def cmd_usage(args: argparse.Namespace) -> int:
    from rich.console import Console

    from twengine.config import TemplateError
    from twserve.store.sqlite import usage_totals
    from twserve.usage.view import check_group, parse_since, render_table, totals

    now = time.time()
    try:
        by = check_group(args.by)
        since = parse_since(args.since, now)
        until = parse_since(args.until, now) if args.until else None
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        dsn = _postgres_dsn(args)
    except TemplateError as exc:
        print(f"store.postgres_dsn: {exc.message}", file=sys.stderr)
        return 1
    if dsn is not None:
        from twserve.store.postgres import usage_totals_pg

        try:
            rows = usage_totals_pg(dsn, by=by, since=since, until=until)
        except Exception as exc:  # psycopg's errors, without importing it up front
            print(f"cannot read the PostgreSQL request store: {exc}", file=sys.stderr)
            return 1
    else:
        path = _data_dir(args) / "requests.sqlite3"
        if not path.exists():
            print(f"no request store at {path}", file=sys.stderr)
            return 1
        try:
            rows = usage_totals(path, by=by, since=since, until=until)
        except sqlite3.Error as exc:
            print(f"cannot read {path}: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({"by": by, "since": since, "rows": rows, "total": totals(rows)}, indent=2))
        return 0
    start = dt.datetime.fromtimestamp(since).astimezone().isoformat(timespec="minutes")
    title = f"usage by {by} since {start}"
    Console(width=args.width).print(render_table(by, rows, title=title))
    return 0


def cmd_prices_update(args: argparse.Namespace) -> int:
    from twengine.pricing import PriceTable
    from twserve.usage.prices import convert_litellm, fetch_source, save_user_prices

    try:
        raw = fetch_source(args.source)
        source = json.loads(raw)
    except (OSError, ValueError) as exc:
        print(f"cannot read a price list from {args.source}: {exc}", file=sys.stderr)
        return 1
    if not isinstance(source, dict):
        print(f"{args.source} is not a LiteLLM model price list (a JSON object)", file=sys.stderr)
        return 1
    refused: list[str] = []
    data = convert_litellm(
        source,
        package="litellm",
        version=args.version or f"from {args.source}",
        retrieved=dt.date.today().isoformat(),
        refused=refused,
    )
    if refused:
        shown = ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if refused[10:] else "")
        print(
            f"left out {len(refused)} model(s) with a price that is not a finite number of "
            f"zero or more (NaN, Infinity, negative): {shown}",
            file=sys.stderr,
        )
    count = len(PriceTable.from_data(data).models)
    if count == 0:
        print(
            f"{args.source} lists no chat model of a known provider; nothing saved", file=sys.stderr
        )
        return 1
    path = save_user_prices(_data_dir(args), data)
    print(f"saved {count} model prices to {path}; a gateway started from now on uses them")
    return 0


def cmd_prices_show(args: argparse.Namespace) -> int:
    from twserve.usage.prices import USER_FILE, load_price_table

    directory = _data_dir(args)
    table = load_price_table(directory)
    where = directory / USER_FILE
    origin = str(where) if where.exists() else "the table shipped with twserve"
    print(f"prices: {origin} (litellm {table.version}, retrieved {table.retrieved})")
    print(f"{len(table.models)} models")
    for model in args.models:
        found = table.lookup(model)
        if found is None:
            print(f"{model}: no price")
            continue
        r = found.rates
        info: dict[str, Any] = {
            "input": r.input,
            "output": r.output,
            "cache_read": r.cache_read,
            "cache_write": r.cache_write,
            "cache_write_1h": r.cache_write_1h,
            "context_window": found.context_window,
            "max_output_tokens": found.max_output_tokens,
        }
        if found.tiers:
            info["tiers"] = [{"above": t.above, "input": t.rates.input} for t in found.tiers]
        print(f"{model} ({found.name}): {json.dumps(info)}")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``usage`` and ``prices`` to the CLI's subcommands."""
    p = sub.add_parser("usage", help="requests, tokens and cost from the request store")
    p.add_argument("--by", default="key", help="key, model, provider, day or hour (default: key)")
    p.add_argument("--since", default="7d", help="unix seconds, ISO date, or span (default 7d)")
    p.add_argument("--until", help="end of the range (same forms; default: now)")
    p.add_argument("--data-dir", help="data directory (default: $TWSERVE_HOME or ~/.twserve)")
    p.add_argument(
        "--config", help="config file naming store.postgres_dsn (default: the data directory's)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_usage)

    prices = sub.add_parser("prices", help="the model price table")
    psub = prices.add_subparsers(dest="prices_command", required=True)
    p = psub.add_parser("update", help="refresh prices from a LiteLLM model price list")
    p.add_argument("--from", dest="source", required=True, metavar="FILE_OR_URL")
    p.add_argument("--version", help="the source's version, recorded in the saved table")
    p.add_argument("--data-dir", help="data directory (default: $TWSERVE_HOME or ~/.twserve)")
    p.set_defaults(func=cmd_prices_update)
    p = psub.add_parser("show", help="which price table is used; look models up")
    p.add_argument("models", nargs="*")
    p.add_argument("--data-dir", help="data directory (default: $TWSERVE_HOME or ~/.twserve)")
    p.set_defaults(func=cmd_prices_show)
