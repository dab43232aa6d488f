"""Slots and key permits: counting, FIFO grants, expiry, key limits.

Which candidate a request takes, skips or waits for is the attempt machine's rule
(tests/twengine/attempt/test_machine.py); `Slots` only counts, queues and grants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.slots import Grant, Permit, Slots, SlotScope, Ticket


def take(slots: Slots, name: str, owner: str, scope: SlotScope = SlotScope.UPSTREAM) -> Permit:
    permit = slots.try_acquire(name, owner=owner, scope=scope)
    assert permit is not None, name
    return permit


def queue(
    slots: Slots,
    names: list[str],
    owner: str,
    deadline: float,
    scope: SlotScope = SlotScope.UPSTREAM,
) -> Ticket:
    return slots.wait(names, owner=owner, deadline=deadline, scope=scope)


def test_unlimited_upstreams_are_counted_but_never_full() -> None:
    slots = Slots()
    permits = [slots.try_acquire("up", owner=str(i)) for i in range(100)]
    assert all(permits)
    assert slots.in_flight("up") == 100
    assert not slots.is_full("up")
    assert slots.limit("up") is None


def test_when_every_candidate_is_full_the_request_waits_for_the_first_free() -> None:
    slots = Slots(upstream_limits={"a": 1, "b": 1})
    pa = take(slots, "a", "r1")
    pb = take(slots, "b", "r2")
    ticket = queue(slots, ["a", "b"], "r3", 121.0)
    assert ticket.names == ("a", "b")
    # `b` frees first: the ticket gets `b`.
    (grant,) = slots.release(pb)
    assert grant.ticket == ticket
    assert (grant.permit.name, grant.permit.owner) == ("b", "r3")
    assert slots.in_flight("b") == 1
    assert slots.release(pa) == []
    assert slots.waiting() == []


def test_grants_go_in_fifo_order() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = take(slots, "a", "r0")
    for i in range(1, 5):
        queue(slots, ["a"], f"r{i}", 100.0)
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
    pa = take(slots, "a", "x")
    pb = take(slots, "b", "y")
    queue(slots, ["b"], "first", 9.0)
    queue(slots, ["a", "b"], "second", 9.0)
    # `a` frees: only the second ticket wants it.
    (grant,) = slots.release(pa)
    assert grant.permit.owner == "second"
    # `b` frees: the first ticket, still waiting, gets it.
    (grant,) = slots.release(pb)
    assert grant.permit.owner == "first"


def test_expiry_at_the_deadline() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = take(slots, "a", "x")
    # Deadlines count from each request's arrival: arrival + wait_secs.
    early = queue(slots, ["a"], "early", 5.0 + 120.0)
    late = queue(slots, ["a"], "late", 10.0 + 120.0)
    assert slots.next_deadline() == 125.0
    assert slots.expire(124.9) == []
    assert slots.expire(125.0) == [early]
    assert slots.next_deadline() == 130.0
    (grant,) = slots.release(held)
    assert grant.ticket == late
    assert slots.next_deadline() is None


def test_cancel_removes_a_ticket() -> None:
    slots = Slots(upstream_limits={"a": 1})
    held = take(slots, "a", "x")
    waiting = queue(slots, ["a"], "gone", 9.0)
    assert slots.cancel(waiting)
    assert not slots.cancel(waiting)
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
    key = SlotScope.KEY
    s1 = take(slots, "team", "s1", key)
    s2 = take(slots, "team", "s2", key)
    assert s1.scope is SlotScope.KEY
    # Both streams are still running, long after they started: the key stays full.
    assert slots.try_acquire("team", owner="s3", scope=key) is None
    queue(slots, ["team"], "s3", 110.0, key)
    assert slots.in_flight("team", SlotScope.KEY) == 2
    # Upstream slots of the same name are another pool.
    assert slots.in_flight("team") == 0
    (grant,) = slots.release(s2)  # the second stream ended
    assert grant.permit.owner == "s3"
    assert slots.in_flight("team", SlotScope.KEY) == 2
    slots.release(s1)
    slots.release(grant.permit)
    assert slots.in_flight("team", SlotScope.KEY) == 0
    assert take(slots, "other", "o", key)


def test_key_queue_expires() -> None:
    slots = Slots(key_limits={"k": 1})
    take(slots, "k", "a", SlotScope.KEY)
    queued = queue(slots, ["k"], "b", 10.0, SlotScope.KEY)
    assert slots.expire(10.0) == [queued]
    assert slots.try_acquire("k", owner="c", scope=SlotScope.KEY) is None


def test_raising_a_limit_grants_waiters() -> None:
    slots = Slots(upstream_limits={"a": 1}, key_limits={"k": 1})
    take(slots, "a", "x")
    for owner in ("w1", "w2", "w3"):
        queue(slots, ["a"], owner, 9.0)
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
            permit = slots.try_acquire("a", owner=str(now)) or slots.try_acquire(
                "b", owner=str(now)
            )
            if permit is not None:
                held.append(permit)
            elif arg % 5:
                queue(slots, ["a", "b"], str(now), now + arg % 5)
        elif op == "release" and held:
            grants: list[Grant] = slots.release(held.pop(arg % len(held)))
            held.extend(g.permit for g in grants)
        else:
            slots.expire(now)
        assert slots.in_flight("a") <= limits[0]
        assert slots.in_flight("b") <= limits[1]
        for ticket in slots.waiting():
            assert all(slots.is_full(name) for name in ticket.names)


def test_slots_held_elsewhere_count_against_the_limit() -> None:
    slots = Slots(upstream_limits={"a": 3})
    take(slots, "a", "r1")
    assert slots.set_outside({"a": 2}) == []
    assert slots.outside("a") == 2 and slots.is_full("a")
    assert slots.try_acquire("a", owner="r2") is None
    ticket = slots.wait(["a"], owner="r2", deadline=10.0)
    # Another instance let one go: the room goes to the waiting ticket.
    (grant,) = slots.set_outside({"a": 1})
    assert grant.ticket == ticket and grant.permit.owner == "r2"
    assert slots.in_flight("a") == 2 and slots.is_full("a")
    # Names left out hold nothing elsewhere.
    assert slots.set_outside({}) == [] and slots.outside("a") == 0 and not slots.is_full("a")
