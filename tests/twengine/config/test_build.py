"""Valid configs: defaults, every section read into the frozen model, lookups."""

from __future__ import annotations

import dataclasses
import io
import ipaddress
from typing import Any

import pytest
from ruamel.yaml import YAML

from twengine.config import (
    ALL_UPSTREAMS,
    Alias,
    BalanceBy,
    Billing,
    CompareOp,
    Config,
    ConfigError,
    Failover,
    GroupMember,
    GroupType,
    KeyLimit,
    LimitMeasure,
    LimitPeriod,
    ModelPrice,
    ModelSpec,
    OnMatch,
    PinnedTarget,
    Retention,
    SetOverrides,
    StateConfig,
    Store,
    TargetKind,
    build_config,
    parse_comparison,
)
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel


def build(**sections: Any) -> Config:
    return build_config({"version": 1, **sections})


def test_minimal_config_is_all_defaults() -> None:
    config = build()
    assert config == Config()
    assert config.listen.gateway.bind == "127.0.0.1"
    assert config.listen.gateway.port == 8788
    assert config.listen.gateway.allow_from == ()
    assert config.listen.control.enabled is False
    assert config.listen.control.port == 8789
    assert config.failover == Failover(
        failures_to_pause=3,
        pause_secs=60,
        max_pause_secs=600,
        no_balance_pause_secs=1800,
        quota_pause_secs=3600,
        rate_limit_max_pause_secs=3600,
        idle_timeout_secs=300,
        wait_secs=120,
        next_on_slow_start=False,
        stream_start_wait_secs=30,
    )
    assert config.retention == Retention(row_days=90, body_days=7)
    assert (config.providers, config.clients, config.routes) == ((), (), ())
    assert config.state is None and config.store is None


def test_config_is_frozen_and_hashable() -> None:
    config = build(providers=[{"name": "a", "base_url": "https://x.example"}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.default_route = "x"  # type: ignore[misc]
    assert hash(config) == hash(build(providers=[{"name": "a", "base_url": "https://x.example"}]))


def test_null_means_absent() -> None:
    config = build(
        providers=[{"name": "a", "base_url": "https://x.example", "key": None, "models": None}],
        failover=None,
        default_route=None,
    )
    assert config.provider("a").key is None
    assert config.provider("a").models is None
    assert config.failover == Failover()


def test_listen_sections() -> None:
    config = build(
        listen={
            "gateway": {
                "bind": "0.0.0.0",
                "port": 9000,
                "allow_from": ["10.0.0.0/8", "192.168.1.7/24", "2001:db8::/32", "172.16.0.9"],
            },
            "control": {"bind": "localhost", "port": 9001, "key": "${CONTROL_KEY}"},
        }
    )
    gateway, control = config.listen.gateway, config.listen.control
    assert (gateway.bind, gateway.port) == ("0.0.0.0", 9000)
    assert gateway.allow_from == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.168.1.0/24"),
        ipaddress.ip_network("2001:db8::/32"),
        ipaddress.ip_network("172.16.0.9/32"),
    )
    assert control.enabled and control.key == "${CONTROL_KEY}"
    assert (control.bind, control.port) == ("localhost", 9001)


def test_control_can_be_switched_off_without_a_key() -> None:
    config = build(listen={"control": {"enabled": False}})
    assert config.listen.control.enabled is False
    assert config.listen.control.key is None


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("10.1.2.3", True),
        ("11.0.0.1", False),
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:10.9.9.9", True),
        ("::ffff:11.0.0.1", False),
        ("::ffff:127.0.0.1", True),
        ("2001:db8::5", True),
        ("2001:db9::5", False),
        ("fe80::1%eth0", False),
        ("not an address", False),
    ],
)
def test_allow_from(address: str, allowed: bool) -> None:
    config = build(listen={"gateway": {"allow_from": ["10.0.0.0/8", "2001:db8::/32"]}})
    assert config.listen.gateway.allows(address) is allowed


def test_empty_allow_from_allows_everyone() -> None:
    assert build().listen.gateway.allows("203.0.113.5")


def test_connection_caps_and_web_page_settings() -> None:
    config = build()
    gateway, control = config.listen.gateway, config.listen.control
    assert (gateway.allow_origins, gateway.allow_hosts) == ((), ())
    assert gateway.per_address_cap == 500  # half of max_connections when unset
    assert (control.max_connections, control.max_body_bytes) == (32, 1024 * 1024)
    assert control.body_budget_bytes == 4 * 1024 * 1024
    config = build(
        listen={
            "gateway": {
                "max_connections": 7,
                "allow_origins": ["HTTPS://App.Example.com/", "*", "null"],
                "allow_hosts": ["Gateway.Local", "[::1]", "10.0.0.2"],
            },
            "control": {"key": "c", "max_connections": 3, "max_body_bytes": 4096},
        }
    )
    gateway, control = config.listen.gateway, config.listen.control
    assert gateway.per_address_cap == 3
    assert gateway.allow_origins == ("https://app.example.com", "*", "null")
    assert gateway.allow_hosts == ("gateway.local", "::1", "10.0.0.2")
    assert (control.max_connections, control.max_body_bytes) == (3, 4096)
    explicit = build(listen={"gateway": {"max_connections_per_address": 40}})
    assert explicit.listen.gateway.per_address_cap == 40


@pytest.mark.parametrize(
    ("url", "protocol"),
    [
        ("https://api.anthropic.com", Dialect.ANTHROPIC),
        ("https://API.Anthropic.com/", Dialect.ANTHROPIC),
        ("https://generativelanguage.googleapis.com", Dialect.GEMINI),
        ("https://api.openai.com/v1", Dialect.OPENAI_CHAT),
        ("http://127.0.0.1:11434/v1", Dialect.OPENAI_CHAT),
        ("https://[::1]:8443/relay/v1", Dialect.OPENAI_CHAT),
    ],
)
def test_protocol_recognised_from_base_url(url: str, protocol: Dialect) -> None:
    provider = build(providers=[{"name": "p", "base_url": url}]).provider("p")
    assert provider.protocol is protocol
    assert provider.protocol_recognised


def test_written_protocol_wins() -> None:
    provider = build(
        providers=[
            {"name": "p", "base_url": "https://api.anthropic.com", "protocol": "openai-responses"}
        ]
    ).provider("p")
    assert provider.protocol is Dialect.OPENAI_RESPONSES
    assert not provider.protocol_recognised


def test_provider_fields() -> None:
    config = build(
        pricing={"sheets": [{"name": "half", "multiplier": 0.5}]},
        providers=[
            {
                "name": "relay",
                "base_url": "https://relay.example/v1/",
                "key": "${RELAY_KEY}",
                "protocol": "openai-chat",
                "headers": {"x-team": "core", "x-token": "Bearer ${TEAM_TOKEN}"},
                "models": ["gpt-5", "gpt-5-mini"],
                "max_concurrent": 8,
                "billing": "free",
                "model_specs": {
                    "gpt-5": {"context_window": 400_000, "max_output_tokens": 128_000},
                    "gpt-5-mini": {"max_output_tokens": 64_000},
                },
                "price_sheet": "half",
                "connect_timeout_secs": 2.5,
            }
        ],
    )
    p = config.provider("relay")
    assert p.base_url == "https://relay.example/v1"
    assert p.key == "${RELAY_KEY}"
    assert p.headers == (("x-team", "core"), ("x-token", "Bearer ${TEAM_TOKEN}"))
    assert p.models == ("gpt-5", "gpt-5-mini")
    assert p.max_concurrent == 8
    assert p.billing is Billing.FREE
    assert p.model_spec("gpt-5") == ModelSpec(context_window=400_000, max_output_tokens=128_000)
    assert p.model_spec("gpt-5-mini") == ModelSpec(max_output_tokens=64_000)
    assert p.model_spec("gpt-4") is None
    assert p.price_sheet == "half"
    assert p.connect_timeout_secs == 2.5
    assert p.offers("gpt-5") and not p.offers("gpt-4")


def test_provider_defaults() -> None:
    p = build(providers=[{"name": "p", "base_url": "https://x.example"}]).provider("p")
    assert p.key is None and p.models is None and p.max_concurrent is None
    assert p.billing is Billing.METERED
    assert p.connect_timeout_secs == 10.0
    assert p.offers("anything")


def test_clients_and_limits() -> None:
    config = build(
        routes=[{"name": "cheap"}],
        clients=[
            {
                "name": "ci",
                "key": "${CI_KEY}",
                "route": "cheap",
                "max_concurrent": 4,
                "limits": [
                    {"per": "minute", "requests": 60},
                    {"per": "day", "tokens": 2_000_000, "cache_reads": True},
                    {"per": "month", "cost": 12.5},
                ],
            },
            {"name": "me", "key": "plain-key"},
        ],
    )
    ci = config.client("ci")
    assert ci.route == "cheap" and ci.max_concurrent == 4
    assert ci.limits == (
        KeyLimit(per=LimitPeriod.MINUTE, measure=LimitMeasure.REQUESTS, amount=60),
        KeyLimit(
            per=LimitPeriod.DAY, measure=LimitMeasure.TOKENS, amount=2_000_000, cache_reads=True
        ),
        KeyLimit(per=LimitPeriod.MONTH, measure=LimitMeasure.COST, amount=12_500_000),
    )
    assert config.client("me").limits == ()
    assert [c.name for c in config.clients] == ["ci", "me"]


def test_limit_periods() -> None:
    assert [p.rolling for p in LimitPeriod] == [True, True, False, False, False]
    assert [p.retention_days for p in LimitPeriod] == [1, 1, 1, 7, 31]


def test_week_limit_with_enough_retention() -> None:
    config = build(
        retention={"row_days": 7},
        clients=[{"name": "x", "key": "k", "limits": [{"per": "week", "requests": 5}]}],
    )
    assert config.client("x").limits[0].per is LimitPeriod.WEEK


def test_default_key() -> None:
    config = build(clients=[{"name": "local", "key": "k"}], default_key="local")
    assert config.default_key == "local"


def test_aliases() -> None:
    config = build(
        aliases={"sonnet": ["claude-sonnet-4-5", "anthropic/claude-sonnet-4.5"], "fast": "m1"}
    )
    assert config.aliases == (
        Alias(name="sonnet", targets=("claude-sonnet-4-5", "anthropic/claude-sonnet-4.5")),
        Alias(name="fast", targets=("m1",)),
    )
    assert config.alias("fast") == Alias(name="fast", targets=("m1",))
    assert config.alias("m1") is None


def test_alias_may_list_its_own_name() -> None:
    config = build(aliases={"sonnet": ["claude-sonnet-4-5", "sonnet"]})
    assert config.alias("sonnet") is not None


def test_groups() -> None:
    config = build(
        providers=[
            {"name": n, "base_url": "https://x.example"} for n in ("official", "relay", "spare")
        ],
        groups=[
            {
                "name": "lb",
                "type": "load-balance",
                "providers": [{"name": "relay", "weight": 7}, "official", {"name": "spare"}],
                "balance_by": "latency-health",
            },
            {
                "name": "pick",
                "type": "select",
                "providers": ["official", "relay"],
                "selected": "relay",
            },
            {"name": "plain", "providers": ["spare", "official"]},
        ],
    )
    lb = config.group("lb")
    assert lb.type is GroupType.LOAD_BALANCE and lb.balance_by is BalanceBy.LATENCY_HEALTH
    assert lb.members == (
        GroupMember(provider="relay", weight=7),
        GroupMember(provider="official", weight=1),
        GroupMember(provider="spare", weight=1),
    )
    assert config.group("pick").selected == "relay"
    plain = config.group("plain")
    assert plain.type is GroupType.FALLBACK and plain.balance_by is BalanceBy.WEIGHTS
    assert plain.provider_names == ("spare", "official")


def test_routes_and_rules() -> None:
    config = build(
        clients=[{"name": "ci", "key": "k"}],
        providers=[
            {"name": "a", "base_url": "https://x.example"},
            {"name": "b", "base_url": "https://y.example", "models": ["m1"]},
        ],
        aliases={"quick": ["m1"]},
        groups=[{"name": "both", "providers": ["a", "b"]}],
        routes=[
            {
                "name": "default",
                "rules": [
                    {
                        "name": "hop",
                        "when": {"provider_would_be": "b"},
                        "set": {"reasoning": "low"},
                        "on_match": "continue",
                    },
                    {
                        "name": "big",
                        "when": {
                            "model": ["claude-*", "gpt-5*"],
                            "client": "ci",
                            "dialect": ["anthropic", "openai-responses"],
                            "input_tokens": ">200k",
                            "max_tokens": "<=4k",
                            "tool_count": 3,
                            "tools": True,
                            "image": False,
                            "thinking": True,
                            "stream": True,
                        },
                        "to": "both",
                    },
                    {"name": "one", "when": {"model": "x"}, "to": "a"},
                    {"name": "all", "when": {"model": "y"}, "to": "__all__"},
                    {"name": "pin", "to": [{"provider": "b", "model": "quick"}]},
                    {"name": "no", "deny": True},
                    {"name": "no2", "deny": "go away"},
                    {"name": "rewrite", "set": {"model": "quick", "max_tokens": 100}},
                    {"name": "halt", "set": {"reasoning": "off"}, "on_match": "stop"},
                ],
            }
        ],
    )
    rules = {r.name: r for r in config.route("default").rules}
    assert rules["hop"].when.per_hop and rules["hop"].on_match is OnMatch.CONTINUE
    assert not rules["hop"].stops
    big = rules["big"].when
    assert big.model == ("claude-*", "gpt-5*")
    assert big.client == ("ci",)
    assert big.dialect == (Dialect.ANTHROPIC, Dialect.OPENAI_RESPONSES)
    assert big.input_tokens is not None and big.input_tokens.value == 200_000
    assert big.max_tokens is not None and big.max_tokens.op is CompareOp.LE
    assert big.tool_count is not None and big.tool_count.op is CompareOp.EQ
    assert (big.tools, big.image, big.thinking, big.stream) == (True, False, True, True)
    assert rules["big"].to is not None and rules["big"].to.kind is TargetKind.GROUP
    assert rules["one"].to is not None and rules["one"].to.kind is TargetKind.PROVIDER
    assert rules["all"].to is not None and rules["all"].to.kind is TargetKind.ALL
    pin = rules["pin"].to
    assert pin is not None and pin.kind is TargetKind.PINNED
    assert pin.pinned == (PinnedTarget(provider="b", model="quick"),)
    assert rules["no"].deny == "denied by rule 'no'" and rules["no"].stops
    assert rules["no2"].deny == "go away"
    assert rules["rewrite"].overrides == SetOverrides(model="quick", max_tokens=100)
    assert not rules["rewrite"].stops
    assert rules["halt"].overrides.reasoning is ReasoningLevel.OFF and rules["halt"].stops
    assert ALL_UPSTREAMS == "__all__"


def test_failover_and_retention() -> None:
    config = build(
        failover={
            "failures_to_pause": 5,
            "pause_secs": 30,
            "max_pause_secs": 900,
            "idle_timeout_secs": 600,
            "wait_secs": 0,
            "next_on_slow_start": True,
            "stream_start_wait_secs": 45,
        },
        retention={"row_days": 400, "body_days": 0},
    )
    f = config.failover
    assert (f.failures_to_pause, f.pause_secs, f.max_pause_secs) == (5, 30.0, 900.0)
    assert (f.idle_timeout_secs, f.wait_secs) == (600.0, 0.0)
    assert f.next_on_slow_start and f.stream_start_wait_secs == 45.0
    assert isinstance(f.failures_to_pause, int) and isinstance(f.pause_secs, float)
    assert config.retention == Retention(row_days=400, body_days=0)


def test_short_stream_start_wait_is_fine_when_switch_is_off() -> None:
    assert build(failover={"stream_start_wait_secs": 2}).failover.stream_start_wait_secs == 2


def test_pricing() -> None:
    config = build(
        pricing={
            "sheets": [
                {
                    "name": "relay",
                    "multiplier": 0.8,
                    "models": {
                        "my-model": {"input": 1, "output": 4.5, "cache_read": 0.1},
                    },
                }
            ]
        }
    )
    sheet = config.price_sheet("relay")
    assert sheet.multiplier == 0.8
    assert sheet.price("my-model") == ModelPrice(input=1, output=4.5, cache_read=0.1)
    assert sheet.price("other") is None


def test_state_is_built() -> None:
    config = build(state={"redis_url": " rediss://:secret@cache.internal:6380/2 "})
    assert config.state is not None
    assert config.state.redis_url == "rediss://:secret@cache.internal:6380/2"
    assert build(state={}).state == StateConfig()
    # A password in a bad URL is not quoted back.
    with pytest.raises(ConfigError) as info:
        build(state={"redis_url": "redis://:secret@cache:notaport/x"})
    assert info.value.problems[0].code == "config.url_invalid"
    assert "secret" not in info.value.problems[0].message


def test_state_timing_is_built_and_bounded() -> None:
    config = build(state={"redis_url": "redis://cache", "timeout_secs": 2.5, "retry_secs": 0.5})
    assert config.state is not None
    assert (config.state.timeout_secs, config.state.retry_secs) == (2.5, 0.5)
    assert (StateConfig().timeout_secs, StateConfig().retry_secs) == (1.0, 1.0)
    for field, value in (("timeout_secs", 0.01), ("timeout_secs", 31), ("retry_secs", 0)):
        with pytest.raises(ConfigError) as info:
            build(state={"redis_url": "redis://cache", field: value})
        (problem,) = info.value.problems
        assert (problem.code, problem.path) == ("config.out_of_range", f"state.{field}")


def test_postgres_dsn_is_kept_as_written_and_checked_with_the_environment() -> None:
    config = build(store={"postgres_dsn": "postgresql://tw@db/tw"})
    assert config.store is not None and config.store.postgres_dsn == "postgresql://tw@db/tw"
    templated = {"postgres_dsn": "${TW_PG}"}
    # Without an environment only the template's syntax is checked.
    assert build(store=templated).store == Store(postgres_dsn="${TW_PG}")
    data = {"version": 1, "store": templated}
    config = build_config(data, env={"TW_PG": "postgres://tw:pw@db:5433/tw?sslmode=require"})
    assert config.store == Store(postgres_dsn="${TW_PG}")
    with pytest.raises(ConfigError) as info:
        build_config(data, env={})
    assert [(p.code, p.path) for p in info.value.problems] == [
        ("config.env_missing", "store.postgres_dsn")
    ]
    with pytest.raises(ConfigError) as info:
        build_config(data, env={"TW_PG": "redis://tw:hunter2@db/0"})
    (problem,) = info.value.problems
    assert (problem.code, problem.path) == ("config.url_invalid", "store.postgres_dsn")
    assert "hunter2" not in problem.message
    assert build(store={}).store == Store()


def test_lookups() -> None:
    config = build(
        providers=[{"name": "a", "base_url": "https://x.example", "models": ["m2", "m1"]}],
        aliases={"fast": ["m0", "m1", "m2"]},
        routes=[{"name": "r"}],
        clients=[{"name": "c", "key": "k"}],
    )
    assert config.has_provider("a") and not config.has_provider("b")
    assert config.has_route("r") and config.has_client("c") and not config.has_group("a")
    with pytest.raises(KeyError):
        config.provider("b")
    with pytest.raises(KeyError):
        config.group("a")
    # The upstream receives the first of the alias's names it offers.
    assert config.model_for("a", "fast") == "m1"
    assert config.model_for("a", "m2") == "m2"
    assert config.model_for("a", "m3") is None


def test_ruamel_round_trip_data_is_accepted() -> None:
    text = """\
version: 1
# upstreams
providers:
  - name: a            # the official one
    base_url: https://api.anthropic.com
    max_concurrent: 4
groups:
  - {name: g, type: load-balance, providers: [{name: a, weight: 3}]}
failover:
  pause_secs: 12.5
"""
    data = YAML(typ="rt").load(io.StringIO(text))
    config = build_config(data)
    assert config.provider("a").max_concurrent == 4
    assert type(config.provider("a").name) is str
    assert config.group("g").members[0].weight == 3
    assert config.failover.pause_secs == 12.5


def test_config_error_is_an_exception_with_problems() -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"version": 1, "nope": 1})
    assert len(info.value.problems) == 1
    assert (
        str(info.value)
        == "1 problem in the config\n  nope: unknown field 'nope' [config.unknown_field]"
    )


@pytest.mark.parametrize(
    ("text", "op", "value"),
    [
        (">200k", CompareOp.GT, 200_000),
        ("<=4k", CompareOp.LE, 4_000),
        ("==3", CompareOp.EQ, 3),
        (">=1.5m", CompareOp.GE, 1_500_000),
        ("< 2M", CompareOp.LT, 2_000_000),
        (" != 0 ", CompareOp.NE, 0),
        (">1.25k", CompareOp.GT, 1_250),
        ("<0.5k", CompareOp.LT, 500),
        (7, CompareOp.EQ, 7),
    ],
)
def test_parse_comparison(text: str | int, op: CompareOp, value: int) -> None:
    comparison = parse_comparison(text)
    assert (comparison.op, comparison.value) == (op, value)


@pytest.mark.parametrize(
    "text", ["", ">", "200k", "=3", ">-1", ">1.5", ">0.0001k", ">1kk", "> k", ">1e3", -1, True]
)
def test_parse_comparison_refuses(text: str | int) -> None:
    with pytest.raises(ValueError):
        parse_comparison(text)


@pytest.mark.parametrize(
    ("text", "true_for", "false_for"),
    [
        (">10", [11], [10, 9]),
        (">=10", [10, 11], [9]),
        ("<10", [9], [10]),
        ("<=10", [10, 9], [11]),
        ("==10", [10], [9, 11]),
        ("!=10", [9, 11], [10]),
    ],
)
def test_comparison_holds(text: str, true_for: list[int], false_for: list[int]) -> None:
    comparison = parse_comparison(text)
    assert all(comparison.holds(n) for n in true_for)
    assert not any(comparison.holds(n) for n in false_for)
