"""Routing: route choice, rule matching, set merging, deny, per-hop rules, aliases, candidates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twengine.config import (
    BalanceBy,
    Config,
    GroupType,
    SetOverrides,
    TargetKind,
    When,
    build_config,
    parse_comparison,
)
from twengine.router import Router
from twengine.rules import (
    Candidate,
    Decisions,
    RequestFacts,
    Skipped,
    SkipReason,
    hop_overrides,
    resolve,
    resumes,
    route_for,
    when_holds,
)
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel

PROVIDERS: list[dict[str, Any]] = [
    {
        "name": "official",
        "base_url": "https://api.anthropic.com",
        "models": ["claude-sonnet-4-5", "claude-opus-4-1"],
    },
    {
        "name": "relay",
        "base_url": "https://relay.example/v1",
        "models": ["anthropic/claude-sonnet-4.5", "gpt-5"],
    },
    {"name": "any", "base_url": "https://any.example/v1"},
]


def config(**sections: Any) -> Config:
    return build_config({"version": 1, "providers": PROVIDERS, **sections})


def facts(model: str = "gpt-5", **fields: Any) -> RequestFacts:
    return RequestFacts(model=model, dialect=fields.pop("dialect", Dialect.ANTHROPIC), **fields)


def one_route(*rules: dict[str, Any], **sections: Any) -> Config:
    return config(routes=[{"name": "default", "rules": list(rules)}], **sections)


def names(decision: Any) -> list[tuple[str, str]]:
    return [(c.provider, c.model) for c in decision.candidates]


# --- which route ---------------------------------------------------------------------------

ROUTES: list[dict[str, Any]] = [{"name": n, "rules": []} for n in ("own", "chosen", "default")]


@pytest.mark.parametrize(
    ("sections", "client", "expected"),
    [
        ({"default_route": "chosen"}, "with-route", "own"),
        ({"default_route": "chosen"}, "without-route", "chosen"),
        ({"default_route": "chosen"}, None, "chosen"),
        ({"default_route": "chosen"}, "ghost", "chosen"),
        ({}, "without-route", "default"),
        ({}, None, "default"),
    ],
)
def test_route_choice(sections: dict[str, Any], client: str | None, expected: str) -> None:
    cfg = config(
        routes=ROUTES,
        clients=[
            {"name": "with-route", "key": "k1", "route": "own"},
            {"name": "without-route", "key": "k2"},
        ],
        **sections,
    )
    route = route_for(cfg, client)
    assert route is not None and route.name == expected
    assert resolve(cfg, facts(client=client)).route == expected


def test_no_route_means_every_upstream_in_order() -> None:
    cfg = config(routes=[{"name": "other", "rules": [{"name": "x", "deny": True}]}])
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.route is None and decision.rule is None
    assert decision.target is TargetKind.ALL and decision.group is None
    assert decision.group_type is GroupType.FALLBACK
    assert names(decision) == [("relay", "gpt-5"), ("any", "gpt-5")]
    assert decision.skipped == (
        Skipped(provider="official", model="gpt-5", reason=SkipReason.MODEL_NOT_OFFERED),
    )
    assert not decision.denied


def test_no_deciding_rule_means_every_upstream() -> None:
    cfg = one_route(
        {"name": "claude", "when": {"model": "claude-*"}, "to": "official"},
        {"name": "limit", "set": {"max_tokens": 1000}},
    )
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.route == "default" and decision.rule is None
    assert decision.target is TargetKind.ALL
    assert decision.overrides == SetOverrides(max_tokens=1000)
    assert names(decision) == [("relay", "gpt-5"), ("any", "gpt-5")]


@pytest.mark.parametrize(
    ("route_resume", "group_resume", "model", "expected"),
    [
        (False, False, "gpt-5", False),
        (True, False, "gpt-5", True),  # the route's, whichever target decides
        (True, False, "claude-sonnet-4-5", True),
        (False, True, "gpt-5", True),  # routed to the group
        (False, True, "claude-sonnet-4-5", False),  # routed to an upstream, not the group
    ],
)
def test_resume_comes_from_the_route_or_the_target_group(
    route_resume: bool, group_resume: bool, model: str, expected: bool
) -> None:
    cfg = config(
        groups=[{"name": "pool", "providers": ["relay", "any"], "resume": group_resume}],
        routes=[
            {
                "name": "default",
                "resume": route_resume,
                "rules": [
                    {"name": "claude", "when": {"model": "claude-*"}, "to": "official"},
                    {"name": "rest", "to": "pool"},
                ],
            }
        ],
    )
    assert resumes(resolve(cfg, facts(model))) is expected


def test_resume_is_off_without_a_route() -> None:
    cfg = config()
    assert resumes(resolve(cfg, facts("gpt-5"))) is False


# --- rule matching -------------------------------------------------------------------------


def when(**fields: Any) -> When:
    for name in ("input_tokens", "max_tokens", "tool_count"):
        if name in fields:
            fields[name] = parse_comparison(fields[name])
    return When(**fields)


@pytest.mark.parametrize(
    ("condition", "request_facts", "holds"),
    [
        (when(), facts(), True),
        (when(model=("claude-*",)), facts("claude-sonnet-4-5"), True),
        (when(model=("claude-*",)), facts("gpt-5"), False),
        (when(model=("claude-*",)), facts("Claude-sonnet"), False),
        (when(model=("gpt-?",)), facts("gpt-5"), True),
        (when(model=("gpt-[45]*",)), facts("gpt-4o"), True),
        (when(model=("gpt-[45]*",)), facts("gpt-3.5"), False),
        (when(model=("x", "gpt-5")), facts("gpt-5"), True),
        (when(client=("ci",)), facts(client="ci"), True),
        (when(client=("ci",)), facts(client="me"), False),
        (when(client=("ci",)), facts(client=None), False),
        (when(dialect=(Dialect.GEMINI, Dialect.OPENAI_CHAT)), facts(dialect=Dialect.GEMINI), True),
        (when(dialect=(Dialect.GEMINI,)), facts(dialect=Dialect.ANTHROPIC), False),
        (when(input_tokens=">200k"), facts(input_tokens=200_001), True),
        (when(input_tokens=">200k"), facts(input_tokens=200_000), False),
        (when(input_tokens=">=1.5m"), facts(input_tokens=1_500_000), True),
        (when(input_tokens="<1m"), facts(input_tokens=999_999), True),
        (when(max_tokens="<=4k"), facts(max_tokens=4_000), True),
        (when(max_tokens="<=4k"), facts(max_tokens=4_001), False),
        (when(max_tokens="<=4k"), facts(max_tokens=None), False),
        (when(tool_count="==3"), facts(tool_count=3), True),
        (when(tool_count="==3"), facts(tool_count=2), False),
        (when(tool_count="!=0"), facts(tool_count=0), False),
        (when(tools=True), facts(tools=True), True),
        (when(tools=True), facts(tools=False), False),
        (when(tools=False), facts(tools=False), True),
        (when(image=True), facts(image=True), True),
        (when(image=False), facts(image=True), False),
        (when(thinking=True), facts(thinking=False), False),
        (when(stream=False), facts(stream=False), True),
        (when(stream=True), facts(stream=False), False),
        (
            when(model=("claude-*",), thinking=True, input_tokens=">100k"),
            facts("claude-x", thinking=True, input_tokens=150_000),
            True,
        ),
        (
            when(model=("claude-*",), thinking=True, input_tokens=">100k"),
            facts("claude-x", thinking=False, input_tokens=150_000),
            False,
        ),
        (when(provider_would_be=("relay",)), facts(), False),
    ],
)
def test_when_holds(condition: When, request_facts: RequestFacts, holds: bool) -> None:
    assert when_holds(condition, request_facts) is holds


def test_provider_would_be_needs_the_hop() -> None:
    condition = when(provider_would_be=("relay", "any"))
    assert when_holds(condition, facts(), "relay")
    assert when_holds(condition, facts(), "any")
    assert not when_holds(condition, facts(), "official")
    assert not when_holds(condition, facts())


def test_conditions_written_in_yaml_shapes() -> None:
    cfg = one_route(
        {
            "name": "big",
            "when": {"input_tokens": ">200k", "tools": True, "dialect": "openai-chat"},
            "to": "any",
        }
    )
    big = facts(input_tokens=250_000, tools=True, dialect=Dialect.OPENAI_CHAT)
    assert resolve(cfg, big).rule == "big"
    assert resolve(cfg, facts(input_tokens=250_000, tools=True)).rule is None


# --- deciding and merging ------------------------------------------------------------------


def test_first_decider_wins_and_ends_the_reading() -> None:
    cfg = one_route(
        {"name": "early-set", "set": {"reasoning": "high"}},
        {"name": "gpt", "when": {"model": "gpt-*"}, "to": "relay"},
        {"name": "everything", "to": "any"},
        {"name": "late-set", "set": {"max_tokens": 5}},
    )
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.rule == "gpt" and decision.target is TargetKind.PROVIDER
    assert names(decision) == [("relay", "gpt-5")]
    assert decision.overrides == SetOverrides(reasoning=ReasoningLevel.HIGH)
    other = resolve(cfg, facts("claude-sonnet-4-5"))
    assert other.rule == "everything"
    assert names(other) == [("any", "claude-sonnet-4-5")]


def test_set_merges_top_to_bottom_field_by_field() -> None:
    cfg = one_route(
        {"name": "a", "set": {"reasoning": "high", "max_tokens": 100}},
        {"name": "b", "when": {"model": "nomatch"}, "set": {"max_tokens": 1}},
        {"name": "c", "when": {"model": "gpt-*"}, "set": {"max_tokens": 200}},
        {"name": "d", "set": {"model": "gpt-5"}, "to": "relay"},
    )
    decision = resolve(cfg, facts("gpt-4o"))
    assert decision.overrides == SetOverrides(
        model="gpt-5", max_tokens=200, reasoning=ReasoningLevel.HIGH
    )
    assert decision.model == "gpt-5"
    assert names(decision) == [("relay", "gpt-5")]
    assert decision.candidates[0].overrides == decision.overrides


def test_deny() -> None:
    cfg = one_route(
        {"name": "cap", "set": {"max_tokens": 10}},
        {"name": "no-images", "when": {"image": True}, "deny": "images are not allowed"},
        {"name": "rest", "to": "any"},
    )
    decision = resolve(cfg, facts(image=True))
    assert decision.denied and decision.deny_message == "images are not allowed"
    assert decision.rule == "no-images" and decision.target is None
    assert decision.candidates == () and decision.skipped == ()
    assert not resolve(cfg, facts(image=False)).denied


def test_deny_true_has_a_message() -> None:
    decision = resolve(one_route({"name": "closed", "deny": True}), facts())
    assert decision.denied and decision.deny_message == "denied by rule 'closed'"


def test_set_only_rule_with_stop_ends_the_reading() -> None:
    cfg = one_route(
        {
            "name": "small",
            "when": {"max_tokens": "<1k"},
            "set": {"reasoning": "off"},
            "on_match": "stop",
        },
        {"name": "to-relay", "to": "relay"},
    )
    stopped = resolve(cfg, facts(max_tokens=500))
    assert stopped.rule == "small" and stopped.target is TargetKind.ALL
    assert stopped.overrides.reasoning is ReasoningLevel.OFF
    assert names(stopped) == [("relay", "gpt-5"), ("any", "gpt-5")]
    assert resolve(cfg, facts(max_tokens=5000)).rule == "to-relay"


# --- targets -------------------------------------------------------------------------------


def test_group_target_keeps_declared_order_and_weights() -> None:
    cfg = one_route(
        {"name": "lb", "to": "mix"},
        groups=[
            {
                "name": "mix",
                "type": "load-balance",
                "balance_by": "latency",
                "providers": ["any", {"name": "relay", "weight": 7}, "official"],
            }
        ],
    )
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.target is TargetKind.GROUP and decision.group == "mix"
    assert decision.group_type is GroupType.LOAD_BALANCE
    assert decision.balance_by is BalanceBy.LATENCY
    assert decision.candidates == (
        Candidate(provider="any", model="gpt-5", weight=1),
        Candidate(provider="relay", model="gpt-5", weight=7),
    )
    assert [s.provider for s in decision.skipped] == ["official"]


def test_select_group_carries_selected() -> None:
    cfg = one_route(
        {"name": "pick", "to": "sel"},
        groups=[
            {"name": "sel", "type": "select", "providers": ["relay", "any"], "selected": "any"}
        ],
    )
    decision = resolve(cfg, facts())
    assert decision.group_type is GroupType.SELECT and decision.selected == "any"
    assert names(decision) == [("relay", "gpt-5"), ("any", "gpt-5")]


def test_all_target() -> None:
    decision = resolve(one_route({"name": "all", "to": "__all__"}), facts("claude-opus-4-1"))
    assert decision.rule == "all" and decision.target is TargetKind.ALL
    assert names(decision) == [("official", "claude-opus-4-1"), ("any", "claude-opus-4-1")]


def test_single_upstream_target_can_be_skipped() -> None:
    decision = resolve(one_route({"name": "one", "to": "official"}), facts("gpt-5"))
    assert decision.candidates == ()
    assert decision.skipped == (
        Skipped(provider="official", model="gpt-5", reason=SkipReason.MODEL_NOT_OFFERED),
    )
    assert not decision.denied


def test_pinned_targets_send_their_own_model() -> None:
    cfg = one_route(
        {"name": "rewrite", "set": {"model": "gpt-5"}},
        {
            "name": "pin",
            "to": [
                {"provider": "relay", "model": "sonnet"},
                {"provider": "official", "model": "claude-opus-4-1"},
            ],
        },
        aliases={"sonnet": ["claude-sonnet-4-5", "anthropic/claude-sonnet-4.5"]},
    )
    decision = resolve(cfg, facts("whatever"))
    assert decision.target is TargetKind.PINNED
    # (An upstream pinned twice is refused at load: engine.pinned_upstream_twice.)
    assert names(decision) == [
        ("relay", "anthropic/claude-sonnet-4.5"),
        ("official", "claude-opus-4-1"),
    ]


# --- aliases and model lists ----------------------------------------------------------------


def test_alias_gives_each_upstream_the_first_name_it_offers() -> None:
    cfg = config(aliases={"sonnet": ["claude-sonnet-4-5", "anthropic/claude-sonnet-4.5"]})
    decision = resolve(cfg, facts("sonnet"))
    assert names(decision) == [
        ("official", "claude-sonnet-4-5"),
        ("relay", "anthropic/claude-sonnet-4.5"),
        ("any", "claude-sonnet-4-5"),
    ]
    assert decision.model == "sonnet"


def test_alias_not_offered_is_skipped() -> None:
    cfg = config(aliases={"opus": "claude-opus-4-1"})
    decision = resolve(cfg, facts("opus"))
    assert names(decision) == [("official", "claude-opus-4-1"), ("any", "claude-opus-4-1")]
    assert decision.skipped == (
        Skipped(provider="relay", model="opus", reason=SkipReason.MODEL_NOT_OFFERED),
    )


def test_set_model_may_be_an_alias() -> None:
    cfg = one_route(
        {"name": "upgrade", "when": {"model": "claude-3*"}, "set": {"model": "sonnet"}},
        aliases={"sonnet": ["claude-sonnet-4-5", "anthropic/claude-sonnet-4.5"]},
    )
    decision = resolve(cfg, facts("claude-3-5-sonnet"))
    assert decision.model == "sonnet"
    assert names(decision) == [
        ("official", "claude-sonnet-4-5"),
        ("relay", "anthropic/claude-sonnet-4.5"),
        ("any", "claude-sonnet-4-5"),
    ]


def test_upstream_without_a_list_is_always_kept() -> None:
    decision = resolve(config(), facts("totally-unknown"))
    assert names(decision) == [("any", "totally-unknown")]
    assert [s.provider for s in decision.skipped] == ["official", "relay"]


# --- per-hop rules -------------------------------------------------------------------------

HOP_RULES = (
    {
        "name": "relay-low",
        "when": {"provider_would_be": "relay"},
        "set": {"reasoning": "low", "max_tokens": 64},
        "on_match": "continue",
    },
    {"name": "everyone-high", "set": {"reasoning": "high"}},
    {
        "name": "any-rename",
        "when": {"provider_would_be": ["any"], "model": "gpt-*"},
        "set": {"model": "gpt-5-any"},
        "on_match": "continue",
    },
    {"name": "go", "to": "__all__"},
    {
        "name": "after-decider",
        "when": {"provider_would_be": "relay"},
        "set": {"max_tokens": 1},
        "on_match": "continue",
    },
)


def test_hop_rules_are_left_out_of_the_decision() -> None:
    cfg = one_route(*HOP_RULES)
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.rule == "go"
    assert decision.overrides == SetOverrides(reasoning=ReasoningLevel.HIGH)


def test_hop_overrides_merge_in_rule_order() -> None:
    cfg = one_route(*HOP_RULES)
    route = cfg.route("default")
    # relay-low comes first, so everyone-high overrides its reasoning; the rule after the
    # decider is never reached.
    assert hop_overrides(route, facts("gpt-5"), "relay") == SetOverrides(
        max_tokens=64, reasoning=ReasoningLevel.HIGH
    )
    assert hop_overrides(route, facts("gpt-5"), "official") == SetOverrides(
        reasoning=ReasoningLevel.HIGH
    )
    assert hop_overrides(route, facts("gpt-5"), "any") == SetOverrides(
        model="gpt-5-any", reasoning=ReasoningLevel.HIGH
    )
    assert hop_overrides(route, facts("claude-x"), "any") == SetOverrides(
        reasoning=ReasoningLevel.HIGH
    )
    assert hop_overrides(None, facts(), "relay") == SetOverrides()


def test_candidates_carry_their_hop_overrides_and_model() -> None:
    cfg = one_route(*HOP_RULES)
    decision = resolve(cfg, facts("gpt-5"))
    assert decision.candidates == (
        Candidate(
            provider="relay",
            model="gpt-5",
            overrides=SetOverrides(max_tokens=64, reasoning=ReasoningLevel.HIGH),
        ),
        Candidate(
            provider="any",
            model="gpt-5-any",
            overrides=SetOverrides(model="gpt-5-any", reasoning=ReasoningLevel.HIGH),
        ),
    )


def test_hop_rewrite_can_make_an_upstream_eligible() -> None:
    cfg = one_route(
        {
            "name": "official-name",
            "when": {"provider_would_be": "official", "model": "sonnet-latest"},
            "set": {"model": "claude-sonnet-4-5"},
            "on_match": "continue",
        },
    )
    decision = resolve(cfg, facts("sonnet-latest"))
    assert names(decision) == [("official", "claude-sonnet-4-5"), ("any", "sonnet-latest")]
    assert [s.provider for s in decision.skipped] == ["relay"]


# --- invariants ----------------------------------------------------------------------------

MODELS = ["gpt-5", "claude-sonnet-4-5", "sonnet", "anthropic/claude-sonnet-4.5", "x"]


@given(
    model=st.sampled_from(MODELS),
    tokens=st.integers(min_value=0, max_value=3_000_000),
    image=st.booleans(),
)
def test_every_member_is_a_candidate_or_skipped(model: str, tokens: int, image: bool) -> None:
    decision = resolve(_PROPERTY_CONFIG, facts(model, input_tokens=tokens, image=image))
    if decision.denied:
        assert image and decision.candidates == ()
        return
    tried = [c.provider for c in decision.candidates] + [s.provider for s in decision.skipped]
    if decision.group == "mix":
        assert sorted(tried) == sorted(["relay", "any", "official"])
    else:
        assert sorted(tried) == sorted(p["name"] for p in PROVIDERS)
    for candidate in decision.candidates:
        provider = _PROPERTY_CONFIG.provider(candidate.provider)
        assert provider.models is None or candidate.model in provider.models


_PROPERTY_CONFIG = one_route(
    {"name": "no-images", "when": {"image": True}, "deny": True},
    {"name": "long", "when": {"input_tokens": ">1m"}, "to": "mix"},
    groups=[{"name": "mix", "providers": ["relay", "any", "official"]}],
    aliases={"sonnet": ["claude-sonnet-4-5", "anthropic/claude-sonnet-4.5"]},
)


# --- remembered decisions ------------------------------------------------------------------


def test_decisions_are_remembered_per_key_and_model_without_rules() -> None:
    cfg = config(
        routes=[{"name": "own", "rules": []}],
        clients=[{"name": "a", "key": "k1", "route": "own"}, {"name": "b", "key": "k2"}],
    )
    decisions = Decisions(cfg)
    first = decisions.resolve(facts("gpt-5", client="a", input_tokens=10))
    # Another request of the same key and model: the same decision, not walked again.
    again = decisions.resolve(facts("gpt-5", client="a", input_tokens=99_999, tools=True))
    assert again is first and first == resolve(cfg, facts("gpt-5", client="a"))
    assert first.route == "own"
    other_key = decisions.resolve(facts("gpt-5", client="b"))
    assert other_key.route is None and other_key == resolve(cfg, facts("gpt-5", client="b"))
    claude = decisions.resolve(facts("claude-sonnet-4-5", client="a"))
    assert names(claude) == [("official", "claude-sonnet-4-5"), ("any", "claude-sonnet-4-5")]


def test_a_route_with_rules_is_read_for_every_request() -> None:
    cfg = one_route({"name": "big", "when": {"input_tokens": "> 1000"}, "to": "official"})
    decisions = Decisions(cfg)
    small = decisions.resolve(facts("claude-sonnet-4-5", input_tokens=10))
    big = decisions.resolve(facts("claude-sonnet-4-5", input_tokens=5000))
    assert small.rule is None and big.rule == "big"
    assert names(big) == [("official", "claude-sonnet-4-5")]
    assert decisions.resolve(facts("claude-sonnet-4-5", input_tokens=10)) == small


def test_a_reloaded_config_is_not_answered_from_the_old_decisions() -> None:
    router = Router(config())
    assert names(router.plan(facts("gpt-5"), now=0.0).decision) == [
        ("relay", "gpt-5"),
        ("any", "gpt-5"),
    ]
    reloaded = build_config({"version": 1, "providers": PROVIDERS[:2]})  # "any" is gone
    router.configure(reloaded)
    assert names(router.plan(facts("gpt-5"), now=1.0).decision) == [("relay", "gpt-5")]
