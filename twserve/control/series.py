"""Counters and histograms counted on the event loop, written out by prometheus-client.

prometheus-client's `Counter` and `Histogram` take a lock on every update, and a histogram's
observe walks its buckets through several calls: about 0.8 µs a counter increment and 2 µs a
histogram observation on the development machine, and a request's row makes a dozen of them.
Every update here happens on the event loop's thread (the rows' listeners) and so does every
scrape (the control plane's handler, on the same loop), so no lock is needed: a child is a
list of numbers, an increment one addition, an observation a `bisect` and two additions (about
0.3 µs). At scrape time `collect` hands prometheus-client the same metric families its own
classes would, so the exposition is its reference code (docs/observability.md, "Metrics").
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ("LoopCounter", "LoopHistogram")


def _go_float(bound: float) -> str:
    """A bucket bound as Prometheus clients write ``le``: ``0.1``, ``1.0``, ``600.0``."""
    return repr(float(bound))


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopCounter(Collector):
    """A counter family with `labels`; its children are kept for good (label values come from
    bounded sets). ``name`` without ``_total``: the exposition adds it."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._children: dict[tuple[str, ...], _Count] = {}
        if not labelnames:
            self._children[()] = _Count()
        registry.register(self)

    def labels(self, *values: str) -> _Count:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = _Count()
        return child

    def inc(self, amount: float = 1.0) -> None:
        """Increment the counter of a family without labels."""
        self._children[()].value += amount

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(list(values), child.value)
        yield family


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class LoopHistogram(Collector):
    """A histogram family with `labels` and fixed `buckets` (upper bounds, ascending; +Inf is
    added); ``le`` is written as prometheus-client writes it (``0.1``, ``1.0``, ``+Inf``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must ascend, each once")
        if bounds and bounds[-1] == float("inf"):
            bounds.pop()
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self.bounds = bounds
        self._les = [_go_float(b) for b in bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], _Buckets] = {}
        if not labelnames:
            self._children[()] = _Buckets(bounds)
        registry.register(self)

    def labels(self, *values: str) -> _Buckets:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = _Buckets(self.bounds)
        return child

    def observe(self, amount: float) -> None:
        """Observe on a family without labels."""
        self._children[()].observe(amount)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            running, cumulative = 0, []
            for le, count in zip(self._les, child.counts, strict=True):
                running += count
                cumulative.append((le, float(running)))
            family.add_metric(list(values), cumulative, sum_value=child.sum)
        yield family
