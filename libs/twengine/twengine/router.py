"""The router: per-process routing state, and the ordered candidates of each request.

Theory of operation
-------------------
`twengine.rules.resolve` says where a request *may* go: the rule, the group, the members that
offer the model, in declared order. This module decides the *order* in which they are asked, and
keeps the state that order depends on across requests: one smooth weighted round-robin per
``load-balance`` group, upstream health (`Health`), slots (`Slots`) and conversation affinity
(`Affinity`). twserve keeps one `Router` per process, asks it for a `RoutePlan` per request,
hands the plan's candidates to the attempt machine, and reports every outcome back here — the
router is the one place the relay talks to about routing state.

A plan, step by step (`Router.plan`):

1. **The turn's decision.** A request that continues a turn of a known conversation reuses the
   decision made at the turn's start — rule, group, rewrites and candidates — so a rule on ``tools``
   or ``input_tokens`` does not flip between the requests of one turn (docs/balancing.md,
   "Conversations and affinity"). The decision is made afresh at every new turn; when the input
   reaches 90% of the smallest context window among the held candidates; when the request names
   another model or comes from another key than the one decided for; and after a reload that changed
   what routing reads (upstreams' model lists, aliases, groups, routes, keys' routes). Denials and
   decisions without candidates are never held: nothing was sent, so there is no turn to keep.
2. **Sitting out.** Candidates paused at ``now`` and those without a free slot sit out of
   balancing; when every candidate sits out, all take part.
3. **Sticky upstream.** With a conversation, `Affinity.sticky_upstream` names the upstream that
   last answered it: within a turn always, across turns while its prompt cache is warm, never a
   paused one or one not among the candidates.
4. **Strategy.** ``fallback`` (and any target that is not a group) keeps declared order;
   ``select`` puts the selected member first; ``url-test`` ranks by first-content median (the
   connection test timed at startup until an upstream has three samples); ``cheapest`` by the
   requested model's input price; ``load-balance`` puts the member smooth weighted round-robin
   picks first, the rest by effective weight. A sticky request does not take a turn: it is
   *counted* toward its upstream's share (`SmoothWeightedRoundRobin.count`), so load-balance
   takes turns between new conversations only and a weight stays the long-run share of all
   requests. The balancer steps over the group's full member list (members that do not offer
   this model sit out), so requests for different models share one set of turns.
5. **Order.** The sticky upstream first; then, in strategy order, candidates neither paused nor
   full, then full ones, then paused ones. Nobody is dropped: a single candidate is never held
   back, and when every candidate is paused they are all tried. The plan names the paused and
   full candidates so the attempt machine and the request record can say why.

Dry-run (`Router.dryrun`) runs the same steps without moving anything: the balancer is asked
with ``peek`` instead of ``pick``, nothing is counted and no turn is recorded. Its `next` is
therefore exactly the first candidate of a `plan` made with the same arguments at the same
``now`` — the property the tests check over long runs.

Reload (`Router.configure`) keeps what still applies: a ``load-balance`` group whose members
and weights are unchanged keeps its balancer's current weights; health, samples and pauses of
upstreams still configured carry over; slots keep their holders under the new limits (a raised
limit may grant waiting requests, which `configure` returns).

Figures the config does not hold — the shipped price table, context windows beyond
``model_specs`` — come through a `twengine.catalog.Catalog`; `ConfigCatalog` reads only the
config.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from twengine.affinity import Affinity
from twengine.attempt.actions import CandidateRef
from twengine.balance import (
    SmoothWeightedRoundRobin,
    balance_factors,
    effective_weights,
    take_part,
)
from twengine.catalog import Catalog, ConfigCatalog
from twengine.config.model import (
    BalanceBy,
    Config,
    Failover,
    GroupMember,
    GroupType,
)
from twengine.dryrun import DryRunCandidate, DryRunReport, DryRunSkip
from twengine.groups import URL_TEST_MIN_SAMPLES, order_members, url_test_latency
from twengine.health import Health, HealthSettings, PauseChanged
from twengine.rules import Candidate, Decisions, RequestFacts, RoutingDecision, Skipped
from twengine.slots import Grant, Slots
from twproto.failures import Failure

__all__ = (
    "Balance",
    "MemberBalance",
    "RoutePlan",
    "Router",
    "health_settings",
)


def health_settings(failover: Failover) -> HealthSettings:
    """The health thresholds of a config's ``failover`` section (sample windows are fixed)."""
    return HealthSettings(
        failures_to_pause=failover.failures_to_pause,
        pause_secs=failover.pause_secs,
        max_pause_secs=failover.max_pause_secs,
        no_balance_pause_secs=failover.no_balance_pause_secs,
        quota_pause_secs=failover.quota_pause_secs,
        rate_limit_max_pause_secs=failover.rate_limit_max_pause_secs,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberBalance:
    """One ``load-balance`` member as the balancer saw it: configured weight, balance factor,
    ``weight × factor``, and whether it took part (not sitting out, and offering the model)."""

    provider: str
    weight: int
    factor: float
    effective_weight: float
    taking_part: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Balance:
    """How a ``load-balance`` group chose.

    `lead` is the member that took this request's turn: the balancer's pick for a new
    conversation, or the sticky upstream. `counted` says whether a sticky request was counted
    toward its upstream's share (False: it was already `max_lead` requests ahead); None for a
    pick, and for a dry-run, which moves nothing.
    """

    balance_by: BalanceBy
    members: tuple[MemberBalance, ...]
    lead: str
    sticky: bool = False
    counted: bool | None = None

    def member(self, provider: str) -> MemberBalance | None:
        """The balance figures of `provider`, if it is a member."""
        for member in self.members:
            if member.provider == provider:
                return member
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutePlan:
    """The upstreams one request asks, in order, and why they are in that order.

    `decision` is the routing decision in force (`held`: the one made at the turn's start).
    `candidates` are its candidates reordered (see the module docstring); empty for a denial or
    when no upstream offers the model. `sticky` is the upstream the conversation stays on (it
    comes first). `paused` and `full` name the candidates that were paused or without a free
    slot at planning time, in candidate order. `balance` is set for a ``load-balance`` group.
    """

    decision: RoutingDecision
    candidates: tuple[Candidate, ...] = ()
    sticky: str | None = None
    held: bool = False
    paused: tuple[str, ...] = ()
    full: tuple[str, ...] = ()
    balance: Balance | None = None
    # The conversation's last upstream and why it was kept first or not (`Affinity.stickiness`).
    last_upstream: str | None = None
    affinity: str | None = None

    @property
    def denied(self) -> bool:
        return self.decision.denied

    @property
    def skipped(self) -> tuple[Skipped, ...]:
        """Members left out before any attempt (they do not offer the model)."""
        return self.decision.skipped

    @property
    def first(self) -> str | None:
        """The upstream asked first, or None when there is none."""
        return self.candidates[0].provider if self.candidates else None

    @property
    def all_paused(self) -> bool:
        """Every candidate is paused: they are all tried anyway."""
        return bool(self.candidates) and len(self.paused) == len(self.candidates)

    def candidate_refs(self) -> tuple[CandidateRef, ...]:
        """The candidates as the attempt machine takes them."""
        return tuple(
            CandidateRef(name=c.provider, sticky=c.provider == self.sticky) for c in self.candidates
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Held:
    # A turn's decision, with what it was decided for: a reload that changed routing, another
    # model or another key makes it stale.
    generation: int
    model: str
    client: str | None
    decision: RoutingDecision


def _routing_view(config: Config) -> object:
    # What a held decision depends on; a reload that changes any of it re-decides open turns.
    return (
        tuple((p.name, p.models) for p in config.providers),
        config.aliases,
        config.groups,
        config.routes,
        config.default_route,
        tuple((c.name, c.route) for c in config.clients),
    )


def _upstream_limits(config: Config) -> dict[str, int]:
    return {p.name: p.max_concurrent for p in config.providers if p.max_concurrent is not None}


def _key_limits(config: Config) -> dict[str, int]:
    return {c.name: c.max_concurrent for c in config.clients if c.max_concurrent is not None}


def _balanced_members(config: Config) -> dict[str, tuple[GroupMember, ...]]:
    return {g.name: g.members for g in config.groups if g.type is GroupType.LOAD_BALANCE}


class Router:
    """Routing state of one process, and the plans made from it (see the module docstring).

    `catalog` supplies context windows and prices (default: `ConfigCatalog`). `max_lead` caps
    how far sticky traffic may run an upstream ahead of its share
    (`SmoothWeightedRoundRobin`). `max_conversations` and `conversation_ttl_secs` bound the
    conversations remembered (`Affinity`).
    """

    __slots__ = (
        "_affinity",
        "_balancers",
        "_catalog",
        "_config",
        "_connection_tests",
        "_decisions",
        "_generation",
        "_health",
        "_max_lead",
        "_slots",
    )

    def __init__(
        self,
        config: Config,
        *,
        catalog: Catalog | None = None,
        max_lead: float = 100.0,
        max_conversations: int = 10_000,
        conversation_ttl_secs: float = 3600.0,
    ) -> None:
        self._config = config
        # Decisions of routes without rules, remembered for this config (twengine.rules).
        self._decisions = Decisions(config)
        self._catalog: Catalog = catalog if catalog is not None else ConfigCatalog()
        self._max_lead = max_lead
        self._health = Health(health_settings(config.failover))
        self._slots = Slots(
            upstream_limits=_upstream_limits(config), key_limits=_key_limits(config)
        )
        self._affinity: Affinity[_Held] = Affinity(
            max_conversations=max_conversations, ttl_secs=conversation_ttl_secs
        )
        self._balancers = {
            name: SmoothWeightedRoundRobin(max_lead=max_lead) for name in _balanced_members(config)
        }
        self._connection_tests: dict[str, float] = {}
        self._generation = 0

    # -- state and views -----------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config

    @property
    def health(self) -> Health:
        """Upstream health (samples, success rates, pauses), for views."""
        return self._health

    @property
    def slots(self) -> Slots:
        """Upstream slots and key permits: the relay claims and releases them here."""
        return self._slots

    @property
    def conversations(self) -> int:
        """How many conversations are remembered now (affinity), for views."""
        return len(self._affinity)

    def balancer(self, group: str) -> SmoothWeightedRoundRobin | None:
        """The balancer of ``load-balance`` group `group` (None for other groups)."""
        return self._balancers.get(group)

    def configure(self, config: Config) -> list[Grant]:
        """Apply a reloaded config, keeping the state that still applies.

        Returns the slot grants a raised limit made: the relay wakes those requests.
        """
        old = self._config
        self._config = config
        self._decisions = Decisions(config)
        if _routing_view(old) != _routing_view(config):
            self._generation += 1
        self._health.configure(health_settings(config.failover))
        kept = {p.name for p in config.providers}
        for provider in old.providers:
            if provider.name not in kept:
                self._health.forget(provider.name)
                self._connection_tests.pop(provider.name, None)
        before = _balanced_members(old)
        balancers: dict[str, SmoothWeightedRoundRobin] = {}
        for name, members in _balanced_members(config).items():
            current = self._balancers.get(name)
            if current is None or before.get(name) != members:
                current = SmoothWeightedRoundRobin(max_lead=self._max_lead)
            balancers[name] = current
        self._balancers = balancers
        return self._slots.configure(
            upstream_limits=_upstream_limits(config), key_limits=_key_limits(config)
        )

    # -- planning ------------------------------------------------------------------------

    def plan(
        self,
        facts: RequestFacts,
        *,
        now: float,
        conversation: str | None = None,
        new_turn: bool = True,
        take_turn: bool = True,
    ) -> RoutePlan:
        """Route one request and order its candidates, taking the balancer's step.

        `conversation` is the conversation key (`twengine.affinity.conversation_key`), None
        when the request belongs to none; `new_turn` whether the request starts a turn
        (`twengine.affinity.is_new_turn`). With `take_turn` False (a token count) nothing moves:
        no balancer step, no turn recorded — the plan is the one a dry-run shows.
        """
        return self._plan(facts, now, conversation, new_turn, commit=take_turn)

    def dryrun(
        self,
        facts: RequestFacts,
        *,
        now: float,
        conversation: str | None = None,
        new_turn: bool = True,
    ) -> DryRunReport:
        """What `plan` would do now, without moving anything, with the figures behind it."""
        plan = self._plan(facts, now, conversation, new_turn, commit=False)
        return self._report(plan, facts, now)

    def _plan(
        self,
        facts: RequestFacts,
        now: float,
        conversation: str | None,
        new_turn: bool,
        *,
        commit: bool,
    ) -> RoutePlan:
        decision, held = self._decide(facts, now, conversation, new_turn, commit=commit)
        if decision.denied or not decision.candidates:
            return RoutePlan(decision=decision, held=held)
        names = [c.provider for c in decision.candidates]
        paused = self._health.paused(names, now)
        full = self._slots.full(names)
        sticky = last = why = None
        if conversation is not None:
            sticky, last, why = self._affinity.stickiness(
                conversation, now, names, paused, new_turn=new_turn
            )
        balance = None
        if decision.group is not None and decision.group_type is GroupType.LOAD_BALANCE:
            balance = self._balance(decision, names, paused | full, sticky, now, commit=commit)
        final = self._ordered(decision, balance, sticky, paused, full)
        return RoutePlan(
            decision=decision,
            candidates=final,
            sticky=sticky,
            held=held,
            last_upstream=last,
            affinity=why,
            paused=tuple(c.provider for c in final if c.provider in paused),
            full=tuple(c.provider for c in final if c.provider in full),
            balance=balance,
        )

    def _ordered(
        self,
        decision: RoutingDecision,
        balance: Balance | None,
        sticky: str | None,
        paused: Collection[str],
        full: Collection[str],
    ) -> tuple[Candidate, ...]:
        ordered = self._strategy_order(decision, balance)
        head: list[Candidate] = []
        if sticky is not None:
            head.append(ordered.pop(next(i for i, c in enumerate(ordered) if c.provider == sticky)))
        # A stable sort: within each class the strategy's order holds.
        ordered.sort(key=lambda c: (c.provider in paused, c.provider in full))
        return (*head, *ordered)

    def take_shared_turn(
        self, plan: RoutePlan, current: Mapping[str, int], *, lead: str, counted: bool | None
    ) -> RoutePlan:
        """`plan` with the turn a balancer shared by several instances took instead of this
        router's own (`SharedTurns` in twserve runs the same step on the shared current weights).

        The group's balancer takes the shared `current` weights, so it carries on from them if
        the shared state is lost. `lead` is the shared pick for a new conversation (ignored for
        a sticky request, whose upstream stays first); `counted` whether a sticky request was
        counted. A `lead` that is not among the plan's candidates leaves the plan as it was.
        """
        balance, group = plan.balance, plan.decision.group
        if balance is None or group is None:
            return plan
        rr = self._balancers.get(group)
        if rr is not None:
            rr.restore(current)
        if balance.sticky:
            return replace(plan, balance=replace(balance, counted=counted))
        if lead == balance.lead or all(c.provider != lead for c in plan.candidates):
            return plan
        balance = replace(balance, lead=lead)
        final = self._ordered(plan.decision, balance, plan.sticky, plan.paused, plan.full)
        return replace(plan, candidates=final, balance=balance)

    def _decide(
        self,
        facts: RequestFacts,
        now: float,
        conversation: str | None,
        new_turn: bool,
        *,
        commit: bool,
    ) -> tuple[RoutingDecision, bool]:
        if conversation is not None and not new_turn:
            view = self._affinity.get(conversation, now)
            held = view.decision if view is not None else None
            if (
                held is not None
                and held.generation == self._generation
                and held.model == facts.model
                and held.client == facts.client
            ):
                windows = [
                    self._catalog.context_window(self._config, c.provider, c.model)
                    for c in held.decision.candidates
                ]
                reused = self._affinity.turn_decision(
                    conversation,
                    now,
                    new_turn=False,
                    input_tokens=facts.input_tokens,
                    context_windows=windows,
                )
                if reused is not None:
                    return reused.decision, True
        decision = self._decisions.resolve(facts)
        if commit and conversation is not None and decision.candidates and not decision.denied:
            self._affinity.begin_turn(
                conversation,
                now,
                _Held(
                    generation=self._generation,
                    model=facts.model,
                    client=facts.client,
                    decision=decision,
                ),
            )
        return decision, False

    def _balance(
        self,
        decision: RoutingDecision,
        names: Sequence[str],
        sitting_out: set[str],
        sticky: str | None,
        now: float,
        *,
        commit: bool,
    ) -> Balance:
        assert decision.group is not None
        group = self._config.group(decision.group)
        members = [m.provider for m in group.members]
        weights = [(m.provider, float(m.weight)) for m in group.members]
        factors = balance_factors(
            members,
            group.balance_by,
            first_content={
                name: self._health.first_content_median(name, min_samples=URL_TEST_MIN_SAMPLES)
                for name in members
            },
            success_rate={name: self._health.success_rate(name, now) for name in members},
        )
        effective = effective_weights(weights, factors)
        # Members that do not offer the model are not candidates: they never take part, and
        # their current weights wait untouched for requests they can serve.
        eligible = take_part(names, sitting_out)
        rr = self._balancers.get(group.name)
        if rr is None:
            rr = self._balancers[group.name] = SmoothWeightedRoundRobin(max_lead=self._max_lead)
        counted: bool | None = None
        if sticky is not None:
            lead = sticky
            if commit:
                counted = rr.count(sticky, effective, eligible)
        else:
            lead = rr.pick(effective, eligible) if commit else rr.peek(effective, eligible)
        effective_of = dict(effective)
        return Balance(
            balance_by=group.balance_by,
            members=tuple(
                MemberBalance(
                    provider=m.provider,
                    weight=m.weight,
                    factor=factors[m.provider],
                    effective_weight=effective_of[m.provider],
                    taking_part=m.provider in eligible,
                )
                for m in group.members
            ),
            lead=lead,
            sticky=sticky is not None,
            counted=counted,
        )

    def _strategy_order(
        self, decision: RoutingDecision, balance: Balance | None
    ) -> list[Candidate]:
        candidates = list(decision.candidates)
        kind = decision.group_type if decision.group is not None else GroupType.FALLBACK
        if kind is GroupType.FALLBACK:
            # Pinned pairs may name one upstream twice; keep them exactly as declared.
            return candidates
        by_name = {c.provider: c for c in candidates}
        names = list(by_name)
        if kind is GroupType.SELECT:
            order = order_members(kind, names, selected=decision.selected)
        elif kind is GroupType.LOAD_BALANCE:
            assert balance is not None
            order = order_members(
                kind,
                names,
                lead=balance.lead,
                weights={m.provider: m.effective_weight for m in balance.members},
            )
        elif kind is GroupType.URL_TEST:
            order = order_members(kind, names, latency=self._url_test_latencies(names))
        else:
            prices = {
                c.provider: self._catalog.input_price(self._config, c.provider, c.model)
                for c in candidates
            }
            order = order_members(kind, names, prices=prices)
        return [by_name[name] for name in order]

    def _url_test_latencies(self, names: Sequence[str]) -> dict[str, float | None]:
        return {
            name: url_test_latency(
                self._health.first_content_median(name),
                self._health.sample_count(name),
                self._connection_tests.get(name),
            )
            for name in names
        }

    def _report(self, plan: RoutePlan, facts: RequestFacts, now: float) -> DryRunReport:
        decision = plan.decision
        balance = plan.balance
        rows: list[DryRunCandidate] = []
        for candidate in plan.candidates:
            name = candidate.provider
            snap = self._health.snapshot(name, now)
            member = balance.member(name) if balance is not None else None
            median = snap.first_content_median
            rows.append(
                DryRunCandidate(
                    provider=name,
                    model=candidate.model,
                    weight=candidate.weight,
                    first_content_ms=None if median is None else round(median * 1000),
                    first_content_samples=snap.first_content_samples,
                    success_rate=snap.success_rate,
                    attempts=snap.attempts,
                    balance_factor=member.factor if member is not None else None,
                    effective_weight=member.effective_weight if member is not None else None,
                    paused_until=snap.paused_until,
                    pause_reason=(
                        snap.pause_reason.value if snap.pause_reason is not None else None
                    ),
                    in_flight=self._slots.in_flight(name),
                    max_concurrent=self._slots.limit(name),
                    sticky=name == plan.sticky,
                    paused=name in plan.paused,
                    full=name in plan.full,
                )
            )
        first = rows[0] if rows else None
        return DryRunReport(
            now=now,
            model=facts.model,
            route=decision.route,
            rule=decision.rule,
            target=decision.target.value if decision.target is not None else None,
            group=decision.group,
            group_type=decision.group_type.value if decision.group is not None else None,
            balance_by=decision.balance_by.value if decision.group is not None else None,
            denied=decision.denied,
            deny_message=decision.deny_message,
            held=plan.held,
            sticky=plan.sticky,
            lead=balance.lead if balance is not None else None,
            candidates=tuple(rows),
            skipped=tuple(
                DryRunSkip(provider=s.provider, model=s.model, reason=s.reason.value)
                for s in decision.skipped
            ),
            next=plan.first,
            waits=first is not None and first.full,
        )

    # -- outcomes ------------------------------------------------------------------------

    def record_first_content(self, provider: str, seconds: float, *, now: float) -> None:
        """A streamed answer's time from send to first content (or the whole idle wait).

        `now` is when the sample was taken; samples are kept by count, not by age.
        """
        del now
        self._health.record_first_content(provider, seconds)

    def record_connection_test(self, provider: str, seconds: float) -> None:
        """The connection test timed at startup: ``url-test`` ranks by it until the upstream
        has enough first-content samples of its own."""
        if seconds < 0:
            raise ValueError("a connection time cannot be negative")
        self._connection_tests[provider] = seconds

    def connection_test(self, provider: str) -> float | None:
        """The startup connection time recorded for `provider`, in seconds (None: none)."""
        return self._connection_tests.get(provider)

    def record_success(self, provider: str, *, now: float) -> list[PauseChanged]:
        """An attempt got its answer: clears the failure run and ends a pause."""
        return self._health.record_success(provider, now)

    def record_failure(
        self, provider: str, failure: Failure, *, now: float, wall_now: float | None = None
    ) -> list[PauseChanged]:
        """An attempt failed with the classified `failure`; returns the pause it started.

        `wall_now` is the wall clock at `now`, to place a quota's named reset. Failures that do
        not count against an upstream (client errors, cancels, full-slot skips) are not reported.
        """
        return self._health.record(provider, now, failure, wall_now=wall_now)

    def record_answer(
        self, conversation: str, provider: str, *, cached_tokens: int, now: float
    ) -> None:
        """`provider` answered the conversation, reading or writing `cached_tokens` of prompt
        cache: the next request of the conversation may stay there."""
        self._affinity.record_answer(
            conversation, now, upstream=provider, cached_tokens=cached_tokens
        )

    def next_deadline(self) -> float | None:
        """When the earliest pause runs out; call `on_timer` then."""
        return self._health.next_deadline()

    def on_timer(self, now: float) -> list[PauseChanged]:
        """End the pauses that have run out by `now`."""
        return self._health.on_timer(now)
