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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, TypeVar

from twengine.config import defaults
from twengine.config.listen import (
    ControlListen,
    GatewayListen,
    Http2Listen,
    HttpListen,
    IPNetwork,
    Listen,
    WebSocketListen,
)
from twengine.config.problem import Problem
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel

__all__ = (
    "ALL_UPSTREAMS",
    "Alias",
    "AnswerModel",
    "BalanceBy",
    "BedrockCount",
    "BedrockSettings",
    "Billing",
    "Client",
    "CloudPlatform",
    "CloudSettings",
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
    "Notification",
    "NotifyEvent",
    "NotifyFormat",
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
    "UpstreamPool",
    "WebSocketListen",
    "When",
    "parse_comparison",
)

# The `to:` value meaning every upstream in declared order; reserved, so no name may take it.
ALL_UPSTREAMS = "__all__"


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


class BedrockCount(StrEnum):
    """How a Bedrock provider answers a token count (``count_tokens``, docs/bedrock.md)."""

    UPSTREAM = "upstream"  # Bedrock's CountTokens; a model without it: the local estimate
    ESTIMATE = "estimate"  # the gateway's local estimate, Bedrock not asked
    REFUSE = "refuse"  # 501, as a gateway without token counts through Bedrock answers


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
    # From this wall-clock time on (unix seconds) the key is refused (gw.auth.key_expired).
    expires_at: float | None = None
    # Model globs the key may ask for (fnmatchcase, as rules match models); empty: any model.
    allowed_models: tuple[str, ...] = ()
    # The secret a rotation replaced, still accepted until `previous_key_until` (unix seconds).
    previous_key: str | None = None
    previous_key_until: float | None = None

    def allows_model(self, model: str) -> bool:
        """Whether the key may ask for `model` (`allowed_models`; none listed: any)."""
        return not self.allowed_models or any(fnmatchcase(model, p) for p in self.allowed_models)


# --- providers (upstreams) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A manual model spec; a None field falls back to the price table's figure."""

    context_window: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BedrockSettings:
    """A ``bedrock-anthropic`` or ``bedrock-converse`` provider's AWS fields, each a
    ``${VAR}``-able template or None: None reads the standard AWS variable at send time
    (``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``; docs/bedrock.md)."""

    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    count_tokens: BedrockCount = BedrockCount.UPSTREAM
    # ``protocol: bedrock-converse``: Converse / ConverseStream instead of InvokeModel.
    converse: bool = False


class CloudPlatform(StrEnum):
    """A cloud platform's upstream protocol (docs/cloud.md)."""

    VERTEX_GEMINI = "vertex-gemini"
    VERTEX_ANTHROPIC = "vertex-anthropic"
    AZURE_OPENAI = "azure-openai"


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudSettings:
    """A Vertex AI or Azure OpenAI provider's own fields, each text field a ``${VAR}``-able
    template or None (docs/cloud.md).

    Vertex: `project` (None: ``GOOGLE_CLOUD_PROJECT``), `location` (None:
    ``GOOGLE_CLOUD_LOCATION``, else ``global``), `credentials_file` (a service-account key file;
    None: ``GOOGLE_APPLICATION_CREDENTIALS``, else application-default credentials) — unless
    the provider's `key` is a static access token. Azure: `api_version` (None: the v1 paths),
    `deployments` (model name → deployment name; a model not listed is its own deployment),
    `entra` (the `key` is a Microsoft Entra ID token, sent as a bearer token)."""

    platform: CloudPlatform
    project: str | None = None
    location: str | None = None
    credentials_file: str | None = None
    api_version: str | None = None
    deployments: tuple[tuple[str, str], ...] = ()
    entra: bool = False

    def deployment(self, model: str) -> str:
        """The Azure deployment serving `model`: its entry in `deployments`, else its name."""
        for name, deployment in self.deployments:
            if name == model:
                return deployment
        return model


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
    # The bound on one event of its streams (docs/conversion.md, large answers).
    max_answer_bytes: int = int(_d(defaults.PROVIDER, "max_answer_bytes"))
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
    # ``protocol: vertex-gemini``, ``vertex-anthropic`` or ``azure-openai``: `protocol` is the
    # format spoken (Gemini, Anthropic, OpenAI Chat or Responses), sent as that platform takes
    # it (docs/cloud.md); an empty `base_url` is a Vertex location's endpoint.
    cloud: CloudSettings | None = None

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
    responses_secs: int = int(_d(defaults.RETENTION, "responses_secs"))
    responses_per_key: int = int(_d(defaults.RETENTION, "responses_per_key"))
    responses_key_bytes: int = int(_d(defaults.RETENTION, "responses_key_bytes"))


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
class UpstreamPool:
    """``pool`` (docs/configuration.md): the upstream connection pools' bounds."""

    max_connections: int = 10_000
    max_idle: int = 200
    idle_secs: float = 60.0
    wait_secs: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StateConfig:
    """``state`` (docs/configuration.md): state shared across instances through Redis."""

    redis_url: str | None = None
    timeout_secs: float = _d(defaults.STATE, "timeout_secs")
    retry_secs: float = _d(defaults.STATE, "retry_secs")


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
    log_queue_lines: int = int(_d(defaults.OBSERVABILITY, "log_queue_lines"))
    # ``observability.traces``: OpenTelemetry traces; None without the section (the standard
    # OTEL_EXPORTER_OTLP_*ENDPOINT variables may still turn them on, twserve.observe.traces).
    traces: Traces | None = None


class NotifyFormat(StrEnum):
    """``notifications[].format``: the JSON event, or Slack's ``{"text": ...}``."""

    JSON = "json"
    SLACK = "slack"


class NotifyEvent(StrEnum):
    """What a notification can be sent for (docs/observability.md, "Notifications")."""

    KEY_LIMIT_80 = "key_limit_80"
    KEY_LIMIT_100 = "key_limit_100"
    UPSTREAM_PAUSED = "upstream_paused"  # and its end
    ROUTE_DOWN = "route_down"  # every upstream of a route paused, and back
    CONFIG_REFUSED = "config_refused"
    SAFE_MODE = "safe_mode"  # entered, and left


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """``notifications[]``: where events are POSTed, signed with `secret` (kept as written,
    ``${VAR}`` templates included)."""

    name: str
    url: str
    secret: str
    events: tuple[NotifyEvent, ...]
    format: NotifyFormat = NotifyFormat.JSON
    timeout_secs: float = _d(defaults.NOTIFICATIONS, "timeout_secs")
    max_attempts: int = int(_d(defaults.NOTIFICATIONS, "max_attempts"))
    backoff_secs: float = _d(defaults.NOTIFICATIONS, "backoff_secs")
    max_queued: int = int(_d(defaults.NOTIFICATIONS, "max_queued"))


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
    pool: UpstreamPool = field(default_factory=UpstreamPool)
    notifications: tuple[Notification, ...] = ()
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
