"""Prometheus metrics, served by the control plane at ``GET /metrics``.

Counters are counted from each request's stored row (`Metrics.observe_row` is a gateway row
listener), so the metrics and the request store never disagree about what happened: the
status, the upstream that answered, every attempt with its outcome and retry round, and the
time to first content. Gauges of live state — in flight and paused per upstream — are read
from the router when Prometheus scrapes (`_LiveState`), so they cannot drift from what they
show.
The number of requests in flight is kept from the events (`Metrics.on_event`), by request id.

Every app instance has its own `CollectorRegistry`: nothing touches prometheus-client's global
default registry, so several gateways can run in one process (the tests do). The series counted
per row are `twserve.control.series`'s lock-free counters and histograms (a row costs about 5 µs
of CPU, docs/benchmarks.md); the live state is `twserve.control.gauges`', read at scrape time.

Every label value comes from a bounded set, since each series is kept for good: formats,
statuses, outcomes, and the names of keys and upstreams the config writes. The ``model`` label
(the model a client asked for) is a model name the config writes or the price table lists, and
``other`` for anything else a client sends (`_ModelLabels`).

Fallbacks and retries, per request, from its attempts in order (skipped candidates left out):
an attempt that goes to another upstream within the same retry round is a *fallback*; an
attempt in a retry round above 0 is a *retry*, labelled with the upstream it went to.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from twengine.codes import CODES
from twengine.config import Config
from twengine.model_listing import configured_models
from twengine.pricing import PriceTable
from twengine.router import Router
from twproto.failures import FailureKind
from twserve.control.gauges import KeyLimitUsage, LiveState, StoreState
from twserve.control.series import LoopCounter, LoopHistogram
from twserve.events import Event, RequestFailed, RequestFinished, RequestStarted
from twserve.observe.logs import outcome
from twserve.store.sqlite import RequestRow

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds; first bytes range from tens of milliseconds (cached, small) to a minute (slow
# reasoning models before their first token).
TTFB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Seconds; a whole request runs from a cached token count (milliseconds) to a long reasoning
# answer streamed for minutes.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Seconds; one batch of request rows written by the store's writer.
STORE_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The attempt failure reasons a label may carry: the failure kinds, and the ``gw.`` codes of
# an end without a failure (a stream broken after content, a slow start); anything else is
# ``other``.
_REASONS = frozenset(k.value for k in FailureKind) | frozenset(
    c for c in CODES if c.startswith("gw.")
)


class _ModelLabels:
    """The ``model`` label's value for a model name: the name when the config (as it is now)
    writes it or `table` lists it, else ``other``; ``none`` for no name."""

    __slots__ = ("_config", "_names", "_table")

    def __init__(self, table: Callable[[], PriceTable | None]) -> None:
        self._table = table
        self._config: Config | None = None
        self._names: frozenset[str] = frozenset()

    def __call__(self, config: Config, model: str | None) -> str:
        if model is None:
            return "none"
        if config is not self._config:  # a reload: the names it writes
            self._config, self._names = config, configured_models(config)
        if model in self._names:
            return model
        table = self._table()
        return model if table is not None and model in table.models else "other"


class Metrics:
    """One gateway's metrics (see the module docstring). `table` is the price table whose
    model names, with the config's, may label series; `set_aside` counts the request rows the
    store could not write."""

    def __init__(
        self,
        router: Callable[[], Router],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        table: Callable[[], PriceTable | None] = lambda: None,
        set_aside: Callable[[], int] = lambda: 0,
        queued: Callable[[], int] = lambda: 0,
        keys: Callable[[], list[str]] = lambda: [],
        key_view: Callable[[str], list[Any]] = lambda key: [],
    ) -> None:
        self._router = router
        self._wall = wall
        self._model_label = _ModelLabels(table)
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = LoopCounter(
            "gateway_requests",
            "Requests by client format, final status and the upstream that answered",
            ["format", "status", "provider"],
            registry=reg,
        )
        self.attempts = LoopCounter(
            "gateway_provider_attempts",
            "Attempts by upstream and outcome (ok, failed, skipped, cancelled, ...)",
            ["provider", "outcome"],
            registry=reg,
        )
        self.fallbacks = LoopCounter(
            "gateway_provider_fallback",
            "Attempts that moved to another upstream within a retry round",
            registry=reg,
        )
        self.retries = LoopCounter(
            "gateway_provider_retry",
            "Attempts in a retry round above 0, by the upstream retried",
            ["provider"],
            registry=reg,
        )
        self.ttfb = LoopHistogram(
            "gateway_ttfb_seconds",
            "From sending to the answering upstream to its first content (unstreamed: answer)",
            ["provider"],
            buckets=TTFB_BUCKETS,
            registry=reg,
        )
        # Spend (docs/limits-and-costs.md): tokens by kind and known cost, per key, upstream and
        # model asked.
        self.tokens = LoopCounter(
            "gateway_tokens",
            "Tokens the upstreams reported, by key, upstream, model asked (other: a name the "
            "config and price table do not know) and kind "
            "(input = uncached input, cache_read, cache_write, output)",
            ["key", "provider", "model", "kind"],
            registry=reg,
        )
        self.cost = LoopCounter(
            "gateway_cost_usd",
            "Known cost in USD by key, upstream and model asked (free and unpriced add 0)",
            ["key", "provider", "model"],
            registry=reg,
        )
        self.unpriced = LoopCounter(
            "gateway_unpriced_requests",
            "Requests whose cost is unknown (the model has no price), by upstream and model",
            ["provider", "model"],
            registry=reg,
        )
        self.estimated = LoopCounter(
            "gateway_estimated_cost_usd",
            "Estimated cost in USD of requests whose answer reported no usage (cancelled or "
            "cut off before it), as the key limits counted it, by key, upstream and model asked",
            ["key", "provider", "model"],
            registry=reg,
        )
        self._open: set[str] = set()
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests started and not yet ended", registry=reg
        )
        self.in_flight.set_function(lambda: float(len(self._open)))
        # By client format, the upstream that answered and how the request ended
        # (ok, local, refused, error, cancelled: docs/observability.md).
        self.duration = LoopHistogram(
            "gateway_request_duration_seconds",
            "Whole requests as the gateway saw them, by client format, upstream and outcome",
            ["format", "upstream", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.first_content = LoopHistogram(
            "gateway_time_to_first_content_seconds",
            "From sending to the answering upstream to its first content, by client format, "
            "upstream and outcome",
            ["format", "upstream", "outcome"],
            buckets=TTFB_BUCKETS,
            registry=reg,
        )
        self.key_requests = LoopCounter(
            "gateway_key_requests",
            "Requests by gateway key and outcome",
            ["key", "outcome"],
            registry=reg,
        )
        self.refusals = LoopCounter(
            "gateway_refusals",
            "Requests answered with an error code, by gateway key and code (docs/codes.md; "
            "other: a code the list does not hold)",
            ["key", "code"],
            registry=reg,
        )
        self.attempt_failures = LoopCounter(
            "gateway_upstream_attempt_failures",
            "Attempts that failed or were cut short, by upstream and reason (a failure kind or "
            "a gw. code)",
            ["upstream", "reason"],
            registry=reg,
        )
        self.failovers = LoopCounter(
            "gateway_upstream_failovers",
            "Moves to another upstream within a retry round, by the upstream left and why",
            ["upstream", "reason"],
            registry=reg,
        )
        self.store_write = LoopHistogram(
            "gateway_store_write_seconds",
            "Time the request store took to write one batch of rows",
            buckets=STORE_WRITE_BUCKETS,
            registry=reg,
        )
        self.store_rows = LoopCounter(
            "gateway_store_rows_written", "Request rows the store wrote", registry=reg
        )
        reg.register(LiveState(router, clock))
        reg.register(StoreState(set_aside, queued))
        reg.register(KeyLimitUsage(keys, key_view))
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        # process_start_time_seconds, … read from /proc at scrape time (Linux).
        ProcessCollector(registry=reg)
        self.totals = {"requests": 0, "ok": 0, "failed": 0, "cancelled": 0}
        self._requests, self._attempts = self.requests.labels, self.attempts.labels
        self._retries, self._ttfb = self.retries.labels, self.ttfb.labels
        self._tokens, self._cost = self.tokens.labels, self.cost.labels
        self._unpriced, self._estimated = self.unpriced.labels, self.estimated.labels
        self._duration, self._first = self.duration.labels, self.first_content.labels
        self._key_requests, self._refusals = self.key_requests.labels, self.refusals.labels
        self._failed, self._failovers = self.attempt_failures.labels, self.failovers.labels

    @property
    def open_requests(self) -> int:
        return len(self._open)

    def on_event(self, event: Event) -> None:
        """An `EventBus` listener: keeps the set of requests in flight."""
        if isinstance(event, RequestStarted):
            self._open.add(event.id)
        elif isinstance(event, RequestFinished | RequestFailed):
            self._open.discard(event.id)

    def observe_batch(self, rows: int, secs: float) -> None:
        """A store batch listener: one batch of `rows` written in `secs`."""
        self.store_write.observe(secs)
        self.store_rows.inc(rows)

    def observe_row(self, row: RequestRow) -> None:
        """A gateway row listener: count one ended request."""
        provider = row.provider or "none"
        status = "none" if row.status is None else str(row.status)
        fmt, ended, key = row.format or "unknown", outcome(row), row.key_name or "none"
        self._requests(fmt, status, provider).inc()
        self._key_requests(key, ended).inc()
        # A request refused before the relay has no duration in its row: it ends now.
        secs = row.duration_ms / 1000 if row.duration_ms is not None else self._wall() - row.ts
        self._duration(fmt, provider, ended).observe(max(0.0, secs))
        if row.error_code is not None:
            code = row.error_code if row.error_code in CODES else "other"
            self._refusals(key, code).inc()
        self.totals["requests"] += 1
        if row.cancelled:
            self.totals["cancelled"] += 1
        elif row.status is not None and row.status < 400:
            self.totals["ok"] += 1
        else:
            self.totals["failed"] += 1
        if row.ttfb_ms is not None and row.provider:
            secs = row.ttfb_ms / 1000
            self._ttfb(row.provider).observe(secs)
            self._first(fmt, provider, ended).observe(secs)
        self._observe_spend(row, provider)
        attempts: list[dict[str, Any]] = (row.routing or {}).get("attempts") or []
        previous: dict[str, Any] | None = None
        for attempt in attempts:
            name = str(attempt.get("provider"))
            result = str(attempt.get("outcome"))
            self._attempts(name, result).inc()
            if result == "skipped":
                continue
            failed = result not in _NOT_FAILED
            reason = _reason(attempt, result) if failed else ""
            if failed:
                self._failed(name, reason).inc()
            round_ = int(attempt.get("retry") or 0)
            if round_ > 0:
                self._retries(name).inc()
            if (
                previous is not None
                and previous.get("provider") != name
                and int(previous.get("retry") or 0) == round_
            ):
                self.fallbacks.inc()
                left = str(previous.get("provider"))
                self._failovers(left, _reason(previous, str(previous.get("outcome")))).inc()
            previous = attempt

    def _observe_spend(self, row: RequestRow, provider: str) -> None:
        key = row.key_name or "none"
        model = self._model_label(self._router().config, row.model)
        if row.cost_state == "estimated":
            # No usage was reported: the row's input tokens and cost are the gateway's estimate,
            # kept apart from what upstreams reported.
            self._estimated(key, provider, model).inc((row.cost_micros or 0) / 1_000_000)
            return
        for kind, count in (
            ("input", row.input_tokens),
            ("cache_read", row.cache_read_tokens),
            ("cache_write", row.cache_write_tokens),
            ("output", row.output_tokens),
        ):
            if count:
                self._tokens(key, provider, model, kind).inc(count)
        if row.cost_micros:
            self._cost(key, provider, model).inc(row.cost_micros / 1_000_000)
        if row.cost_state == "unknown":
            self._unpriced(provider, model).inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(_WithoutCreated(self.registry))


# Attempt outcomes that are not failures of the upstream.
_NOT_FAILED = frozenset(("ok", "cancelled", "skipped", "in_flight"))


def _reason(attempt: dict[str, Any], result: str) -> str:
    """Why an attempt ended as it did: its error (a failure kind or a gw. code) when that is
    one of the known set, else its outcome, else ``other``."""
    error = attempt.get("error")
    if isinstance(error, str):
        return error if error in _REASONS else "other"
    return result if result.isidentifier() and len(result) < 32 else "other"


class _WithoutCreated(CollectorRegistry):
    """A view of a registry without the ``*_created`` series.

    prometheus-client adds a ``_created`` timestamp series next to every counter and histogram;
    in the text format each becomes a series of its own that nobody here reads. Turning them
    off with ``disable_created_metrics`` would change every registry in the process, so they are
    left out of this registry's exposition instead.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self._source = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():
            kept = copy.copy(metric)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept
