"""How fast ``GET /requests`` answers over a large store: the first page and a deep page, with
each filter, over a SQLite store of N rows (default 100 000) written as the gateway writes them.

    python -m benchmarks.e2e.requests_listing [--rows 100000] [--repeat 20]

Each query runs `--repeat` times through the store's own `page` (a fresh connection each time,
as the control plane reads); the median and the slowest are printed in milliseconds, with the
rows read and the query plan SQLite chose. Rows: 8 keys, 12 models, 4 upstreams, one in 20 an
error, spread over 30 days, with a routing record like a real one.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import anyio

from twserve.store.listing import RequestFilter, decode_cursor, next_cursor, page_sql
from twserve.store.sqlite import RequestRow, RequestStore

__all__ = ["fill", "main", "synthetic_rows"]

KEYS = [f"key-{i}" for i in range(8)]
MODELS = [f"model-{i}" for i in range(12)]
UPSTREAMS = ["alpha", "beta", "gamma", "delta"]
START = 1_790_000_000.0


def synthetic_rows(
    count: int, *, start: float = START, span: float = 30 * 86400
) -> Iterator[RequestRow]:
    """`count` rows, oldest first, evenly over `span` seconds from `start`."""
    step = span / max(count, 1)
    for i in range(count):
        failed = i % 20 == 7
        upstream = UPSTREAMS[i % len(UPSTREAMS)]
        yield RequestRow(
            id=f"req-{i:08d}",
            ts=start + i * step,
            path="/v1/chat/completions",
            key_name=KEYS[i % len(KEYS)],
            format="openai-chat",
            model=MODELS[(i // 3) % len(MODELS)],
            provider=upstream,
            status=502 if failed else 200,
            ttfb_ms=120 + i % 300,
            duration_ms=900 + i % 2000,
            input_tokens=100 + i % 50,
            output_tokens=200 + i % 70,
            cost_state="known",
            cost_micros=1500,
            error_code="gw.upstream.status" if failed else None,
            routing={"attempts": [{"provider": upstream, "outcome": "failed" if failed else "ok"}]},
        )


def fill(path: Path, count: int) -> None:
    """A store at `path` with `count` synthetic rows, written by the store's own writer."""
    store = RequestStore(path)

    async def write() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            for n, row in enumerate(synthetic_rows(count)):
                store.record(row)
                if n % 1000 == 999:
                    await anyio.sleep(0)  # let the writer keep up: the queue stays short
            store.close()

    anyio.run(write)
    assert store.written == count, (store.written, count)
    store.close_db()


QUERIES: dict[str, RequestFilter] = {
    "first page": RequestFilter(),
    "key": RequestFilter(key="key-3"),
    "model": RequestFilter(model="model-5"),
    "upstream": RequestFilter(provider="gamma"),
    "status 5xx": RequestFilter(status=(500, 599)),
    "errors": RequestFilter(errors=True),
    "last day": RequestFilter(since=START + 29 * 86400),
    "text (common)": RequestFilter(text="model-1"),
    "text (one row)": RequestFilter(text="req-00000042"),
    "key+model+5xx": RequestFilter(key="key-7", model="model-2", status=(500, 599)),
}


async def _measure(store: RequestStore, f: RequestFilter, repeat: int) -> tuple[list[float], int]:
    times = []
    rows = 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = len(await store.page(f))
        times.append((time.perf_counter() - started) * 1000)
    return times, rows


def _plan(path: Path, f: RequestFilter) -> str:
    sql, params = page_sql(f, "?")
    with closing(sqlite3.connect(path)) as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    return "; ".join(str(step[-1]) for step in plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.sqlite3"
        started = time.perf_counter()
        fill(path, args.rows)
        print(f"{args.rows} rows written in {time.perf_counter() - started:.1f} s")
        store = RequestStore(path)

        async def run() -> None:
            print(f"{'query':<16} {'median ms':>10} {'max ms':>8} {'rows':>5}  plan")
            for name, f in QUERIES.items():
                times, rows = await _measure(store, f, args.repeat)
                print(
                    f"{name:<16} {statistics.median(times):>10.2f} {max(times):>8.2f} "
                    f"{rows:>5}  {_plan(path, f)}"
                )
            # A deep page: the 200th page of 50, reached by its cursor.
            first = await store.page(RequestFilter())
            cursor = next_cursor(first, 50)
            for _ in range(199):
                assert cursor is not None
                page = await store.page(RequestFilter(before=decode_cursor(cursor)))
                cursor = next_cursor(page, 50)
            assert cursor is not None
            deep = RequestFilter(before=decode_cursor(cursor))
            times, rows = await _measure(store, deep, args.repeat)
            print(
                f"{'page 201':<16} {statistics.median(times):>10.2f} {max(times):>8.2f} {rows:>5}"
            )

        anyio.run(run)
        store.close_db()


if __name__ == "__main__":
    main()
