"""Dry-run: the report's figures, that asking moves nothing, JSON and text forms."""

from __future__ import annotations

import json
from typing import Any

from twengine.config import Config, build_config
from twengine.dryrun import DryRunCandidate, DryRunReport, format_text, report_from_dict
from twengine.router import Router
from twengine.rules import RequestFacts
from twproto.dialect import Dialect
from twproto.failures import Failure, FailureKind, PauseRule, stream_ended_early

NO_BALANCE = Failure(
    kind=FailureKind.NO_BALANCE, failover=True, temporary=False, pause=PauseRule.NO_BALANCE
)


def config(**sections: Any) -> Config:
    return build_config(
        {
            "version": 1,
            "providers": [
                {"name": "relay", "base_url": "https://relay.example/v1", "max_concurrent": 4},
                {"name": "official", "base_url": "https://api.example/v1"},
                {"name": "narrow", "base_url": "https://n.example/v1", "models": ["other"]},
            ],
            "groups": [
                {
                    "name": "pool",
                    "type": "load-balance",
                    "balance_by": "latency-health",
                    "providers": [{"name": "relay", "weight": 7}, "official", "narrow"],
                }
            ],
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {"name": "nope", "when": {"model": "banned-*"}, "deny": "not here"},
                        {"name": "pool", "to": "pool"},
                    ],
                }
            ],
            **sections,
        }
    )


def facts(model: str = "m") -> RequestFacts:
    return RequestFacts(model=model, dialect=Dialect.OPENAI_CHAT, client=None)


def busy_router() -> Router:
    router = Router(config())
    for secs in (0.4, 0.5, 0.6):
        router.record_first_content("relay", secs, now=0.0)
    for i in range(4):
        router.record_success("relay", now=float(i))
    router.record_failure("relay", stream_ended_early(), now=4.0)
    assert router.slots.try_acquire("relay", owner="x") is not None
    return router


def test_report_names_rule_group_and_figures() -> None:
    router = busy_router()
    report = router.dryrun(facts(), now=10.0)
    assert (report.route, report.rule, report.group) == ("default", "pool", "pool")
    assert (report.group_type, report.balance_by, report.target) == (
        "load-balance",
        "latency-health",
        "group",
    )
    assert report.next == "relay" == report.lead and not report.waits
    relay, official = report.candidates
    assert relay.weight == 7 and official.weight == 1
    assert relay.first_content_ms == 500 and relay.first_content_samples == 3
    assert relay.success_rate == 0.8 and relay.attempts == 5
    # Latency: relay is the only measured member, so it is the group median (factor 1).
    assert relay.balance_factor is not None and abs(relay.balance_factor - 0.64) < 1e-9
    assert relay.effective_weight is not None and abs(relay.effective_weight - 4.48) < 1e-9
    assert (official.balance_factor, official.effective_weight) == (1.0, 1.0)
    assert (relay.in_flight, relay.max_concurrent) == (1, 4)
    assert (official.in_flight, official.max_concurrent) == (0, None)
    assert [(s.provider, s.reason) for s in report.skipped] == [("narrow", "model_not_offered")]


def test_dryrun_moves_nothing() -> None:
    router = busy_router()
    balancer = router.balancer("pool")
    assert balancer is not None
    before = balancer.current()
    reports = [router.dryrun(facts(), now=10.0, conversation="c") for _ in range(5)]
    assert all(r == reports[0] for r in reports)
    assert balancer.current() == before
    # No turn was recorded either: continuing the "turn" decides afresh.
    assert not router.plan(facts(), now=11.0, conversation="c", new_turn=False).held
    assert balancer.current() != before


def test_pause_sticky_and_held_show() -> None:
    router = Router(config())
    router.plan(facts(), now=0.0, conversation="c")
    router.record_answer("c", "official", cached_tokens=0, now=0.0)
    router.record_failure("relay", NO_BALANCE, now=0.0)
    report = router.dryrun(facts(), now=100.0, conversation="c", new_turn=False)
    assert report.held and report.sticky == "official" == report.next
    relay = report.candidates[1]
    assert relay.paused and relay.pause_reason == "no_balance" and relay.paused_until == 1800.0
    assert relay.pause_left_secs(100.0) == 1700.0
    assert report.to_dict()["candidates"][1]["pause_left_secs"] == 1700.0


def test_to_dict_is_json() -> None:
    report = busy_router().dryrun(facts(), now=10.0)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["next"] == "relay" and data["balance_by"] == "latency-health"
    assert [c["provider"] for c in data["candidates"]] == ["relay", "official"]
    assert data["candidates"][0]["first_content_ms"] == 500
    assert data["skipped"] == [{"provider": "narrow", "model": "m", "reason": "model_not_offered"}]


def test_a_report_reads_back_from_its_json() -> None:
    # What the CLI does with a running gateway's answer: the same report, and the same text.
    router = busy_router()
    router.plan(facts(), now=0.0, conversation="c")
    router.record_answer("c", "official", cached_tokens=0, now=0.0)
    router.record_failure("relay", NO_BALANCE, now=0.0)
    for report in (
        busy_router().dryrun(facts(), now=10.0),
        router.dryrun(facts(), now=100.0, conversation="c", new_turn=False),
        router.dryrun(facts("banned-x"), now=100.0),
    ):
        data = json.loads(json.dumps(report.to_dict()))
        data["request"] = {"model": report.model}  # what the control plane adds is left out
        back = report_from_dict(data)
        assert back == report
        assert format_text(back) == format_text(report)


def test_format_text() -> None:
    text = format_text(busy_router().dryrun(facts(), now=10.0))
    lines = text.splitlines()
    assert lines[0] == (
        "model m: route default, rule pool, group pool (load-balance, balance_by latency-health)"
    )
    assert lines[1] == "next: relay (its turn in the load balance)"
    header, relay, official = lines[3:6]
    assert header.split() == [
        "#",
        "upstream",
        "model",
        "weight",
        "factor",
        "effective",
        "first",
        "success",
        "slots",
    ]
    assert relay.split() == ["1", "relay", "m", "7", "0.64", "4.48", "500", "ms", "80%", "1/4"]
    assert official.split() == ["2", "official", "m", "1", "1.00", "1.00", "-", "-", "0/-"]
    assert lines[-1] == "skipped narrow: model_not_offered (m)"


def test_format_text_denied_and_empty() -> None:
    router = Router(config())
    denied = format_text(router.dryrun(facts("banned-x"), now=0.0))
    assert denied.splitlines() == ["model banned-x: route default, rule nope", "denied: not here"]
    report = DryRunReport(now=0.0, model="q", target="all")
    assert format_text(report).splitlines() == [
        "model q: route (none), rule (none), target all",
        "next: none (no upstream offers this model)",
    ]


def test_format_text_states() -> None:
    report = DryRunReport(
        now=5.0,
        model="m",
        target="provider",
        sticky="a",
        next="a",
        waits=True,
        candidates=(
            DryRunCandidate(provider="a", model="m", sticky=True, full=True, max_concurrent=1),
            DryRunCandidate(provider="b", model="m", paused_until=65.0, pause_reason="quota"),
        ),
    )
    lines = format_text(report).splitlines()
    assert (
        lines[1] == "next: a (the conversation stays there; no free slot: the request would wait)"
    )
    assert lines[-2].endswith("sticky; full") and lines[-1].endswith("paused 60 s, quota")
