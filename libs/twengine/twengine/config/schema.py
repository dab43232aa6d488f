"""The config's field names, section by section, and what each field is for — kept as data.

`SECTIONS` is the schema the validator reads mappings through: a section's path (``""`` for the
top level, ``providers[]`` for each entry of a list, ``providers[].model_specs.*`` for each value
of a mapping keyed by free names) maps to the field names allowed in it. Any other name is
`config.unknown_field`.

Every accepted field must also *do* something. `FIELD_USES` says, for each field path, where
it takes effect: the module outside the validator that reads it and the attribute of the
runtime model it reads (a test opens the module and checks the attribute is there), or that it
is only read by the validator itself (it shapes other checks), or that it is a section holding
other fields. `NOT_BUILT` lists fields whose behaviour is not built: the validator refuses them
with ``config.not_built`` rather than accept and ignore them. `PENDING` lists fields whose
behaviour is being built; they are accepted, and docs/operations.md lists them as not built yet.
A field moves from `PENDING` to `FIELD_USES` when the code that reads it lands.

A test walks `SECTIONS` and fails for any field that is in none of the three tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from twengine.config import defaults

__all__ = ("FIELD_USES", "NOT_BUILT", "PENDING", "SECTIONS", "FieldUse")

_MEASURES = ("requests", "tokens", "cost")

SECTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "": (
            "version",
            "listen",
            "clients",
            "providers",
            "aliases",
            "groups",
            "routes",
            "default_route",
            "default_key",
            "failover",
            "answer_model",
            "retention",
            "pricing",
            "state",
            "store",
            "observability",
            "pool",
            "notifications",
        ),
        "listen": ("gateway", "control", "http", "http2", "websocket"),
        "listen.http": tuple(defaults.LISTEN_HTTP),
        "listen.http2": tuple(defaults.LISTEN_HTTP2),
        "listen.websocket": tuple(defaults.LISTEN_WEBSOCKET),
        "listen.gateway": (
            "bind",
            "port",
            "allow_from",
            "max_connections",
            "max_connections_per_address",
            "allow_origins",
            "allow_hosts",
            "max_model_name_chars",
            "max_requests",
            "shed_loop_lag_ms",
        ),
        "listen.control": (
            "enabled",
            "bind",
            "port",
            "key",
            "max_connections",
            "max_body_bytes",
            "max_config_bytes",
        ),
        "clients[]": (
            "name",
            "key",
            "route",
            "max_concurrent",
            "limits",
            "disabled",
            "expires_at",
            "allowed_models",
            "previous_key",
            "previous_key_until",
        ),
        "clients[].limits[]": ("per", *_MEASURES, "cache_reads"),
        "providers[]": (
            "name",
            "base_url",
            "key",
            "protocol",
            "headers",
            "models",
            "max_concurrent",
            "billing",
            "model_specs",
            "price_sheet",
            "connect_timeout_secs",
            "max_answer_bytes",
            "forward_mock_headers",
            "http2",
            "realtime",
            "responses_transport",
            "region",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
            "count_tokens",
            "project",
            "location",
            "credentials_file",
            "api_version",
            "deployments",
            "api",
            "auth",
        ),
        "providers[].model_specs.*": ("context_window", "max_output_tokens"),
        "groups[]": ("name", "type", "providers", "selected", "balance_by", "resume"),
        "groups[].providers[]": ("name", "weight"),
        "routes[]": ("name", "rules", "resume"),
        "routes[].rules[]": ("name", "when", "to", "set", "deny", "on_match"),
        "routes[].rules[].when": (
            "model",
            "client",
            "dialect",
            "input_tokens",
            "max_tokens",
            "tool_count",
            "tools",
            "image",
            "thinking",
            "stream",
            "provider_would_be",
        ),
        "routes[].rules[].set": ("model", "max_tokens", "reasoning"),
        "routes[].rules[].to[]": ("provider", "model"),
        "failover": (*defaults.FAILOVER, "next_on_slow_start"),
        "retention": (*defaults.RETENTION, "store_bodies"),
        "pricing": ("sheets",),
        "pricing.sheets[]": ("name", "multiplier", "models"),
        "pricing.sheets[].models.*": ("input", "output", "cache_read", "cache_write"),
        "state": ("redis_url", *defaults.STATE),
        "store": ("postgres_dsn", "commit_before_end", *defaults.STORE),
        "observability": ("log_format", "access_log", "traces", *defaults.OBSERVABILITY),
        "observability.traces": ("endpoint", *defaults.TRACES, "capture_content"),
        "notifications[]": ("name", "url", "secret", "events", "format", *defaults.NOTIFICATIONS),
        "pool": tuple(defaults.POOL),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldUse:
    """Where a config field takes effect.

    `module` reads `attribute` of the runtime model (``"twserve.upstream.client"``, ``"key"``); a
    `module` of None means the validator itself is the reader (the field only shapes other
    checks, or is folded into another field), and `why` says how.
    """

    module: str | None
    attribute: str = ""
    why: str = ""


def _reads(module: str, attribute: str) -> FieldUse:
    return FieldUse(module=module, attribute=attribute)


def _validator(why: str) -> FieldUse:
    return FieldUse(module=None, why=why)


_SECTION = _validator("a section: its fields are listed on their own")

FIELD_USES: Mapping[str, FieldUse] = MappingProxyType(
    {
        "version": _validator("only version 1 exists; anything else is refused"),
        "listen": _SECTION,
        "listen.gateway": _SECTION,
        "listen.gateway.bind": _reads("twserve.app.wiring", "bind"),
        "listen.gateway.port": _reads("twserve.app.wiring", "port"),
        "listen.gateway.allow_from": _reads("twengine.callers", "allow_from"),
        "listen.gateway.max_connections": _reads("twserve.app.wiring", "max_connections"),
        "listen.gateway.max_connections_per_address": _reads(
            "twserve.app.wiring", "per_address_cap"
        ),
        "listen.gateway.allow_origins": _reads("twengine.browser", "allow_origins"),
        "listen.gateway.allow_hosts": _reads("twengine.browser", "allow_hosts"),
        "listen.gateway.max_model_name_chars": _reads("twengine.admission", "max_model_name_chars"),
        "listen.gateway.max_requests": _reads("twengine.shedding", "max_requests"),
        "listen.gateway.shed_loop_lag_ms": _reads("twengine.shedding", "shed_loop_lag_ms"),
        # The transports' bounds: read into the servers' limits when a connection is set up.
        **{f"listen.{section}": _SECTION for section in ("http", "http2", "websocket")},
        **{
            f"listen.{section}.{name}": _reads("twserve.app.transport_limits", name)
            for section, table in (
                ("http", defaults.LISTEN_HTTP),
                ("http2", defaults.LISTEN_HTTP2),
                ("websocket", defaults.LISTEN_WEBSOCKET),
            )
            for name in table
        },
        "listen.control": _SECTION,
        "listen.control.enabled": _reads("twserve.app.wiring", "enabled"),
        "listen.control.bind": _reads("twserve.app.wiring", "bind"),
        "listen.control.port": _reads("twserve.app.wiring", "port"),
        "listen.control.key": _reads("twserve.control.plane", "key"),
        "listen.control.max_connections": _reads("twserve.app.wiring", "max_connections"),
        "listen.control.max_body_bytes": _reads("twserve.app.wiring", "max_body_bytes"),
        "listen.control.max_config_bytes": _reads("twserve.control.config_api", "max_config_bytes"),
        "clients": _SECTION,
        "clients[].name": _reads("twengine.callers", "name"),
        "clients[].key": _reads("twengine.callers", "key"),
        "clients[].route": _reads("twengine.router", "route"),
        "clients[].max_concurrent": _reads("twserve.gateway.key_turn", "max_concurrent"),
        "clients[].disabled": _reads("twengine.callers", "disabled"),
        "clients[].expires_at": _reads("twengine.callers", "expires_at"),
        "clients[].allowed_models": _reads("twengine.admission", "allows_model"),
        "clients[].previous_key": _reads("twengine.callers", "previous_key"),
        "clients[].previous_key_until": _reads("twengine.callers", "previous_key_until"),
        "providers": _SECTION,
        "providers[].name": _reads("twserve.gateway.handler", "name"),
        "providers[].base_url": _reads("twengine.destinations", "base_url"),
        "providers[].key": _reads("twengine.config.credentials", "key"),
        "providers[].protocol": _reads("twengine.destinations", "protocol"),
        "providers[].headers": _reads("twengine.config.credentials", "headers"),
        "providers[].models": _reads("twengine.rules", "model_for"),
        "providers[].max_concurrent": _reads("twengine.router", "max_concurrent"),
        "providers[].billing": _reads("twengine.catalog", "billing"),
        "providers[].model_specs": _reads("twengine.model_listing", "model_spec"),
        "providers[].model_specs.*.context_window": _reads("twengine.catalog", "context_window"),
        "providers[].model_specs.*.max_output_tokens": _reads(
            "twengine.model_listing", "max_output_tokens"
        ),
        "providers[].price_sheet": _reads("twengine.catalog", "price_sheet"),
        "providers[].connect_timeout_secs": _reads("twengine.destinations", "connect_timeout_secs"),
        "providers[].max_answer_bytes": _reads("twengine.destinations", "max_answer_bytes"),
        "providers[].forward_mock_headers": _reads("twengine.destinations", "forward_mock_headers"),
        "providers[].http2": _reads("twengine.destinations", "http2"),
        "providers[].realtime": _reads("twserve.gateway.realtime", "realtime"),
        "providers[].responses_transport": _reads("twengine.destinations", "responses_transport"),
        "providers[].region": _reads("twengine.config.credentials", "region"),
        "providers[].aws_access_key_id": _reads("twengine.config.credentials", "access_key_id"),
        "providers[].aws_secret_access_key": _reads(
            "twengine.config.credentials", "secret_access_key"
        ),
        "providers[].aws_session_token": _reads("twengine.config.credentials", "session_token"),
        "providers[].count_tokens": _reads("twengine.admission", "count_tokens"),
        "providers[].project": _reads("twengine.config.cloud_access", "project"),
        "providers[].location": _reads("twengine.config.cloud_access", "location"),
        "providers[].credentials_file": _reads("twengine.config.cloud_access", "credentials_file"),
        "providers[].api_version": _reads("twengine.config.cloud_access", "api_version"),
        "providers[].deployments": _reads("twengine.config.cloud_access", "deployment"),
        "providers[].api": _reads("twengine.destinations", "protocol"),
        "providers[].auth": _reads("twengine.config.cloud_access", "entra"),
        "aliases": _reads("twengine.rules", "model_for"),
        "groups": _SECTION,
        "groups[].name": _reads("twengine.router", "group"),
        "groups[].type": _reads("twengine.rules", "type"),
        "groups[].providers": _reads("twengine.rules", "members"),
        "groups[].providers[].name": _reads("twengine.rules", "provider"),
        "groups[].providers[].weight": _reads("twengine.rules", "weight"),
        "groups[].selected": _reads("twengine.rules", "selected"),
        "groups[].balance_by": _reads("twengine.rules", "balance_by"),
        "groups[].resume": _reads("twengine.rules", "resume"),
        "routes": _SECTION,
        "routes[].name": _reads("twengine.rules", "route"),
        "routes[].rules": _reads("twengine.rules", "rules"),
        "routes[].resume": _reads("twengine.rules", "resume"),
        "routes[].rules[].name": _reads("twengine.rules", "name"),
        "routes[].rules[].when": _reads("twengine.rules", "when"),
        "routes[].rules[].to": _reads("twengine.rules", "to"),
        "routes[].rules[].to[].provider": _reads("twengine.rules", "provider"),
        "routes[].rules[].to[].model": _reads("twengine.rules", "model"),
        "routes[].rules[].set": _reads("twengine.rules", "overrides"),
        "routes[].rules[].deny": _reads("twengine.rules", "deny"),
        "routes[].rules[].on_match": _reads("twengine.rules", "stops"),
        **{
            f"routes[].rules[].when.{name}": _reads("twengine.rules", name)
            for name in (
                "model",
                "client",
                "dialect",
                "input_tokens",
                "max_tokens",
                "tool_count",
                "tools",
                "image",
                "thinking",
                "stream",
                "provider_would_be",
            )
        },
        "routes[].rules[].set.model": _reads("twengine.rules", "model"),
        "routes[].rules[].set.max_tokens": _reads("twengine.destinations", "max_tokens"),
        "routes[].rules[].set.reasoning": _reads("twengine.destinations", "reasoning"),
        "default_route": _reads("twengine.rules", "default_route"),
        "default_key": _reads("twengine.callers", "client_for"),
        "answer_model": _reads("twengine.destinations", "answer_model"),
        # The cheapest group type orders by input price; costs themselves are not computed yet.
        "pricing": _SECTION,
        "pricing.sheets": _reads("twengine.catalog", "price_sheet"),
        "pricing.sheets[].name": _reads("twengine.catalog", "price_sheet"),
        "pricing.sheets[].multiplier": _reads("twengine.catalog", "multiplier"),
        "pricing.sheets[].models": _reads("twengine.catalog", "price"),
        "pricing.sheets[].models.*.input": _reads("twengine.catalog", "input"),
        "clients[].limits": _reads("twengine.limits", "limits"),
        "clients[].limits[].per": _reads("twengine.limits", "per"),
        "clients[].limits[].requests": _reads("twengine.limits", "measure"),
        "clients[].limits[].tokens": _reads("twengine.limits", "measure"),
        "clients[].limits[].cost": _reads("twengine.limits", "amount"),
        "clients[].limits[].cache_reads": _reads("twengine.limits", "cache_reads"),
        "retention": _SECTION,
        **{
            f"retention.{name}": _reads(
                "twserve.app.maintenance"
                if name.endswith("_days")
                else "twserve.gateway.conversations"
                if name.startswith("responses_")
                else "twserve.gateway.responders",
                name,
            )
            for name in (*defaults.RETENTION, "store_bodies")
        },
        "pricing.sheets[].models.*.output": _reads("twengine.pricing", "output"),
        "pricing.sheets[].models.*.cache_read": _reads("twengine.pricing", "cache_read"),
        "pricing.sheets[].models.*.cache_write": _reads("twengine.pricing", "cache_write"),
        "state": _SECTION,
        "state.redis_url": _reads("twserve.shared.redis", "redis_url"),
        **{f"state.{name}": _reads("twserve.app.wiring", name) for name in defaults.STATE},
        "store": _SECTION,
        "store.postgres_dsn": _reads("twserve.app.wiring", "postgres_dsn"),
        "store.commit_before_end": _reads("twserve.gateway.responders", "commit_before_end"),
        "store.commit_wait_secs": _reads("twserve.gateway.responders", "commit_wait_secs"),
        "observability": _SECTION,
        "observability.log_format": _reads("twserve.observe.logs", "log_format"),
        "observability.access_log": _reads("twserve.observe.logs", "access_log"),
        "pool": _SECTION,
        **{f"pool.{name}": _reads("twserve.upstream.client", name) for name in defaults.POOL},
        "observability.log_queue_lines": _reads("twserve.observe.logs", "log_queue_lines"),
        "notifications": _reads("twserve.observe.notify", "notifications"),
        **{
            f"notifications[].{name}": _reads("twserve.observe.notify", name)
            for name in ("name", "url", "secret", "events", "format", *defaults.NOTIFICATIONS)
        },
        "observability.traces": _SECTION,
        "observability.traces.endpoint": _reads("twserve.observe.traces", "endpoint"),
        "observability.traces.sample_ratio": _reads("twserve.observe.traces", "sample_ratio"),
        "observability.traces.capture_content": _reads("twserve.observe.traces", "capture_content"),
        "failover": _SECTION,
        "failover.failures_to_pause": _reads("twengine.health", "failures_to_pause"),
        "failover.pause_secs": _reads("twengine.health", "pause_secs"),
        "failover.max_pause_secs": _reads("twengine.health", "max_pause_secs"),
        "failover.no_balance_pause_secs": _reads("twengine.health", "no_balance_pause_secs"),
        "failover.quota_pause_secs": _reads("twengine.health", "quota_pause_secs"),
        "failover.rate_limit_max_pause_secs": _reads(
            "twengine.health", "rate_limit_max_pause_secs"
        ),
        "failover.idle_timeout_secs": _reads("twengine.attempt.actions", "idle_timeout_secs"),
        "failover.wait_secs": _reads("twengine.attempt.actions", "wait_secs"),
        "failover.next_on_slow_start": _reads("twengine.attempt.actions", "next_on_slow_start"),
        "failover.stream_start_wait_secs": _reads(
            "twengine.attempt.actions", "stream_start_wait_secs"
        ),
    }
)

# Behaviour nobody builds yet: the validator refuses these with ``config.not_built``.
NOT_BUILT: Mapping[str, str] = MappingProxyType({})

# Behaviour being built now: accepted, and listed in docs/operations.md as not built yet.
PENDING: Mapping[str, str] = MappingProxyType({})
