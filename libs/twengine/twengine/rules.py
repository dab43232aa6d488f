"""The routing rules: from what a request asks to the upstreams it may try.

docs/configuration.md ("`routes`, `default_route`") describes the rules this module reads.

Which route
    A request follows its gateway key's ``route``, else ``default_route``, else the route named
    ``default``. With none of these it goes to every upstream in declared order, exactly as if
    a rule had said ``to: __all__``.

Reading the rules
    A route's rules are read top to bottom. Every rule whose ``when`` holds contributes its
    ``set``, field by field, with later rules overriding earlier ones. The first matching rule
    with ``to`` or ``deny`` decides and ends the reading; so does a set-only rule written with
    ``on_match: stop``. If no rule decides, the request goes to every upstream, so a route only
    has to spell out its exceptions. A deny decision has no candidates; twserve answers 403
    (``gw.rule.denied``) with the rule's message.

Per-hop rules
    A rule with ``when.provider_would_be`` cannot be judged before an upstream is picked, so it
    is left out of the decision and judged for each upstream as it is tried (failover and
    retries included). `hop_overrides` reads the route again for one upstream, this time with
    those rules in their place among the others, and returns the overrides that hop uses. Such
    rules may only ``set`` (checked at load), so the decision itself never depends on the hop.

Candidates
    The deciding target names the members in declared order: one upstream, a group's members
    with their weights, every upstream, or pinned ``(upstream, model)`` pairs. Each member is
    asked for the model the client sent, or the one ``set.model`` rewrote it to — per hop, since
    a per-hop rule may rewrite it for one upstream. An alias is resolved per upstream: it
    receives the first of the alias's names it offers, and one without a model list receives the
    first name. A member that offers none of the names is skipped and the skip recorded, so the
    request row can say why an upstream was not tried; a member without a list is kept (if it
    answers 404 the request moves on without blaming it). A pinned pair sends its own model and
    is not rewritten by ``set.model``.

What this module does not do
    Ordering members by strategy (fallback, select, load-balance, url-test, cheapest), health,
    pauses and slots belong to the group and balance modules. The decision carries the group's
    type, ``balance_by`` and ``selected`` for them, and keeps members in declared order.

Remembered decisions
    Under a route without rules (or no route), the decision depends on nothing of the request
    but its key (which route) and its model. `Decisions` keeps those decisions for one config,
    so that a request does not walk every upstream's model list again; a reload makes a new
    `Decisions`. A route with rules is read for every request.

Model globs are matched case-sensitively with `fnmatch.fnmatchcase`, the same on every
platform.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase

from twengine.config.model import (
    ALL_UPSTREAMS,
    BalanceBy,
    Config,
    GroupType,
    RouteConfig,
    RoutingRule,
    SetOverrides,
    Target,
    TargetKind,
    When,
)
from twproto.dialect import Dialect

__all__ = (
    "Candidate",
    "Decisions",
    "RequestFacts",
    "RoutingDecision",
    "SkipReason",
    "Skipped",
    "hop_overrides",
    "may_reach",
    "resolve",
    "resumes",
    "route_for",
    "when_holds",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFacts:
    """What routing may look at in a request.

    `model` is the model the client asked for; `client` the gateway key's name (None when the
    request has none); `input_tokens` an estimate; `max_tokens` None when the client sent none;
    `tools` whether the request defines tools and `tool_count` how many; `image` whether any
    message holds an image; `thinking` whether reasoning is on.
    """

    model: str
    dialect: Dialect
    client: str | None = None
    input_tokens: int = 0
    max_tokens: int | None = None
    tool_count: int = 0
    tools: bool = False
    image: bool = False
    thinking: bool = False
    stream: bool = False


class SkipReason(StrEnum):
    MODEL_NOT_OFFERED = "model_not_offered"


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A member that may be tried: the upstream, the model it receives, its group weight, and
    the overrides that apply when this upstream is the hop (per-hop rules included)."""

    provider: str
    model: str
    weight: int = 1
    overrides: SetOverrides = field(default_factory=SetOverrides)


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    """A member left out before any attempt, with the model it was asked for and why."""

    provider: str
    model: str
    reason: SkipReason


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingDecision:
    """Where a request may go, before strategy, health and slots are considered.

    `route` and `rule` are None when no route applies or no rule decided. `target` is None for
    a deny. `model` is the model asked for after the request-level ``set.model`` (possibly an
    alias); each candidate's `model` is what that upstream receives. `overrides` are the
    request-level overrides; a candidate's own `overrides` add its per-hop rules.
    """

    route: str | None
    rule: str | None
    model: str
    denied: bool = False
    deny_message: str | None = None
    target: TargetKind | None = TargetKind.ALL
    group: str | None = None
    group_type: GroupType = GroupType.FALLBACK
    balance_by: BalanceBy = BalanceBy.WEIGHTS
    selected: str | None = None
    candidates: tuple[Candidate, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    overrides: SetOverrides = field(default_factory=SetOverrides)
    # A broken stream is continued on the next candidate: the route or the target group says
    # ``resume: true`` (docs/failover.md, "Resuming a broken stream").
    resume: bool = False


def resumes(decision: RoutingDecision) -> bool:
    """Whether a broken stream of a request routed by `decision` is continued on the next
    candidate (its route's or target group's ``resume``, as the config that routed it said)."""
    return decision.resume


def route_for(config: Config, client: str | None) -> RouteConfig | None:
    """The route a request from gateway key `client` follows, or None for every upstream."""
    if client is not None and config.has_client(client):
        own = config.client(client).route
        if own is not None:
            return config.route(own)
    if config.default_route is not None:
        return config.route(config.default_route)
    if config.has_route("default"):
        return config.route("default")
    return None


def when_holds(when: When, facts: RequestFacts, provider: str | None = None) -> bool:
    """Whether every condition of `when` holds for `facts`.

    `provider` is the upstream of the hop being judged; a ``provider_would_be`` condition never
    holds without one. A ``max_tokens`` comparison does not hold for a request without
    max_tokens.
    """
    if when.model and not any(fnmatchcase(facts.model, pattern) for pattern in when.model):
        return False
    if when.client and facts.client not in when.client:
        return False
    if when.dialect and facts.dialect not in when.dialect:
        return False
    if when.input_tokens is not None and not when.input_tokens.holds(facts.input_tokens):
        return False
    if when.max_tokens is not None and (
        facts.max_tokens is None or not when.max_tokens.holds(facts.max_tokens)
    ):
        return False
    if when.tool_count is not None and not when.tool_count.holds(facts.tool_count):
        return False
    for wanted, actual in (
        (when.tools, facts.tools),
        (when.image, facts.image),
        (when.thinking, facts.thinking),
        (when.stream, facts.stream),
    ):
        if wanted is not None and wanted != actual:
            return False
    return not when.provider_would_be or (
        provider is not None and provider in when.provider_would_be
    )


def _read(
    route: RouteConfig | None, facts: RequestFacts, provider: str | None
) -> tuple[SetOverrides, RoutingRule | None]:
    # One reading of the rules. Without `provider`, per-hop rules are passed over (the
    # decision); with it, they count where they stand (one hop).
    merged = SetOverrides()
    if route is None:
        return merged, None
    for rule in route.rules:
        if rule.when.per_hop and provider is None:
            continue
        if not when_holds(rule.when, facts, provider):
            continue
        merged = merged.merged(rule.overrides)
        if rule.stops:
            return merged, rule
    return merged, None


def hop_overrides(
    route: RouteConfig | None, facts: RequestFacts, provider_name: str
) -> SetOverrides:
    """The overrides in force when the request is sent to `provider_name`: the request-level
    ones with the per-hop rules for that upstream merged in their place."""
    return _read(route, facts, provider_name)[0]


def _members(config: Config, target: Target) -> list[tuple[str, int, str | None]]:
    # (upstream, weight, pinned model) in declared order.
    if target.kind is TargetKind.PINNED:
        return [(pin.provider, 1, pin.model) for pin in target.pinned]
    if target.kind is TargetKind.ALL or target.name in (None, ALL_UPSTREAMS):
        return [(p.name, 1, None) for p in config.providers]
    assert target.name is not None
    if target.kind is TargetKind.GROUP:
        return [(m.provider, m.weight, None) for m in config.group(target.name).members]
    return [(target.name, 1, None)]


def resolve(config: Config, facts: RequestFacts) -> RoutingDecision:
    """Route one request: the route and rule that apply, and its candidates in declared order.

    Members that cannot serve the model are in `skipped`; an empty `candidates` with no deny
    means no upstream can take the request (``gw.no_upstream``).
    """
    route = route_for(config, facts.client)
    merged, decider = _read(route, facts, None)
    route_name = route.name if route is not None else None
    rule_name = decider.name if decider is not None else None
    asked = merged.model or facts.model
    if decider is not None and decider.deny is not None:
        return RoutingDecision(
            route=route_name,
            rule=rule_name,
            model=asked,
            denied=True,
            deny_message=decider.deny,
            target=None,
            overrides=merged,
        )
    target = (
        decider.to
        if decider is not None and decider.to is not None
        else Target(kind=TargetKind.ALL)
    )
    per_hop = route is not None and any(rule.when.per_hop for rule in route.rules)
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    for provider, weight, pinned in _members(config, target):
        hop = hop_overrides(route, facts, provider) if per_hop else merged
        wanted = pinned or hop.model or facts.model
        sent = config.model_for(provider, wanted)
        if sent is None:
            skipped.append(
                Skipped(provider=provider, model=wanted, reason=SkipReason.MODEL_NOT_OFFERED)
            )
            continue
        candidates.append(Candidate(provider=provider, model=sent, weight=weight, overrides=hop))
    group = config.group(target.name) if target.kind is TargetKind.GROUP and target.name else None
    return RoutingDecision(
        route=route_name,
        rule=rule_name,
        model=asked,
        target=target.kind,
        group=group.name if group is not None else None,
        group_type=group.type if group is not None else GroupType.FALLBACK,
        balance_by=group.balance_by if group is not None else BalanceBy.WEIGHTS,
        selected=group.selected if group is not None else None,
        candidates=tuple(candidates),
        skipped=tuple(skipped),
        overrides=merged,
        resume=(route is not None and route.resume) or (group is not None and group.resume),
    )


def may_reach(config: Config, client: str | None, dialects: frozenset[Dialect], model: str) -> bool:
    """Whether a request of gateway key `client` in one of `dialects` asking for `model` can
    have a candidate: what a model listing shows that key (twengine.model_listing).

    The rules are read as `resolve` reads them, with the conditions that depend on the rest of
    the request (tokens, tools, images, thinking, stream) taken both ways, so a model counts
    when some request for it would get an upstream: a deny, or members that all lack the model,
    on every way of reading leave it out. A per-hop ``set.model`` counts for its upstream.
    """
    route = route_for(config, client)
    rules = [r for r in route.rules if not r.when.per_hop] if route is not None else []
    # A route whose conditions branch more than this is taken to reach the model.
    budget = [256]

    def offered(target: Target, rewritten: str | None) -> bool:
        for provider, _, pinned in _members(config, target):
            names = {pinned or rewritten or model}
            if route is not None and pinned is None:
                names.update(
                    r.overrides.model
                    for r in route.rules
                    if r.overrides.model is not None
                    and provider in r.when.provider_would_be
                    and _holds_for(r.when, client, dialects, model) is not False
                )
            if any(config.model_for(provider, name) is not None for name in names):
                return True
        return False

    def read(start: int, rewritten: str | None) -> bool:
        for n in range(start, len(rules)):
            rule = rules[n]
            holds = _holds_for(rule.when, client, dialects, model)
            if holds is False:
                continue
            if holds is None:  # this rule may not match: read on without it too
                budget[0] -= 1
                if budget[0] < 0 or read(n + 1, rewritten):
                    return True
            if rule.overrides.model is not None:
                rewritten = rule.overrides.model
            if rule.stops:
                if rule.deny is not None:
                    return False
                return offered(rule.to or Target(kind=TargetKind.ALL), rewritten)
        return offered(Target(kind=TargetKind.ALL), rewritten)

    return read(0, None)


def _holds_for(
    when: When, client: str | None, dialects: frozenset[Dialect], model: str
) -> bool | None:
    """Whether `when` (per-hop conditions aside) holds for every request of `client` in
    `dialects` for `model` (True), for none (False), or depends on the request (None)."""
    if when.model and not any(fnmatchcase(model, pattern) for pattern in when.model):
        return False
    if when.client and client not in when.client:
        return False
    if when.dialect:
        matching = dialects.intersection(when.dialect)
        if not matching:
            return False
        if matching != dialects:  # some of the formats match
            return None
    request_dependent = (
        when.input_tokens,
        when.max_tokens,
        when.tool_count,
        when.tools,
        when.image,
        when.thinking,
        when.stream,
    )
    if any(condition is not None for condition in request_dependent):
        return None
    return True


class Decisions:
    """`resolve` for one config, remembered per (key, model) where the route has no rules
    (see the module notes)."""

    __slots__ = ("_memo", "config")

    # Model names come from clients: the memo stops growing here (later ones are resolved).
    LIMIT = 10_000

    def __init__(self, config: Config) -> None:
        self.config = config
        self._memo: dict[tuple[str | None, str], RoutingDecision] = {}

    def resolve(self, facts: RequestFacts) -> RoutingDecision:
        route = route_for(self.config, facts.client)
        if route is not None and route.rules:
            return resolve(self.config, facts)
        key = (facts.client, facts.model)
        decision = self._memo.get(key)
        if decision is None:
            decision = resolve(self.config, facts)
            if len(self._memo) < self.LIMIT:
                self._memo[key] = decision
        return decision
