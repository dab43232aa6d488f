"""Slots and key permits: skip or wait, FIFO grants, expiry, key limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.slots import Busy, Claimed, Grant, Permit, Slots, SlotScope, Waiting


def claimed(claim: object) -> Permit:
    assert isinstance(claim, Claimed), claim
    return claim.permit


def test_unlimited_upstreams_are_counted_but_never_full() -> None:
    slots = Slots()
    permits = [slots.try_acquire("up", owner=str(i)) for i in range(100)]
    assert all(permits)
    assert slots.in_flight("up") == 100
    assert not slots.is_full("up")
    assert slots.limit("up") is None


def test_a_full_upstream_is_skipped_at_once() -> None:
    slots = Slots(upstream_limits={"a": 1, "b": 2})
    first = claimed(slots.claim(["a", "b"], owner="r1", now=0.0, deadline=120.0))
    assert first.name == "a"
    claim = slots.claim(["a", "b"], owner="r2", now=0.0, deadline=120.0)
    assert isinstance(claim, Claimed)
    assert (claim.permit.name, claim.skipped) == ("b", ("a",))
    assert slots.full(["a", "b"]) == {"a"}


def test_when_every_candidate_is_full_the_request_waits_for_the_first_free() -> None:
    slots = Slots(upstream_limits={"a": 1, "b": 1})
    pa = claimed(slots.claim(["a"], owner="r1", now=0.0, deadline=120.0))
    pb = claimed(slots.claim(["b"], owner="r2", now=0.0, deadline=120.0))
    waiting = slots.claim(["a", "b"], owner="r3", now=1.0, deadline=121.0)
    assert isinstance(waiting, Waiting)
    assert waiting.skipped == ("a", "b")
    assert waiting.ticket.names == ("a", "b")
    # `b` frees first: the ticket gets `b`.
    (grant,) = slots.release(pb)
    assert grant.ticket == waiting.ticket
    assert (grant.permit.name, grant.permit.owner) == ("b", "r3")
    assert slots.in_flight("b") == 1
    assert slots.release(pa) == []
    assert slots.waiting() == []


def test_a_held_conversation_waits_for_its_own_upstream() -> None:
    slots = Slots(upstream_limits={"a": 1, "b": 1})
    pa = claimed(slots.claim(["a"], owner="r1", now=0.0, deadline=120.0))
    claim = slots.claim(["a", "b"], owner="conv", now=0.0, deadline=30.0, hold_to="a")
    assert isinstance(claim, Waiting)
    assert claim.ticket.names == ("a",)
    # `b` is free but the ticket does not want it.
    assert not slots.is_full("b")
    (grant,) = slots.release(pa)
    assert (grant.permit.name, grant.permit.owner) == ("a", "conv")
    # With room, the held upstream is taken at once.
    slots.release(grant.permit)
    assert claimed(slots.claim(["b"], owner="c2", now=0.0, deadline=9.0, hold_to="a")).name == "a"


def test_grants_go_in_fifo_order() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = claimed(slots.claim(["a"], owner="r0", now=0.0, deadline=100.0))
    tickets = []
    for i in range(1, 5):
        claim = slots.claim(["a"], owner=f"r{i}", now=float(i), deadline=100.0)
        assert isinstance(claim, Waiting)
        tickets.append(claim.ticket)
    owners = []
    permit = held
    for _ in range(4):
        (grant,) = slots.release(permit)
        owners.append(grant.permit.owner)
        permit = grant.permit
    assert owners == ["r1", "r2", "r3", "r4"]
    assert slots.release(permit) == []
    assert slots.in_flight("a") == 0


def test_fifo_across_tickets_waiting_for_different_sets() -> None:
    slots = Slots(upstream_limits={"a": 1, "b": 1})
    pa = claimed(slots.claim(["a"], owner="x", now=0.0, deadline=9.0))
    pb = claimed(slots.claim(["b"], owner="y", now=0.0, deadline=9.0))
    only_b = slots.claim(["b"], owner="first", now=0.0, deadline=9.0)
    either = slots.claim(["a", "b"], owner="second", now=0.0, deadline=9.0)
    assert isinstance(only_b, Waiting) and isinstance(either, Waiting)
    # `a` frees: only the second ticket wants it.
    (grant,) = slots.release(pa)
    assert grant.permit.owner == "second"
    # `b` frees: the first ticket, still waiting, gets it.
    (grant,) = slots.release(pb)
    assert grant.permit.owner == "first"


def test_no_time_to_wait_is_busy() -> None:
    slots = Slots(upstream_limits={"a": 1})
    claimed(slots.claim(["a"], owner="x", now=0.0, deadline=0.0))
    # wait_secs 0: deadline == arrival.
    busy = slots.claim(["a"], owner="y", now=0.0, deadline=0.0)
    assert busy == Busy(skipped=("a",))
    assert slots.claim(["b"], owner="y", now=0.0, deadline=0.0, hold_to="a") == Busy(skipped=("a",))
    assert slots.waiting() == []


def test_expiry_at_the_deadline() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = claimed(slots.claim(["a"], owner="x", now=0.0, deadline=120.0))
    # Deadlines count from each request's arrival: arrival + wait_secs.
    early = slots.claim(["a"], owner="early", now=5.0, deadline=5.0 + 120.0)
    late = slots.claim(["a"], owner="late", now=10.0, deadline=10.0 + 120.0)
    assert isinstance(early, Waiting) and isinstance(late, Waiting)
    assert slots.next_deadline() == 125.0
    assert slots.expire(124.9) == []
    assert slots.expire(125.0) == [early.ticket]
    assert slots.next_deadline() == 130.0
    (grant,) = slots.release(held)
    assert grant.ticket == late.ticket
    assert slots.next_deadline() is None


def test_cancel_removes_a_ticket() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = claimed(slots.claim(["a"], owner="x", now=0.0, deadline=9.0))
    waiting = slots.claim(["a"], owner="gone", now=0.0, deadline=9.0)
    assert isinstance(waiting, Waiting)
    assert slots.cancel(waiting.ticket)
    assert not slots.cancel(waiting.ticket)
    assert slots.release(held) == []


def test_release_is_idempotent() -> None:
    slots = Slots(upstream_limits={"a": 2})
    one = slots.try_acquire("a", owner="1")
    two = slots.try_acquire("a", owner="2")
    assert one and two
    slots.release(one)
    slots.release(one)
    assert slots.in_flight("a") == 1


def test_waiting_on_a_name_with_room_is_refused() -> None:
    slots = Slots(upstream_limits={"a": 1})
    with pytest.raises(ValueError):
        slots.wait(["a"], owner="x", deadline=9.0)
    with pytest.raises(ValueError):
        slots.wait([], owner="x", deadline=9.0)
    with pytest.raises(ValueError):
        Slots(upstream_limits={"a": 0})


# -- key permits ------------------------------------------------------------------------------


def test_key_limits_count_streams_until_released() -> None:
    slots = Slots(key_limits={"team": 2})
    s1 = claimed(slots.claim_key("team", owner="s1", now=0.0, deadline=60.0))
    s2 = claimed(slots.claim_key("team", owner="s2", now=0.0, deadline=60.0))
    assert s1.scope is SlotScope.KEY
    # Both streams are still running, long after they started: the key stays full.
    queued = slots.claim_key("team", owner="s3", now=50.0, deadline=110.0)
    assert isinstance(queued, Waiting)
    assert slots.in_flight("team", SlotScope.KEY) == 2
    # Upstream slots of the same name are another pool.
    assert slots.in_flight("team") == 0
    (grant,) = slots.release(s2)  # the second stream ended
    assert grant.permit.owner == "s3"
    assert slots.in_flight("team", SlotScope.KEY) == 2
    slots.release(s1)
    slots.release(grant.permit)
    assert slots.in_flight("team", SlotScope.KEY) == 0
    assert claimed(slots.claim_key("other", owner="o", now=0.0, deadline=0.0))


def test_key_queue_expires_and_busy() -> None:
    slots = Slots(key_limits={"k": 1})
    claimed(slots.claim_key("k", owner="a", now=0.0, deadline=10.0))
    queued = slots.claim_key("k", owner="b", now=0.0, deadline=10.0)
    assert isinstance(queued, Waiting)
    assert slots.expire(10.0) == [queued.ticket]
    assert slots.claim_key("k", owner="c", now=10.0, deadline=10.0) == Busy(skipped=("k",))


def test_raising_a_limit_grants_waiters() -> None:
    slots = Slots(upstream_limits={"a": 1}, key_limits={"k": 1})
    claimed(slots.claim(["a"], owner="x", now=0.0, deadline=9.0))
    w1 = slots.claim(["a"], owner="w1", now=0.0, deadline=9.0)
    w2 = slots.claim(["a"], owner="w2", now=0.0, deadline=9.0)
    w3 = slots.claim(["a"], owner="w3", now=0.0, deadline=9.0)
    assert isinstance(w1, Waiting) and isinstance(w2, Waiting) and isinstance(w3, Waiting)
    grants = slots.configure(upstream_limits={"a": 3}, key_limits={"k": 1})
    assert [g.permit.owner for g in grants] == ["w1", "w2"]
    assert [t.owner for t in slots.waiting()] == ["w3"]
    # Lowering a limit keeps what is held and admits nobody until below it.
    slots.configure(upstream_limits={"a": 1}, key_limits={})
    assert slots.in_flight("a") == 3
    assert slots.try_acquire("a", owner="y") is None
    assert slots.release(grants[0].permit) == []
    assert slots.release(grants[1].permit) == []
    assert slots.try_acquire("a", owner="z") is None  # still 1 held with limit 1


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["claim", "release", "expire"]), st.integers(0, 30)),
        max_size=120,
    ),
    limits=st.tuples(st.integers(1, 3), st.integers(1, 3)),
)
def test_limits_are_never_exceeded_and_nobody_waits_beside_a_free_slot(
    ops: list[tuple[str, int]], limits: tuple[int, int]
) -> None:
    slots = Slots(upstream_limits={"a": limits[0], "b": limits[1]})
    held: list[Permit] = []
    now = 0.0
    for op, arg in ops:
        now += 1.0
        if op == "claim":
            claim = slots.claim(["a", "b"], owner=str(now), now=now, deadline=now + arg % 5)
            if isinstance(claim, Claimed):
                held.append(claim.permit)
        elif op == "release" and held:
            grants: list[Grant] = slots.release(held.pop(arg % len(held)))
            held.extend(g.permit for g in grants)
        else:
            slots.expire(now)
        assert slots.in_flight("a") <= limits[0]
        assert slots.in_flight("b") <= limits[1]
        for ticket in slots.waiting():
            assert all(slots.is_full(name) for name in ticket.names)
