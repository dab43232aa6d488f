"""What a finished request's row shows and what its key's limits count (twserve/usage/keeper.py):
the two agree, an answer without usage included (cost state ``estimated``)."""

from __future__ import annotations

from typing import Any

from twengine.attempt import AttemptRecord, Outcome
from twengine.config import build_config
from twengine.limits import Admitted, Spend
from twengine.pricing import PriceTable
from twproto.ir import Usage
from twserve.store.sqlite import RequestRow
from twserve.usage.keeper import Admission, UsageKeeper

PRICES = PriceTable.from_data({"models": {"m": {"input": 2, "output": 8}}})
ESTIMATE = Spend(requests=1, tokens=500, cost_micros=1000)


def _keeper() -> UsageKeeper:
    config = build_config(
        {
            "version": 1,
            "clients": [{"name": "k", "key": "k-1", "limits": [{"per": "day", "cost": 5}]}],
            "providers": [
                {"name": n, "base_url": f"https://{n}.example", **extra}
                for n, extra in (("a", {}), ("b", {}), ("free", {"billing": "free"}))
            ],
        }
    )
    return UsageKeeper(config, PRICES, wall=lambda: 1000.0)


def _finish(
    provider: str | None,
    attempts: list[AttemptRecord],
    *,
    usage: Usage | None = None,
    billed: dict[int, Usage] | None = None,
) -> tuple[RequestRow, list[dict[str, Any]], UsageKeeper]:
    keeper = _keeper()
    admitted = keeper.limits.admit("k", ESTIMATE, 1000.0)
    assert isinstance(admitted, Admitted)
    views: list[dict[str, Any]] = [{"provider": a.provider} for a in attempts]
    row = RequestRow(id="r", ts=1000.0, path="/v1/chat/completions", model="m", provider=provider)
    row.routing = {"attempts": views}
    if usage is not None:
        row.input_tokens, row.output_tokens = usage.input_tokens, usage.output_tokens
    keeper.finish(
        row,
        Admission(reservation=admitted.reservation, estimate=ESTIMATE),
        usage=usage,
        attempts=attempts,
        attempt_usage=billed or {},
        models={"a": "m", "b": "m", "free": "m"},
    )
    return row, views, keeper


def _sent(provider: str, outcome: Outcome, status: int | None = 200) -> AttemptRecord:
    return AttemptRecord(provider=provider, outcome=outcome, status=status, sent_at=1.0)


def test_an_answer_cancelled_before_its_usage_is_the_estimate() -> None:
    row, views, keeper = _finish("a", [_sent("a", Outcome.CANCELLED)])
    assert (row.cost_micros, row.cost_state, row.input_tokens) == (1000, "estimated", 500)
    assert (views[0]["cost_micros"], views[0]["cost_state"]) == (1000, "estimated")
    assert (row.limit_tokens, row.limit_cost) == (500, 1000)
    assert keeper.key_view("k")[0]["used"] == 1000


def test_an_unanswered_request_that_reached_an_upstream_is_the_estimate() -> None:
    # Sent, a 200 head, then cut off before any content or usage: no answer, the estimate.
    row, _, _ = _finish(None, [_sent("a", Outcome.FAILED)])
    assert (row.cost_micros, row.cost_state, row.input_tokens) == (1000, "estimated", 500)
    assert (row.limit_tokens, row.limit_cost) == (500, 1000)


def test_an_abandoned_attempts_billing_adds_to_the_estimate() -> None:
    # `a` reported 100 input tokens before it broke; `b` answered and the client left before
    # its usage: both are counted, and the row shows both.
    billed = {0: Usage(input_tokens=100)}
    attempts = [_sent("a", Outcome.FAILED), _sent("b", Outcome.CANCELLED)]
    row, views, _ = _finish("b", attempts, billed=billed)
    assert (row.cost_micros, row.cost_state) == (200 + 1000, "estimated")
    assert (views[0]["cost_micros"], views[0]["cost_state"]) == (200, "known")
    assert (row.limit_tokens, row.limit_cost) == (100 + 500, 1200)


def test_a_reported_usage_replaces_the_estimate() -> None:
    row, _, _ = _finish(
        "a", [_sent("a", Outcome.OK)], usage=Usage(input_tokens=10, output_tokens=5)
    )
    assert (row.cost_micros, row.cost_state, row.input_tokens) == (60, "known", 10)
    assert (row.limit_tokens, row.limit_cost) == (15, 60)


def test_every_upstream_refusing_outright_counts_nothing_but_the_request() -> None:
    # A 503 from each: billed nothing, so the row's 0 is what the limits count.
    attempts = [_sent("a", Outcome.FAILED, 503), _sent("b", Outcome.FAILED, 503)]
    row, _, _ = _finish(None, attempts)
    assert (row.cost_micros, row.cost_state, row.input_tokens) == (0, "known", None)
    assert (row.limit_tokens, row.limit_cost) == (0, 0)


def test_a_free_upstream_without_usage_costs_nothing() -> None:
    row, _, _ = _finish("free", [_sent("free", Outcome.CANCELLED)])
    assert (row.cost_micros, row.cost_state) == (0, "free")
    assert (row.limit_tokens, row.limit_cost) == (500, 0)
