"""The `cheapest` group orders by the requested model's price (free first, unpriced last), and a
conversion to Anthropic without max_tokens sends the model's output limit from the price table
unless model_specs say otherwise (docs/balancing.md, docs/limits-and-costs.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import Upstream, running_stack
from twengine.router import RequestFacts
from twmock.script import MockSettings
from twproto.dialect import Dialect

pytestmark = pytest.mark.sdk


def _upstreams() -> dict[str, Upstream]:
    return {
        # Declared dearest first: the group must reorder.
        "dear": Upstream("anthropic", MockSettings(), extra={"price_sheet": "dear"}),
        "unpriced": Upstream("anthropic", MockSettings(), extra={"price_sheet": "none"}),
        "list": Upstream("anthropic", MockSettings()),
        "local": Upstream("anthropic", MockSettings(), extra={"billing": "free"}),
    }


CONFIG = {
    "pricing": {
        "sheets": [
            {"name": "dear", "multiplier": 2},
            {"name": "none", "models": {"other-model": {"input": 1, "output": 1}}},
        ]
    },
    "groups": [
        {"name": "cheap", "type": "cheapest", "providers": ["dear", "unpriced", "list", "local"]}
    ],
    "default_route": "r",
    "routes": [{"name": "r", "rules": [{"name": "all", "to": "cheap"}]}],
}


def test_cheapest_orders_free_then_by_price_then_unpriced(tmp_path: Path) -> None:
    with running_stack(tmp_path, _upstreams(), config=CONFIG) as st:
        router = st.app.gateway.router
        known = router.dryrun(
            RequestFacts(model="claude-sonnet-4-6", dialect=Dialect.ANTHROPIC), now=0.0
        )
        # "unpriced" has a sheet that does not list the model, so the table prices it at 1×;
        # an unknown model is priced nowhere: only "local" (free) is known.
        unknown = router.dryrun(
            RequestFacts(model="mystery-model", dialect=Dialect.ANTHROPIC), now=0.0
        )
    assert [c.provider for c in known.candidates] == ["local", "unpriced", "list", "dear"]
    assert [c.provider for c in unknown.candidates] == ["local", "dear", "unpriced", "list"]


def test_conversion_to_anthropic_sends_the_output_limit(tmp_path: Path) -> None:
    upstreams = {
        "a": Upstream(
            "anthropic",
            MockSettings(),
            extra={"model_specs": {"spec-model": {"max_output_tokens": 1234}}},
        )
    }
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        sent = []
        for model in ("claude-sonnet-4-6", "spec-model", "mystery-model"):
            c.openai.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
            sent.append(st.mock("a").received[-1].json()["max_tokens"])
    # The price table's 128000 for Sonnet 4.6, the manual spec, then the documented default.
    assert sent == [128_000, 1234, 8192]
