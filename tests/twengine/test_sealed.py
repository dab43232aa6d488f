"""Sealed-reasoning marks: per conversation and upstream, refreshed by use, bounded."""

from __future__ import annotations

from twengine.sealed import SealedReasoning


def test_marks_are_per_conversation_and_upstream() -> None:
    s = SealedReasoning(ttl_secs=100.0)
    s.mark("c1", "a", now=0.0)
    assert s.leave_out("c1", "a", now=1.0)
    assert not s.leave_out("c1", "b", now=1.0)
    assert not s.leave_out("c2", "a", now=1.0)


def test_marks_expire_unless_used() -> None:
    s = SealedReasoning(ttl_secs=100.0)
    s.mark("c", "a", now=0.0)
    assert s.leave_out("c", "a", now=90.0)  # used: lasts until 190
    assert s.leave_out("c", "a", now=180.0)
    assert not s.leave_out("c", "a", now=281.0)
    assert len(s) == 0


def test_store_is_bounded() -> None:
    s = SealedReasoning(max_marks=3)
    for i in range(5):
        s.mark(f"c{i}", "a", now=float(i))
    assert len(s) == 3
    assert not s.leave_out("c0", "a", now=5.0) and s.leave_out("c4", "a", now=5.0)
