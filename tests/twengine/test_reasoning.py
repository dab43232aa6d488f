"""What each upstream gets of a request's reasoning: the effort memory (remembered choices, their
expiry, dropping them when an upstream changes), the sealed-reasoning marks, and both applied to
a request's destinations and settled from its attempt records. Pure: time is an argument."""

from __future__ import annotations

import json
from typing import Any

import pytest

from twengine import (
    AttemptRecord,
    Destination,
    Outcome,
    ReasoningMemory,
    ResendReason,
    build_config,
)
from twengine.reasoning import (
    EFFORT_MEMORY_TTL_SECS,
    EffortChoice,
    EffortKey,
    EffortMemory,
    Efforts,
    SealedReasoning,
    upstream_identities,
    upstream_identity,
)
from twproto import Dialect, UpstreamTarget
from twproto.ir import ReasoningLevel

KEY = EffortKey(upstream="a", model="m", client_format="anthropic", level="xhigh")
ID_A = upstream_identity("https://a.example", "anthropic", "sk-1")


def test_remember_and_recall() -> None:
    memory = EffortMemory()
    assert memory.recall(KEY, now=0.0, identity=ID_A) is None
    assert memory.remember(KEY, "high", now=10.0, identity=ID_A)
    assert not memory.remember(KEY, "high", now=11.0, identity=ID_A)  # nothing new to persist
    assert memory.recall(KEY, now=20.0, identity=ID_A) == "high"
    # Another model, format or level asked is another entry.
    assert (
        memory.recall(
            EffortKey(upstream="a", model="m", client_format="openai-chat", level="xhigh"),
            now=20.0,
            identity=ID_A,
        )
        is None
    )


def test_expires_after_seven_days() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    assert EFFORT_MEMORY_TTL_SECS == 7 * 24 * 3600
    assert memory.recall(KEY, now=EFFORT_MEMORY_TTL_SECS - 1, identity=ID_A) == "high"
    assert memory.recall(KEY, now=EFFORT_MEMORY_TTL_SECS, identity=ID_A) is None
    assert len(memory) == 0


def test_identity_covers_address_protocol_and_key() -> None:
    others = {
        upstream_identity("https://b.example", "anthropic", "sk-1"),
        upstream_identity("https://a.example", "openai-chat", "sk-1"),
        upstream_identity("https://a.example", "anthropic", "sk-2"),
    }
    assert ID_A not in others and len(others) == 3
    assert "sk-1" not in ID_A
    assert upstream_identity("https://a.example/", "anthropic", "sk-1") == ID_A


def test_changed_or_removed_upstreams_are_forgotten() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    other = EffortKey(upstream="b", model="m", client_format="anthropic", level="max")
    memory.remember(other, "off", now=0.0, identity="id-b")
    assert not memory.keep_only({"a": ID_A, "b": "id-b"})
    assert memory.keep_only({"a": ID_A})  # b removed
    assert memory.keep_only({"a": upstream_identity("https://a.example", "anthropic", "sk-9")})
    assert len(memory) == 0


def test_round_trip_through_json_skips_bad_and_expired_entries() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    data = json.loads(json.dumps(memory.to_json()))
    data["entries"] += [
        {"upstream": "x"},
        "junk",
        {**data["entries"][0], "upstream": "old", "expires_at": 5.0},
    ]
    loaded = EffortMemory.from_json(data, now=10.0)
    assert len(loaded) == 1 and loaded.recall(KEY, now=10.0, identity=ID_A) == "high"
    assert len(EffortMemory.from_json("not an object", now=0.0)) == 0


# --- sealed-reasoning marks: per conversation and upstream, refreshed by use, bounded ---


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


# --- the memories applied to a request's destinations, and settled from its attempts ---------

URL = "https://a.example"
ASKED = {"model": "m", "output_config": {"effort": "xhigh"}, "messages": []}


def dest(name: str = "a", **extra: Any) -> Destination:
    target = UpstreamTarget(dialect=Dialect.ANTHROPIC, base_url=URL, key="sk-" + name, model="m")
    return Destination(name=name, target=target, **extra)


def key_of(name: str = "a", level: str = "xhigh") -> EffortKey:
    return EffortKey(upstream=name, model="m", client_format="anthropic", level=level)


def identity_of(name: str = "a") -> str:
    return upstream_identity(URL, "anthropic", "sk-" + name)


def resent_ok(provider: str = "a") -> tuple[AttemptRecord, ...]:
    return (
        AttemptRecord(provider=provider, outcome=Outcome.RESENT),
        AttemptRecord(provider=provider, outcome=Outcome.OK, resend=ResendReason.EFFORT_REFUSED),
    )


def test_a_remembered_level_is_sent_up_front() -> None:
    memory = EffortMemory()
    memory.remember(key_of(), "high", now=0.0, identity=identity_of())
    out, views = Efforts(memory).apply([dest(), dest("b")], ASKED, Dialect.ANTHROPIC, now=1.0)
    assert [d.reasoning for d in out] == [ReasoningLevel.HIGH, None]
    assert views == {
        "a": {"asked": "xhigh", "sent": "high", "reason": "remembered"},
        "b": {"asked": "xhigh", "sent": "xhigh", "reason": None},  # unchanged: no view on the row
    }


@pytest.mark.parametrize(
    ("stored", "identity", "sent"),
    [
        ("high", identity_of(), ReasoningLevel.HIGH),
        ("turbo", identity_of(), None),  # a hand-edited level this gateway does not send
        ("high", identity_of("other"), None),  # remembered for another key at that upstream
    ],
)
def test_only_a_level_for_this_upstream_as_it_is_counts(
    stored: str, identity: str, sent: ReasoningLevel | None
) -> None:
    memory = EffortMemory()
    memory.remember(key_of(), stored, now=0.0, identity=identity)
    out, _ = Efforts(memory).apply([dest()], ASKED, Dialect.ANTHROPIC, now=1.0)
    assert out[0].reasoning is sent


def test_a_rules_level_is_what_is_asked_and_a_budget_alone_asks_none() -> None:
    efforts = Efforts()
    _, views = efforts.apply([dest(reasoning=ReasoningLevel.LOW)], ASKED, Dialect.ANTHROPIC, now=0)
    assert views == {"a": {"asked": "low", "sent": "low", "reason": "rule"}}
    budget = {"model": "m", "thinking": {"type": "enabled", "budget_tokens": 31999}}
    out, views = efforts.apply([dest()], budget, Dialect.ANTHROPIC, now=0)
    assert views == {} and out[0].reasoning is None


def test_a_successful_resend_is_remembered_once() -> None:
    efforts = Efforts()
    dests, views = efforts.apply([dest(), dest("b")], ASKED, Dialect.ANTHROPIC, now=0.0)
    resent = {"a": "high"}
    args = (dests, views, ASKED, Dialect.ANTHROPIC)
    assert efforts.remember(resent_ok(), resent, *args, now=10.0)
    assert efforts.memory.recall(key_of(), now=11.0, identity=identity_of()) == "high"
    assert efforts.memory.recall(key_of("b"), now=11.0, identity=identity_of("b")) is None
    assert not efforts.remember(resent_ok(), resent, *args, now=12.0)  # nothing new to persist


@pytest.mark.parametrize(
    "attempts",
    [
        # The resend failed too.
        (
            AttemptRecord(provider="a", outcome=Outcome.RESENT),
            AttemptRecord(provider="a", outcome=Outcome.FAILED, resend=ResendReason.EFFORT_REFUSED),
        ),
        # An answer with no effort resend before it.
        (AttemptRecord(provider="a", outcome=Outcome.OK),),
    ],
)
def test_nothing_is_remembered_without_a_successful_effort_resend(
    attempts: tuple[AttemptRecord, ...],
) -> None:
    efforts = Efforts()
    dests, views = efforts.apply([dest()], ASKED, Dialect.ANTHROPIC, now=0.0)
    assert not efforts.remember(
        attempts, {"a": "high"}, dests, views, ASKED, Dialect.ANTHROPIC, now=1.0
    )
    assert len(efforts.memory) == 0


def test_use_drops_the_choices_of_changed_upstreams() -> None:
    cfg = build_config(
        {
            "version": 1,
            "clients": [{"name": "k", "key": "k-1"}],
            "providers": [
                {"name": "a", "base_url": URL, "protocol": "anthropic", "key": "${A_KEY}"},
                {"name": "b", "base_url": URL, "protocol": "anthropic", "key": "${UNSET}"},
            ],
        },
        {},
    )
    identities = upstream_identities(cfg, {"A_KEY": "sk-a"})
    # The key as read from the environment; the configured text where it does not resolve.
    assert identities == {"a": identity_of(), "b": upstream_identity(URL, "anthropic", "${UNSET}")}
    memory = EffortMemory()
    memory.remember(key_of(), "high", now=0.0, identity=identity_of())
    memory.remember(key_of("gone"), "high", now=0.0, identity=identity_of("gone"))
    efforts = Efforts()
    assert efforts.use(memory, identities)  # "gone" is no longer configured
    assert efforts.memory is memory and len(memory) == 1
    assert not efforts.use(memory, identities)


def test_the_memory_taken_keeps_only_the_upstreams_configured() -> None:
    cfg = build_config(
        {
            "version": 1,
            "clients": [{"name": "k", "key": "k-1"}],
            "providers": [
                {"name": "a", "base_url": URL, "protocol": "anthropic", "key": "${A_KEY}"}
            ],
        },
        {},
    )
    memory = EffortMemory()
    memory.remember(key_of(), "high", now=0.0, identity=identity_of())
    reasoning = ReasoningMemory()
    # The key as the environment gives it now: with another key, "a" is another endpoint.
    assert not reasoning.use(memory, cfg, {"A_KEY": "sk-a"})
    assert reasoning.efforts.memory is memory and len(memory) == 1
    assert reasoning.use(memory, cfg, {"A_KEY": "sk-rotated"}) and len(memory) == 0


def test_a_conversation_refused_for_its_sealed_reasoning_leaves_it_out_later() -> None:
    reasoning = ReasoningMemory()
    plan = reasoning.prepare(
        [dest(), dest("b")], ASKED, Dialect.ANTHROPIC, "conv", counting=False, now=0.0, wall=0.0
    )
    assert [d.drop_sealed for d in plan.destinations] == [False, False]
    refused = (
        AttemptRecord(provider="a", outcome=Outcome.RESENT),
        AttemptRecord(provider="a", outcome=Outcome.OK, resend=ResendReason.SEALED_REASONING),
    )
    assert not reasoning.settle(plan, refused, {}, finished=True, now=1.0, wall=1.0)
    later = reasoning.prepare(
        [dest(), dest("b")], ASKED, Dialect.ANTHROPIC, "conv", counting=False, now=2.0, wall=2.0
    )
    assert [d.drop_sealed for d in later.destinations] == [True, False]
    other = reasoning.prepare(
        [dest()], ASKED, Dialect.ANTHROPIC, "other", counting=False, now=2.0, wall=2.0
    )
    assert not other.destinations[0].drop_sealed


@pytest.mark.parametrize(("finished", "counting"), [(True, False), (False, False), (True, True)])
def test_a_level_is_remembered_only_for_a_generation_that_ran_to_its_end(
    finished: bool, counting: bool
) -> None:
    reasoning = ReasoningMemory()
    plan = reasoning.prepare(
        [dest()], ASKED, Dialect.ANTHROPIC, None, counting=counting, now=0.0, wall=100.0
    )
    # A token count sends no level: nothing of the memory is applied to it.
    assert plan.efforts == (
        {} if counting else {"a": {"asked": "xhigh", "sent": "xhigh", "reason": None}}
    )
    changed = reasoning.settle(
        plan, resent_ok(), {"a": "high"}, finished=finished, now=1.0, wall=200.0
    )
    assert changed is (finished and not counting)
    if changed:
        # The entry expires a week after the wall clock it was settled at.
        memory = reasoning.efforts.memory
        assert memory.recall(
            key_of(), now=200.0 + EFFORT_MEMORY_TTL_SECS - 1, identity=identity_of()
        )
        assert not memory.recall(
            key_of(), now=200.0 + EFFORT_MEMORY_TTL_SECS, identity=identity_of()
        )


# --- shared with other instances --------------------------------------------------------------


def test_a_choice_learned_is_told_once_and_taken_elsewhere() -> None:
    efforts = Efforts()
    told: list[tuple[EffortKey, EffortChoice]] = []
    efforts.learned.append(lambda key, choice: told.append((key, choice)))
    dests, views = efforts.apply([dest()], ASKED, Dialect.ANTHROPIC, now=0.0)
    args = (dests, views, ASKED, Dialect.ANTHROPIC)
    assert efforts.remember(resent_ok(), {"a": "high"}, *args, now=10.0)
    assert not efforts.remember(resent_ok(), {"a": "high"}, *args, now=11.0)
    assert told == [
        (
            key_of(),
            EffortChoice(
                sent="high", expires_at=10.0 + EFFORT_MEMORY_TTL_SECS, identity=identity_of()
            ),
        )
    ]
    # Another instance's memory takes it; a copy, an older one or an expired one changes nothing.
    other = EffortMemory()
    key, choice = told[0]
    assert other.take(key, choice, now=20.0)
    assert other.recall(key, now=21.0, identity=identity_of()) == "high"
    assert not other.take(key, choice, now=22.0)
    older = EffortChoice(sent="low", expires_at=choice.expires_at - 5, identity=identity_of())
    assert not other.take(key, older, now=22.0)
    assert not EffortMemory().take(key, choice, now=choice.expires_at)
    assert [k for k, _ in other.items()] == [key]


def test_a_mark_made_is_told_and_taken_elsewhere_with_its_end() -> None:
    here, there = SealedReasoning(ttl_secs=100.0), SealedReasoning(ttl_secs=100.0)
    told: list[tuple[str, str, float]] = []
    here.listeners.append(lambda conv, up, ttl: told.append((conv, up, ttl)))
    here.mark("c", "a", now=0.0)
    assert told == [("c", "a", 100.0)]
    assert there.take("c", "a", now=5.0, until=105.0)
    assert not there.take("c", "a", now=5.0, until=50.0)  # a shorter one changes nothing
    assert not there.take("d", "a", now=5.0, until=5.0)  # already over
    assert there.leave_out("c", "a", now=104.0) and not there.leave_out("d", "a", now=6.0)
    assert not told[1:]  # taking a mark tells no one (it came from elsewhere)
