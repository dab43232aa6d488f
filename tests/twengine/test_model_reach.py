"""Which models a key's listing shows: those its route can reach (`may_reach`, `answer_models`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.admission import LocalAnswer, Refusal
from twengine.config import Config, build_config
from twengine.model_listing import answer_models
from twengine.rules import RequestFacts, may_reach, resolve
from twproto.dialect import Dialect
from twproto.paths import match_path

PROVIDERS: list[dict[str, Any]] = [
    {"name": "official", "base_url": "https://api.anthropic.com", "models": ["claude-a", "shared"]},
    {"name": "relay", "base_url": "https://relay.example/v1", "models": ["gpt-b", "shared"]},
    {"name": "other", "base_url": "https://other.example/v1", "models": ["gpt-c"]},
]
CLIENTS = [
    {"name": "wide", "key": "k-wide"},
    {"name": "narrow", "key": "k-narrow", "route": "narrow"},
]
ROUTES = [
    {
        "name": "narrow",
        "rules": [
            {"name": "no-shared", "when": {"model": "shared"}, "deny": True},
            {"name": "big-to-other", "when": {"input_tokens": ">100k"}, "to": "other"},
            {"name": "only-relay", "to": "relay"},
        ],
    }
]
ALL = frozenset(Dialect)


def config(**sections: Any) -> Config:
    base: dict[str, Any] = {"version": 1, "providers": PROVIDERS, "clients": CLIENTS}
    return build_config({**base, **sections}, {})


def body(cfg: Config, client: str, dialect: Dialect, path: str = "/v1/models") -> Any:
    route = match_path("GET", path)
    assert route is not None
    answer = answer_models(cfg, route, dialect, client=client)
    assert isinstance(answer, LocalAnswer)
    return json.loads(answer.body)


def listed(cfg: Config, client: str) -> list[str]:
    return [m["id"] for m in body(cfg, client, Dialect.OPENAI_CHAT)["data"]]


def test_a_key_lists_only_what_its_route_reaches() -> None:
    cfg = config(routes=ROUTES, aliases={"fast": ["claude-a", "gpt-b"]})
    assert listed(cfg, "wide") == ["claude-a", "shared", "gpt-b", "gpt-c", "fast"]
    # Denied (shared), or offered only by an upstream the route never sends to (claude-a); a
    # big request goes to `other`, so gpt-c is reachable; the alias reaches gpt-b on relay.
    assert listed(cfg, "narrow") == ["gpt-b", "gpt-c", "fast"]


def test_a_model_the_route_cannot_reach_is_not_found() -> None:
    cfg = config(routes=ROUTES)
    route = match_path("GET", "/v1/models/claude-a")
    assert route is not None
    refused = answer_models(cfg, route, Dialect.OPENAI_CHAT, client="narrow")
    assert isinstance(refused, Refusal) and refused.error.status == 404
    found = body(cfg, "wide", Dialect.OPENAI_CHAT, "/v1/models/claude-a")
    assert found["id"] == "claude-a"


def test_conditions_on_the_request_are_read_both_ways() -> None:
    rules = [
        {"name": "no-thinking", "when": {"thinking": True}, "deny": True},
        {"name": "claude-stays", "when": {"model": "claude-*", "stream": True}, "to": "official"},
        {"name": "rest", "to": "relay"},
    ]
    cfg = config(routes=[{"name": "narrow", "rules": rules}])
    # claude-a: denied with thinking, refused by relay without streaming, but a streamed
    # request without thinking goes to `official`.
    assert listed(cfg, "narrow") == ["claude-a", "shared", "gpt-b"]


def test_dialect_conditions_follow_the_listing_s_format() -> None:
    rules = [
        {"name": "anthropic-official", "when": {"dialect": "anthropic"}, "to": "official"},
        {"name": "responses-other", "when": {"dialect": "openai-responses"}, "to": "other"},
        {"name": "rest", "deny": True},
    ]
    cfg = config(routes=[{"name": "narrow", "rules": rules}])
    for dialect, expected in (
        (Dialect.ANTHROPIC, ["claude-a", "shared"]),
        # OpenAI's listing serves Chat and Responses clients: what Responses reaches.
        (Dialect.OPENAI_CHAT, ["gpt-c"]),
        (Dialect.GEMINI, []),
    ):
        answer = body(cfg, "narrow", dialect)
        models = answer.get("data", answer.get("models", []))
        ids = [m.get("id") or m["name"].removeprefix("models/") for m in models]
        assert ids == expected, dialect


def test_per_hop_rewrites_make_an_upstream_offer_the_model() -> None:
    rules = [
        {
            "name": "relay-rename",
            "when": {"provider_would_be": "relay", "model": "claude-a"},
            "set": {"model": "gpt-b"},
            "on_match": "continue",
        },
        {"name": "only-relay", "to": "relay"},
    ]
    cfg = config(routes=[{"name": "narrow", "rules": rules}])
    assert may_reach(cfg, "narrow", ALL, "claude-a")
    assert not may_reach(cfg, "narrow", ALL, "gpt-c")


_FACTS = st.builds(
    RequestFacts,
    model=st.sampled_from(["claude-a", "shared", "gpt-b", "gpt-c", "fast", "nope"]),
    dialect=st.sampled_from(list(Dialect)),
    client=st.sampled_from(["wide", "narrow"]),
    input_tokens=st.sampled_from([0, 100_000, 100_001]),
    max_tokens=st.sampled_from([None, 10, 5000]),
    tool_count=st.sampled_from([0, 3]),
    image=st.booleans(),
    thinking=st.booleans(),
    stream=st.booleans(),
)
_RULES = st.lists(
    st.fixed_dictionaries(
        {
            "when": st.dictionaries(
                st.sampled_from(
                    ["model", "thinking", "stream", "input_tokens", "dialect", "image"]
                ),
                st.just(None),
                max_size=2,
            )
        },
        optional={
            "to": st.sampled_from(["official", "relay", "other"]),
            "deny": st.just(True),
            "set": st.fixed_dictionaries({"model": st.sampled_from(["gpt-b", "claude-a"])}),
        },
    ),
    max_size=4,
)
_VALUES: dict[str, Any] = {
    "model": st.sampled_from(["claude-*", "gpt-?", "shared", "fast"]),
    "thinking": st.booleans(),
    "stream": st.booleans(),
    "image": st.booleans(),
    "input_tokens": st.sampled_from([">100k", "<=100k"]),
    "dialect": st.sampled_from([d.value for d in Dialect]),
}


@settings(max_examples=150, deadline=None)
@given(rules=_RULES, facts=st.lists(_FACTS, min_size=1, max_size=8), data=st.data())
def test_every_model_a_request_reaches_is_listed(
    rules: list[dict[str, Any]], facts: list[RequestFacts], data: st.DataObject
) -> None:
    # Random routes of random rules, each request's decision against the listing.
    written = []
    for n, rule in enumerate(rules):
        if "to" in rule and "deny" in rule:
            del rule["deny"]
        if not ({"to", "deny", "set"} & set(rule)):
            rule["deny"] = True
        when = {key: data.draw(_VALUES[key]) for key in rule["when"]}
        written.append({**rule, "name": f"r{n}", "when": when})
    cfg = config(
        routes=[{"name": "narrow", "rules": written}], aliases={"fast": ["claude-a", "gpt-b"]}
    )
    for fact in facts:
        fact = dataclasses.replace(fact, tools=fact.tool_count > 0)
        decision = resolve(cfg, fact)
        if decision.candidates and not decision.denied:
            assert may_reach(cfg, fact.client, frozenset({fact.dialect}), fact.model), (
                written,
                fact,
            )
