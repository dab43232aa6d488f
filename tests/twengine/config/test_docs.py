"""docs/configuration.md stays true: its example builds, and it names every field and default."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from twengine.config import Config, build_config, defaults
from twengine.rules import RequestFacts, resolve
from twproto.dialect import Dialect

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
EXAMPLE_MARK = "<!-- example: the test suite loads the YAML block below and builds it -->"


def example_data() -> Any:
    text = DOC.read_text(encoding="utf-8")
    after = text.split(EXAMPLE_MARK, 1)[1]
    m = re.search(r"```yaml\n(.*?)```", after, re.S)
    assert m is not None
    return YAML(typ="rt").load(io.StringIO(m[1]))


def example() -> Config:
    return build_config(example_data())


def test_the_full_example_builds() -> None:
    config = example()
    assert [p.name for p in config.providers] == ["anthropic", "openai", "relay", "gemini", "local"]
    assert config.listen.control.enabled
    assert config.client("ci").route == "batch"
    assert [n.name for n in config.notifications] == ["ops", "chat"]


def test_the_example_routes_as_described() -> None:
    config = example()
    claude = resolve(config, RequestFacts(model="sonnet", dialect=Dialect.ANTHROPIC, client="me"))
    assert claude.group == "claude"
    assert [(c.provider, c.model, c.weight) for c in claude.candidates] == [
        ("anthropic", "claude-sonnet-4-5", 7),
        ("relay", "anthropic/claude-sonnet-4.5", 3),
    ]
    assert claude.candidates[1].overrides.reasoning == "medium"
    long = resolve(
        config,
        RequestFacts(model="gpt-5", dialect=Dialect.OPENAI_CHAT, client="me", input_tokens=300_000),
    )
    assert [(c.provider, c.model) for c in long.candidates] == [("gemini", "gemini-2.5-pro")]
    denied = resolve(
        config, RequestFacts(model="local-llama", dialect=Dialect.OPENAI_CHAT, image=True)
    )
    assert denied.denied and denied.deny_message == "local models do not read images"


def test_every_field_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    fields = [
        *defaults.FAILOVER,
        "next_on_slow_start",
        *defaults.RETENTION,
        *defaults.PROVIDER,
        "allow_from",
        "base_url",
        "protocol",
        "headers",
        "models",
        "billing",
        "model_specs",
        "price_sheet",
        "context_window",
        "max_output_tokens",
        "cache_reads",
        "balance_by",
        "resume",
        "selected",
        "weight",
        "provider_would_be",
        "on_match",
        "default_route",
        "default_key",
        "redis_url",
        "postgres_dsn",
        "multiplier",
        "cache_write",
        "max_connections_per_address",
        "allow_origins",
        "allow_hosts",
        "max_body_bytes",
        "max_requests",
        "shed_loop_lag_ms",
        *defaults.POOL,
        *defaults.OBSERVABILITY,
        *defaults.NOTIFICATIONS,
        "secret",
        "events",
    ]
    # A field counts as documented when it appears inside inline code: `selected`,
    # `state.redis_url`, `model: {context_window, max_output_tokens}`.
    missing = [f for f in fields if not re.search(rf"`[^`\n]*\b{f}\b[^`\n]*`", text)]
    assert missing == []


def _shown(value: float) -> str:
    """A default as the page writes it: whole numbers in full (2592000), others shortest."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def test_documented_failover_defaults_match() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name, bound in defaults.FAILOVER.items():
        row = f"| `{name}` | `{_shown(bound.default)}` |"
        assert row in text, row
    for name, bound in defaults.RETENTION.items():
        assert f"| `{name}` | `{_shown(bound.default)}` |" in text
    for name, bound in defaults.POOL.items():
        assert f"| `{name}` | `{_shown(bound.default)}` |" in text, name
    for section in (defaults.OBSERVABILITY, defaults.NOTIFICATIONS):
        for name, bound in section.items():
            assert f"| `{name}` | `{_shown(bound.default)}` |" in text, name
