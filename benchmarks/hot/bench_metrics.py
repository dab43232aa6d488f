"""Hot-path benchmark of the Prometheus metrics (docs/observability.md, "Metrics"): µs of CPU
per request for `Metrics.observe_row`, the only per-request work of the metrics, on a routed
request's row that failed over once (two attempts, usage, cost) and on a refused one.

    pytest benchmarks/hot/bench_metrics.py --benchmark-enable -p no:cacheprovider
"""

from __future__ import annotations

from typing import Any

import pytest

from twengine.config import build_config
from twengine.router import Router
from twserve.control.metrics import Metrics
from twserve.store.sqlite import RequestRow

ROWS = 2000
CONFIG = {
    "version": 1,
    "clients": [{"name": "me", "key": "k", "limits": [{"per": "day", "requests": 10**6}]}],
    "providers": [
        {"name": "a", "protocol": "openai-chat", "base_url": "http://127.0.0.1:1/v1", "key": "x"},
        {"name": "b", "protocol": "anthropic", "base_url": "http://127.0.0.1:2", "key": "y"},
    ],
}


def _attempt(provider: str, outcome: str, error: str | None, status: int) -> dict[str, Any]:
    return {
        "provider": provider,
        "model": "claude-sonnet-4-5",
        "outcome": outcome,
        "status": status,
        "error": error,
        "ms": 40,
        "queued_ms": 0,
        "skipped": None,
        "retry": 0,
        "backoff_ms": None,
        "resend": None,
        "effort": None,
        "resumed_from": None,
    }


def routed_row(n: int) -> RequestRow:
    return RequestRow(
        id=f"{n:024x}",
        ts=1_796_205_600.0 + n,
        path="/v1/chat/completions",
        key_name="me",
        format="openai-chat",
        model="claude-sonnet-4-5",
        provider="b",
        status=200,
        stream=True,
        ttfb_ms=180,
        duration_ms=950,
        input_tokens=1200,
        output_tokens=300,
        cache_read_tokens=0,
        cache_write_tokens=0,
        cost_micros=8100,
        cost_state="known",
        routing={
            "attempts": [
                _attempt("a", "failed", "overloaded", 503),
                _attempt("b", "ok", None, 200),
            ]
        },
    )


def refused_row(n: int) -> RequestRow:
    return RequestRow(
        id=f"{n:024x}",
        ts=1_796_205_600.0 + n,
        path="/v1/chat/completions",
        key_name="me",
        format="openai-chat",
        model="m",
        status=400,
        duration_ms=0,
        error_code="gw.request.invalid",
    )


def _run(metrics: Metrics, rows: list[RequestRow]) -> int:
    for row in rows:
        metrics.observe_row(row)
    return len(rows)


@pytest.mark.parametrize("kind", ["routed", "refused"])
def test_observe_row(benchmark: Any, kind: str) -> None:
    router = Router(build_config(CONFIG))
    metrics = Metrics(lambda: router)
    make = routed_row if kind == "routed" else refused_row
    rows = [make(n) for n in range(ROWS)]
    assert benchmark(_run, metrics, rows) == ROWS
    assert metrics.totals["requests"] >= ROWS
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_request"] = stats.stats.mean / ROWS * 1e6
