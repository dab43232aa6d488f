"""The gateway's request handler: recognise, authenticate, route, relay, record.

Order of checks for every request (SPEC §3.1, §20): the client address against
``allow_from`` (before auth), the path (unknown → 404 in the format the path or headers suggest),
the gateway key, then the body. A request refused at any of these never reaches an upstream.
Every request that got as far as a key check leaves one row in the request store.
"""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from twengine.affinity import conversation_key, fingerprint, is_new_turn, session_id
from twengine.attempt import (
    Action,
    AttemptRecord,
    AttemptSettings,
    Backoff,
    Outcome,
    ResendReason,
    Send,
)
from twengine.config import Config
from twengine.config.credentials import CredentialFault, resolve_credentials
from twengine.effort_memory import EffortKey, EffortMemory, upstream_identity
from twengine.pricing import PriceTable, TableCatalog
from twengine.router import Router
from twengine.routing import Candidate as RoutedCandidate
from twengine.routing import RequestFacts
from twengine.sealed import SealedReasoning
from twengine.slots import Permit
from twproto import json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_body, error_headers
from twproto.formats._effort import requested_effort, sets_only_budget
from twproto.ir import ReasoningLevel
from twproto.paths import Operation, Route, match_path
from twproto.structure import check_structure
from twproto.summary import summarize
from twserve.auth import AddressFilter, KeyRing, find_key, strip_key_param
from twserve.bodies import BodyTap
from twserve.count_tokens import LocalFallbackResponder, answer_locally
from twserve.engine import EngineHooks
from twserve.events import EventBus
from twserve.http1 import Refusal
from twserve.httptypes import Headers, Request, Responder
from twserve.relay import Candidate, RelayOutcome, RelayRequest, relay
from twserve.store import RequestRow, RequestStore
from twserve.upstream import UpstreamClient
from twserve.usage import Admission, UsageKeeper

__all__ = ["Gateway", "client_dialect_for"]


def client_dialect_for(path: str | None, headers: Headers | None = None) -> Dialect:
    """The format to answer in when the path alone does not fix one (SPEC §3.1)."""
    if path:
        route = match_path("POST", path) or match_path("GET", path)
        if route is not None and route.dialect is not None:
            return route.dialect
        if path.startswith("/v1beta"):
            return Dialect.GEMINI
        if "/messages" in path:
            return Dialect.ANTHROPIC
    for name, _ in headers or ():
        if name in (b"anthropic-version", b"x-api-key"):
            return Dialect.ANTHROPIC
        if name == b"x-goog-api-key":
            return Dialect.GEMINI
    return Dialect.OPENAI_CHAT


def transport_error(
    path: str | None, status: int, code: str, message: str
) -> tuple[Headers, bytes]:
    """Errors the HTTP layer answers itself (bad HTTP, limits), in the client's format."""
    category = ErrorCategory.TIMEOUT if status == 408 else ErrorCategory.REQUEST
    if status >= 500:
        category = ErrorCategory.UPSTREAM
    if status == 503:  # the transport sheds load (request bodies): the client should back off
        category = ErrorCategory.RATE_LIMITED
    err = GatewayError(status=status, category=category, code=code, message=message)
    return error_headers(err), error_body(client_dialect_for(path), err)


async def respond_error(responder: Responder, dialect: Dialect, err: GatewayError) -> None:
    body = error_body(dialect, err)
    await responder.start(
        err.status, [*error_headers(err), (b"content-length", str(len(body)).encode())]
    )
    await responder.send(body)
    await responder.end()


async def respond_bytes(
    responder: Responder, status: int, body: bytes, content_type: bytes = b"application/json"
) -> None:
    await responder.start(
        status, [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    )
    await responder.send(body)
    await responder.end()


class Gateway:
    """Holds what every request needs; `handle` is the HTTP handler."""

    router: Router
    hooks: EngineHooks

    def __init__(
        self,
        config: Config,
        *,
        store: RequestStore,
        upstream: UpstreamClient,
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        usage: UsageKeeper | None = None,
    ) -> None:
        self.store = store
        # Prices, cost and key limits (twserve.usage): one admit and one finish per request.
        self.usage = usage or UsageKeeper(config, PriceTable.from_data({}), wall=wall, clock=clock)
        self.upstream = upstream
        self.env = env
        self.clock = clock
        self.wall = wall
        self.on_finished: Callable[[RequestRow], None] | None = None
        # Body copies of requests in progress, by request id (retention.store_bodies).
        self._taps: dict[str, BodyTap] = {}
        # Called with every stored row, after `on_finished` (metrics, the control plane).
        self.row_listeners: list[Callable[[RequestRow], None]] = []
        # RequestStarted/Routed/Finished/Failed go here when the app wires a bus.
        self.events: EventBus | None = None
        self._configured = False
        # Request ids: a random prefix per process and a counter (one urandom call, not one
        # per request).
        self._id_prefix = uuid.uuid4().hex[:12]
        self._id_counter = itertools.count(1)
        self.rng = random.Random()
        # Reasoning levels upstreams accepted in place of refused ones (docs/operations.md); the app
        # loads and persists it (effort-memory.json) through `effort_memory_changed`.
        self.effort_memory = EffortMemory()
        self.effort_memory_changed: Callable[[], None] | None = None
        # Conversations whose sealed reasoning an upstream refused (docs/operations.md).
        self.sealed = SealedReasoning()
        self.apply_config(config)

    def apply_config(self, config: Config) -> None:
        self.config = config
        if not self._configured:
            self._configured = True
            # Prices and limits from the table too: `cheapest` ordering, context windows.
            self.catalog = TableCatalog(self.usage.table)
            self.router = Router(config, catalog=self.catalog)
            self.hooks = EngineHooks(self.router, wall=self.wall, clock=self.clock)
        else:
            for grant in self.router.configure(config):
                self.hooks.deliver_grant(grant)
            self.usage.apply_config(config)
        self.settings = AttemptSettings.from_failover(config.failover)
        self.use_effort_memory(self.effort_memory)
        self.keys = KeyRing.of([(c.key, c.name) for c in config.clients])
        self.addresses = AddressFilter(list(config.listen.gateway.allow_from))

    def check_head(self, request: Request) -> Refusal | None:
        """The checks a request's head is enough for — address, path, key — made by the
        transport before it reads the body, so that no body is buffered for a request that
        would be refused anyway. `handle` makes the same checks again."""
        dialect = client_dialect_for(request.path, request.headers)
        route = match_path(request.method, request.path, request.query)
        err: GatewayError | None = None
        if not self.addresses.allows(request.client[0]):
            err = GatewayError(
                status=403,
                category=ErrorCategory.DENIED,
                code="gw.auth.denied_address",
                message="this address may not use the gateway",
            )
        elif route is None or route.operation is Operation.HEALTH:
            return None  # handle answers these without a key (404, the warm-up probe, health)
        else:
            presented = find_key(request.headers, request.query)
            matched = self.keys.lookup(presented)
            if self.config.client_for(matched, presented=bool(presented)) is None:
                err = GatewayError(
                    status=401,
                    category=ErrorCategory.AUTH,
                    code="gw.auth.bad_key" if presented else "gw.auth.missing_key",
                    message="invalid gateway key" if presented else "missing gateway key",
                )
        if err is None:
            return None
        return Refusal(status=err.status, headers=error_headers(err), body=error_body(dialect, err))

    def _identities(self) -> dict[str, str]:
        out = {}
        for p in self.config.providers:
            creds = resolve_credentials(p, self.env)
            key = creds.key if not isinstance(creds, CredentialFault) else (p.key or "")
            out[p.name] = upstream_identity(p.base_url, p.protocol.value, key)
        return out

    def use_effort_memory(self, memory: EffortMemory) -> None:
        """Take `memory`, dropping the choices of upstreams removed or changed (address, key,
        protocol) since they were made."""
        self.effort_memory = memory
        if memory.keep_only(self._identities()):
            self._effort_memory_changed()

    def _effort_memory_changed(self) -> None:
        if self.effort_memory_changed is not None:
            self.effort_memory_changed()

    def _apply_effort_memory(
        self, candidates: list[Candidate], body: dict[str, Any], dialect: Dialect
    ) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
        """Candidates with remembered levels put in up front, and each one's effort view
        (``{asked, sent, reason: rule|remembered}``) for the request row."""
        client_level = None if sets_only_budget(body, dialect) else requested_effort(body, dialect)
        out: list[Candidate] = []
        efforts: dict[str, dict[str, Any]] = {}
        for cand in candidates:
            asked = (
                cand.reasoning.value
                if cand.reasoning is not None
                else (client_level.value if client_level else None)
            )
            sent: ReasoningLevel | None = None
            if asked is not None and asked != "off":
                key = EffortKey(
                    upstream=cand.name, model=cand.model, client_format=dialect.value, level=asked
                )
                identity = upstream_identity(cand.base_url, cand.dialect.value, cand.key)
                found = self.effort_memory.recall(key, now=self.wall(), identity=identity)
                # A hand-edited file may hold anything: only a level this gateway sends counts.
                if found is not None and found in set(ReasoningLevel):
                    sent = ReasoningLevel(found)
            if sent is not None:
                cand = replace(cand, reasoning=sent)
                efforts[cand.name] = {"asked": asked, "sent": sent.value, "reason": "remembered"}
            elif cand.reasoning is not None:
                efforts[cand.name] = {
                    "asked": asked,
                    "sent": cand.reasoning.value,
                    "reason": "rule",
                }
            elif asked is not None:
                # Unchanged (no view on the row) unless the upstream refuses it.
                efforts[cand.name] = {"asked": asked, "sent": asked, "reason": None}
            out.append(cand)
        return out, efforts

    def _remember_efforts(
        self,
        outcome: RelayOutcome,
        candidates: list[Candidate],
        efforts: dict[str, dict[str, Any]],
        body: dict[str, Any],
        dialect: Dialect,
    ) -> None:
        """After a resend with an accepted level succeeded, remember that level."""
        ok = {
            a.provider
            for a in outcome.attempts
            if a.outcome is Outcome.OK and a.resend is ResendReason.EFFORT_REFUSED
        }
        client_level = requested_effort(body, dialect)
        changed = False
        for cand in candidates:
            sent = outcome.effort_resent.get(cand.name)
            if sent is None or cand.name not in ok:
                continue
            asked = efforts.get(cand.name, {}).get("asked") or (
                cand.reasoning.value if cand.reasoning is not None else None
            )
            asked = asked or (client_level.value if client_level else None)
            if asked is None:
                continue
            key = EffortKey(
                upstream=cand.name, model=cand.model, client_format=dialect.value, level=asked
            )
            identity = upstream_identity(cand.base_url, cand.dialect.value, cand.key)
            changed |= self.effort_memory.remember(key, sent, now=self.wall(), identity=identity)
        if changed:
            self._effort_memory_changed()

    async def handle(self, request: Request, responder: Responder) -> None:
        route = match_path(request.method, request.path, request.query)
        dialect = client_dialect_for(request.path, request.headers)
        if not self.addresses.allows(request.client[0]):
            await respond_error(
                responder,
                dialect,
                GatewayError(
                    status=403,
                    category=ErrorCategory.DENIED,
                    code="gw.auth.denied_address",
                    message="this address may not use the gateway",
                ),
            )
            return
        if route is None:
            if request.method == "HEAD" or (request.method == "GET" and request.path == "/"):
                # Claude Code's warm-up probe: answer at once, no key needed.
                await respond_bytes(responder, 200, b"", b"text/plain")
                return
            await respond_error(
                responder,
                dialect,
                GatewayError(
                    status=404,
                    category=ErrorCategory.REQUEST,
                    code="gw.request.not_found",
                    message=f"no API at {request.method} {request.path}",
                ),
            )
            return
        if route.operation is Operation.HEALTH:
            await respond_bytes(responder, 200, b"ok", b"text/plain")
            return
        presented = find_key(request.headers, request.query)
        client_name = self.config.client_for(self.keys.lookup(presented), presented=bool(presented))
        if client_name is None:
            await respond_error(
                responder,
                dialect,
                GatewayError(
                    status=401,
                    category=ErrorCategory.AUTH,
                    code="gw.auth.bad_key" if presented else "gw.auth.missing_key",
                    message="invalid gateway key" if presented else "missing gateway key",
                ),
            )
            return
        if route.operation in (Operation.LIST_MODELS, Operation.GET_MODEL):
            await self._models(request, responder, route, dialect)
            return
        assert route.dialect is not None
        retention = self.config.retention
        if not retention.store_bodies:
            await self._generate(request, responder, route, route.dialect, client_name)
            return
        # retention.store_bodies: a bounded copy of the answer goes to the row (twserve.bodies).
        tap = BodyTap(responder, retention.body_max_bytes, request.body)
        try:
            await self._generate(request, tap, route, route.dialect, client_name, tap=tap)
        finally:
            # A request that ended without storing its row leaves no copy behind.
            for request_id in [i for i, t in self._taps.items() if t is tap]:
                del self._taps[request_id]

    async def _models(
        self, request: Request, responder: Responder, route: Route, dialect: Dialect
    ) -> None:
        from twproto.models import ModelInfo, encode_model, encode_model_list

        if route.dialect is None:
            # The listing's shape follows the client (SPEC §3.1): Anthropic by its headers,
            # Gemini by its key header (google-genai lists under /v1/models too), else OpenAI.
            if request.header(b"anthropic-version") or request.header(b"x-api-key"):
                dialect = Dialect.ANTHROPIC
            elif request.header(b"x-goog-api-key"):
                dialect = Dialect.GEMINI
            else:
                dialect = Dialect.OPENAI_CHAT
        infos = [
            ModelInfo(
                id=name,
                display_name=name,
                context_window=spec[0],
                max_output_tokens=spec[1],
                owned_by="twserve",
            )
            for name, spec in self._listed_models().items()
        ]
        if route.operation is Operation.GET_MODEL:
            wanted = (route.model or "").removeprefix("models/")
            for info in infos:
                if info.id == wanted:
                    await respond_bytes(responder, 200, encode_model(dialect, info))
                    return
            await respond_error(
                responder,
                dialect,
                GatewayError(
                    status=404,
                    category=ErrorCategory.REQUEST,
                    code="gw.request.not_found",
                    message=f"model {wanted!r} not found",
                ),
            )
            return
        await respond_bytes(responder, 200, encode_model_list(dialect, infos))

    def _listed_models(self) -> dict[str, tuple[int | None, int | None]]:
        """Every model an upstream lists, then every alias, with the context window and output
        limit that `model_specs` give (for an alias: those of the first target that has one)."""
        specs: dict[str, tuple[int | None, int | None]] = {}
        for provider in self.config.providers:
            for name in provider.models or ():
                spec = provider.model_spec(name)
                known = specs.get(name, (None, None))
                if spec is not None:
                    known = (
                        known[0] or spec.context_window,
                        known[1] or spec.max_output_tokens,
                    )
                specs[name] = known
        table = self.usage.table
        for name, (context, output) in specs.items():
            # model_specs first, field by field; the price table fills what they leave out.
            if context is None or output is None:
                specs[name] = (
                    context or table.context_window(name),
                    output or table.max_output_tokens(name),
                )
        for alias in self.config.aliases:
            if alias.name not in specs:
                targets = [specs.get(t, (None, None)) for t in alias.targets]
                specs[alias.name] = next((t for t in targets if t != (None, None)), (None, None))
        return specs

    def _candidate(self, cand: RoutedCandidate, sticky: str | None) -> Candidate | CredentialFault:
        provider = self.config.provider(cand.provider)
        # Read at send time; a variable not set or a value no header can carry skips this
        # upstream (the fault never holds the value) instead of failing the request.
        creds = resolve_credentials(provider, self.env)
        if isinstance(creds, CredentialFault):
            return creds
        return Candidate(
            name=provider.name,
            dialect=provider.protocol,
            base_url=provider.base_url,
            key=creds.key,
            model=cand.model,
            headers=tuple((k.lower().encode(), v.encode()) for k, v in creds.headers),
            sticky=cand.provider == sticky,
            max_tokens=cand.overrides.max_tokens,
            output_limit=self.catalog.max_output_tokens(self.config, cand.provider, cand.model),
            reasoning=cand.overrides.reasoning,
            mock_headers=provider.forward_mock_headers,
            connect_timeout=provider.connect_timeout_secs,
        )

    async def _generate(
        self,
        request: Request,
        responder: Responder,
        route: Route,
        dialect: Dialect,
        client_name: str,
        tap: BodyTap | None = None,
    ) -> None:
        started = self.clock()
        # A reload may swap the config while this request waits for a key permit; it keeps the
        # settings it was admitted with (its candidates are fixed below, before any wait).
        settings = self.settings
        row = RequestRow(
            id=self._next_id(),
            ts=self.wall(),
            path=request.path,
            key_name=client_name,
            format=dialect.value,
        )
        if tap is not None:
            self._taps[row.id] = tap
        if self.events is not None:
            self.events.request_started(row)
        try:
            body = json_loads(request.body) if request.body else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            err = GatewayError(
                status=400,
                category=ErrorCategory.REQUEST,
                code="gw.request.bad_json",
                message="the request body must be a JSON object",
            )
            row.status, row.error_code = 400, err.code
            self._record(row)
            await respond_error(responder, dialect, err)
            return
        fault = check_structure(dialect, body)
        if fault is not None:
            # Checked here because a same-format body goes upstream without being decoded.
            err = GatewayError(
                status=400,
                category=ErrorCategory.REQUEST,
                code="gw.request.invalid_body",
                message=fault.message,
            )
            row.status, row.error_code = 400, err.code
            self._record(row)
            await respond_error(responder, dialect, err)
            return
        model = route.model if route.model is not None else body.get("model")
        stream = route.stream if dialect is Dialect.GEMINI else bool(body.get("stream"))
        if not isinstance(model, str) or not model:
            err = GatewayError(
                status=400,
                category=ErrorCategory.REQUEST,
                code="gw.request.bad_json",
                message="the request names no model",
            )
            row.status, row.error_code = 400, err.code
            self._record(row)
            await respond_error(responder, dialect, err)
            return
        row.model = model
        row.stream = stream
        summary = summarize(body, dialect)
        facts = RequestFacts(
            model=model,
            dialect=dialect,
            client=client_name,
            input_tokens=summary.input_tokens,
            max_tokens=summary.max_tokens,
            tool_count=summary.tool_count,
            tools=summary.tool_count > 0,
            image=summary.image,
            thinking=summary.thinking,
            stream=stream,
        )
        session = session_id(request.headers, prompt_cache_key=summary.prompt_cache_key)
        row.session = session[:200] if session else None
        conversation = conversation_key(
            session,
            fingerprint(summary.system_text, summary.first_user_text)
            if summary.first_user_text
            else None,
        )
        counting = route.operation is Operation.COUNT_TOKENS
        plan = self.router.plan(
            facts,
            now=self.clock(),
            conversation=conversation,
            new_turn=is_new_turn(summary.last_kind),
            take_turn=not counting,  # a token count is no turn of the balancer or the conversation
        )
        decision = plan.decision
        row.routing = {
            "route": decision.route,
            "rule": decision.rule,
            "group": decision.group,
            "skipped": [
                {"provider": s.provider, "model": s.model, "reason": s.reason.value}
                for s in decision.skipped
            ],
            # Candidates ordered last because they were paused or full when the request came.
            "paused": list(plan.paused),
            "full": list(plan.full),
            "sticky": plan.sticky,
        }
        if decision.denied:
            err = GatewayError(
                status=403,
                category=ErrorCategory.DENIED,
                code="gw.rule.denied",
                message=decision.deny_message or "this request is not allowed",
            )
            row.status, row.error_code = 403, err.code
            self._record(row)
            await respond_error(responder, dialect, err)
            return
        if not plan.candidates:
            err = GatewayError(
                status=404 if decision.skipped else 503,
                category=ErrorCategory.CONFIG,
                code="gw.no_upstream",
                message=f"no upstream offers the model {model!r}"
                if decision.skipped
                else "no upstream is configured",
            )
            row.status, row.error_code = err.status, err.code
            self._record(row)
            await respond_error(responder, dialect, err)
            return
        built = [self._candidate(c, plan.sticky) for c in plan.candidates]
        candidates = [c for c in built if isinstance(c, Candidate)]
        faults = [c for c in built if isinstance(c, CredentialFault)]
        if faults:
            row.routing["attempts"] = [credential_skip_view(f) for f in faults]
            if not candidates:
                err = GatewayError(
                    status=503,
                    category=ErrorCategory.CONFIG,
                    code=faults[0].code,
                    message="no upstream for this request has usable credentials: "
                    + "; ".join(f.message for f in faults),
                )
                row.status, row.error_code = err.status, err.code
                self._record(row)
                await respond_error(responder, dialect, err)
                return
        if route.operation is Operation.COUNT_TOKENS:
            # Token counts go only to an upstream of the client's own format, without failover
            # to another format or retries; with none, they are estimated here (SPEC §14).
            candidates = [c for c in candidates if c.dialect is dialect][:1]
            if not candidates:
                row.local, row.status, row.cost_micros, row.cost_state = True, 200, 0, "local"
                row.input_tokens = summary.input_tokens
                self._record(row)
                await answer_locally(responder, dialect, summary.input_tokens)
                return
            # Never retried (docs/operations.md); an upstream without the endpoint is estimated.
            fallback = LocalFallbackResponder(responder)
        efforts: dict[str, dict[str, Any]] = {}
        if not counting:
            candidates, efforts = self._apply_effort_memory(candidates, body, dialect)
        if conversation is not None:
            now = self.clock()
            candidates = [
                replace(c, drop_sealed=True)
                if self.sealed.leave_out(conversation, c.name, now=now)
                else c
                for c in candidates
            ]
        if self.events is not None:
            self.events.request_routed(row, plan)
        req = RelayRequest(
            client_dialect=dialect,
            operation=route.operation,
            body=request.body,
            headers=request.headers,
            model=model,
            stream=stream,
            sse=route.sse,
            query=strip_key_param(request.query),
            owner=row.id,
            arrival=started,
        )
        client = self.config.client(client_name)
        key_permit = None
        if client.max_concurrent is not None:
            # A key at its max_concurrent queues, within failover.wait_secs of arrival.
            deadline = started + self.config.failover.wait_secs
            key_permit = await self.hooks.key_permit(client_name, row.id, deadline)
            if key_permit is None:
                err = GatewayError(
                    status=429,
                    category=ErrorCategory.RATE_LIMITED,
                    code="gw.key.busy",
                    message=f"this key already has {client.max_concurrent} requests running",
                    retry_after=1.0,
                )
                row.status, row.error_code = 429, err.code
                self._record(row)
                await respond_error(responder, dialect, err)
                return
        admission = await self._admit(
            row,
            responder,
            dialect,
            summary.input_tokens,
            candidates,
            started,
            key_permit,
            route.operation,
        )
        if admission is None:
            return
        outcome = RelayOutcome()
        finished = False
        try:
            await relay(
                self.upstream,
                self.hooks,
                candidates,
                req,
                fallback if counting else responder,
                settings=self._settings_for(settings, counting, body, dialect),
                clock=self.clock,
                wall=self.wall,
                rng=self.rng.random,
                out=outcome,
                observer=self._observer(row.id),
            )
            if counting and fallback.held:
                await answer_locally(responder, dialect, summary.input_tokens)
            finished = True
        finally:
            if key_permit is not None:
                self.hooks.release(key_permit)
            row.duration_ms = int((self.clock() - started) * 1000)
            row.cancelled = outcome.cancelled or (not finished and not outcome.delivered)
            models = {c.name: c.model for c in candidates}
            self._fill_row(row, outcome, models, efforts)
            if finished and not counting:
                self._remember_efforts(outcome, candidates, efforts, body, dialect)
            self.usage.finish(
                row,
                admission,
                usage=outcome.usage,
                attempts=outcome.attempts,
                attempt_usage=outcome.attempt_usage,
                models=models,
            )
            if conversation is not None:
                for a in outcome.attempts:
                    if a.resend is ResendReason.SEALED_REASONING:
                        self.sealed.mark(conversation, a.provider, now=self.clock())
            if counting and fallback.held and finished:
                row.local, row.status, row.provider = True, 200, None
                row.cost_micros, row.cost_state = 0, "local"
                row.input_tokens = summary.input_tokens
            usage = outcome.usage
            if conversation and outcome.provider and usage is not None:
                self.router.record_answer(
                    conversation,
                    outcome.provider,
                    cached_tokens=(usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0),
                    now=self.clock(),
                )
            self._record(row)

    @staticmethod
    def _settings_for(
        settings: AttemptSettings, counting: bool, body: dict[str, Any], dialect: Dialect
    ) -> AttemptSettings:
        if counting:
            return replace(settings, wait_secs=0)  # a token count is never retried
        if sets_only_budget(body, dialect):
            return replace(settings, resend_effort=False)  # docs/operations.md: not resent
        return settings

    async def _admit(
        self,
        row: RequestRow,
        responder: Responder,
        dialect: Dialect,
        input_tokens: int,
        candidates: list[Candidate],
        started: float,
        key_permit: Permit | None,
        operation: Operation,
    ) -> Admission | None:
        """The key's usage limits (SPEC §11): an admission, or None once a 429 went out."""
        usage = self.usage
        if operation is Operation.COUNT_TOKENS:
            # Token counts cost nothing and count toward no limit (SPEC §14).
            return Admission.uncounted(row.key_name or "")
        estimate = usage.estimate(input_tokens, [(c.name, c.model) for c in candidates])
        try:
            admitted = await usage.admit(
                row.key_name or "", estimate, deadline=started + self.config.failover.wait_secs
            )
        except BaseException:  # the client left while waiting
            if key_permit is not None:
                self.hooks.release(key_permit)
            raise
        if isinstance(admitted, Admission):
            return admitted
        if key_permit is not None:
            self.hooks.release(key_permit)
        row.status, row.error_code = admitted.status, admitted.code
        self._record(row)
        await respond_error(responder, dialect, admitted)
        return None

    def _fill_row(
        self,
        row: RequestRow,
        outcome: RelayOutcome,
        models: dict[str, str],
        efforts: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        row.status = outcome.status
        row.provider = outcome.provider
        row.ttfb_ms = outcome.ttfb_ms
        row.error_code = outcome.error_code
        row.translated = outcome.translated
        routing = row.routing or {}
        routing["attempts"] = [
            *routing.get("attempts", ()),  # upstreams skipped for their credentials
            *(
                attempt_view(a, models.get(a.provider), _effort_view(a, outcome, efforts or {}))
                for a in outcome.attempts
            ),
        ]
        row.routing = routing
        usage = outcome.usage
        if usage is not None:
            row.input_tokens = usage.input_tokens
            row.output_tokens = usage.output_tokens
            row.cache_read_tokens = usage.cache_read_tokens
            row.cache_write_tokens = usage.cache_write_tokens
            row.reasoning_tokens = usage.reasoning_tokens

    def _observer(self, request_id: str) -> Callable[[Action], None] | None:
        """Publishes RequestRetrying / RequestDequeued for the relay's waits."""
        events = self.events
        if events is None:
            return None

        def observe(action: Action) -> None:
            if isinstance(action, Backoff):
                backoff_ms = int(max(0.0, action.until - self.clock()) * 1000)
                events.request_retrying(request_id, retry=action.retry_round, backoff_ms=backoff_ms)
            elif isinstance(action, Send):
                events.request_dequeued(
                    request_id,
                    provider=action.provider,
                    retry=action.retry_round,
                    queued_ms=action.backoff_ms or action.queued_ms,
                )

        return observe

    def _next_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):012x}"

    def _record(self, row: RequestRow) -> None:
        tap = self._taps.pop(row.id, None) if self._taps else None
        if tap is not None:
            row.body = tap.stored()
        self.store.record(row)
        if self.on_finished is not None:
            self.on_finished(row)
        for listener in self.row_listeners:
            listener(row)
        if self.events is not None:
            self.events.request_ended(row)


def _effort_view(
    record: AttemptRecord, outcome: RelayOutcome, efforts: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """``{asked, sent, reason}`` of an attempt (docs/operations.md), None when unchanged."""
    base = efforts.get(record.provider)
    if record.resend is ResendReason.EFFORT_REFUSED:
        sent = outcome.effort_resent.get(record.provider)
        asked = base["asked"] if base else None
        return {"asked": asked, "sent": sent, "reason": "rejected"}
    return base if base is not None and base["reason"] is not None else None


def attempt_view(
    record: AttemptRecord, model: str | None, effort: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One attempt as the request row's routing JSON keeps it (SPEC §16); `model` is the model
    name sent to that upstream, `effort` what became of its reasoning level."""
    return {
        "provider": record.provider,
        "model": model,
        "outcome": record.outcome.value,
        "status": record.status,
        "error": record.error,
        "ms": _span_ms(record.sent_at, record.ended_at),
        "queued_ms": record.queued_ms,
        "skipped": record.skipped.value if record.skipped else None,
        "retry": record.retry_round,
        "backoff_ms": record.backoff_ms,
        "resend": record.resend.value if record.resend else None,
        "effort": effort,
    }


def credential_skip_view(fault: CredentialFault) -> dict[str, Any]:
    """An upstream skipped for its credentials, in the shape of `attempt_view`."""
    return {
        "provider": fault.provider,
        "model": None,
        "outcome": "skipped",
        "status": None,
        "error": fault.code,
        "ms": None,
        "queued_ms": 0,
        "skipped": fault.code.rsplit(".", 1)[-1],
        "retry": 0,
        "backoff_ms": None,
        "resend": None,
        "effort": None,
    }


def _span_ms(start: float | None, end: float | None) -> int | None:
    if start is None or end is None:
        return None
    return int((end - start) * 1000)
