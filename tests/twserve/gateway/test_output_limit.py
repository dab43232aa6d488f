"""A Chat request without max_tokens converted to an Anthropic upstream gets the model's output
limit from ``model_specs`` (docs/conversion.md), seen in what the upstream received."""

from __future__ import annotations

from tests.twserve.conftest import KEY, Sdks, StackFactory
from tests.twserve.support.stack import Stack, Upstream
from twproto.formats.anthropic import DEFAULT_MAX_TOKENS


def _ask(sdks: Sdks, st: Stack, model: str) -> None:
    client = sdks.openai(st, KEY, 5.0)
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])


def test_output_limit_comes_from_model_specs(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(
        {
            "claude": Upstream(
                "anthropic",
                models=["claude-big", "claude-plain"],
                extra={"model_specs": {"claude-big": {"max_output_tokens": 64000}}},
            )
        }
    )
    _ask(sdks, st, "claude-big")
    _ask(sdks, st, "claude-plain")
    sent = [r.json()["max_tokens"] for r in st.mock("claude").received]
    assert sent == [64000, DEFAULT_MAX_TOKENS]
