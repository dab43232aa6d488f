"""Stage 2: the config read section by section, one reader per section.

Each reader takes the top level's `_Fields` (and the environment where ``${VAR}`` templates
must be resolved at load) and returns the section's model: `Listen`, `Failover`, `Retention`,
`StateConfig`, `Store`, or for the list sections (``clients``, ``pricing.sheets`` here;
``providers`` in `twengine.config.stages.providers`; ``aliases``, ``groups`` and ``routes`` in
`twengine.config.stages.routing`) each entry as a `_Placed`, its value with the path it was read at,
for the consistency checks of stage 3. A check that needs only the section's own fields is
made here (a control plane on the gateway's port, a key's limits); one that needs another
section is made in `twengine.config.stages.consistency`. `_not_built` refuses the fields whose
behaviour is not built.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from twengine.config import defaults
from twengine.config.credentials import header_value_fault
from twengine.config.defaults import Bound
from twengine.config.model import (
    Client,
    ControlListen,
    Failover,
    GatewayListen,
    Http2Listen,
    HttpListen,
    IPNetwork,
    KeyLimit,
    LimitMeasure,
    LimitPeriod,
    Listen,
    LogFormat,
    ModelPrice,
    Observability,
    PriceSheet,
    Retention,
    StateConfig,
    Store,
    Traces,
    UpstreamPool,
    WebSocketListen,
)
from twengine.config.schema import NOT_BUILT, SECTIONS
from twengine.config.stages.fields import (
    _ABSENT,
    _as_choice,
    _as_model,
    _as_number,
    _as_secret,
    _as_text,
    _as_time,
    _at,
    _entries,
    _Fields,
    _is_seq,
    _one_or_many,
    _Placed,
    _Problems,
)
from twengine.config.template import TemplateError, resolve_template, template_variables

__all__ = ()

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
        max_requests = gf.integer("max_requests", defaults.GATEWAY_MAX_REQUESTS)
        lag_ms = gf.integer("shed_loop_lag_ms", defaults.GATEWAY_SHED_LOOP_LAG_MS)
        gateway = GatewayListen(
            bind=bind,
            port=port or defaults.GATEWAY_PORT,
            allow_from=tuple(networks),
            max_connections=max_connections or 1000,
            max_connections_per_address=per_address,
            allow_origins=_origins(out, gf),
            allow_hosts=_hosts(out, gf),
            max_model_name_chars=model_chars or 256,
            max_requests=max_requests or 0,
            shed_loop_lag_ms=250 if lag_ms is None else lag_ms,
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
        if control.max_config_bytes > control.max_body_bytes and not cf.has("max_config_bytes"):
            # Left at its default, the config limit follows a lower body limit.
            control = replace(control, max_config_bytes=control.max_body_bytes)
        elif control.max_config_bytes > control.max_body_bytes:
            # The control listener refuses a body over max_body_bytes before PUT /config reads
            # it: a larger config limit set by hand could never be reached.
            out.add(
                "config.listen_limits_conflict",
                cf.at("max_config_bytes"),
                f"max_config_bytes ({control.max_config_bytes}) is above max_body_bytes "
                f"({control.max_body_bytes}): no config that large could ever arrive",
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


def _time(out: _Problems, f: _Fields, name: str) -> float | None:
    return _as_time(out, f.at(name), f.raw(name)) if f.has(name) else None


def _model_globs(out: _Problems, f: _Fields) -> tuple[str, ...]:
    """``allowed_models``: one model glob or a list of them (as a rule's ``when.model``)."""
    if not f.has("allowed_models"):
        return ()
    items = _one_or_many(out, f.at("allowed_models"), f.raw("allowed_models")) or []
    globs: list[str] = []
    for path, item in items:
        text = _as_text(out, path, item)
        if text is not None and not text.strip():
            out.add("config.model_name_invalid", path, "a model pattern cannot be blank")
        elif text is not None:
            globs.append(text)
    return tuple(globs)


def _previous_key(
    out: _Problems, f: _Fields, env: Mapping[str, str] | None
) -> tuple[str | None, float | None]:
    """``previous_key`` (the secret a rotation replaced) and ``previous_key_until``."""
    if not f.has("previous_key"):
        return None, None
    raw = _as_secret(out, f.at("previous_key"), f.raw("previous_key"))
    key = None if raw is None else _client_key(out, f.at("previous_key"), raw, env)
    until = _time(out, f, "previous_key_until")
    if until is None and not f.has("previous_key_until"):
        out.add(
            "config.previous_key_until_missing",
            f.at("previous_key"),
            "previous_key needs previous_key_until: the time it stops being accepted",
        )
        return None, None
    return key, until


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
        disabled = f.boolean("disabled", False)
        expires_at = _time(out, f, "expires_at")
        allowed = _model_globs(out, f)
        previous = _previous_key(out, f, env)
        if name is None:
            continue
        client = Client(
            name=name,
            key=key or "",
            route=route,
            max_concurrent=max_concurrent,
            limits=tuple(lim for _, lim in limits if lim is not None),
            disabled=disabled,
            expires_at=expires_at,
            allowed_models=allowed,
            previous_key=previous[0],
            previous_key_until=previous[1],
        )
        parts = tuple(p for p, lim in limits if lim is not None)
        placed.append(_Placed(path=path, value=client, parts=parts))
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
        **{
            name: _int_or_default(rf.integer(name, defaults.RETENTION[name]), name)
            for name in ("responses_secs", "responses_per_key", "responses_key_bytes")
        },
    )


def _int_or_default(value: int | None, name: str) -> int:
    return int(defaults.RETENTION[name].default or 0) if value is None else value


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


_REDIS_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::\d{1,5})?"
_REDIS_URL = re.compile(
    r"rediss?://(?:[^\s/?#@]*@)?" + _REDIS_HOST + r"(?:/\d{1,5})?(?:\?[^\s#]*)?"
)
# Sentinel: the sentinels (comma-separated), the master's name, the database number.
_SENTINEL_URL = re.compile(
    r"redis\+sentinel://(?:[^\s/?#@]*@)?" + _REDIS_HOST + r"(?:," + _REDIS_HOST + r")*"
    r"/[^\s/?#]+(?:/\d{1,5})?(?:\?sentinel_password=[^\s#&]*)?"
)
# Cluster: nodes to learn the cluster from; a Cluster has database 0 only.
_CLUSTER_URL = re.compile(
    r"redis\+cluster://(?:[^\s/?#@]*@)?" + _REDIS_HOST + r"(?:," + _REDIS_HOST + r")*(?:/0?)?"
)


def _observability(out: _Problems, top: _Fields) -> Observability:
    of = top.fields("observability", SECTIONS["observability"])
    if of is None:
        return Observability()
    return Observability(
        log_format=of.choice("log_format", LogFormat, LogFormat.TEXT),
        access_log=of.boolean("access_log", True),
        log_queue_lines=of.integer("log_queue_lines", defaults.OBSERVABILITY["log_queue_lines"])
        or 0,
        traces=_traces(out, of),
    )


def _pool(out: _Problems, top: _Fields) -> UpstreamPool:
    pf = top.fields("pool", SECTIONS["pool"])
    if pf is None:
        return UpstreamPool()
    values: dict[str, float] = {}
    for name, bound in defaults.POOL.items():
        found = pf.number(name, bound)
        assert found is not None
        values[name] = found
    return UpstreamPool(
        max_connections=int(values["max_connections"]),
        max_idle=int(values["max_idle"]),
        idle_secs=values["idle_secs"],
        wait_secs=values["wait_secs"],
    )


def _traces(out: _Problems, of: _Fields) -> Traces | None:
    tf = of.fields("traces", SECTIONS["observability.traces"])
    if tf is None:
        return None
    endpoint = tf.text("endpoint")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        out.add(
            "config.url_invalid",
            tf.at("endpoint"),
            "observability.traces.endpoint must be an http:// or https:// URL",
        )
        endpoint = None
    ratio = tf.number("sample_ratio", defaults.TRACES["sample_ratio"])
    return Traces(
        endpoint=endpoint,
        sample_ratio=1.0 if ratio is None else ratio,
        capture_content=tf.boolean("capture_content", False),
    )


def _state(out: _Problems, top: _Fields) -> StateConfig | None:
    sf = top.fields("state", SECTIONS["state"])
    if sf is None:
        return None
    bounds = defaults.STATE
    timeout = sf.number("timeout_secs", bounds["timeout_secs"]) or 1.0
    retry = sf.number("retry_secs", bounds["retry_secs"]) or 1.0
    url = sf.text("redis_url")
    if url is None:
        return StateConfig(timeout_secs=timeout, retry_secs=retry)
    text = url.strip()
    if not any(form.fullmatch(text) for form in (_REDIS_URL, _SENTINEL_URL, _CLUSTER_URL)):
        # A Redis URL may carry a password: describe it without quoting it.
        shown = "the value" if "@" in url else repr(url)
        if text.startswith("redis+sentinel://"):
            why = (
                "is not a redis+sentinel:// URL (sentinels host:port,host:port, then "
                "/<master name>, optionally /<database number>)"
            )
        elif text.startswith("redis+cluster://"):
            why = (
                "is not a redis+cluster:// URL (nodes host:port,host:port; a Redis Cluster "
                "has database 0 only)"
            )
        else:
            why = (
                "is not a redis:// or rediss:// URL (host, port, database number), nor a "
                "redis+sentinel:// or redis+cluster:// one"
            )
        out.add("config.url_invalid", sf.at("redis_url"), f"{shown} {why}")
        return None
    return StateConfig(redis_url=url.strip(), timeout_secs=timeout, retry_secs=retry)


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
