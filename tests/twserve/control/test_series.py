"""The event-loop counters and histograms (twserve/control/series.py) write exactly what
prometheus-client's own `Counter` and `Histogram` write for the same updates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from twserve.control.series import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.05, 0.1, 0.25, 1.0, 2.5, 60.0, 600.0)
LABELS = st.sampled_from(["a", "b", "c"])
AMOUNTS = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


@given(st.lists(st.tuples(LABELS, LABELS, AMOUNTS), max_size=40))
def test_histogram_writes_what_prometheus_client_writes(
    updates: list[tuple[str, str, float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistogram("h_seconds", "h", ["x", "y"], buckets=BUCKETS, registry=ours)
    reference = Histogram("h_seconds", "h", ["x", "y"], buckets=BUCKETS, registry=theirs)
    for x, y, amount in updates:
        mine.labels(x, y).observe(amount)
        reference.labels(x, y).observe(amount)
    got, want = _samples(ours), _samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


@given(st.lists(st.tuples(LABELS, AMOUNTS), max_size=40))
def test_counter_writes_what_prometheus_client_writes(updates: list[tuple[str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopCounter("c", "c", ["x"], registry=ours)
    reference = Counter("c", "c", ["x"], registry=theirs)
    plain, plain_ref = LoopCounter("p", "p", registry=ours), Counter("p", "p", registry=theirs)
    for x, amount in updates:
        mine.labels(x).inc(amount)
        reference.labels(x).inc(amount)
        plain.inc()
        plain_ref.inc()
    got, want = _samples(ours), _samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def test_wrong_label_count_and_unsorted_buckets_are_refused() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("c", "c", ["x"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="ascend"):
        LoopHistogram("h", "h", buckets=(1.0, 0.5), registry=registry)
