"""The router: turn decisions, strategies, balancing with stickiness, pauses, slots, reloads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.attempt import CandidateRef
from twengine.catalog import ConfigCatalog
from twengine.config import Config, build_config
from twengine.router import Router, health_settings
from twengine.rules import RequestFacts
from twproto.dialect import Dialect
from twproto.failures import Failure, FailureKind, PauseRule, stream_ended_early

NO_BALANCE = Failure(
    kind=FailureKind.NO_BALANCE, failover=True, temporary=False, pause=PauseRule.NO_BALANCE
)
ENOUGH_CACHE = 2048


def provider(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "base_url": f"https://{name}.example/v1", **fields}


def config(
    *groups: dict[str, Any],
    providers: list[dict[str, Any]] | None = None,
    rules: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> Config:
    data: dict[str, Any] = {
        "version": 1,
        "providers": providers or [provider("a"), provider("b"), provider("c")],
        "groups": list(groups),
        **sections,
    }
    if rules is not None:
        data["routes"] = [{"name": "default", "rules": rules}]
    elif groups:
        data["routes"] = [{"name": "default", "rules": [{"name": "all", "to": groups[0]["name"]}]}]
    return build_config(data)


def lb(*members: Any, name: str = "pool", balance_by: str = "weights") -> dict[str, Any]:
    return {
        "name": name,
        "type": "load-balance",
        "balance_by": balance_by,
        "providers": list(members),
    }


def weighted(**weights: int) -> list[dict[str, Any]]:
    return [{"name": name, "weight": weight} for name, weight in weights.items()]


def facts(model: str = "m", **fields: Any) -> RequestFacts:
    return RequestFacts(model=model, dialect=Dialect.ANTHROPIC, **fields)


def order(router: Router, now: float = 0.0, **kw: Any) -> list[str]:
    return [c.provider for c in router.plan(facts(), now=now, **kw).candidates]


def planned(router: Router, now: float, **kw: Any) -> str | None:
    """RoutePlan one request, checking first that dry-run predicts its first candidate."""
    predicted = router.dryrun(facts(), now=now, **kw).next
    first = router.plan(facts(), now=now, **kw).first
    assert predicted == first
    return first


# --- load-balance over long runs ------------------------------------------------------------


def test_7_3_over_1000_requests_with_a_pause_halfway() -> None:
    router = Router(config(lb(*weighted(a=7, b=3))))
    counts = {"a": 0, "b": 0}
    run: list[str] = []
    for i in range(1000):
        now = float(i)
        if i == 500:
            (event,) = router.record_failure("b", NO_BALANCE, now=now)
            assert event.paused and event.upstream == "b"
        name = planned(router, now)
        assert name is not None
        counts[name] += 1
        run.append(name)
    assert abs(counts["a"] - 850) <= 2 and abs(counts["b"] - 150) <= 2
    # Smooth: the first ten interleave rather than run seven a's.
    assert run[:10].count("b") == 3 and "aaaa" not in "".join(run[:10])
    # While paused, b is still a candidate, asked last.
    plan = router.plan(facts(), now=1000.0)
    assert [c.provider for c in plan.candidates] == ["a", "b"] and plan.paused == ("b",)


def test_7_3_with_unexplained_failures_pausing_a_member() -> None:
    router = Router(config(lb(*weighted(a=7, b=3))))
    counts = {"a": 0, "b": 0}
    for i in range(1000):
        now = float(i)
        if i == 500:
            events = [router.record_failure("a", stream_ended_early(), now=now) for _ in range(3)]
            assert [len(e) for e in events] == [0, 0, 1]
        name = planned(router, now)
        assert name is not None
        counts[name] += 1
    # a is paused for 60 s (requests 500–559): b takes all of those.
    assert abs(counts["a"] - (350 + 440 * 0.7)) <= 2
    assert abs(counts["b"] - (150 + 60 + 440 * 0.3)) <= 2


def test_sticky_requests_count_toward_the_share() -> None:
    router = Router(config(lb(*weighted(a=7, b=3))))
    router.plan(facts(), now=0.0, conversation="long", new_turn=True)
    router.record_answer("long", "a", cached_tokens=0, now=0.0)
    counts = {"a": 0, "b": 0}
    for i in range(1, 1001):
        now = float(i)
        if i % 2:
            name = planned(router, now, conversation="long", new_turn=False)
            assert name == "a"
        else:
            name = planned(router, now)
        assert name is not None
        counts[name] += 1
    # Half the traffic sticks to a; new conversations make up the difference so that the
    # weights still describe the whole: 700:300.
    assert abs(counts["a"] - 700) <= 2 and abs(counts["b"] - 300) <= 2


def test_a_sticky_request_is_counted_not_picked() -> None:
    router = Router(config(lb("a", "b")))
    assert router.plan(facts(), now=0.0, conversation="c", new_turn=True).first == "a"
    router.record_answer("c", "a", cached_tokens=0, now=0.0)
    plan = router.plan(facts(), now=1.0, conversation="c", new_turn=False)
    assert plan.first == "a" and plan.sticky == "a"
    assert plan.balance is not None and plan.balance.counted is True
    assert plan.candidate_refs() == (
        CandidateRef(name="a", sticky=True),
        CandidateRef(name="b", sticky=False),
    )
    # a has had two requests, so the next two new conversations go to b.
    assert [router.plan(facts(), now=2.0).first for _ in range(3)] == ["b", "b", "a"]


def test_sticky_traffic_beyond_max_lead_is_not_counted() -> None:
    router = Router(config(lb("a", "b")), max_lead=2.0)
    router.record_answer("c", "a", cached_tokens=0, now=0.0)
    counted = []
    for i in range(8):
        plan = router.plan(facts(), now=float(i), conversation="c", new_turn=False)
        assert plan.first == "a" and plan.balance is not None
        counted.append(plan.balance.counted)
    assert counted[:2] == [True, True] and counted[-1] is False
    # The debt is capped, so b's run of new conversations is short.
    run = [router.plan(facts(), now=9.0).first for _ in range(8)]
    assert run[:2] == ["b", "b"] and "a" in run[:6]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["new", "cont", "answer", "fail", "ok", "busy", "free", "wait"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 3),
        ),
        max_size=60,
    )
)
def test_dryrun_predicts_every_plan(steps: list[tuple[str, str, int]]) -> None:
    cfg = config(
        lb(*weighted(a=5, b=3, c=1), balance_by="latency-health"),
        providers=[provider("a", max_concurrent=1), provider("b"), provider("c")],
    )
    router = Router(cfg)
    now = 0.0
    permits = []
    for op, name, n in steps:
        conv = f"conv{n}"
        if op == "new":
            planned(router, now, conversation=conv, new_turn=True)
        elif op == "cont":
            planned(router, now, conversation=conv, new_turn=False)
        elif op == "answer":
            router.record_answer(conv, name, cached_tokens=1000 * n, now=now)
            router.record_first_content(name, 0.1 + n, now=now)
        elif op == "fail":
            router.record_failure(name, NO_BALANCE if n == 3 else stream_ended_early(), now=now)
        elif op == "ok":
            router.record_success(name, now=now)
        elif op == "busy":
            permit = router.slots.try_acquire(name, owner="t")
            if permit is not None:
                permits.append(permit)
        elif op == "free" and permits:
            router.slots.release(permits.pop())
        else:
            now += 40.0 * n
            router.on_timer(now)
        planned(router, now)


# --- stickiness -----------------------------------------------------------------------------


def test_within_a_turn_the_conversation_stays_without_cache() -> None:
    router = Router(config(lb("a", "b")))
    router.plan(facts(), now=0.0)  # a
    first = router.plan(facts(), now=1.0, conversation="c", new_turn=True).first
    assert first == "b"
    router.record_answer("c", "b", cached_tokens=0, now=1.0)
    assert router.plan(facts(), now=500.0, conversation="c", new_turn=False).sticky == "b"


def test_across_turns_only_with_a_warm_cache() -> None:
    router = Router(config(lb("a", "b")))
    router.plan(facts(), now=0.0)  # a's turn; b would be next
    router.record_answer("warm", "a", cached_tokens=ENOUGH_CACHE, now=0.0)
    router.record_answer("small", "a", cached_tokens=1023, now=0.0)
    assert router.dryrun(facts(), now=299.0, conversation="warm").sticky == "a"
    assert router.dryrun(facts(), now=299.0, conversation="small").sticky is None
    assert router.dryrun(facts(), now=300.0, conversation="warm").sticky is None
    assert router.plan(facts(), now=100.0, conversation="warm").first == "a"


def test_a_paused_sticky_upstream_is_not_held_to() -> None:
    router = Router(config(lb("a", "b")))
    router.record_answer("c", "a", cached_tokens=0, now=0.0)
    router.record_failure("a", NO_BALANCE, now=1.0)
    plan = router.plan(facts(), now=2.0, conversation="c", new_turn=False)
    assert plan.sticky is None and [c.provider for c in plan.candidates] == ["b", "a"]


def test_sticky_upstream_that_is_full_stays_first() -> None:
    router = Router(
        config(lb("a", "b"), providers=[provider("a", max_concurrent=1), provider("b")])
    )
    router.record_answer("c", "a", cached_tokens=0, now=0.0)
    assert router.slots.try_acquire("a", owner="other") is not None
    plan = router.plan(facts(), now=1.0, conversation="c", new_turn=False)
    assert plan.first == "a" and plan.full == ("a",)
    assert router.dryrun(facts(), now=1.0, conversation="c", new_turn=False).waits


def test_sticky_applies_to_groups_without_balancing() -> None:
    router = Router(config({"name": "fb", "providers": ["a", "b", "c"]}))
    router.record_answer("c", "c", cached_tokens=0, now=0.0)
    assert order(router, conversation="c", new_turn=False) == ["c", "a", "b"]


# --- the turn's decision --------------------------------------------------------------------

TOOL_RULES: list[dict[str, Any]] = [
    {"name": "tools", "when": {"tools": True}, "to": "b"},
    {"name": "plain", "to": "a"},
]


def test_the_decision_holds_for_the_turn() -> None:
    router = Router(config(rules=TOOL_RULES))
    start = router.plan(facts(tools=True), now=0.0, conversation="c", new_turn=True)
    assert start.decision.rule == "tools" and not start.held
    later = router.plan(facts(tools=False), now=1.0, conversation="c", new_turn=False)
    assert later.decision.rule == "tools" and later.held and later.first == "b"
    assert router.dryrun(facts(tools=False), now=1.0, conversation="c", new_turn=False).held
    fresh = router.plan(facts(tools=False), now=2.0, conversation="c", new_turn=True)
    assert fresh.decision.rule == "plain" and not fresh.held


def test_decision_is_made_again_near_the_context_window() -> None:
    providers = [provider("a"), provider("b", model_specs={"m": {"context_window": 1000}})]
    router = Router(config(rules=TOOL_RULES, providers=providers))
    router.plan(facts(tools=True, input_tokens=100), now=0.0, conversation="c")
    held = router.plan(facts(input_tokens=899), now=1.0, conversation="c", new_turn=False)
    assert held.held and held.decision.rule == "tools"
    near = router.plan(facts(input_tokens=900), now=2.0, conversation="c", new_turn=False)
    assert not near.held and near.decision.rule == "plain"
    # The remade decision holds for the rest of the turn.
    assert router.plan(facts(tools=True), now=3.0, conversation="c", new_turn=False).held


def test_another_model_or_a_routing_reload_decides_afresh() -> None:
    cfg = config(rules=TOOL_RULES)
    router = Router(cfg)
    router.plan(facts(tools=True), now=0.0, conversation="c")
    assert not router.plan(facts("other"), now=1.0, conversation="c", new_turn=False).held
    router.plan(facts(tools=True), now=2.0, conversation="c")
    # A reload that routing does not read keeps the turn's decision...
    router.configure(config(rules=TOOL_RULES, failover={"pause_secs": 30}))
    assert router.plan(facts(), now=3.0, conversation="c", new_turn=False).held
    # ...one that changes the rules does not.
    router.configure(config(rules=[*TOOL_RULES[:1], {"name": "plain", "to": "c"}]))
    assert not router.plan(facts(), now=4.0, conversation="c", new_turn=False).held


def test_denials_are_not_held() -> None:
    rules: list[dict[str, Any]] = [
        {"name": "no", "when": {"tools": True}, "deny": "no tools"},
        {"name": "x", "to": "a"},
    ]
    router = Router(config(rules=rules))
    plan = router.plan(facts(tools=True), now=0.0, conversation="c")
    assert plan.denied and plan.candidates == () and plan.first is None
    assert router.plan(facts(), now=1.0, conversation="c", new_turn=False).first == "a"


# --- strategies, pauses and slots -----------------------------------------------------------


def test_fallback_keeps_declared_order_and_puts_paused_last() -> None:
    router = Router(config({"name": "fb", "providers": ["a", "b", "c"]}))
    assert order(router) == ["a", "b", "c"]
    router.record_failure("a", NO_BALANCE, now=0.0)
    plan = router.plan(facts(), now=1.0)
    assert [c.provider for c in plan.candidates] == ["b", "c", "a"] and plan.paused == ("a",)
    assert not plan.all_paused


def test_all_paused_are_all_tried_in_order() -> None:
    router = Router(config({"name": "fb", "providers": ["a", "b", "c"]}))
    for name in ("c", "a", "b"):
        router.record_failure(name, NO_BALANCE, now=0.0)
    plan = router.plan(facts(), now=1.0)
    assert [c.provider for c in plan.candidates] == ["a", "b", "c"] and plan.all_paused
    # A pause that runs out ends at the router's deadline.
    assert router.next_deadline() == 1800.0
    assert {e.upstream for e in router.on_timer(1800.0)} == {"a", "b", "c"}
    assert router.plan(facts(), now=1800.0).paused == ()


def test_a_single_candidate_is_never_held_back() -> None:
    router = Router(config(rules=[{"name": "one", "to": "b"}]))
    router.record_failure("b", NO_BALANCE, now=0.0)
    plan = router.plan(facts(), now=1.0)
    assert plan.first == "b" and plan.all_paused


def test_select_puts_the_selected_member_first() -> None:
    group = {"name": "sel", "type": "select", "providers": ["a", "b", "c"], "selected": "b"}
    assert order(Router(config(group))) == ["b", "a", "c"]


def test_url_test_ranks_by_first_content() -> None:
    router = Router(config({"name": "fast", "type": "url-test", "providers": ["a", "b", "c"]}))
    for secs in (0.9, 1.0, 1.1):
        router.record_first_content("a", secs, now=0.0)
    for secs in (0.3, 0.2):  # two samples: not yet its own median
        router.record_first_content("c", secs, now=0.0)
    router.record_connection_test("c", 2.0)
    router.record_connection_test("b", 0.5)
    assert order(router) == ["b", "a", "c"]
    router.record_first_content("c", 0.25, now=0.0)
    assert order(router) == ["c", "b", "a"]
    with pytest.raises(ValueError):
        router.record_connection_test("a", -1.0)


def test_cheapest_orders_free_first_and_unpriced_last() -> None:
    cfg = config(
        {"name": "cheap", "type": "cheapest", "providers": ["a", "b", "c", "d"]},
        providers=[
            provider("a"),
            provider("b", price_sheet="dear"),
            provider("c", price_sheet="half"),
            provider("d", billing="free"),
        ],
        pricing={
            "sheets": [
                {"name": "dear", "models": {"m": {"input": 3, "output": 15}}},
                {"name": "half", "multiplier": 0.5, "models": {"m": {"input": 4, "output": 8}}},
            ]
        },
    )
    router = Router(cfg)
    assert order(router) == ["d", "c", "b", "a"]
    assert ConfigCatalog().input_price(cfg, "c", "m") == 2.0
    assert ConfigCatalog().input_price(cfg, "c", "other") is None


def test_full_members_sit_out_of_balancing_and_go_after_free_ones() -> None:
    cfg = config(
        lb(*weighted(a=9, b=1)),
        providers=[provider("a", max_concurrent=1), provider("b"), provider("c")],
    )
    router = Router(cfg)
    permit = router.slots.try_acquire("a", owner="x")
    assert permit is not None
    for i in range(3):
        plan = router.plan(facts(), now=float(i))
        assert [c.provider for c in plan.candidates] == ["b", "a"] and plan.full == ("a",)
        assert plan.balance is not None and plan.balance.lead == "b"
    router.slots.release(permit)
    # a sat out without gaining credit: it comes back where it left off, no burst of catch-up.
    assert [router.plan(facts(), now=5.0).first for _ in range(10)].count("a") == 9


def test_all_full_take_part() -> None:
    cfg = config(
        lb(*weighted(a=3, b=1)),
        providers=[provider("a", max_concurrent=1), provider("b", max_concurrent=1)],
    )
    router = Router(cfg)
    for name in ("a", "b"):
        assert router.slots.try_acquire(name, owner="x") is not None
    firsts = [router.plan(facts(), now=0.0).first for _ in range(4)]
    assert sorted(str(f) for f in firsts) == ["a", "a", "a", "b"]
    assert router.dryrun(facts(), now=0.0).waits


def test_members_that_lack_the_model_keep_their_turns() -> None:
    cfg = config(
        lb("a", "b"),
        providers=[provider("a", models=["m", "only-a"]), provider("b", models=["m"])],
    )
    router = Router(cfg)
    assert router.plan(facts(), now=0.0).first == "a"
    plan = router.plan(facts("only-a"), now=0.0)
    assert [c.provider for c in plan.candidates] == ["a"]
    assert [s.provider for s in plan.skipped] == ["b"]
    # Only a took part in that step, and a lone participant's step changes nothing: b is
    # still next for the shared model.
    assert router.plan(facts(), now=0.0).first == "b"


def test_health_balance_shifts_share_away_from_failures() -> None:
    router = Router(config(lb("a", "b", balance_by="health")))
    for i in range(10):
        router.record_success("a", now=float(i))
        router.record_failure("b", stream_ended_early(), now=float(i))
        router.record_success("b", now=float(i))  # keeps b unpaused at a 50% success rate
    plan = router.plan(facts(), now=10.0)
    assert plan.balance is not None
    factors = {m.provider: m.factor for m in plan.balance.members}
    assert factors == {"a": 1.0, "b": 0.25}
    picks = [plan.first] + [router.plan(facts(), now=10.0).first for _ in range(99)]
    assert picks.count("a") == 80


def test_no_candidate_when_nobody_offers_the_model() -> None:
    router = Router(config(lb("a", "b"), providers=[provider("a", models=["x"]), provider("b")]))
    plan = router.plan(facts("y"), now=0.0)
    assert [c.provider for c in plan.candidates] == ["b"]
    router = Router(config(providers=[provider("a", models=["x"])]))
    plan = router.plan(facts("y"), now=0.0, conversation="c")
    assert plan.candidates == () and plan.balance is None and plan.first is None


# --- reload ---------------------------------------------------------------------------------


def test_configure_keeps_balancers_of_unchanged_groups() -> None:
    both = [lb(*weighted(a=7, b=3)), lb("b", "c", name="other")]
    cfg = config(*both, providers=[provider("a"), provider("b", max_concurrent=1), provider("c")])
    router = Router(cfg)
    for _ in range(3):
        router.plan(facts(), now=0.0)
    pool, other = router.balancer("pool"), router.balancer("other")
    assert pool is not None and other is not None
    before = pool.current()
    assert before != {}
    ticket_holder = router.slots.try_acquire("b", owner="x")
    assert ticket_holder is not None
    waiting = router.slots.wait(["b"], owner="y", deadline=10.0)
    grants = router.configure(
        config(*both, providers=[provider("a"), provider("b", max_concurrent=2), provider("c")])
    )
    assert [g.ticket for g in grants] == [waiting]
    assert router.balancer("pool") is pool and pool.current() == before
    # Changed weights start afresh; an unchanged sibling group keeps its state.
    router.configure(config(lb(*weighted(a=6, b=3)), both[1]))
    fresh = router.balancer("pool")
    assert fresh is not None and fresh is not pool and fresh.current() == {}
    assert router.balancer("other") is other


def test_configure_forgets_removed_upstreams_and_applies_failover() -> None:
    router = Router(config({"name": "fb", "providers": ["a", "b", "c"]}))
    router.record_failure("c", NO_BALANCE, now=0.0)
    router.record_connection_test("c", 0.1)
    router.configure(
        config(
            {"name": "fb", "providers": ["a", "b"]},
            providers=[provider("a"), provider("b")],
            failover={"failures_to_pause": 1},
        )
    )
    assert router.health.snapshot("c", 1.0).paused_until is None
    assert router.health.settings == health_settings(router.config.failover)
    assert len(router.record_failure("a", stream_ended_early(), now=1.0)) == 1
    assert router.balancer("fb") is None


# --- turns taken by a balancer shared by several instances ----------------------------------


def test_a_shared_turn_replaces_the_local_pick_and_its_current_weights() -> None:
    router = Router(config(lb(*weighted(a=7, b=3, c=1))))
    plan = router.plan(facts(), now=0.0)
    assert plan.first == "a"
    shared = {"a": -1000, "b": 2000, "c": -1000}
    taken = router.take_shared_turn(plan, shared, lead="b", counted=None)
    # b leads; the others follow by effective weight, as a local pick of b would order them.
    assert [c.provider for c in taken.candidates] == ["b", "a", "c"]
    assert taken.balance is not None and taken.balance.lead == "b"
    balancer = router.balancer("pool")
    assert balancer is not None and balancer.current() == shared
    # The local balancer carries on from the shared weights (as when Redis is lost next): a
    # (6000 against b's 5000), where its own weights after its pick of a would have made b.
    assert router.dryrun(facts(), now=1.0).next == "a"


def test_a_shared_turn_that_names_no_candidate_leaves_the_plan() -> None:
    router = Router(config(lb(*weighted(a=7, b=3))))
    plan = router.plan(facts(), now=0.0)
    assert router.take_shared_turn(plan, {"a": 0, "b": 0}, lead="gone", counted=None) is plan


def test_a_shared_count_of_a_sticky_request_keeps_it_first() -> None:
    router = Router(config(lb("a", "b")))
    router.plan(facts(), now=0.0, conversation="c", new_turn=True)
    router.record_answer("c", "a", cached_tokens=0, now=0.0)
    plan = router.plan(facts(), now=1.0, conversation="c", new_turn=False)
    taken = router.take_shared_turn(plan, {"a": -500, "b": 500}, lead="a", counted=False)
    assert taken.first == "a" and taken.sticky == "a"
    assert taken.balance is not None and taken.balance.counted is False
