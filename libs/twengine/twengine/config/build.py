"""Validation: parsed config data → `Config`, or `ConfigError` naming every problem.

twserve parses the YAML (stage 1, ``config.yaml_invalid``) and hands over plain mappings,
sequences and scalars. The remaining stages run here:

2. **Schema** — each section is read field by field. Every mapping is read through `_Fields`,
   which knows the section's allowed field names, so an unknown field (usually a misspelling) is
   reported with the nearest known name. Types, required fields and ranges are checked here,
   comparisons such as ``">200k"`` are parsed, and templates are checked for syntax.
3. **Consistency** — names that point elsewhere (group members, rule targets, key routes,
   `default_route`, price sheets) must exist, names must be unique, and some settings depend on
   others (key limits on retention, the slow-start wait on its switch).
4. **Build** — the `Config` is assembled. It is only made when no problem was found.

Every problem is collected, not only the first: an operator fixing a config wants the whole
list in one go. To keep one mistake from causing a cascade of others, a field that fails its
check is replaced by its default and its entry is kept as long as its *name* is sound — so a
provider with a bad URL still counts as a known upstream for the groups that list it.

A problem carries a stable code from `twengine.codes`, the path of the offending field in the
config (``providers[2].max_concurrent``), and a message for people. Messages never repeat a
secret.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import Any, TypeVar, overload

from twengine.codes import CODES
from twengine.config import defaults
from twengine.config.credentials import credential_faults, header_value_fault
from twengine.config.defaults import Bound
from twengine.config.model import (
    ALL_UPSTREAMS,
    Alias,
    AnswerModel,
    BalanceBy,
    Billing,
    Client,
    Comparison,
    Config,
    ControlListen,
    Failover,
    GatewayListen,
    Group,
    GroupMember,
    GroupType,
    Http2Listen,
    HttpListen,
    IPNetwork,
    KeyLimit,
    LimitMeasure,
    LimitPeriod,
    Listen,
    ModelPrice,
    ModelSpec,
    OnMatch,
    PinnedTarget,
    PriceSheet,
    Pricing,
    Provider,
    ResponsesTransport,
    Retention,
    Route,
    Rule,
    SetOverrides,
    State,
    Store,
    Target,
    TargetKind,
    WebSocketListen,
    When,
    parse_comparison,
)
from twengine.config.problem import Problem
from twengine.config.schema import NOT_BUILT, SECTIONS
from twengine.config.template import TemplateError, resolve_template, template_variables
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel

__all__ = ["ConfigError", "Problem", "build_config"]


class ConfigError(Exception):
    """A config that cannot be used; `problems` lists everything found, in config order."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the config"
        return "\n  ".join([head, *(str(p) for p in self.problems)])


# --- reading helpers ----------------------------------------------------------------------


class _Absent(Enum):
    ABSENT = 0


_ABSENT = _Absent.ABSENT
_E = TypeVar("_E", bound=StrEnum)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
_WILDCARD = re.compile(r"[*?\[\]]")


class _Problems:
    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.warnings: list[Problem] = []

    def add(self, code: str, path: str, message: str) -> None:
        # An unregistered code is a bug here, not a config problem.
        assert code in CODES, code
        self.items.append(Problem(code=code, path=path, message=message))

    def warn(self, code: str, path: str, message: str) -> None:
        assert code in CODES, code
        self.warnings.append(Problem(code=code, path=path, message=message))


def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def _is_seq(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, Mapping):
        return "a mapping"
    if _is_seq(value):
        return "a list"
    return type(value).__name__


def _as_text(out: _Problems, path: str, value: object) -> str | None:
    if isinstance(value, str):
        return str(value)
    out.add("config.wrong_type", path, f"expected text, got {_kind(value)}")
    return None


def _as_bool(out: _Problems, path: str, value: object) -> bool | None:
    if isinstance(value, bool):
        return bool(value)
    out.add("config.wrong_type", path, f"expected true or false, got {_kind(value)}")
    return None


def _as_number(out: _Problems, path: str, value: object, bound: Bound, code: str) -> float | None:
    name = path.rsplit(".", 1)[-1]
    if isinstance(value, bool) or not isinstance(value, int | float):
        out.add("config.wrong_type", path, f"{name} must be a number, got {_kind(value)}")
        return None
    if bound.integer and not isinstance(value, int):
        out.add("config.wrong_type", path, f"{name} must be a whole number, got {value}")
        return None
    if not math.isfinite(value) or not bound.holds(value):
        out.add(code, path, f"{name} must be {bound.describe()}, got {value}")
        return None
    return float(value) if not bound.integer else int(value)


def _as_choice(out: _Problems, path: str, value: object, enum: type[_E]) -> _E | None:
    choices = ", ".join(e.value for e in enum)
    if not isinstance(value, str):
        out.add("config.wrong_type", path, f"expected one of {choices}; got {_kind(value)}")
        return None
    try:
        return enum(str(value))
    except ValueError:
        out.add("config.invalid_choice", path, f"{value!r} is not one of {choices}")
        return None


# Control and format characters, line and paragraph separators, and every space but U+0020:
# none belongs in a name, and a U+2028 in one breaks the file's lines for tools that split on it.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp", "Zs"})


def _unprintable(text: str) -> str | None:
    """The first character of `text` that has no place in a name, as ``U+XXXX``; None."""
    for char in text:
        if char != " " and unicodedata.category(char) in _UNPRINTABLE:
            return f"U+{ord(char):04X}"
    return None


def _printable(out: _Problems, path: str, text: str) -> bool:
    found = _unprintable(text)
    if found is not None:
        out.add(
            "config.name_unprintable",
            path,
            f"the name holds {found}, a control or separator character; names are visible text",
        )
    return found is None


def _as_name(out: _Problems, path: str, value: object) -> str | None:
    text = _as_text(out, path, value)
    if text is None:
        return None
    if not _printable(out, path, text):
        return None
    if not text.strip() or text != text.strip():
        out.add("config.name_invalid", path, f"{text!r} is not a usable name")
        return None
    if text == ALL_UPSTREAMS:
        out.add("config.name_invalid", path, f"{ALL_UPSTREAMS} is reserved for 'every upstream'")
        return None
    return text


def _as_model(out: _Problems, path: str, value: object) -> str | None:
    """An exact model name: not blank, no wildcard, visible characters."""
    text = _as_text(out, path, value)
    if text is None or not _printable(out, path, text):
        return None
    if not text.strip():
        out.add("config.model_name_invalid", path, "a model name cannot be blank")
        return None
    if _WILDCARD.search(text):
        out.add(
            "config.model_name_invalid",
            path,
            f"{text!r} is a pattern; an exact model name is needed here",
        )
        return None
    return text


def _as_secret(out: _Problems, path: str, value: object) -> str | None:
    """A key as written: non-empty, ``${VAR}`` templates well-formed. Never echoed."""
    text = _as_text(out, path, value)
    if text is None:
        return None
    if not text.strip():
        out.add("config.key_empty", path, "a key cannot be empty")
        return None
    try:
        template_variables(text)
    except TemplateError as exc:
        out.add(exc.code, path, exc.message)
        return None
    return text


class _Fields:
    """One mapping being read: only `allowed` field names may appear in it.

    A value of None (a YAML key written without a value) counts as absent, so ``route:`` with
    nothing after it means the same as no ``route`` line.
    """

    def __init__(
        self, out: _Problems, path: str, data: Mapping[Any, Any], allowed: Iterable[str]
    ) -> None:
        self.out = out
        self.path = path
        known = tuple(allowed)
        self.values: dict[str, object] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                out.add("config.wrong_type", path, f"field names are text, got {key!r}")
                continue
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                out.add("config.unknown_field", _at(path, key), f"unknown field {key!r}{hint}")
                continue
            self.values[str(key)] = value

    @classmethod
    def of(cls, out: _Problems, path: str, value: object, allowed: Iterable[str]) -> _Fields | None:
        if not isinstance(value, Mapping):
            out.add("config.wrong_type", path, f"expected a mapping, got {_kind(value)}")
            return None
        return cls(out, path, value, allowed)

    def at(self, name: str) -> str:
        return _at(self.path, name)

    def raw(self, name: str) -> object:
        value = self.values.get(name)
        return _ABSENT if value is None else value

    def has(self, name: str) -> bool:
        return self.raw(name) is not _ABSENT

    def required(self, name: str) -> object:
        value = self.raw(name)
        if value is _ABSENT:
            self.out.add("config.missing_field", self.at(name), f"{name} is required")
        return value

    def fields(self, name: str, allowed: Iterable[str]) -> _Fields | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        return _Fields.of(self.out, self.at(name), value, allowed)

    def mapping(self, name: str) -> Mapping[Any, Any] | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        if not isinstance(value, Mapping):
            self.out.add(
                "config.wrong_type", self.at(name), f"expected a mapping, got {_kind(value)}"
            )
            return None
        return value

    def sequence(self, name: str) -> Sequence[object] | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        if not _is_seq(value):
            self.out.add("config.wrong_type", self.at(name), f"expected a list, got {_kind(value)}")
            return None
        assert isinstance(value, Sequence)
        return value

    @overload
    def text(self, name: str, default: str) -> str: ...
    @overload
    def text(self, name: str, default: None = None) -> str | None: ...
    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_text(self.out, self.at(name), value)
        return default if found is None else found

    def name(self, field_name: str = "name", *, required: bool = True) -> str | None:
        value = self.required(field_name) if required else self.raw(field_name)
        if value is _ABSENT:
            return None
        return _as_name(self.out, self.at(field_name), value)

    @overload
    def boolean(self, name: str, default: bool) -> bool: ...
    @overload
    def boolean(self, name: str, default: None = None) -> bool | None: ...
    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_bool(self.out, self.at(name), value)
        return default if found is None else found

    def number(self, name: str, bound: Bound, *, code: str = "config.out_of_range") -> float | None:
        """The value, the bound's default when absent, or None when invalid and no default."""
        value = self.raw(name)
        if value is not _ABSENT:
            found = _as_number(self.out, self.at(name), value, bound, code)
            if found is not None:
                return found
        return None if bound.default is None else float(bound.default)

    def integer(self, name: str, bound: Bound, *, code: str = "config.out_of_range") -> int | None:
        found = self.number(name, bound, code=code)
        return None if found is None else int(found)

    @overload
    def choice(self, name: str, enum: type[_E], default: _E) -> _E: ...
    @overload
    def choice(self, name: str, enum: type[_E], default: None = None) -> _E | None: ...
    def choice(self, name: str, enum: type[_E], default: _E | None = None) -> _E | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_choice(self.out, self.at(name), value, enum)
        return default if found is None else found


def _entries(out: _Problems, f: _Fields, name: str) -> list[tuple[str, object]]:
    """(path, item) for each item of list field `name`."""
    items = f.sequence(name)
    if items is None:
        return []
    return [(_at(f.at(name), i), item) for i, item in enumerate(items)]


def _one_or_many(out: _Problems, path: str, value: object) -> list[tuple[str, object]] | None:
    """A scalar or a non-empty list of them, as (path, item) pairs."""
    if not _is_seq(value):
        return [(path, value)]
    assert isinstance(value, Sequence)
    if not value:
        out.add(
            "config.wrong_type",
            path,
            "an empty list matches nothing; leave the condition out to match anything",
        )
        return None
    return [(_at(path, i), item) for i, item in enumerate(value)]


# --- stage 2: schema, section by section --------------------------------------------------

_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_WILDCARD_BINDS = ("0.0.0.0", "::", "")


def _bind(f: _Fields, default: str) -> str:
    bind = f.text("bind", default)
    if bind == default:
        return bind
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        if not _HOST_NAME.fullmatch(bind):
            f.out.add(
                "config.bind_invalid", f.at("bind"), f"{bind!r} is not an address to listen on"
            )
            return default
    return bind


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")


def _origins(out: _Problems, gf: _Fields) -> tuple[str, ...]:
    """``allow_origins``: web origins as a browser writes them in ``Origin`` (compared
    lower-case, without a trailing slash), ``null``, or ``*`` for any page."""
    origins: list[str] = []
    for path, item in _entries(out, gf, "allow_origins"):
        text = _as_text(out, path, item)
        if text is None:
            continue
        origin = text.strip().lower().rstrip("/")
        if origin in ("*", "null") or _ORIGIN.fullmatch(origin):
            origins.append(origin)
        else:
            out.add(
                "config.origin_invalid",
                path,
                f"{text!r} is not a web origin such as https://app.example.com (or * for any)",
            )
    return tuple(origins)


def _hosts(out: _Problems, gf: _Fields) -> tuple[str, ...]:
    """``allow_hosts``: the names a request's Host may carry (compared lower-case, the port
    aside)."""
    hosts: list[str] = []
    for path, item in _entries(out, gf, "allow_hosts"):
        text = _as_text(out, path, item)
        if text is None:
            continue
        host = text.strip().lower()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOST_NAME.fullmatch(host):
                out.add(
                    "config.host_invalid",
                    path,
                    f"{text!r} is not a host name or IP address (write it without a port)",
                )
                continue
        hosts.append(host)
    return tuple(hosts)


def _listen(out: _Problems, top: _Fields) -> Listen:
    lf = top.fields("listen", SECTIONS["listen"])
    if lf is None:
        return Listen()
    gateway = GatewayListen()
    gf = lf.fields("gateway", SECTIONS["listen.gateway"])
    if gf is not None:
        bind = _bind(gf, defaults.GATEWAY_BIND)
        port = gf.integer("port", replace(defaults.PORT, default=defaults.GATEWAY_PORT))
        networks: list[IPNetwork] = []
        for path, item in _entries(out, gf, "allow_from"):
            text = _as_text(out, path, item)
            if text is None:
                continue
            try:
                # strict=False: "10.1.2.3/8" is read as the network it lies in.
                networks.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                out.add(
                    "config.cidr_invalid",
                    path,
                    f"{text!r} is not an IP address or network such as 10.0.0.0/8",
                )
        max_connections = gf.integer("max_connections", defaults.GATEWAY_MAX_CONNECTIONS)
        per_address = gf.integer(
            "max_connections_per_address", defaults.GATEWAY_MAX_CONNECTIONS_PER_ADDRESS
        )
        model_chars = gf.integer("max_model_name_chars", defaults.GATEWAY_MAX_MODEL_NAME_CHARS)
        gateway = GatewayListen(
            bind=bind,
            port=port or defaults.GATEWAY_PORT,
            allow_from=tuple(networks),
            max_connections=max_connections or 1000,
            max_connections_per_address=per_address,
            allow_origins=_origins(out, gf),
            allow_hosts=_hosts(out, gf),
            max_model_name_chars=model_chars or 256,
        )
    control = ControlListen()
    cf = lf.fields("control", SECTIONS["listen.control"])
    if cf is not None:
        enabled = cf.boolean("enabled", True)
        key = None
        if cf.has("key"):
            key = _as_secret(out, cf.at("key"), cf.raw("key"))
        elif enabled:
            out.add(
                "config.control_key_missing",
                cf.at("key"),
                "the control plane needs a key (or write enabled: false)",
            )
        control = ControlListen(
            enabled=enabled,
            bind=_bind(cf, defaults.CONTROL_BIND),
            port=cf.integer("port", replace(defaults.PORT, default=defaults.CONTROL_PORT))
            or defaults.CONTROL_PORT,
            key=key,
            max_connections=cf.integer("max_connections", defaults.CONTROL_MAX_CONNECTIONS)
            or int(defaults.CONTROL_MAX_CONNECTIONS.default or 1),
            max_body_bytes=cf.integer("max_body_bytes", defaults.CONTROL_MAX_BODY_BYTES)
            or int(defaults.CONTROL_MAX_BODY_BYTES.default or 1024),
            max_config_bytes=cf.integer("max_config_bytes", defaults.CONTROL_MAX_CONFIG_BYTES)
            or ControlListen().max_config_bytes,
        )
        same_host = control.bind == gateway.bind or bool(
            {control.bind, gateway.bind} & set(_WILDCARD_BINDS)
        )
        if control.enabled and control.port == gateway.port and same_host:
            out.add(
                "config.port_conflict",
                cf.at("port"),
                f"the control plane and the gateway cannot both listen on port {control.port}",
            )
    http, http2, websocket = _transport_limits(out, lf)
    return Listen(gateway=gateway, control=control, http=http, http2=http2, websocket=websocket)


def _figures(lf: _Fields, name: str, table: Mapping[str, Bound]) -> dict[str, Any] | None:
    """Section `name` of `listen`, each field at its bound's default when absent (whole
    numbers as int); None when the section is absent."""
    sf = lf.fields(name, SECTIONS[f"listen.{name}"])
    if sf is None:
        return None
    figures: dict[str, Any] = {}
    for field_name, bound in table.items():
        found = sf.number(field_name, bound)
        assert found is not None  # every field of these tables has a default
        figures[field_name] = int(found) if bound.integer else found
    return figures


def _transport_limits(
    out: _Problems, lf: _Fields
) -> tuple[HttpListen, Http2Listen, WebSocketListen]:
    """``listen.http``, ``listen.http2`` and ``listen.websocket``: the transports' bounds."""
    found = _figures(lf, "http", defaults.LISTEN_HTTP)
    http = HttpListen() if found is None else HttpListen(**found)
    found = _figures(lf, "http2", defaults.LISTEN_HTTP2)
    http2 = Http2Listen() if found is None else Http2Listen(**found)
    found = _figures(lf, "websocket", defaults.LISTEN_WEBSOCKET)
    websocket = WebSocketListen() if found is None else WebSocketListen(**found)
    if http.body_budget_bytes < http.max_body_bytes:
        out.add(
            "config.listen_limits_conflict",
            f"{lf.at('http')}.body_budget_bytes",
            f"body_budget_bytes ({http.body_budget_bytes}) is below max_body_bytes "
            f"({http.max_body_bytes}): no body that large could ever be held",
        )
    if http2.hard_header_list_size < http2.max_header_list_size:
        out.add(
            "config.listen_limits_conflict",
            f"{lf.at('http2')}.hard_header_list_size",
            f"hard_header_list_size ({http2.hard_header_list_size}) is below "
            f"max_header_list_size ({http2.max_header_list_size}), the size advertised",
        )
    return http, http2, websocket


_MEASURES = tuple(m.value for m in LimitMeasure)


def _limit(out: _Problems, path: str, item: object) -> KeyLimit | None:
    f = _Fields.of(out, path, item, SECTIONS["clients[].limits[]"])
    if f is None:
        return None
    per_raw = f.required("per")
    per = None if per_raw is _ABSENT else _as_choice(out, f.at("per"), per_raw, LimitPeriod)
    given = [m for m in _MEASURES if f.has(m)]
    cache_reads = f.boolean("cache_reads", False)
    if not given:
        out.add(
            "config.key_limit_no_measure",
            path,
            "a limit needs one of requests, tokens or cost",
        )
        return None
    if len(given) > 1:
        out.add(
            "config.key_limit_two_measures",
            path,
            f"a limit counts one measure, got {' and '.join(given)}; write one limit each",
        )
        return None
    measure = LimitMeasure(given[0])
    if f.has("cache_reads") and measure is not LimitMeasure.TOKENS:
        # Only a token count can add cache reads; on another measure it would seem to do
        # something and do nothing.
        out.add(
            "config.key_limit_cache_reads",
            f.at("cache_reads"),
            f"cache_reads applies to a tokens limit, not to a {measure.value} limit",
        )
        return None
    if measure is LimitMeasure.COST:
        cost = f.number("cost", defaults.LIMIT_COST_USD)
        amount = None if cost is None else round(cost * 1_000_000)
    else:
        bound = (
            defaults.LIMIT_REQUESTS if measure is LimitMeasure.REQUESTS else defaults.LIMIT_TOKENS
        )
        amount = f.integer(measure.value, bound)
    if per is None or amount is None:
        return None
    return KeyLimit(per=per, measure=measure, amount=amount, cache_reads=cache_reads)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Placed:
    """A parsed entry and where it sits, for consistency messages."""

    path: str
    value: Any
    # Paths of the entry's sub-items that survived parsing (group members, key limits), in
    # step with the value's tuple of them.
    parts: tuple[str, ...] = ()


def _client_key(out: _Problems, path: str, key: str, env: Mapping[str, str] | None) -> str | None:
    """A gateway key with its ``${VAR}`` read from `env`: keys are compared as presented, so the
    template is resolved once, at load. None (and a problem) when it cannot be. Without `env`
    a template is kept as written."""
    if env is None and template_variables(key):
        return key
    try:
        value = resolve_template(key, env or {})
    except TemplateError as exc:
        out.add(exc.code, path, exc.message)
        return None
    # A client sends its key in a header, which cannot carry these; such a key matches nobody.
    fault = header_value_fault(value)
    if fault is not None:
        out.add("config.secret_invalid", path, f"the key {fault}; no client could present it")
        return None
    return value


def _clients(out: _Problems, top: _Fields, env: Mapping[str, str] | None) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "clients"):
        f = _Fields.of(out, path, item, SECTIONS["clients[]"])
        if f is None:
            continue
        name = f.name()
        key_raw = f.required("key")
        key = None if key_raw is _ABSENT else _as_secret(out, f.at("key"), key_raw)
        if key is not None:
            key = _client_key(out, f.at("key"), key, env)
        route = f.name("route", required=False)
        max_concurrent = f.integer(
            "max_concurrent",
            defaults.CLIENT_MAX_CONCURRENT,
            code="config.key_concurrency_range",
        )
        limits = [(p, _limit(out, p, i)) for p, i in _entries(out, f, "limits")]
        if name is None:
            continue
        client = Client(
            name=name,
            key=key or "",
            route=route,
            max_concurrent=max_concurrent,
            limits=tuple(lim for _, lim in limits if lim is not None),
        )
        parts = tuple(p for p, lim in limits if lim is not None)
        placed.append(_Placed(path=path, value=client, parts=parts))
    return placed


_HTTP_URL = re.compile(
    r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d{1,5}))?"
    r"(?P<path>/[^\s?#]*)?"
)


def _http_url(out: _Problems, path: str, value: object) -> tuple[str, str] | None:
    """(URL without trailing slash, lowercased host) of an http(s) base URL."""
    text = _as_text(out, path, value)
    if text is None:
        return None
    m = _HTTP_URL.fullmatch(text.strip())
    if m is None or (m["port"] and not 1 <= int(m["port"]) <= 65535):
        # A URL with an ``@`` may carry a user and password: describe it without quoting it.
        shown = "the value" if "@" in text else repr(text)
        out.add(
            "config.url_invalid",
            path,
            f"{shown} is not an http:// or https:// base URL (no query, no fragment, no user)",
        )
        return None
    return text.strip().rstrip("/"), m["host"].lower()


# RFC 9110 token characters for header names.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Framing and connection headers are the gateway's own: a fixed value would corrupt requests.
_GATEWAY_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)


def _headers(out: _Problems, f: _Fields) -> tuple[tuple[str, str], ...]:
    mapping = f.mapping("headers")
    if mapping is None:
        return ()
    result: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in mapping.items():
        path = _at(f.at("headers"), str(name))
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            out.add("config.header_invalid", path, f"{name!r} is not a valid header name")
            continue
        lowered = name.lower()
        if lowered in _GATEWAY_HEADERS:
            out.add("config.header_invalid", path, f"{name} is set by the gateway itself")
            continue
        if lowered in seen:
            out.add("config.header_invalid", path, f"header {name} is given twice")
            continue
        seen.add(lowered)
        text = _as_text(out, path, value)
        if text is None:
            continue
        if any(c in text for c in "\r\n\0"):
            out.add("config.header_invalid", path, "a header value cannot hold line breaks")
            continue
        try:
            template_variables(text)
        except TemplateError as exc:
            out.add(exc.code, path, exc.message)
            continue
        result.append((str(name), text))
    return tuple(result)


def _models(out: _Problems, f: _Fields) -> tuple[str, ...] | None:
    if not f.has("models"):
        return None
    items = f.sequence("models")
    if items is None:
        return None
    if not items:
        out.add(
            "config.provider_models_empty",
            f.at("models"),
            "an empty models list offers nothing; leave it out to offer any model",
        )
        return None
    names: list[str] = []
    for i, item in enumerate(items):
        path = _at(f.at("models"), i)
        name = _as_model(out, path, item)
        if name is None:
            continue
        if name in names:
            out.add("config.provider_model_duplicate", path, f"{name!r} is listed twice")
            continue
        names.append(name)
    return tuple(names)


_SPEC_FIELDS = SECTIONS["providers[].model_specs.*"]


def _model_specs(out: _Problems, f: _Fields) -> tuple[tuple[str, ModelSpec], ...]:
    mapping = f.mapping("model_specs")
    if mapping is None:
        return ()
    specs: list[tuple[str, ModelSpec]] = []
    for model, value in mapping.items():
        path = _at(f.at("model_specs"), str(model))
        if not isinstance(model, str) or not model.strip():
            out.add("config.model_spec_blank", path, "a model spec needs a model name")
            continue
        if not _printable(out, path, model):
            continue
        if _WILDCARD.search(model):
            out.add(
                "config.model_spec_wildcard",
                path,
                f"{model!r} is a pattern; a model spec applies to one model",
            )
            continue
        if value is None or (isinstance(value, Mapping) and not value):
            out.add(
                "config.model_spec_empty", path, "set context_window, max_output_tokens or both"
            )
            continue
        sf = _Fields.of(out, path, value, _SPEC_FIELDS)
        if sf is None:
            continue
        figures: dict[str, int] = {}
        for field_name in _SPEC_FIELDS:
            raw = sf.raw(field_name)
            if raw is _ABSENT:
                continue
            fpath = sf.at(field_name)
            if isinstance(raw, int) and not isinstance(raw, bool) and raw <= 0:
                out.add(
                    "config.model_spec_zero",
                    fpath,
                    f"{field_name} must be a positive number of tokens, got {raw}",
                )
                continue
            found = _as_number(out, fpath, raw, defaults.MODEL_SPEC_TOKENS, "config.out_of_range")
            if found is not None:
                figures[field_name] = int(found)
        if not figures:
            if not any(sf.has(n) for n in _SPEC_FIELDS):
                out.add(
                    "config.model_spec_empty",
                    path,
                    "set context_window, max_output_tokens or both",
                )
            continue
        spec = ModelSpec(**figures)
        if (
            spec.context_window is not None
            and spec.max_output_tokens is not None
            and spec.max_output_tokens > spec.context_window
        ):
            out.add(
                "config.model_spec_output_exceeds_window",
                _at(path, "max_output_tokens"),
                f"max_output_tokens {spec.max_output_tokens} exceeds context_window "
                f"{spec.context_window}",
            )
            continue
        specs.append((model, spec))
    return tuple(specs)


def _providers(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "providers"):
        f = _Fields.of(out, path, item, SECTIONS["providers[]"])
        if f is None:
            continue
        name = f.name()
        url_raw = f.required("base_url")
        url = None if url_raw is _ABSENT else _http_url(out, f.at("base_url"), url_raw)
        key = _as_secret(out, f.at("key"), f.raw("key")) if f.has("key") else None
        protocol = f.choice("protocol", Dialect)
        recognised = False
        if protocol is None and not f.has("protocol"):
            host = url[1] if url else ""
            protocol = Dialect(defaults.OFFICIAL_HOSTS.get(host, Dialect.OPENAI_CHAT.value))
            recognised = True
        provider = Provider(
            name=name or "",
            base_url=url[0] if url else "",
            protocol=protocol or Dialect.OPENAI_CHAT,
            protocol_recognised=recognised,
            key=key,
            headers=_headers(out, f),
            models=_models(out, f),
            max_concurrent=f.integer(
                "max_concurrent",
                defaults.PROVIDER["max_concurrent"],
                code="config.provider_concurrency_range",
            ),
            billing=f.choice("billing", Billing, Billing.METERED),
            model_specs=_model_specs(out, f),
            price_sheet=f.name("price_sheet", required=False),
            connect_timeout_secs=f.number(
                "connect_timeout_secs", defaults.PROVIDER["connect_timeout_secs"]
            )
            or 10.0,
            forward_mock_headers=f.boolean("forward_mock_headers", False),
            http2=f.boolean("http2", False),
            realtime=f.boolean("realtime", False),
            responses_transport=_responses_transport(out, f, protocol),
        )
        if name is not None:
            placed.append(_Placed(path=path, value=provider))
    return placed


def _responses_transport(
    out: _Problems, f: _Fields, protocol: Dialect | None
) -> ResponsesTransport:
    """``responses_transport``: a Responses upstream's own WebSocket exists only for the
    ``openai-responses`` protocol."""
    transport = f.choice("responses_transport", ResponsesTransport, ResponsesTransport.HTTP)
    if transport is ResponsesTransport.WEBSOCKET and protocol not in (
        None,
        Dialect.OPENAI_RESPONSES,
    ):
        out.add(
            "config.responses_transport_protocol",
            f.at("responses_transport"),
            f"responses_transport: websocket needs protocol openai-responses, not {protocol}",
        )
        return ResponsesTransport.HTTP
    return transport


def _aliases(out: _Problems, top: _Fields) -> list[_Placed]:
    mapping = top.mapping("aliases")
    if mapping is None:
        return []
    placed: list[_Placed] = []
    for alias, value in mapping.items():
        path = _at("aliases", str(alias))
        name = _as_model(out, path, alias)
        if value is None or (_is_seq(value) and not value):
            out.add("engine.alias_empty", path, "an alias needs at least one model name")
            continue
        items = _one_or_many(out, path, value) or []
        targets = [_as_model(out, tpath, t) for tpath, t in items]
        if name is None or any(t is None for t in targets):
            continue
        placed.append(
            _Placed(path=path, value=Alias(name=name, targets=tuple(t for t in targets if t)))
        )
    return placed


def _member(
    out: _Problems, path: str, item: object, group_type: GroupType | None
) -> GroupMember | None:
    if isinstance(item, str):
        name = _as_name(out, path, item)
        return None if name is None else GroupMember(provider=name)
    f = _Fields.of(out, path, item, SECTIONS["groups[].providers[]"])
    if f is None:
        return None
    name = f.name()
    weight = 1
    if f.has("weight"):
        if group_type is not None and group_type is not GroupType.LOAD_BALANCE:
            out.add(
                "engine.group_weight_not_load_balance",
                f.at("weight"),
                f"weights only apply to load-balance groups, not {group_type.value}",
            )
        else:
            weight = (
                f.integer("weight", defaults.GROUP_WEIGHT, code="engine.group_weight_out_of_range")
                or 1
            )
    return None if name is None else GroupMember(provider=name, weight=weight)


def _groups(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "groups"):
        f = _Fields.of(out, path, item, SECTIONS["groups[]"])
        if f is None:
            continue
        name = f.name()
        type_given = f.has("type")
        group_type = f.choice("type", GroupType)
        if not type_given:
            group_type = GroupType.FALLBACK
        members: list[GroupMember] = []
        member_paths: list[str] = []
        if f.required("providers") is not _ABSENT:
            entries = _entries(out, f, "providers")
            if not entries and _is_seq(f.raw("providers")):
                out.add(
                    "engine.group_empty", f.at("providers"), "a group needs at least one upstream"
                )
            for mpath, mitem in entries:
                member = _member(out, mpath, mitem, group_type)
                if member is None:
                    continue
                if any(m.provider == member.provider for m in members):
                    out.add(
                        "engine.group_upstream_twice",
                        mpath,
                        f"{member.provider!r} is listed twice in group {name!r}",
                    )
                    continue
                members.append(member)
                member_paths.append(mpath)
        selected = f.name("selected", required=False)
        if selected is not None and group_type is not None:
            if group_type is not GroupType.SELECT:
                out.add(
                    "engine.group_selected_not_select",
                    f.at("selected"),
                    f"selected only applies to select groups, not {group_type.value}",
                )
                selected = None
            elif not any(m.provider == selected for m in members):
                out.add(
                    "engine.group_selected_unknown",
                    f.at("selected"),
                    f"{selected!r} is not a member of group {name!r}",
                )
                selected = None
        balance_by = f.choice("balance_by", BalanceBy, BalanceBy.WEIGHTS)
        if f.has("balance_by") and group_type not in (None, GroupType.LOAD_BALANCE):
            assert group_type is not None
            out.add(
                "engine.group_balance_by_not_load_balance",
                f.at("balance_by"),
                f"balance_by only applies to load-balance groups, not {group_type.value}",
            )
        if name is None:
            continue
        group = Group(
            name=name,
            type=group_type or GroupType.FALLBACK,
            members=tuple(members),
            selected=selected,
            balance_by=balance_by,
            resume=f.boolean("resume", False),
        )
        placed.append(_Placed(path=path, value=group, parts=tuple(member_paths)))
    return placed


def _when(out: _Problems, f: _Fields) -> When:
    wf = f.fields("when", SECTIONS["routes[].rules[].when"])
    if wf is None:
        return When()

    def texts(name: str, check: Any) -> tuple[Any, ...]:
        value = wf.raw(name)
        if value is _ABSENT:
            return ()
        items = _one_or_many(out, wf.at(name), value)
        if items is None:
            return ()
        found = [check(out, p, v) for p, v in items]
        return tuple(v for v in found if v is not None)

    def comparison(name: str) -> Comparison | None:
        value = wf.raw(name)
        if value is _ABSENT:
            return None
        if not isinstance(value, str | int):
            out.add(
                "engine.rule_comparison_invalid",
                wf.at(name),
                f"expected a comparison such as '>200k', got {_kind(value)}",
            )
            return None
        try:
            return parse_comparison(value)
        except ValueError as exc:
            out.add("engine.rule_comparison_invalid", wf.at(name), str(exc))
            return None

    def glob(o: _Problems, path: str, value: object) -> str | None:
        text = _as_text(o, path, value)
        if text is not None and not text.strip():
            o.add("config.model_name_invalid", path, "a model pattern cannot be blank")
            return None
        return text

    def dialect(o: _Problems, path: str, value: object) -> Dialect | None:
        return _as_choice(o, path, value, Dialect)

    return When(
        model=texts("model", glob),
        client=texts("client", _as_name),
        dialect=texts("dialect", dialect),
        input_tokens=comparison("input_tokens"),
        max_tokens=comparison("max_tokens"),
        tool_count=comparison("tool_count"),
        tools=wf.boolean("tools"),
        image=wf.boolean("image"),
        thinking=wf.boolean("thinking"),
        stream=wf.boolean("stream"),
        provider_would_be=texts("provider_would_be", _as_name),
    )


def _set(out: _Problems, f: _Fields) -> SetOverrides:
    sf = f.fields("set", SECTIONS["routes[].rules[].set"])
    if sf is None:
        return SetOverrides()
    model = _as_model(out, sf.at("model"), sf.raw("model")) if sf.has("model") else None
    return SetOverrides(
        model=model,
        max_tokens=sf.integer("max_tokens", defaults.SET_MAX_TOKENS)
        if sf.has("max_tokens")
        else None,
        reasoning=sf.choice("reasoning", ReasoningLevel),
    )


def _target(out: _Problems, f: _Fields) -> Target | None:
    value = f.raw("to")
    path = f.at("to")
    if value is _ABSENT:
        return None
    if isinstance(value, str):
        if value == ALL_UPSTREAMS:
            return Target(kind=TargetKind.ALL)
        name = _as_name(out, path, value)
        # The kind is settled in the consistency stage, once every name is known.
        return None if name is None else Target(kind=TargetKind.PROVIDER, name=name)
    items: list[tuple[str, object]]
    if isinstance(value, Mapping):
        items = [(path, value)]
    elif _is_seq(value):
        assert isinstance(value, Sequence)
        items = [(_at(path, i), item) for i, item in enumerate(value)]
        if not items:
            out.add("engine.rule_unknown_target", path, "to: [] names no upstream")
            return None
    else:
        out.add(
            "config.wrong_type",
            path,
            f"to is an upstream or group name, {ALL_UPSTREAMS}, or a list of "
            f"{{provider, model}}; got {_kind(value)}",
        )
        return None
    pins: list[PinnedTarget] = []
    for ipath, item in items:
        pf = _Fields.of(out, ipath, item, SECTIONS["routes[].rules[].to[]"])
        if pf is None:
            continue
        provider = pf.name("provider")
        model_raw = pf.required("model")
        model = None if model_raw is _ABSENT else _as_model(out, pf.at("model"), model_raw)
        if provider is not None and model is not None:
            pins.append(PinnedTarget(provider=provider, model=model))
    if len(pins) != len(items):
        return None
    return Target(kind=TargetKind.PINNED, pinned=tuple(pins))


def _deny(out: _Problems, f: _Fields, rule_name: str | None) -> str | None:
    value = f.raw("deny")
    if value is _ABSENT or value is False:
        return None
    if value is True:
        return f"denied by rule {rule_name!r}"
    if isinstance(value, str) and value.strip():
        return str(value)
    out.add(
        "config.wrong_type",
        f.at("deny"),
        f"deny is true or a message for the client, got {_kind(value)}",
    )
    return None


def _rule(out: _Problems, path: str, item: object) -> Rule | None:
    f = _Fields.of(out, path, item, SECTIONS["routes[].rules[]"])
    if f is None:
        return None
    name = f.name()
    when = _when(out, f)
    to = _target(out, f)
    overrides = _set(out, f)
    deny = _deny(out, f, name)
    on_match = f.choice("on_match", OnMatch)
    has_to, has_deny = f.has("to"), f.has("deny") and f.raw("deny") is not False
    if has_to and has_deny:
        out.add("engine.rule_to_and_deny", path, "a rule either routes (to) or refuses (deny)")
    elif not has_to and not has_deny and not f.has("set"):
        out.add("engine.rule_no_action", path, "a rule needs to, deny or set")
    if when.per_hop:
        if has_to or has_deny:
            out.add(
                "engine.rule_hop_only_set",
                path,
                "a provider_would_be rule is judged per upstream tried; it may only set",
            )
        elif on_match is not OnMatch.CONTINUE:
            out.add(
                "engine.rule_hop_needs_continue",
                f.at("on_match"),
                "a provider_would_be rule cannot end rule matching; write on_match: continue",
            )
    elif (has_to or has_deny) and on_match is OnMatch.CONTINUE:
        out.add(
            "engine.rule_continue_with_target",
            f.at("on_match"),
            "a rule with to or deny decides the request; on_match: continue cannot apply",
        )
    if name is None:
        return None
    return Rule(name=name, when=when, to=to, overrides=overrides, deny=deny, on_match=on_match)


def _routes(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "routes"):
        f = _Fields.of(out, path, item, SECTIONS["routes[]"])
        if f is None:
            continue
        name = f.name()
        rules = [_Placed(path=p, value=_rule(out, p, i)) for p, i in _entries(out, f, "rules")]
        resume = f.boolean("resume", False)
        if name is not None:
            placed.append(_Placed(path=path, value=(name, [r for r in rules if r.value], resume)))
    return placed


def _failover(out: _Problems, top: _Fields) -> Failover:
    ff = top.fields("failover", SECTIONS["failover"])
    if ff is None:
        return Failover()
    values: dict[str, float] = {}
    for name, bound in defaults.FAILOVER.items():
        found = ff.number(name, bound)
        assert found is not None
        values[name] = found
    slow = ff.boolean("next_on_slow_start", False)
    failover = Failover(
        failures_to_pause=int(values["failures_to_pause"]),
        pause_secs=values["pause_secs"],
        max_pause_secs=values["max_pause_secs"],
        no_balance_pause_secs=values["no_balance_pause_secs"],
        quota_pause_secs=values["quota_pause_secs"],
        rate_limit_max_pause_secs=values["rate_limit_max_pause_secs"],
        idle_timeout_secs=values["idle_timeout_secs"],
        wait_secs=values["wait_secs"],
        next_on_slow_start=slow,
        stream_start_wait_secs=values["stream_start_wait_secs"],
    )
    if failover.max_pause_secs < failover.pause_secs:
        out.add(
            "config.failover_pause_order",
            ff.at("max_pause_secs"),
            f"max_pause_secs ({failover.max_pause_secs:g}) is below pause_secs "
            f"({failover.pause_secs:g})",
        )
    if slow and failover.stream_start_wait_secs < defaults.MIN_STREAM_START_WAIT_SECS:
        out.add(
            "config.slow_start_too_short",
            ff.at("stream_start_wait_secs"),
            f"with next_on_slow_start on, stream_start_wait_secs must be at least "
            f"{defaults.MIN_STREAM_START_WAIT_SECS}, got {failover.stream_start_wait_secs:g}",
        )
    return failover


def _retention(out: _Problems, top: _Fields) -> Retention:
    rf = top.fields("retention", SECTIONS["retention"])
    if rf is None:
        return Retention()
    return Retention(
        row_days=rf.integer("row_days", defaults.RETENTION["row_days"]) or 1,
        body_days=rf.integer("body_days", defaults.RETENTION["body_days"]) or 0,
        body_max_bytes=rf.integer("body_max_bytes", defaults.RETENTION["body_max_bytes"])
        or int(defaults.RETENTION["body_max_bytes"].default or 0),
        store_bodies=rf.boolean("store_bodies", False),
    )


_PRICE_FIELDS = SECTIONS["pricing.sheets[].models.*"]


def _price(out: _Problems, path: str, value: object) -> ModelPrice | None:
    pf = _Fields.of(out, path, value, _PRICE_FIELDS)
    if pf is None:
        return None
    given = {n: pf.required(n) if n in ("input", "output") else pf.raw(n) for n in _PRICE_FIELDS}
    figures: dict[str, float | None] = {}
    for n, raw in given.items():
        figures[n] = (
            None
            if raw is _ABSENT
            else _as_number(out, pf.at(n), raw, defaults.PRICE_PER_MILLION, "config.out_of_range")
        )
    input_price, output_price = figures["input"], figures["output"]
    if input_price is None or output_price is None:
        return None
    return ModelPrice(
        input=input_price,
        output=output_price,
        cache_read=figures["cache_read"],
        cache_write=figures["cache_write"],
    )


def _pricing(out: _Problems, top: _Fields) -> list[_Placed]:
    pricing = top.fields("pricing", SECTIONS["pricing"])
    if pricing is None:
        return []
    placed: list[_Placed] = []
    for path, item in _entries(out, pricing, "sheets"):
        f = _Fields.of(out, path, item, SECTIONS["pricing.sheets[]"])
        if f is None:
            continue
        name = f.name()
        multiplier = f.number("multiplier", defaults.PRICE_MULTIPLIER)
        models: list[tuple[str, ModelPrice]] = []
        for model, value in (f.mapping("models") or {}).items():
            mpath = _at(f.at("models"), str(model))
            model_name = _as_model(out, mpath, model)
            price = _price(out, mpath, value)
            if model_name is not None and price is not None:
                models.append((model_name, price))
        if name is not None:
            sheet = PriceSheet(name=name, multiplier=multiplier or 0.0, models=tuple(models))
            placed.append(_Placed(path=path, value=sheet))
    return placed


_REDIS_URL = re.compile(
    r"rediss?://(?:[^\s/?#@]*@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::\d{1,5})?"
    r"(?:/\d{1,5})?(?:\?[^\s#]*)?"
)


def _state(out: _Problems, top: _Fields) -> State | None:
    sf = top.fields("state", SECTIONS["state"])
    if sf is None:
        return None
    url = sf.text("redis_url")
    if url is None:
        return State()
    if _REDIS_URL.fullmatch(url.strip()) is None:
        # A Redis URL may carry a password: describe it without quoting it.
        shown = "the value" if "@" in url else repr(url)
        out.add(
            "config.url_invalid",
            sf.at("redis_url"),
            f"{shown} is not a redis:// or rediss:// URL (host, port, database number)",
        )
        return None
    return State(redis_url=url.strip())


_DSN_SCHEMES = ("postgresql://", "postgres://")


def _store(out: _Problems, top: _Fields, env: Mapping[str, str] | None) -> Store | None:
    """``store``: `postgres_dsn` kept as written (``${VAR}`` templates included), checked to
    name a PostgreSQL URI. With `env`, the template is resolved for the check (a variable that
    is not set refuses the config); twserve resolves it again when it connects."""
    sf = top.fields("store", SECTIONS["store"])
    if sf is None:
        return None
    wait = defaults.STORE["commit_wait_secs"]
    commit = Store(
        commit_before_end=sf.boolean("commit_before_end", False),
        commit_wait_secs=sf.number("commit_wait_secs", wait) or float(wait.default or 0),
    )
    raw = sf.raw("postgres_dsn")
    if raw is _ABSENT:
        return commit
    path = sf.at("postgres_dsn")
    text = _as_text(out, path, raw)
    if text is None:
        return None
    try:
        template_variables(text)
        value = resolve_template(text, env) if env is not None else text
    except TemplateError as exc:
        out.add(exc.code, path, exc.message)
        return None
    # Without an environment a DSN that starts with a template cannot be checked yet.
    unchecked = env is None and text.startswith("${")
    if not unchecked and (
        not value.lower().startswith(_DSN_SCHEMES) or any(c.isspace() for c in value)
    ):
        # A DSN carries a password: describe it, never quote it.
        out.add(
            "config.url_invalid",
            path,
            "postgres_dsn must be a postgresql:// (or postgres://) URI without spaces",
        )
        return None
    return replace(commit, postgres_dsn=text)


def _not_built(out: _Problems, data: Mapping[str, object]) -> None:
    """Refuse every field whose behaviour is not built, rather than accept and ignore it."""
    for path, what in NOT_BUILT.items():
        parent, _, name = path.rpartition(".")
        if parent and parent in NOT_BUILT:
            continue  # the enclosing section is refused already
        for where in _occurrences(data, path):
            out.add(
                "config.not_built",
                where,
                f"{what} is not built yet; remove {name} from the config",
            )


def _occurrences(data: object, path: str) -> list[str]:
    """The concrete paths at which schema path `path` (``a.b[].c``, ``m.*.f``) is present."""
    found: list[tuple[str, object]] = [("", data)]
    for segment in path.split("."):
        step: list[tuple[str, object]] = []
        many = segment.endswith("[]")
        name = segment.removesuffix("[]")
        for where, node in found:
            if not isinstance(node, Mapping):
                continue
            items = list(node.items()) if name == "*" else [(name, node.get(name))]
            for key, value in items:
                if value is None:
                    continue
                here = _at(where, str(key))
                if many and _is_seq(value):
                    assert isinstance(value, Sequence)
                    step.extend((_at(here, i), v) for i, v in enumerate(value))
                elif not many:
                    step.append((here, value))
        found = step
    return [where for where, _ in found]


# --- stage 3: consistency -----------------------------------------------------------------


def _duplicates(out: _Problems, placed: Sequence[_Placed], code: str, what: str) -> None:
    first: dict[str, str] = {}
    for entry in placed:
        name = entry.value.name
        if name in first:
            out.add(
                code, _at(entry.path, "name"), f"{what} {name!r} is already used at {first[name]}"
            )
        else:
            first[name] = entry.path


def _check_clients(
    out: _Problems,
    clients: Sequence[_Placed],
    routes: set[str],
    control_key: str | None,
    retention: Retention,
) -> None:
    _duplicates(out, clients, "config.client_duplicate_name", "key name")
    keys: dict[str, str] = {}
    for entry in clients:
        client: Client = entry.value
        if client.key:
            # The message names the other entry, never the key itself.
            if client.key in keys:
                out.add(
                    "config.client_duplicate_key",
                    _at(entry.path, "key"),
                    f"the same key is already given to {keys[client.key]!r}",
                )
            else:
                keys[client.key] = client.name
            if control_key is not None and client.key == control_key:
                out.add(
                    "config.client_key_is_control_key",
                    _at(entry.path, "key"),
                    "a gateway key must differ from the control key",
                )
        if client.route is not None and client.route not in routes:
            out.add(
                "engine.client_route_unknown",
                _at(entry.path, "route"),
                f"route {client.route!r} is not defined",
            )
        seen: dict[tuple[object, ...], str] = {}
        for i, limit in enumerate(client.limits):
            # The same window and measure twice: only the smaller could ever refuse.
            same = (limit.per, limit.measure, limit.cache_reads)
            if same in seen:
                out.add(
                    "config.key_limit_duplicate",
                    entry.parts[i],
                    f"key {client.name!r} already has a per-{limit.per.value} "
                    f"{limit.measure.value} limit at {seen[same]}; give each window and "
                    "measure one limit",
                )
            else:
                seen[same] = entry.parts[i]
            if retention.row_days < limit.per.retention_days:
                out.add(
                    "config.key_limit_retention",
                    _at(entry.parts[i], "per"),
                    f"a per-{limit.per.value} limit is rebuilt from stored rows at startup; "
                    f"retention.row_days must be at least {limit.per.retention_days}, "
                    f"is {retention.row_days}",
                )


def _control_key(
    out: _Problems, control: ControlListen, env: Mapping[str, str] | None
) -> str | None:
    """The control key as a caller presents it: its ``${VAR}`` read from `env`. The control
    plane reads the variable per request, so the `Config` keeps the template; but a variable
    that is not set would lock every caller out without a word, so with `env` it refuses the
    config. Without `env` the key as written."""
    key = control.key
    if key is None or env is None or not control.enabled:
        return key
    try:
        return resolve_template(key, env)
    except TemplateError as exc:
        if exc.variable is not None:  # a malformed template is reported with the field
            out.add(
                exc.code,
                "listen.control.key",
                f"{exc.message}; the control plane would let nobody in",
            )
        return None


def _check_credentials(
    out: _Problems, providers: Sequence[_Placed], env: Mapping[str, str] | None
) -> None:
    """Upstream keys and headers are read at send time; at load, a value that could never be
    sent refuses the config, and a variable not set yet is a warning (requests skip the
    upstream until it is). Without `env` only values written out in full are checked."""
    for entry in providers:
        for found in credential_faults(entry.value, env or {}):
            if found.field == "key":
                path = _at(entry.path, "key")
            else:
                path = _at(_at(entry.path, "headers"), found.field.removeprefix("headers."))
            if found.variable is None:
                out.add("config.secret_invalid", path, found.message)
            elif env is not None:
                out.warn(
                    "config.env_missing",
                    path,
                    f"environment variable {found.variable} is not set; requests skip this "
                    "upstream until it is",
                )


def _check_groups(
    out: _Problems, groups: Sequence[_Placed], providers: set[str], aliases: set[str]
) -> None:
    _duplicates(out, groups, "engine.group_duplicate_name", "group name")
    group_names = {g.value.name for g in groups}
    for entry in groups:
        group: Group = entry.value
        if group.name in providers:
            out.add(
                "engine.name_taken",
                _at(entry.path, "name"),
                f"{group.name!r} is already an upstream's name",
            )
        for i, member in enumerate(group.members):
            if member.provider in providers:
                continue
            if member.provider in group_names:
                why = "is a group; groups list upstreams only"
            elif member.provider in aliases:
                why = "is a model alias, not an upstream"
            else:
                why = "is not an upstream"
            out.add(
                "engine.group_unknown_upstream",
                entry.parts[i],
                f"{member.provider!r} {why}",
            )


def _check_routes(
    out: _Problems,
    routes: Sequence[_Placed],
    providers: Mapping[str, Provider],
    groups: set[str],
    clients: set[str],
    aliases: Mapping[str, Alias],
) -> list[Route]:
    first: dict[str, str] = {}
    built: list[Route] = []
    for entry in routes:
        route_name, rules, resume = entry.value
        if route_name in first:
            out.add(
                "engine.route_duplicate_name",
                _at(entry.path, "name"),
                f"route name {route_name!r} is already used at {first[route_name]}",
            )
        else:
            first[route_name] = entry.path
        seen: dict[str, str] = {}
        finished: list[Rule] = []
        for placed in rules:
            rule: Rule = placed.value
            if rule.name in seen:
                out.add(
                    "engine.rule_duplicate_name",
                    _at(placed.path, "name"),
                    f"rule name {rule.name!r} is already used at {seen[rule.name]}",
                )
            else:
                seen[rule.name] = placed.path
            for i, client in enumerate(rule.when.client):
                if client not in clients:
                    cpath = _at(_at(placed.path, "when"), "client")
                    out.add(
                        "engine.rule_unknown_client",
                        _at(cpath, i) if len(rule.when.client) > 1 else cpath,
                        f"{client!r} is not a gateway key name",
                    )
            for provider in rule.when.provider_would_be:
                if provider not in providers:
                    out.add(
                        "engine.rule_hop_unknown_upstream",
                        _at(_at(placed.path, "when"), "provider_would_be"),
                        f"{provider!r} is not an upstream",
                    )
            to = rule.to
            if to is not None and to.kind is TargetKind.PROVIDER and to.name is not None:
                if to.name in groups:
                    to = replace(to, kind=TargetKind.GROUP)
                elif to.name not in providers:
                    out.add(
                        "engine.rule_unknown_target",
                        _at(placed.path, "to"),
                        f"{to.name!r} is neither an upstream nor a group",
                    )
            if to is not None and to.kind is TargetKind.PINNED:
                pinned: set[str] = set()
                for i, pin in enumerate(to.pinned):
                    ppath = (
                        _at(_at(placed.path, "to"), i)
                        if len(to.pinned) > 1
                        else _at(placed.path, "to")
                    )
                    provider_obj = providers.get(pin.provider)
                    if pin.provider in pinned:
                        # A request tries each upstream once; a second pin could never be sent.
                        out.add(
                            "engine.pinned_upstream_twice",
                            _at(ppath, "provider"),
                            f"{pin.provider!r} is pinned twice in this rule; pin each upstream "
                            "once (an alias can offer it several model names)",
                        )
                    pinned.add(pin.provider)
                    if provider_obj is None:
                        out.add(
                            "engine.pinned_unknown_upstream",
                            _at(ppath, "provider"),
                            f"{pin.provider!r} is not an upstream",
                        )
                    elif provider_obj.model_to_send(pin.model, aliases.get(pin.model)) is None:
                        out.add(
                            "engine.pinned_model_not_offered",
                            _at(ppath, "model"),
                            f"upstream {pin.provider!r} does not list model {pin.model!r}",
                        )
            finished.append(replace(rule, to=to))
        built.append(Route(name=route_name, rules=tuple(finished), resume=resume))
    return built


def _check_aliases(out: _Problems, aliases: Sequence[_Placed]) -> None:
    names = {a.value.name for a in aliases}
    for entry in aliases:
        alias: Alias = entry.value
        for target in alias.targets:
            # A name may list itself: an upstream that knows the alias name literally gets it.
            if target in names and target != alias.name:
                out.add(
                    "engine.alias_to_alias",
                    entry.path,
                    f"{target!r} is itself an alias; list the model names it stands for",
                )


# --- the whole --------------------------------------------------------------------------


def build_config(data: Mapping[str, object], env: Mapping[str, str] | None = None) -> Config:
    """Validate parsed config data and build the `Config`.

    Raises `ConfigError` listing every problem found: schema problems section by section, then
    consistency problems.

    `env` is the environment ``${VAR}`` templates are read from. With it, gateway keys are
    resolved (a variable that is not set refuses the config, as it does for the control key,
    which stays a template in the `Config`) and upstream keys and headers are
    checked (a value that cannot be sent refuses the config; a variable that is not set is a
    warning in `Config.warnings`). Without it — checking a config's shape only — templates are
    checked for syntax and kept as written.
    """
    out = _Problems()
    if not isinstance(data, Mapping):
        raise ConfigError(
            (
                Problem(
                    code="config.yaml_invalid",
                    path="",
                    message=f"the config must be a mapping, got {_kind(data)}",
                ),
            )
        )
    top = _Fields(out, "", data, SECTIONS[""])

    # Stage 2: schema.
    version = top.required("version")
    if version is not _ABSENT and (
        isinstance(version, bool) or not isinstance(version, int) or version != 1
    ):
        out.add(
            "config.version_unsupported",
            "version",
            f"this twserve reads config version 1, got {version!r}",
        )
    listen = _listen(out, top)
    retention = _retention(out, top)
    failover = _failover(out, top)
    sheets = _pricing(out, top)
    clients = _clients(out, top, env)
    providers = _providers(out, top)
    aliases = _aliases(out, top)
    groups = _groups(out, top)
    routes = _routes(out, top)
    default_route = top.name("default_route", required=False)
    default_key = top.name("default_key", required=False)
    answer_model = top.choice("answer_model", AnswerModel, AnswerModel.REQUESTED)
    state = _state(out, top)
    store = _store(out, top, env)
    _not_built(out, data)

    # Stage 3: consistency.
    provider_map = {p.value.name: p.value for p in providers}
    alias_map = {a.value.name: a.value for a in aliases}
    route_names = {r.value[0] for r in routes}
    client_names = {c.value.name for c in clients}
    _duplicates(out, sheets, "config.price_sheet_duplicate", "price sheet")
    control_key = _control_key(out, listen.control, env)
    _check_clients(out, clients, route_names, control_key, retention)
    if default_key is not None and default_key not in client_names:
        out.add("config.default_key_unknown", "default_key", f"{default_key!r} is not a key name")
    _duplicates(out, providers, "config.provider_duplicate_name", "upstream name")
    sheet_names = {s.value.name for s in sheets}
    for entry in providers:
        sheet = entry.value.price_sheet
        if sheet is not None and sheet not in sheet_names:
            out.add(
                "config.price_sheet_unknown",
                _at(entry.path, "price_sheet"),
                f"{sheet!r} is not in pricing.sheets",
            )
    _check_credentials(out, providers, env)
    _check_aliases(out, aliases)
    _check_groups(out, groups, set(provider_map), set(alias_map))
    built_routes = _check_routes(
        out, routes, provider_map, {g.value.name for g in groups}, client_names, alias_map
    )
    if default_route is not None and default_route not in route_names:
        out.add(
            "engine.default_route_unknown",
            "default_route",
            f"route {default_route!r} is not defined",
        )

    if out.items:
        raise ConfigError(tuple(out.items))

    # Stage 4: build.
    return Config(
        version=1,
        listen=listen,
        clients=tuple(c.value for c in clients),
        providers=tuple(p.value for p in providers),
        aliases=tuple(a.value for a in aliases),
        groups=tuple(g.value for g in groups),
        routes=tuple(built_routes),
        default_route=default_route,
        default_key=default_key,
        failover=failover,
        answer_model=answer_model,
        retention=retention,
        pricing=Pricing(sheets=tuple(s.value for s in sheets)),
        state=state,
        store=store,
        warnings=tuple(out.warnings),
    )
