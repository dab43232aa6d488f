"""Cost from reported usage: hand-computed figures, tiers, sheets, free and unpriced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twengine.config import build_config
from twengine.pricing import Cost, CostState, ModelPricing, Pricer, PriceTable, cost_of
from twproto.ir import Usage

SHIPPED = Path(__file__).resolve().parents[2] / "twserve" / "data" / "prices.json"

TABLE = PriceTable.from_data(
    {
        "models": {
            # Claude Sonnet 4.5's list prices (USD per million tokens).
            "claude-sonnet-4-5": {
                "input": 3.0,
                "output": 15.0,
                "cache_read": 0.3,
                "cache_write": 3.75,
                "cache_write_1h": 6.0,
                "max_output_tokens": 64000,
            },
            # Gemini 2.5 Pro: dearer above a 200k-token prompt.
            "gemini-2.5-pro": {
                "input": 1.25,
                "output": 10.0,
                "cache_read": 0.125,
                "tiers": [{"above": 200000, "input": 2.5, "output": 15.0, "cache_read": 0.25}],
            },
            "plain": {"input": 2.0, "output": 8.0},
            "broken": {"input": "free", "output": 1.0},
        }
    }
)


def sonnet() -> ModelPricing:
    found = TABLE.lookup("claude-sonnet-4-5")
    assert found is not None
    return found


def test_cache_heavy_usage_is_priced_kind_by_kind() -> None:
    # The fixture's answer: 3 uncached, 1111 read, 418 written (5 m), 33 out.
    # 3×3 + 1111×0.3 + 418×3.75 + 33×15 = 9 + 333.3 + 1567.5 + 495 = 2404.8 µ$ → 2405
    usage = Usage(input_tokens=3, cache_read_tokens=1111, cache_write_tokens=418, output_tokens=33)
    assert cost_of(usage, sonnet()) == Cost(state=CostState.KNOWN, micros=2405)


def test_one_hour_cache_writes_take_their_own_rate() -> None:
    # 12×3 + 150000×0.3 + 12000×3.75 + 8000×6 + 1200×15
    # = 36 + 45000 + 45000 + 48000 + 18000 = 156036 µ$
    usage = Usage(
        input_tokens=12,
        cache_read_tokens=150_000,
        cache_write_tokens=20_000,
        cache_write_1h_tokens=8_000,
        output_tokens=1_200,
    )
    assert cost_of(usage, sonnet()).micros == 156_036


def test_above_200k_prompt_prices_every_token_at_the_tier() -> None:
    pro = TABLE.lookup("gemini-2.5-pro")
    assert pro is not None
    # 210k prompt: 150000×2.5 + 60000×0.25 + 2000×15 = 375000 + 15000 + 30000
    over = Usage(input_tokens=150_000, cache_read_tokens=60_000, output_tokens=2_000)
    assert cost_of(over, pro).micros == 420_000
    # Exactly 200k is not above: 140000×1.25 + 60000×0.125 + 2000×10 = 175000 + 7500 + 20000
    at = Usage(input_tokens=140_000, cache_read_tokens=60_000, output_tokens=2_000)
    assert cost_of(at, pro).micros == 202_500


def test_missing_cache_prices_fall_back_to_input() -> None:
    plain = TABLE.lookup("plain")
    assert plain is not None
    # 100 read + 50 written at the input price: 150×2 + 10×8 = 380
    usage = Usage(cache_read_tokens=100, cache_write_tokens=50, output_tokens=10)
    assert cost_of(usage, plain).micros == 380


def test_rounding_is_half_up_once_at_the_end() -> None:
    # 5 reads × 0.3 = 1.5 µ$ → 2; three 0.3s summed first (0.9) round to 1, not 0+0+0.
    assert cost_of(Usage(cache_read_tokens=5), sonnet()).micros == 2
    assert cost_of(Usage(cache_read_tokens=3), sonnet()).micros == 1


def test_lookup_by_prefix_case_and_date() -> None:
    assert TABLE.lookup("anthropic/claude-sonnet-4-5") is not None
    assert TABLE.lookup("Claude-Sonnet-4-5") is not None
    assert TABLE.lookup("claude-sonnet-4-5-20250929") is not None
    assert TABLE.lookup("claude-sonnet-4-5@20250929") is not None
    assert TABLE.lookup("no-such-model") is None
    assert TABLE.lookup("broken") is None  # a bad entry is left out, not priced 0
    assert TABLE.max_output_tokens("claude-sonnet-4-5-20250929") == 64000


def test_a_relay_spelling_with_a_dotted_version_is_priced() -> None:
    # docs/configuration.md's relay lists anthropic/claude-sonnet-4.5.
    for spelling in ("anthropic/claude-sonnet-4.5", "claude-sonnet-4.5", "Claude-Sonnet-4.5"):
        found = TABLE.lookup(spelling)
        assert found is not None and found.name == "claude-sonnet-4-5", spelling
    assert TABLE.lookup("claude-sonnet-4.5-20250929") is sonnet()
    # A name that is written with a dot is found as written, never turned into another one.
    assert TABLE.lookup("gemini-2.5-pro") is not None
    assert TABLE.lookup("gemini-2-5-pro") is None
    shipped = PriceTable.from_data(json.loads(SHIPPED.read_text()))
    assert shipped.lookup("anthropic/claude-sonnet-4.5") is shipped.lookup("claude-sonnet-4-5")
    assert shipped.lookup("openai/gpt-4.1") is shipped.lookup("gpt-4.1") is not None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -1.0])
def test_a_price_that_is_not_a_finite_figure_leaves_the_model_unpriced(bad: float) -> None:
    table = PriceTable.from_data(
        {
            "models": {
                "base": {"input": bad, "output": 1.0},
                "read": {"input": 1.0, "output": 1.0, "cache_read": bad},
                "tier": {"input": 1.0, "output": 1.0, "tiers": [{"above": 10, "output": bad}]},
                "fine": {"input": 1.0, "output": 1.0},
            }
        }
    )
    assert sorted(table.models) == ["fine"]


def _pricer(extra: dict[str, object]) -> Pricer:
    data: dict[str, object] = {
        "version": 1,
        "providers": [
            {"name": "official", "base_url": "https://api.anthropic.com", "key": "k"},
            {"name": "local", "base_url": "http://127.0.0.1:1/v1", "billing": "free"},
            {"name": "relay", "base_url": "http://127.0.0.1:2/v1", "key": "k", "price_sheet": "r"},
        ],
        "pricing": {
            "sheets": [
                {
                    "name": "r",
                    "multiplier": 0.5,
                    "models": {"own-model": {"input": 1.0, "output": 4.0}},
                }
            ]
        },
    }
    data.update(extra)
    return Pricer(build_config(data), TABLE)


def test_three_states_free_known_unknown() -> None:
    pricer = _pricer({})
    usage = Usage(input_tokens=1000, output_tokens=100)
    assert pricer.cost("official", "claude-sonnet-4-5", usage) == Cost(
        state=CostState.KNOWN, micros=4500
    )
    assert pricer.cost("local", "claude-sonnet-4-5", usage) == Cost(state=CostState.FREE, micros=0)
    unknown = pricer.cost("official", "mystery-1", usage)
    assert unknown.state is CostState.UNKNOWN and unknown.micros is None
    assert unknown.counted == 0


def test_sheet_prices_and_multiplier() -> None:
    pricer = _pricer({})
    usage = Usage(input_tokens=1000, output_tokens=100)
    # The sheet's own model: (1000×1 + 100×4) × 0.5 = 700
    assert pricer.cost("relay", "own-model", usage).micros == 700
    # A table model through the sheet's upstream: (1000×3 + 100×15) × 0.5 = 2250
    assert pricer.cost("relay", "claude-sonnet-4-5", usage).micros == 2250
    assert pricer.input_price("relay", "claude-sonnet-4-5") == 1.5
    assert pricer.input_price("local", "anything") == 0.0
    assert pricer.input_price("official", "mystery-1") is None


def test_shipped_table_is_small_cited_and_priced() -> None:
    raw = SHIPPED.read_bytes()
    assert len(raw) < 1_000_000
    data = json.loads(raw)
    assert data["package"] == "litellm" and data["version"] and data["retrieved"]
    table = PriceTable.from_data(data)
    assert len(table.models) == len(data["models"]) > 100
    for name in ("claude-sonnet-4-5", "gpt-5", "gemini-2.5-pro"):
        found = table.lookup(name)
        assert found is not None and found.rates.input > 0 and found.max_output_tokens
    pro = table.lookup("gemini-2.5-pro")
    assert pro is not None and pro.tiers and pro.tiers[0].above == 200_000


@pytest.mark.parametrize("model", ["gpt-5", "gemini-2.5-flash", "claude-haiku-4-5"])
def test_shipped_entries_have_limits(model: str) -> None:
    table = PriceTable.from_data(json.loads(SHIPPED.read_text()))
    assert table.context_window(model) and table.max_output_tokens(model)


@pytest.mark.parametrize(
    "model",
    [
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "arn:aws:bedrock:us-east-1:123:inference-profile/eu.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "anthropic.claude-sonnet-4-5-20250929",
    ],
)
def test_bedrock_model_ids_take_the_vendors_prices(model: str) -> None:
    table = PriceTable.from_data(
        {"models": {"claude-sonnet-4-5-20250929": {"input": 3.0, "output": 15.0}}}
    )
    found = table.lookup(model)
    assert found is not None and found.rates.input == 3.0


def test_a_bedrock_id_of_another_model_finds_nothing() -> None:
    table = PriceTable.from_data({"models": {"claude-sonnet-4-5": {"input": 3.0, "output": 15.0}}})
    assert table.lookup("anthropic.claude-opus-4-5-20251101-v1:0") is None
    assert table.lookup("anthropic.claude-sonnet-4-5-20250929-v1:0") is not None  # undated


@pytest.mark.parametrize(
    ("model", "priced_as"),
    [
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),  # Vertex AI's Claude id
        ("publishers/anthropic/models/claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
        ("claude-haiku-4-5@20990101", "claude-haiku-4-5"),  # a date the table lacks: undated
        ("gemini-2.5-flash", "gemini-2.5-flash"),  # Vertex's Gemini names are Google's
        ("gpt-35-turbo", "gpt-3.5-turbo"),  # Azure OpenAI's spelling
        ("gpt-4o", "gpt-4o"),
    ],
)
def test_vertex_and_azure_model_ids_take_the_vendors_prices(model: str, priced_as: str) -> None:
    table = PriceTable.from_data(json.loads(SHIPPED.read_text()))
    found, wanted = table.lookup(model), table.lookup(priced_as)
    assert found is not None and found is wanted
