"""The control plane: HTTP/JSON views of a running gateway on a listener of its own
(docs/control-plane.md).

Theory of operation
-------------------
`ControlPlane.handle` is an `twserve.server.base.Handler` served by `twserve.server.listener` on
``listen.control`` (loopback by default), never on the gateway's own port. Every request must
carry the control key — ``Authorization: Bearer <key>`` or ``x-control-key: <key>`` — compared
in constant time; the check comes before the path, so an unauthenticated caller learns nothing,
not even which paths exist, and before the body (`check_head`, asked by the transport), so it
gets nothing buffered either. The key is read from the config in force at each request, so a
reload that changes it takes effect at once. The listener's connections, bodies and body
budget are bounded apart from the gateway's (``listen.control``; twserve.app.wiring).

The views read the same objects the gateway uses — its `Config`, its `Router` (health, pauses,
slots, balancers), the request store, the event bus and the metrics — and change nothing.
Dry-run asks `Router.dryrun` with the gateway's clock, so its ``next`` is the upstream the next
real request with the same facts is sent to first.

Every answer carries ``x-twserve-control-api: CONTROL_API_VERSION``; the number goes up with
every change to paths, fields or meanings, so a tool can tell which protocol it is speaking.
Errors are ``{"error": {"code": "control.…", "message": …}}`` with a registered code.

Secrets never leave: upstream keys and header values are not shown, gateway keys are masked
(`mask_secret`), and the control key appears nowhere. See docs/control-plane.md.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol
from urllib.parse import parse_qs

import anyio

from twengine.balance import balance_factors
from twengine.config import Config, Problem, TemplateError, resolve_template
from twengine.groups import URL_TEST_MIN_SAMPLES
from twengine.rules import RequestFacts
from twengine.slots import SlotScope
from twproto import json_dumps
from twproto.dialect import Dialect
from twproto.sse import SSEEvent, encode_comment, encode_event
from twserve.console.abort_api import RequestAborter
from twserve.console.requests_query import parse_filter
from twserve.console.static import SECURITY_HEADERS, UI_PREFIX, ui_file
from twserve.control.metrics import CONTENT_TYPE, Metrics
from twserve.events import EVENT_TYPES, Dropped, EventBus, event_json, event_name
from twserve.gateway.handler import Gateway
from twserve.server.base import Headers, HeadRefusal, Request, Responder
from twserve.store.listing import next_cursor
from twserve.store.sqlite import Store, StoreReadError
from twserve.usage import view as usage_view

__all__ = [
    "CONTROL_API_VERSION",
    "ControlPlane",
    "ControlRequestError",
    "control_key_of",
    "dryrun_facts",
    "mask_secret",
]

CONTROL_API_VERSION = 10
API_HEADER = b"x-twserve-control-api"

KEEPALIVE_SECS = 15.0


class ControlRequestError(Exception):
    """A control-plane request that cannot be served: the status and code to answer with."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_json(code: str, message: str) -> bytes:
    return json_dumps({"error": {"code": code, "message": message}})


def transport_error(
    path: str | None, status: int, code: str, message: str
) -> tuple[Headers, bytes]:
    """Errors the HTTP layer answers itself on the control listener (bad HTTP, limits)."""
    del path
    headers: Headers = [
        (b"content-type", b"application/json"),
        (API_HEADER, str(CONTROL_API_VERSION).encode()),
    ]
    return headers, error_json(code, message)


def mask_secret(value: str | None) -> str | None:
    """A key as the control plane shows it.

    A bare ``${VAR}`` reference names where the key comes from and is shown as written; any
    other key shows at most its last four characters (none for a short key).
    """
    if value is None:
        return None
    if value.startswith("${") and value.endswith("}") and value.count("${") == 1:
        return value
    if len(value) >= 16:
        return "…" + value[-4:]
    return "…"


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise ControlRequestError(400, "control.request.invalid", f"{value!r} is not true or false")


def _count(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ControlRequestError(
            400, "control.request.invalid", f"{name} must be a whole number, not {value!r}"
        )
    return number


def dryrun_facts(
    config: Config,
    *,
    model: str | None,
    key: str | None = None,
    dialect: str | None = None,
    stream: bool = False,
    input_tokens: int = 0,
    max_tokens: int | None = None,
    tool_count: int = 0,
    image: bool = False,
    thinking: bool = False,
) -> RequestFacts:
    """The request facts a dry-run routes: `key` is a gateway key's *name* (default: the
    config's ``default_key``, else none); `dialect` the client's format (default openai-chat).
    Raises `ControlRequestError` for a missing model or an unknown key or format."""
    if not model:
        raise ControlRequestError(400, "control.request.invalid", "name a model (model=...)")
    if key is not None and not config.has_client(key):
        raise ControlRequestError(400, "control.request.invalid", f"no gateway key named {key!r}")
    try:
        client_dialect = Dialect(dialect) if dialect else Dialect.OPENAI_CHAT
    except ValueError:
        known = ", ".join(d.value for d in Dialect)
        raise ControlRequestError(
            400, "control.request.invalid", f"unknown format {dialect!r} (one of {known})"
        ) from None
    return RequestFacts(
        model=model,
        dialect=client_dialect,
        client=key if key is not None else config.default_key,
        input_tokens=input_tokens,
        max_tokens=max_tokens,
        tool_count=tool_count,
        tools=tool_count > 0,
        image=image,
        thinking=thinking,
        stream=stream,
    )


def control_key_of(config: Config, env: Mapping[str, str] | None = None) -> str | None:
    """The control key a config sets, its ``${VAR}`` read from `env` (default: os.environ)."""
    key = config.listen.control.key
    if not key:
        return None
    try:
        return resolve_template(key, dict(os.environ) if env is None else env)
    except TemplateError:
        return None


def _query(request: Request) -> dict[str, str]:
    # The last value of each parameter; blank values kept, so "stream=" reads as false.
    return {k: v[-1] for k, v in parse_qs(request.query, keep_blank_values=True).items()}


def _is_ui(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _presented_key(request: Request) -> bytes | None:
    for name, value in request.headers:
        if name == b"x-control-key" and value.strip():
            return value.strip()
    auth = request.header(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        token = auth[7:].strip()
        if token:
            return token
    return None


View = Callable[[Request], Awaitable[Any]]


class ConfigEndpoints(Protocol):
    """The config reads and writes (`twserve.control.config_api.ConfigAPI`), when the gateway runs
    from a config file."""

    async def handle(self, request: Request) -> tuple[int, Any] | None: ...

    def status(self) -> dict[str, Any]: ...


class ControlPlane:
    """The control plane's handler over the gateway's shared objects (see module docs).

    `generation` is 1 for a gateway built from a config object; one that runs from a config
    file reports the reloader's count instead (`config_api`, twserve.config.live). `safe_mode`
    holds the problems of a config that failed at startup (the gateway then does not serve).
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        store: Store,
        events: EventBus,
        metrics: Metrics,
        env: Mapping[str, str],
        safe_mode: Sequence[Problem] = (),
        keepalive_secs: float = KEEPALIVE_SECS,
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.events = events
        self.metrics = metrics
        self.env = env
        self.safe_mode = tuple(safe_mode)
        self.keepalive_secs = keepalive_secs
        self.generation = 1
        # Set by the app when it runs from a config file: GET/PUT /config and the small writes.
        self.config_api: ConfigEndpoints | None = None
        # POST /requests/{id}/abort (twserve.console.abort_api), with or without a file.
        self.aborter = RequestAborter(gateway, store, events)
        # More parts of GET /status, by their key there (the log's writer, notifications).
        self.status_parts: dict[str, Callable[[], Any]] = {}
        self.started_wall = gateway.wall()
        self.started = gateway.clock()
        self._views: dict[str, View] = {
            "/status": self._status,
            "/overview": self._overview,
            "/providers": self._providers,
            "/groups": self._groups,
            "/keys": self._keys,
            "/requests": self._requests,
            "/dryrun": self._dryrun,
            "/usage": self._usage,
        }

    @property
    def config(self) -> Config:
        return self.gateway.config

    # -- the handler -----------------------------------------------------------------------

    async def handle(self, request: Request, responder: Responder) -> None:
        if _is_ui(request.path):
            await self._ui(request, responder)
            return
        try:
            self._authenticate(request)
            self._same_origin(request)
            if request.path == "/events":
                self._only_get(request)
                await self._events(request, responder)
                return
            if request.path == "/metrics":
                self._only_get(request)
                await self._send(responder, 200, self.metrics.exposition(), CONTENT_TYPE.encode())
                return
            answer = await self.aborter.handle(request)
            if answer is None and self.config_api is not None:
                answer = await self.config_api.handle(request)
            if answer is not None:
                status, payload = answer
                await self._send(responder, status, json_dumps(payload))
                return
            view = self._views.get(request.path)
            if view is None:
                raise ControlRequestError(
                    404, "control.request.not_found", f"no control view at {request.path}"
                )
            self._only_get(request)
            body = json_dumps(await view(request))
        except ControlRequestError as err:
            headers: Headers = []
            if err.status == 401:
                headers.append((b"www-authenticate", b'Bearer realm="twserve-control"'))
            if err.status == 405:
                headers.append((b"allow", b"GET"))
            await self._send(
                responder, err.status, error_json(err.code, err.message), extra=headers
            )
            return
        await self._send(responder, 200, body)

    def check_head(self, request: Request) -> HeadRefusal | None:
        """The transport's head check: a request without the right control key is answered
        401 from its head, before a byte of its body is read (`handle` checks again). The
        console page's files need no key (twserve.console.static)."""
        if _is_ui(request.path):
            return None
        try:
            self._authenticate(request)
        except ControlRequestError as err:
            return HeadRefusal(
                status=err.status,
                headers=[
                    (b"content-type", b"application/json"),
                    (b"cache-control", b"no-store"),
                    (API_HEADER, str(CONTROL_API_VERSION).encode()),
                    (b"www-authenticate", b'Bearer realm="twserve-control"'),
                ],
                body=error_json(err.code, err.message),
            )
        return None

    def _authenticate(self, request: Request) -> None:
        presented = _presented_key(request)
        if presented is None:
            raise ControlRequestError(401, "control.auth.missing_key", "missing control key")
        expected = self._expected_key()
        # An unset or unresolvable key lets nobody in; compare anyway to keep the timing flat.
        ok = hmac.compare_digest(presented, expected or b"\0")
        if not (ok and expected):
            raise ControlRequestError(401, "control.auth.bad_key", "invalid control key")

    @staticmethod
    def _same_origin(request: Request) -> None:
        """A write a browser sends names its page's origin; one from another site's page is
        refused (a browser sends ``Origin`` with every write; tools send none)."""
        if request.method in ("GET", "HEAD"):
            return
        origin = request.header(b"origin")
        if origin is None:
            return
        host = request.header(b"host") or b""
        _, _, authority = origin.partition(b"://")
        if not host or authority.lower() != host.lower():
            raise ControlRequestError(
                403,
                "control.request.cross_origin",
                "a write from a page of another origin is refused",
            )

    async def _ui(self, request: Request, responder: Responder) -> None:
        """The console page's files (twserve.console.static), GET or HEAD, without the key."""
        headers: Headers = [*SECURITY_HEADERS, (API_HEADER, str(CONTROL_API_VERSION).encode())]
        if request.method not in ("GET", "HEAD"):
            body = error_json("control.request.method_not_allowed", "the page answers GET")
            status, content_type = 405, b"application/json"
            headers.append((b"allow", b"GET, HEAD"))
        elif request.path == UI_PREFIX:
            body, status, content_type = b"", 308, b"text/plain"
            headers.append((b"location", UI_PREFIX.encode() + b"/"))
        else:
            found = ui_file(request.path)
            if found is None:
                body = error_json("control.request.not_found", f"no page file at {request.path}")
                status, content_type = 404, b"application/json"
            else:
                content_type, body = found
                status = 200
        await responder.start(
            status,
            [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-cache"),
                *headers,
            ],
        )
        if request.method != "HEAD":
            await responder.send(body)
        await responder.end()

    def _expected_key(self) -> bytes | None:
        key = control_key_of(self.config, self.env)
        return key.encode() if key else None

    @staticmethod
    def _only_get(request: Request) -> None:
        if request.method != "GET":
            raise ControlRequestError(
                405,
                "control.request.method_not_allowed",
                f"{request.path} answers GET, not {request.method}",
            )

    @staticmethod
    async def _send(
        responder: Responder,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        extra: Headers | None = None,
    ) -> None:
        await responder.start(
            status,
            [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                (API_HEADER, str(CONTROL_API_VERSION).encode()),
                *(extra or ()),
            ],
        )
        await responder.send(body)
        await responder.end()

    # -- views -----------------------------------------------------------------------------

    def _now(self) -> float:
        return self.gateway.clock()

    def _wall_at(self, monotonic: float | None) -> float | None:
        # The gateway's monotonic time as wall-clock seconds, for people and other machines.
        if monotonic is None:
            return None
        return round(self.gateway.wall() + (monotonic - self._now()), 3)

    async def _status(self, request: Request) -> dict[str, Any]:
        config = self.config
        import importlib.metadata  # asked for rarely: not loaded with the gateway

        try:
            version = importlib.metadata.version("twserve")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return (
            {
                "api_version": CONTROL_API_VERSION,
                "version": version,
                "started_at": self.started_wall,
                "uptime_secs": round(self._now() - self.started, 3),
                "config": {"version": config.version, "generation": self.generation},
                "safe_mode": (
                    {
                        "code": "control.safe_mode",
                        "problems": [asdict(p) for p in self.safe_mode],
                    }
                    if self.safe_mode
                    else None
                ),
                "gateway": {
                    "bind": config.listen.gateway.bind,
                    "port": config.listen.gateway.port,
                },
                "load": {
                    "in_progress": self.gateway.load.in_progress,
                    "loop_lag_ms": round(self.gateway.load.lag_ms, 1),
                    "shedding": self.gateway.load.shedding,
                    "shed": self.gateway.load.shed + self.gateway.load.shed_at_door,
                    "shed_at_door": self.gateway.load.shed_at_door,
                    "accept_wait_ms": round(self.gateway.load.accept_wait_ms, 1),
                    "reads_held": self._reads_held(),
                },
                "store": self.store.status(),
            }
            | {name: part() for name, part in self.status_parts.items()}
            | (self.config_api.status() if self.config_api is not None else {})
        )

    def _reads_held(self) -> int:
        """Upstream reads held to the loop's next turn since start (h1_connection.ReadTurns)."""
        turns = self.gateway.upstream.pool.turns
        return 0 if turns is None else turns.held_total

    async def _overview(self, request: Request) -> dict[str, Any]:
        config = self.config
        router = self.gateway.router
        now = self._now()
        names = [p.name for p in config.providers]
        return {
            "requests": {
                **self.metrics.totals,
                "in_flight": self.metrics.open_requests,
            },
            "config": {
                "upstreams": len(config.providers),
                "groups": len(config.groups),
                "routes": len(config.routes),
                "aliases": len(config.aliases),
                "keys": len(config.clients),
                "default_route": config.default_route,
                "default_key": config.default_key,
            },
            "upstreams": {
                "in_flight": sum(router.slots.in_flight(n) for n in names),
                "paused": sorted(router.health.paused(names, now)),
                "waiting": len(router.slots.waiting()),
            },
            "failover": asdict(config.failover),
            "events": {"subscribers": self.events.subscribers},
        }

    async def _providers(self, request: Request) -> dict[str, Any]:
        config = self.config
        router = self.gateway.router
        now = self._now()
        rows = []
        for p in config.providers:
            snap = router.health.snapshot(p.name, now)
            median = snap.first_content_median
            models: list[str] = list(p.models or ())
            for name, _ in p.model_specs:
                if name not in models:
                    models.append(name)
            model_rows = [self._model_row(config, p.name, name) for name in models]
            rows.append(
                {
                    "name": p.name,
                    "protocol": p.protocol.value,
                    "protocol_recognised": p.protocol_recognised,
                    "base_url": p.base_url,
                    "has_key": p.key is not None,
                    "header_names": [name for name, _ in p.headers],
                    "billing": p.billing.value,
                    "price_sheet": p.price_sheet,
                    "max_concurrent": p.max_concurrent,
                    "in_flight": router.slots.in_flight(p.name),
                    "paused_until": self._wall_at(snap.paused_until),
                    "pause_left_secs": (
                        None
                        if snap.paused_until is None
                        else round(max(0.0, snap.paused_until - now), 3)
                    ),
                    "pause_reason": snap.pause_reason.value if snap.pause_reason else None,
                    "failures_in_row": snap.failures_in_row,
                    "success_rate": snap.success_rate,
                    "attempts": snap.attempts,
                    "first_content_median_ms": None if median is None else round(median * 1000),
                    "first_content_samples": snap.first_content_samples,
                    "any_model": p.models is None,
                    "models": model_rows,
                }
            )
        return {"providers": rows}

    def _model_row(self, config: Config, provider: str, model: str) -> dict[str, Any]:
        """One model of an upstream: its figures as routing reads them (the gateway's catalog)
        and where each came from: ``manual`` (``model_specs``, editable with PUT
        /provider-model-spec), ``price_table`` or None (unknown)."""
        upstream = config.provider(provider)
        spec = upstream.model_spec(model)
        catalog = self.gateway.catalog
        window = catalog.context_window(config, provider, model)
        output = catalog.max_output_tokens(config, provider, model)

        def source(value: int | None, written: int | None) -> str | None:
            if value is None:
                return None
            return "manual" if written is not None else "price_table"

        return {
            "model": model,
            "offered": upstream.offers(model),
            "context_window": window,
            "context_window_source": source(window, spec.context_window if spec else None),
            "max_output_tokens": output,
            "max_output_tokens_source": source(output, spec.max_output_tokens if spec else None),
            "set_by_hand": spec is not None,
        }

    async def _groups(self, request: Request) -> dict[str, Any]:
        rows = []
        health = self.gateway.router.health
        now = self._now()
        for g in self.config.groups:
            names = [m.provider for m in g.members]
            # The automatic factor balance_by multiplies each weight by, as routing works it
            # out now (twengine.balance).
            factors = balance_factors(
                names,
                g.balance_by,
                first_content={
                    n: health.first_content_median(n, min_samples=URL_TEST_MIN_SAMPLES)
                    for n in names
                },
                success_rate={n: health.success_rate(n, now) for n in names},
            )
            rows.append(
                {
                    "name": g.name,
                    "type": g.type.value,
                    "members": [
                        {
                            "provider": m.provider,
                            "weight": m.weight,
                            "factor": round(factors.get(m.provider, 1.0), 4),
                        }
                        for m in g.members
                    ],
                    "selected": g.selected,
                    "balance_by": g.balance_by.value,
                }
            )
        return {"groups": rows}

    async def _keys(self, request: Request) -> dict[str, Any]:
        slots = self.gateway.router.slots
        wall = self.gateway.wall()
        rows = []
        for c in self.config.clients:
            until = c.previous_key_until if c.previous_key else None
            rows.append(
                {
                    "name": c.name,
                    "key": mask_secret(c.key),
                    "route": c.route,
                    "disabled": c.disabled,
                    "expires_at": c.expires_at,
                    "expired": c.expires_at is not None and wall >= c.expires_at,
                    "allowed_models": list(c.allowed_models) or None,
                    # A rotation's old secret, accepted until then (never shown).
                    "previous_key_until": until,
                    "previous_key_active": until is not None and wall < until,
                    "max_concurrent": c.max_concurrent,
                    "in_flight": slots.in_flight(c.name, SlotScope.KEY),
                    # Each limit with its usage (reservations included) and reset time; with
                    # shared state, across instances.
                    "limits": await self.gateway.usage.current_key_view(c.name),
                    "unpriced_models": self.gateway.usage.unpriced_models(c.name),
                }
            )
        return {"keys": rows, "default_key": self.config.default_key}

    # -- usage (twserve.usage.view) ---------------------------------------------------------

    async def _usage(self, request: Request) -> dict[str, Any]:
        """``GET /usage?by=key|model|provider|day&since=…&until=…``: totals from the store."""
        query = _query(request)
        now = self.gateway.wall()
        try:
            by = usage_view.check_group(query.get("by", "key"))
            since = usage_view.parse_since(query.get("since", "24h"), now)
            until = usage_view.parse_since(query["until"], now) if "until" in query else None
        except ValueError as exc:
            raise ControlRequestError(400, "control.request.invalid", str(exc)) from None
        try:
            rows = await self.store.usage(by=by, since=since, until=until)
        except StoreReadError as exc:
            raise ControlRequestError(503, "control.store_unavailable", str(exc)) from None
        return {
            "by": by,
            "since": since,
            "until": until,
            "rows": rows,
            "total": usage_view.totals(rows),
            "prices": {
                "package": self.gateway.usage.table.package,
                "version": self.gateway.usage.table.version,
                "retrieved": self.gateway.usage.table.retrieved,
            },
        }

    async def _requests(self, request: Request) -> dict[str, Any]:
        """A page of stored rows, newest first, with the console's filters and a cursor for
        the next page (twserve.console.requests_query, twserve.store.listing)."""
        try:
            wanted = parse_filter(_query(request), self.gateway.wall())
        except ValueError as exc:
            raise ControlRequestError(400, "control.request.invalid", str(exc)) from None
        try:
            rows = await self.store.page(wanted)
        except StoreReadError as exc:
            raise ControlRequestError(503, "control.store_unavailable", str(exc)) from None
        return {
            "requests": rows,
            "limit": wanted.limit,
            "next": next_cursor(rows, wanted.limit),
        }

    async def _dryrun(self, request: Request) -> dict[str, Any]:
        query = _query(request)
        max_tokens = query.get("max_tokens")
        facts = dryrun_facts(
            self.config,
            model=query.get("model"),
            key=query.get("key") or None,
            dialect=query.get("dialect") or None,
            stream=_flag(query.get("stream", "")),
            input_tokens=_count("input_tokens", query.get("input_tokens") or "0"),
            max_tokens=_count("max_tokens", max_tokens) if max_tokens else None,
            tool_count=_count("tools", query.get("tools") or "0"),
            image=_flag(query.get("image", "")),
            thinking=_flag(query.get("thinking", "")),
        )
        report = self.gateway.router.dryrun(facts, now=self._now())
        body = report.to_dict()
        body["request"] = {
            "key": facts.client,
            "dialect": facts.dialect.value,
            "stream": facts.stream,
        }
        return body

    # -- the event stream ------------------------------------------------------------------

    async def _events(self, request: Request, responder: Responder) -> None:
        wanted: set[str] | None = None
        types = _query(request).get("types")
        if types:
            known = {t.__name__ for t in EVENT_TYPES}
            wanted = {t.strip() for t in types.split(",") if t.strip()}
            unknown = sorted(wanted - known)
            if unknown:
                raise ControlRequestError(
                    400,
                    "control.request.invalid",
                    f"unknown event types {unknown} (known: {sorted(known)})",
                )
        with self.events.subscribe() as sub:
            await responder.start(
                200,
                [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-store"),
                    (API_HEADER, str(CONTROL_API_VERSION).encode()),
                ],
            )
            await responder.send(encode_comment("twserve events"))
            while True:
                item = None
                with anyio.move_on_after(self.keepalive_secs):
                    item = await sub.receive()
                if item is None:
                    await responder.send(encode_comment("keep-alive"))
                elif isinstance(item, Dropped):
                    data = json_dumps({"dropped": item.count, "total": item.total})
                    await responder.send(
                        encode_event(SSEEvent(data=data.decode(), event="dropped"))
                    )
                elif wanted is None or event_name(item.event) in wanted:
                    frame = SSEEvent(
                        data=event_json(item.event).decode(),
                        event=event_name(item.event),
                        id=str(item.seq),
                    )
                    await responder.send(encode_event(frame))
