"""How fast the console's Traffic page gets its first page over a large store, as the page's own
fetch sees it, in Debian's chromium (docs/console.md, "What it costs").

    python -m benchmarks.e2e.console_traffic [--rows 100000] [--loads 15]

A gateway as the browser tests start it (a real config file, mock upstreams) over a SQLite
store of `--rows` synthetic rows; the page is signed in and Traffic loaded `--loads` times (a
fresh page load each). Reported: the median and slowest time of the ``GET /requests`` fetch
(the page's ``performance.now()`` around it, which is what it shows as "first page in … ms"),
and the same with a key filter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tests.twserve.console.test_ui_browser import _fill, config_text
from tests.twserve.support.browser import chromium, console_page
from tests.twserve.support.live import live_gateway
from twmock.script import MockSettings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--loads", type=int, default=15)
    args = ap.parse_args()
    upstreams = {"a": MockSettings(), "bad": MockSettings(), "slow": MockSettings()}
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "home").mkdir(mode=0o700)
        _fill(tmp / "home" / "requests.sqlite3", args.rows)
        with (
            live_gateway(tmp, upstreams, config_text) as live,
            chromium() as browser,
            console_page(browser, f"http://127.0.0.1:{live.control_port}") as c,
        ):
            c.sign_in()
            for label, filters in (("first page", {}), ("key filter", {"key": "key-3"})):
                times = []
                c.page.evaluate(
                    "f => sessionStorage.setItem('twserve.traffic-filters', JSON.stringify(f))",
                    filters,
                )
                for _ in range(args.loads):
                    c.page.reload()
                    c.page.wait_for_selector("#traffic-state[data-ms]")
                    times.append(float(c.page.get_attribute("#traffic-state", "data-ms") or 0))
                figures[label] = {
                    "median_ms": statistics.median(times),
                    "slowest_ms": max(times),
                }
    print(json.dumps({"rows": args.rows, "loads": args.loads, **figures}, indent=2))


if __name__ == "__main__":
    main()
