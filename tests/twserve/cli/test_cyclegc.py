"""`twserve serve` freezes its startup heap and collects young objects less often
(twserve.app.cyclegc); ``TWSERVE_GC=default`` keeps Python's collector as it is."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from twserve.app import cyclegc


class _Node:
    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def restored() -> Iterator[None]:
    """The test process's collector as it was, whatever the test did to it."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


@pytest.mark.usefixtures("restored")
def test_settle_freezes_what_exists_and_still_collects_new_cycles() -> None:
    startup = [_Node()]
    assert _tracked(startup)
    assert cyclegc.settle({}) is True
    assert gc.get_threshold()[0] == cyclegc.YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0
    assert not _tracked(startup)  # frozen: no collection walks it again
    later = _Node()
    later.other = _Node()
    later.other.other = later  # a reference cycle made after the freeze
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None


@pytest.mark.usefixtures("restored")
def test_default_leaves_the_collector_alone() -> None:
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    assert cyclegc.settle({"TWSERVE_GC": "default"}) is False
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == frozen
