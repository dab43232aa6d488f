"""The runtime config: what a valid ``config.yaml`` means, as frozen values.

A `Config` is only ever made by `build_config` (or by tests), after every check has passed, so the
code that reads it may trust it: every name a group, route or client refers to exists, every
range holds, every comparison is parsed. Nothing here is mutable; a reload builds a new `Config`
and swaps it in whole, so a request that started under the old one finishes under it.

Collections are tuples in declared order, because order means something almost everywhere
(upstreams in ``__all__``, members of a fallback group, rules top to bottom). Lookups by name go
through methods backed by indexes built once in ``__post_init__``.

Secrets are kept as written, ``${VAR}`` templates included (see `template`); twserve expands
them when it needs the value. Gateway keys are handed over as a plain list: comparing a presented
key with them must be constant-time, which is twserve's business, so there is no lookup by key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from twengine.config import defaults
from twengine.config.problem import Problem
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel

__all__ = (
    "ALL_UPSTREAMS",
    "Alias",
    "AnswerModel",
    "BalanceBy",
    "BedrockSettings",
    "Billing",
    "Client",
    "CompareOp",
    "Comparison",
    "Config",
    "ControlListen",
    "Failover",
    "GatewayListen",
    "Group",
    "GroupMember",
    "GroupType",
    "Http2Listen",
    "HttpListen",
    "IPNetwork",
    "KeyLimit",
    "LimitMeasure",
    "LimitPeriod",
    "Listen",
    "LogFormat",
    "ModelPrice",
    "ModelSpec",
    "Observability",
    "OnMatch",
    "PinnedTarget",
    "PriceSheet",
    "Pricing",
    "Provider",
    "ResponsesTransport",
    "Retention",
    "RouteConfig",
    "RoutingRule",
    "SetOverrides",
    "StateConfig",
    "Store",
    "Target",
    "TargetKind",
    "Traces",
    "WebSocketListen",
    "When",
    "parse_comparison",
)

# The `to:` value meaning every upstream in declared order; reserved, so no name may take it.
ALL_UPSTREAMS = "__all__"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


# --- enumerations -------------------------------------------------------------------------


class LimitPeriod(StrEnum):
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"

    @property
    def rolling(self) -> bool:
        """Minute and hour windows roll; day, week and month follow the local calendar."""
        return self in (LimitPeriod.MINUTE, LimitPeriod.HOUR)

    @property
    def retention_days(self) -> int:
        """The `retention.row_days` needed to rebuild this window's totals at startup."""
        return {LimitPeriod.WEEK: 7, LimitPeriod.MONTH: 31}.get(self, 1)


class LimitMeasure(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    COST = "cost"


class ResponsesTransport(StrEnum):
    """How an OpenAI Responses upstream is called for a client's Responses WebSocket turns."""

    HTTP = "http"
    WEBSOCKET = "websocket"


class Billing(StrEnum):
    METERED = "metered"
    FREE = "free"


class GroupType(StrEnum):
    FALLBACK = "fallback"
    SELECT = "select"
    LOAD_BALANCE = "load-balance"
    URL_TEST = "url-test"
    CHEAPEST = "cheapest"


class AnswerModel(StrEnum):
    """Which model name an answer's body shows: the one the client asked for, or the one the
    upstream that answered was sent."""

    REQUESTED = "requested"
    SERVED = "served"


class BalanceBy(StrEnum):
    WEIGHTS = "weights"
    LATENCY = "latency"
    HEALTH = "health"
    LATENCY_HEALTH = "latency-health"


class OnMatch(StrEnum):
    STOP = "stop"
    CONTINUE = "continue"


class CompareOp(StrEnum):
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="


class TargetKind(StrEnum):
    PROVIDER = "provider"
    GROUP = "group"
    ALL = "all"
    PINNED = "pinned"


def _d(section: Mapping[str, defaults.Bound], name: str) -> float:
    default = section[name].default
    assert default is not None
    return float(default)


# --- listeners ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayListen:
    """``listen.gateway``. An empty `allow_from` lets every address in; loopback always may."""

    bind: str = defaults.GATEWAY_BIND
    port: int = defaults.GATEWAY_PORT
    allow_from: tuple[IPNetwork, ...] = ()
    # Client connections open at once; beyond it new ones wait in the listen backlog.
    max_connections: int = 1000
    # Of those, from one address (None: half of max_connections, `per_address_cap`).
    max_connections_per_address: int | None = None
    # Web page origins (``scheme://host[:port]``, lower-case; ``*`` any) whose requests are
    # served; a request from any other page is refused (twengine.browser).
    allow_origins: tuple[str, ...] = ()
    # Host names (lower-case, no port) a request's Host may name; empty: any.
    allow_hosts: tuple[str, ...] = ()

    @property
    def per_address_cap(self) -> int:
        """Connections one client address may hold open at once."""
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        return max(1, self.max_connections // 2)

    # The longest model name a request may ask for (400 `gw.request.model_name_too_long`):
    # the name is echoed in headers, rows, events and answers.
    max_model_name_chars: int = 256

    def allows(self, address: str) -> bool:
        """Whether a client at `address` may connect (checked before the key)."""
        if not self.allow_from:
            return True
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        # An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback:
            return True
        return any(ip.version == net.version and ip in net for net in self.allow_from)


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlListen:
    """``listen.control``: on when the section is present (unless ``enabled: false``)."""

    enabled: bool = False
    bind: str = defaults.CONTROL_BIND
    port: int = defaults.CONTROL_PORT
    key: str | None = None
    # The control listener's own caps: connections open at once, one request body's bytes.
    max_connections: int = int(defaults.CONTROL_MAX_CONNECTIONS.default or 32)
    max_body_bytes: int = int(defaults.CONTROL_MAX_BODY_BYTES.default or 1024 * 1024)

    @property
    def body_budget_bytes(self) -> int:
        """Request bodies the control listener holds in memory at once, apart from the
        gateway's budget: four of the largest."""
        return 4 * self.max_body_bytes

    max_config_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpListen:
    """``listen.http``: the bounds of every client connection's requests, whichever protocol
    it speaks (heads, bodies, the time each may take, one write to a client that does not
    read, the bodies held in memory at once). The control listener keeps its own connection
    and body caps (`ControlListen`)."""

    max_header_bytes: int = int(_d(defaults.LISTEN_HTTP, "max_header_bytes"))
    max_headers: int = int(_d(defaults.LISTEN_HTTP, "max_headers"))
    max_body_bytes: int = int(_d(defaults.LISTEN_HTTP, "max_body_bytes"))
    head_timeout_secs: float = _d(defaults.LISTEN_HTTP, "head_timeout_secs")
    body_timeout_secs: float = _d(defaults.LISTEN_HTTP, "body_timeout_secs")
    keepalive_timeout_secs: float = _d(defaults.LISTEN_HTTP, "keepalive_timeout_secs")
    write_timeout_secs: float = _d(defaults.LISTEN_HTTP, "write_timeout_secs")
    body_budget_bytes: int = int(_d(defaults.LISTEN_HTTP, "body_budget_bytes"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Http2Listen:
    """``listen.http2``: what one client HTTP/2 connection is allowed."""

    max_concurrent_streams: int = int(_d(defaults.LISTEN_HTTP2, "max_concurrent_streams"))
    max_frame_size: int = int(_d(defaults.LISTEN_HTTP2, "max_frame_size"))
    max_header_list_size: int = int(_d(defaults.LISTEN_HTTP2, "max_header_list_size"))
    hard_header_list_size: int = int(_d(defaults.LISTEN_HTTP2, "hard_header_list_size"))
    initial_window_size: int = int(_d(defaults.LISTEN_HTTP2, "initial_window_size"))
    max_resets: int = int(_d(defaults.LISTEN_HTTP2, "max_resets"))
    reset_window_secs: float = _d(defaults.LISTEN_HTTP2, "reset_window_secs")
    output_buffer_bytes: int = int(_d(defaults.LISTEN_HTTP2, "output_buffer_bytes"))
    max_owed_control_frames: int = int(_d(defaults.LISTEN_HTTP2, "max_owed_control_frames"))
    max_blocked_secs: float = _d(defaults.LISTEN_HTTP2, "max_blocked_secs")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSocketListen:
    """``listen.websocket``: what one Responses WebSocket is allowed (the idle timeout and the
    output bounds hold for Realtime connections too)."""

    max_message_bytes: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_message_bytes"))
    idle_timeout_secs: float = _d(defaults.LISTEN_WEBSOCKET, "idle_timeout_secs")
    max_queued_turns: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_queued_turns"))
    max_sockets_per_key: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_sockets_per_key"))
    output_buffer_bytes: int = int(_d(defaults.LISTEN_WEBSOCKET, "output_buffer_bytes"))
    max_owed_pongs: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_owed_pongs"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    gateway: GatewayListen = field(default_factory=GatewayListen)
    control: ControlListen = field(default_factory=ControlListen)
    http: HttpListen = field(default_factory=HttpListen)
    http2: Http2Listen = field(default_factory=Http2Listen)
    websocket: WebSocketListen = field(default_factory=WebSocketListen)


# --- clients (gateway keys) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimit:
    """One usage limit of a key: at most `amount` of `measure` per `per`.

    `amount` counts requests, tokens, or micro-dollars (for cost: 1 USD = 1_000_000), the unit
    the request store records cost in. `cache_reads` adds cache-read tokens to a token count.
    """

    per: LimitPeriod
    measure: LimitMeasure
    amount: int
    cache_reads: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """A gateway key (``clients[]``). `key` is kept as written, templates included."""

    name: str
    key: str
    route: str | None = None
    max_concurrent: int | None = None
    limits: tuple[KeyLimit, ...] = ()
    # A disabled key stays in the file (name, limits, history) but opens nothing.
    disabled: bool = False


# --- providers (upstreams) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A manual model spec; a None field falls back to the price table's figure."""

    context_window: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BedrockSettings:
    """A ``bedrock-anthropic`` provider's AWS fields, each a ``${VAR}``-able template or None:
    None reads the standard AWS variable at send time (``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; docs/bedrock.md)."""

    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """An upstream (``providers[]``).

    `protocol_recognised` is True when `protocol` was not written but recognised from the base
    URL. `models` None means the upstream offers any model. `key` None means no credential is
    sent (local servers). `base_url` has no trailing slash.
    """

    name: str
    base_url: str
    protocol: Dialect = Dialect.OPENAI_CHAT
    protocol_recognised: bool = False
    key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    models: tuple[str, ...] | None = None
    max_concurrent: int | None = None
    billing: Billing = Billing.METERED
    model_specs: tuple[tuple[str, ModelSpec], ...] = ()
    price_sheet: str | None = None
    connect_timeout_secs: float = _d(defaults.PROVIDER, "connect_timeout_secs")
    # A test setting: the client's ``x-mock-*`` headers (the mock upstream's per-request
    # script) go to this upstream. Off, nothing of the mock's reaches a real provider.
    forward_mock_headers: bool = False
    # Speak HTTP/2 to this upstream: offered by ALPN over https, prior knowledge (h2c) over http.
    http2: bool = False
    # Takes Realtime WebSockets (``/v1/realtime``) at its base URL (docs/transports.md).
    realtime: bool = False
    # ``websocket``: a client's Responses WebSocket turns reach this (openai-responses)
    # upstream over its own Responses WebSocket, one kept per client socket (docs/transports.md).
    responses_transport: ResponsesTransport = ResponsesTransport.HTTP
    # ``protocol: bedrock-anthropic``: `protocol` is Anthropic, sent as Bedrock's InvokeModel
    # (an empty `base_url` is the region's endpoint); `key`, when set, is a Bedrock API key.
    bedrock: BedrockSettings | None = None

    def offers(self, model: str) -> bool:
        """Whether the upstream serves `model` by its list (no list: any model)."""
        return self.models is None or model in self.models

    def model_to_send(self, model: str, alias: Alias | None = None) -> str | None:
        """The model name this upstream receives when `model` is asked for, or None.

        With `alias` (the alias `model` names), the upstream receives the first of its targets
        it offers, and an upstream without a list the first target. None: it offers none.
        """
        names = alias.targets if alias is not None else (model,)
        if self.models is None:
            return names[0]
        for name in names:
            if name in self.models:
                return name
        return None

    def model_spec(self, model: str) -> ModelSpec | None:
        """The manual spec for `model`, if `model_specs` has one."""
        for name, spec in self.model_specs:
            if name == model:
                return spec
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Alias:
    """``aliases.<name>``: an upstream offering any of `targets` receives the first it offers."""

    name: str
    targets: tuple[str, ...]


# --- groups -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMember:
    provider: str
    weight: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """``groups[]``. Members keep their declared order; strategies only reorder per request."""

    name: str
    type: GroupType = GroupType.FALLBACK
    members: tuple[GroupMember, ...] = ()
    selected: str | None = None
    balance_by: BalanceBy = BalanceBy.WEIGHTS
    resume: bool = False  # continue a broken stream on the next member (docs/failover.md)

    @property
    def provider_names(self) -> tuple[str, ...]:
        return tuple(m.provider for m in self.members)


# --- routes -------------------------------------------------------------------------------

_COMPARISON = re.compile(r"\s*(<=|>=|==|!=|<|>)\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*")
_SUFFIX = {"": 1, "k": 1_000, "m": 1_000_000}


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """A parsed ``">200k"``: `holds(n)` is ``n > 200_000``. `text` keeps the written form."""

    op: CompareOp
    value: int
    text: str

    def holds(self, number: int) -> bool:
        v = self.value
        match self.op:
            case CompareOp.LT:
                return number < v
            case CompareOp.LE:
                return number <= v
            case CompareOp.GT:
                return number > v
            case CompareOp.GE:
                return number >= v
            case CompareOp.EQ:
                return number == v
            case CompareOp.NE:
                return number != v


def parse_comparison(text: str | int) -> Comparison:
    """``">200k"``, ``"<=4k"``, ``"==3"``, ``">=1.5m"`` (k = 1000, m = 1e6), or a bare integer
    meaning ``==``. Raises ValueError for anything else, including a fraction of a token."""
    if isinstance(text, bool):
        raise ValueError("a comparison is text such as '>200k', not true/false")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a count cannot be negative, got {text}")
        return Comparison(op=CompareOp.EQ, value=text, text=str(text))
    m = _COMPARISON.fullmatch(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a comparison: write an operator (<, <=, >, >=, ==, !=) and a "
            "number with an optional k or m suffix, e.g. '>200k'"
        )
    op, number, suffix = m.groups()
    # Decimal arithmetic on the written digits, so "1.5m" is exactly 1_500_000.
    whole, _, frac = number.partition(".")
    scale = _SUFFIX[suffix.lower()]
    scaled_frac = int(frac or "0") * scale
    if scaled_frac % (10 ** len(frac or "0")):
        raise ValueError(f"{text!r} is not a whole number of tokens")
    value = int(whole) * scale + scaled_frac // 10 ** len(frac or "0")
    return Comparison(op=CompareOp(op), value=value, text=text.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class When:
    """A rule's conditions; all given ones must hold, and an empty `When` always holds.

    A tuple field holds when the request's value is any of its entries (globs for `model`).
    `provider_would_be` makes the rule a per-hop rule, judged as each upstream is tried.
    """

    model: tuple[str, ...] = ()
    client: tuple[str, ...] = ()
    dialect: tuple[Dialect, ...] = ()
    input_tokens: Comparison | None = None
    max_tokens: Comparison | None = None
    tool_count: Comparison | None = None
    tools: bool | None = None
    image: bool | None = None
    thinking: bool | None = None
    stream: bool | None = None
    provider_would_be: tuple[str, ...] = ()

    @property
    def per_hop(self) -> bool:
        return bool(self.provider_would_be)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetOverrides:
    """A rule's ``set``: rewrites applied to the request. None leaves a field alone."""

    model: str | None = None
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None

    @property
    def empty(self) -> bool:
        return self.model is None and self.max_tokens is None and self.reasoning is None

    def merged(self, later: SetOverrides) -> SetOverrides:
        """These overrides with `later`'s given fields on top (rules merge top to bottom)."""
        return SetOverrides(
            model=later.model if later.model is not None else self.model,
            max_tokens=later.max_tokens if later.max_tokens is not None else self.max_tokens,
            reasoning=later.reasoning if later.reasoning is not None else self.reasoning,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PinnedTarget:
    provider: str
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A rule's ``to``: an upstream or group by `name`, every upstream, or pinned pairs."""

    kind: TargetKind
    name: str | None = None
    pinned: tuple[PinnedTarget, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingRule:
    """``routes[].rules[]``. `deny` holds the message of a deny rule, else None.

    A rule *decides* when it has `to` or `deny`; the first matching decider ends the matching.
    A set-only rule goes on to the next rule unless ``on_match: stop``. `on_match` is None when
    the config did not write it.
    """

    name: str
    when: When = field(default_factory=When)
    to: Target | None = None
    overrides: SetOverrides = field(default_factory=SetOverrides)
    deny: str | None = None
    on_match: OnMatch | None = None

    @property
    def decides(self) -> bool:
        return self.to is not None or self.deny is not None

    @property
    def stops(self) -> bool:
        """Whether matching ends at this rule when it matches."""
        return self.decides or self.on_match is OnMatch.STOP


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteConfig:
    name: str
    rules: tuple[RoutingRule, ...] = ()
    resume: bool = False  # continue a broken stream on the next candidate (docs/failover.md)


# --- failover, retention, pricing, shared state -------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Failover:
    """``failover``: pauses, timeouts and waiting (docs/configuration.md, docs/failover.md)."""

    failures_to_pause: int = int(_d(defaults.FAILOVER, "failures_to_pause"))
    pause_secs: float = _d(defaults.FAILOVER, "pause_secs")
    max_pause_secs: float = _d(defaults.FAILOVER, "max_pause_secs")
    no_balance_pause_secs: float = _d(defaults.FAILOVER, "no_balance_pause_secs")
    quota_pause_secs: float = _d(defaults.FAILOVER, "quota_pause_secs")
    rate_limit_max_pause_secs: float = _d(defaults.FAILOVER, "rate_limit_max_pause_secs")
    idle_timeout_secs: float = _d(defaults.FAILOVER, "idle_timeout_secs")
    wait_secs: float = _d(defaults.FAILOVER, "wait_secs")
    next_on_slow_start: bool = False
    stream_start_wait_secs: float = _d(defaults.FAILOVER, "stream_start_wait_secs")


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """``retention``: how long rows and bodies are kept; `store_bodies` turns body storage on
    (each body cut at `body_max_bytes`)."""

    row_days: int = int(_d(defaults.RETENTION, "row_days"))
    body_days: int = int(_d(defaults.RETENTION, "body_days"))
    body_max_bytes: int = int(_d(defaults.RETENTION, "body_max_bytes"))
    store_bodies: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPrice:
    """USD per million tokens. A None cache price falls back to the shipped table's rule."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceSheet:
    """``pricing.sheets[]``: own prices, all multiplied by `multiplier` — and so are the shipped
    table's prices for models the sheet does not list, for upstreams that use the sheet."""

    name: str
    multiplier: float = 1.0
    models: tuple[tuple[str, ModelPrice], ...] = ()

    def price(self, model: str) -> ModelPrice | None:
        for name, price in self.models:
            if name == model:
                return price
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    sheets: tuple[PriceSheet, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StateConfig:
    """``state`` (docs/configuration.md): state shared across instances through Redis."""

    redis_url: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Store:
    """``store`` (docs/configuration.md): the request store beyond SQLite. `postgres_dsn` is
    kept as written, ``${VAR}`` templates included. `commit_before_end` holds each answer's
    end until its row is committed, at most `commit_wait_secs`."""

    postgres_dsn: str | None = None
    commit_before_end: bool = False
    commit_wait_secs: float = _d(defaults.STORE, "commit_wait_secs")


class LogFormat(StrEnum):
    """``observability.log_format``: one line of text per record, or one JSON object."""

    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Observability:
    """``observability`` (docs/observability.md): how the gateway's log is written and whether
    every request ends with an access line."""

    log_format: LogFormat = LogFormat.TEXT
    access_log: bool = True
    # ``observability.traces``: OpenTelemetry traces; None without the section (the standard
    # OTEL_EXPORTER_OTLP_*ENDPOINT variables may still turn them on, twserve.observe.traces).
    traces: Traces | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Traces:
    """``observability.traces`` (docs/observability.md): where spans are exported over OTLP/HTTP
    (None: the OTEL_EXPORTER_OTLP_*ENDPOINT variables, else the SDK's default), the share of
    new traces kept, and whether prompt text goes into spans."""

    endpoint: str | None = None
    sample_ratio: float = _d(defaults.TRACES, "sample_ratio")
    capture_content: bool = False


# --- the whole config ---------------------------------------------------------------------


_T = TypeVar("_T", Provider, Client, Alias, Group, RouteConfig, PriceSheet)


def _index(items: tuple[_T, ...]) -> Mapping[str, _T]:
    return MappingProxyType({item.name: item for item in items})


def _empty_index() -> Mapping[str, Any]:
    return MappingProxyType({})


def _no_index() -> Any:
    return field(default_factory=_empty_index, init=False, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A whole, valid config. Use `build_config` to make one from parsed YAML."""

    version: int = 1
    listen: Listen = field(default_factory=Listen)
    clients: tuple[Client, ...] = ()
    providers: tuple[Provider, ...] = ()
    aliases: tuple[Alias, ...] = ()
    groups: tuple[Group, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    default_route: str | None = None
    default_key: str | None = None
    failover: Failover = field(default_factory=Failover)
    answer_model: AnswerModel = AnswerModel.REQUESTED
    retention: Retention = field(default_factory=Retention)
    pricing: Pricing = field(default_factory=Pricing)
    # None without a ``state`` section: limits, slots, pauses and affinity are in-process.
    state: StateConfig | None = None
    # Not built yet (docs/operations.md, "Not built yet"): `build_config` refuses the section,
    # so this stays None.
    store: Store | None = None
    observability: Observability = field(default_factory=Observability)
    # Problems worth telling the operator that do not stop the config from serving (an upstream
    # key's variable not set yet).
    warnings: tuple[Problem, ...] = ()

    _providers: Mapping[str, Provider] = _no_index()
    _clients: Mapping[str, Client] = _no_index()
    _aliases: Mapping[str, Alias] = _no_index()
    _groups: Mapping[str, Group] = _no_index()
    _routes: Mapping[str, RouteConfig] = _no_index()
    _sheets: Mapping[str, PriceSheet] = _no_index()

    def __post_init__(self) -> None:
        # Frozen: the indexes are set once here and never change with the config they index.
        object.__setattr__(self, "_providers", _index(self.providers))
        object.__setattr__(self, "_clients", _index(self.clients))
        object.__setattr__(self, "_aliases", _index(self.aliases))
        object.__setattr__(self, "_groups", _index(self.groups))
        object.__setattr__(self, "_routes", _index(self.routes))
        object.__setattr__(self, "_sheets", _index(self.pricing.sheets))

    def provider(self, name: str) -> Provider:
        """The upstream called `name`; KeyError if there is none."""
        return self._providers[name]

    def group(self, name: str) -> Group:
        """The group called `name`; KeyError if there is none."""
        return self._groups[name]

    def route(self, name: str) -> RouteConfig:
        """The route called `name`; KeyError if there is none."""
        return self._routes[name]

    def client(self, name: str) -> Client:
        """The gateway key called `name` (by name, never by key); KeyError if there is none."""
        return self._clients[name]

    def client_for(self, matched: str | None, *, presented: bool) -> str | None:
        """The gateway key name a request is served as: `matched`, the name of the key it
        presented; or, when it presented none, `default_key` (None: the request is refused).

        A key that was presented but matches nothing is refused even with a `default_key`: a
        mistyped key must not pass as a keyless request.
        """
        if matched is not None:
            return matched
        if presented or self.default_key is None:
            return None
        # A disabled default key serves nobody either.
        default = self._clients.get(self.default_key)
        return None if default is not None and default.disabled else self.default_key

    def price_sheet(self, name: str) -> PriceSheet:
        """The price sheet called `name`; KeyError if there is none."""
        return self._sheets[name]

    def alias(self, name: str) -> Alias | None:
        """The alias called `name`, or None when `name` is not an alias."""
        return self._aliases.get(name)

    def model_for(self, provider: str, model: str) -> str | None:
        """The model upstream `provider` receives when `model` (maybe an alias) is asked for."""
        return self.provider(provider).model_to_send(model, self.alias(model))

    def has_provider(self, name: str) -> bool:
        return name in self._providers

    def has_group(self, name: str) -> bool:
        return name in self._groups

    def has_route(self, name: str) -> bool:
        return name in self._routes

    def has_client(self, name: str) -> bool:
        return name in self._clients
