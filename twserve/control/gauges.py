"""The metrics of live state, read when Prometheus scrapes (nothing is kept between scrapes).

Upstream state comes from the router (its health, its slots), key limit usage from the usage
keeper, the store's queue from the store. Every label value is a name the config writes (keys,
upstreams) or a member of a fixed set (a limit's period and measure), so the series stay as many
as the config has names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from twengine.router import Router

__all__ = ("KeyLimitUsage", "LiveState", "StoreState")


def _family(name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=labels)


class LiveState(Collector):
    """Per upstream: attempts in flight, paused, unexplained failures in a row, success rate
    over its recent attempts, slots in use (here and, with shared state, elsewhere), the slot
    limit, and requests waiting for one of its slots."""

    FAMILIES = (
        ("gateway_provider_in_flight", "Attempts in flight per upstream"),
        ("gateway_provider_paused", "1 while an upstream is paused"),
        ("gateway_upstream_failures_in_row", "Unexplained failures in a row per upstream"),
        (
            "gateway_upstream_success_rate",
            "Share of an upstream's recent attempts that succeeded (absent: no attempt yet)",
        ),
        (
            "gateway_upstream_slots_in_use",
            "Slots of an upstream's max_concurrent in use, by this instance and others",
        ),
        ("gateway_upstream_slot_limit", "An upstream's max_concurrent (absent: no limit)"),
        (
            "gateway_upstream_queue_length",
            "Requests waiting for a slot that this upstream can give",
        ),
    )

    def __init__(self, router: Callable[[], Router], clock: Callable[[], float]) -> None:
        self._router = router
        self._clock = clock

    def _families(self) -> list[GaugeMetricFamily]:
        return [_family(name, text, ["provider"]) for name, text in self.FAMILIES]

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        router = self._router()
        now = self._clock()
        in_flight, paused, failures, success, used, limit, queue = self._families()
        slots, health = router.slots, router.health
        waiting: dict[str, int] = {}
        for ticket in slots.waiting():
            for name in ticket.names:
                waiting[name] = waiting.get(name, 0) + 1
        for provider in router.config.providers:
            name = provider.name
            mine = slots.in_flight(name)
            in_flight.add_metric([name], mine)
            paused.add_metric([name], 1.0 if health.is_paused(name, now) else 0.0)
            snapshot = health.snapshot(name, now)
            failures.add_metric([name], snapshot.failures_in_row)
            if snapshot.success_rate is not None:
                success.add_metric([name], snapshot.success_rate)
            used.add_metric([name], mine + slots.outside(name))
            cap = slots.limit(name)
            if cap is not None:
                limit.add_metric([name], cap)
            queue.add_metric([name], waiting.get(name, 0))
        yield from (in_flight, paused, failures, success, used, limit, queue)


class KeyLimitUsage(Collector):
    """Per key limit: what is used in its current window, its amount, and the share used."""

    FAMILIES = (
        (
            "gateway_key_limit_used",
            "Used in the limit's current window (requests, tokens or micro-USD, as its measure)",
        ),
        ("gateway_key_limit_amount", "The limit's amount, in its measure's unit"),
        ("gateway_key_limit_used_ratio", "Share of the limit used in its current window"),
    )
    LABELS = ("key", "per", "measure")

    def __init__(self, keys: Callable[[], list[str]], view: Callable[[str], list[Any]]) -> None:
        self._keys = keys
        self._view = view

    def _families(self) -> list[GaugeMetricFamily]:
        return [_family(name, text, list(self.LABELS)) for name, text in self.FAMILIES]

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        used, amount, ratio = self._families()
        for key in self._keys():
            for limit in self._view(key):
                labels = [key, str(limit["per"]), str(limit["measure"])]
                used.add_metric(labels, float(limit["used"]))
                amount.add_metric(labels, float(limit["amount"]))
                if limit["amount"]:
                    ratio.add_metric(labels, float(limit["used"]) / float(limit["amount"]))
        yield from (used, amount, ratio)


class StoreState(Collector):
    """The request store: rows waiting to be written, and rows set aside."""

    SET_ASIDE = "gateway_store_rows_set_aside"
    SET_ASIDE_HELP = "Request rows the store could not write and set aside (gw.store.row_set_aside)"
    QUEUE = "gateway_store_queue_depth"
    QUEUE_HELP = (
        "Request rows recorded and not written yet (queued, or held while the database is away)"
    )

    def __init__(self, set_aside: Callable[[], int], queued: Callable[[], int]) -> None:
        self._set_aside = set_aside
        self._queued = queued

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.SET_ASIDE, self.SET_ASIDE_HELP)
        yield GaugeMetricFamily(self.QUEUE, self.QUEUE_HELP)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            self.SET_ASIDE, self.SET_ASIDE_HELP, value=float(self._set_aside())
        )
        yield GaugeMetricFamily(self.QUEUE, self.QUEUE_HELP, value=float(self._queued()))
