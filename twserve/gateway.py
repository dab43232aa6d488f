"""The gateway's request handler: recognise, authenticate, admit, relay, record.

The decisions are twengine's: `check_caller` (the client address against ``allow_from``
before the key, the path, the gateway key), `admit` (the body, routing, token counts answered
here), `answer_models` (the listing). This handler carries them out, waits for a key's
``max_concurrent`` permit, hands admitted requests to the relay and records them
(docs/operations.md). A request refused at any check never reaches an upstream; every request
that got as far as a key check leaves one row in the request store.
"""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, assert_never

from twengine.admission import (
    AdmissionRequest,
    LocalAnswer,
    Refusal,
    Routed,
    admit,
    check_caller,
)
from twengine.attempt import AttemptSettings, ResendReason
from twengine.config import Config
from twengine.config.credentials import CredentialFault
from twengine.effort_memory import EffortMemory
from twengine.model_listing import answer_models
from twengine.pricing import PriceTable, TableCatalog
from twengine.router import Router
from twengine.sealed import SealedReasoning
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_body, error_headers
from twproto.formats._effort import sets_only_budget
from twproto.keys import find_key
from twproto.paths import Operation, Route, guess_client_dialect, match_path
from twproto.upstream_request import ClientCall
from twserve import http1
from twserve.attempt_reader import Destination, destination
from twserve.auth import AddressFilter, KeyRing, strip_key_param
from twserve.bodies import BodyTap
from twserve.client_answer import answer, respond_error, transport_error
from twserve.count_tokens import LocalFallbackResponder, answer_locally
from twserve.efforts import Efforts
from twserve.events import EventBus
from twserve.httptypes import Request, Responder
from twserve.key_turn import key_turn
from twserve.relay import RelayOutcome, RelayRequest, relay
from twserve.relay_hooks import RouterHooks
from twserve.request_row import credential_skip_view, fill_row, retry_observer
from twserve.store import RequestRow, RequestStore
from twserve.upstream import UpstreamClient
from twserve.usage import UsageKeeper

__all__ = ["Gateway", "transport_error"]


class Gateway:
    """Holds what every request needs; `handle` is the HTTP handler."""

    router: Router
    hooks: RouterHooks

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
        # Body copies of requests in progress, by request id (retention.store_bodies).
        self._taps: dict[str, BodyTap] = {}
        self.upstream = upstream
        self.env = env
        self.clock = clock
        self.wall = wall
        self.on_finished: Callable[[RequestRow], None] | None = None
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
        # Reasoning levels upstreams accepted in place of refused ones (docs/operations.md); the
        # app loads and persists them (effort-memory.json) through `effort_memory_changed`.
        self.efforts = Efforts(lambda: self.config, env, wall)
        # Conversations whose sealed reasoning an upstream refused (docs/operations.md).
        self.sealed = SealedReasoning()
        self.apply_config(config)
        self.efforts.use(self.efforts.memory)

    @property
    def effort_memory(self) -> EffortMemory:
        return self.efforts.memory

    @property
    def effort_memory_changed(self) -> Callable[[], None] | None:
        return self.efforts.changed

    @effort_memory_changed.setter
    def effort_memory_changed(self, listener: Callable[[], None] | None) -> None:
        self.efforts.changed = listener

    def use_effort_memory(self, memory: EffortMemory) -> None:
        """Take `memory`, dropping the choices of upstreams removed or changed since."""
        self.efforts.use(memory)

    def apply_config(self, config: Config) -> None:
        self.config = config
        if not self._configured:
            self._configured = True
            # Prices and limits from the table too: `cheapest` ordering, context windows.
            self.catalog = TableCatalog(self.usage.table)
            self.router = Router(config, catalog=self.catalog)
            self.hooks = RouterHooks(self.router, wall=self.wall, clock=self.clock)
        else:
            for grant in self.router.configure(config):
                self.hooks.deliver_grant(grant)
            self.usage.apply_config(config)
        self.settings = AttemptSettings.from_failover(config.failover)
        self.keys = KeyRing.of([(c.key, c.name) for c in config.clients])
        self.addresses = AddressFilter(list(config.listen.gateway.allow_from))

    def check_head(self, request: Request) -> http1.Refusal | None:
        """The checks a request's head is enough for — address and key — made by the transport
        before it reads the body, so that no body is buffered for a request that would be
        refused anyway. `handle` makes the same checks again (`check_caller`)."""
        _, _, verdict = self._caller(request)
        if not isinstance(verdict, Refusal) or verdict.error.status not in (401, 403):
            return None  # handle answers the rest (404, the warm-up probe, health)
        err = verdict.error
        dialect = guess_client_dialect(request.path, request.headers)
        return http1.Refusal(
            status=err.status, headers=error_headers(err), body=error_body(dialect, err)
        )

    def _caller(
        self, request: Request
    ) -> tuple[Route | None, str | None, Refusal | LocalAnswer | None]:
        """The request's route, its key's client name, and `check_caller`'s verdict."""
        route = match_path(request.method, request.path, request.query)
        presented = find_key(request.headers, request.query)
        client = self.config.client_for(self.keys.lookup(presented), presented=bool(presented))
        verdict = check_caller(
            method=request.method,
            path=request.path,
            route=route,
            address_allowed=self.addresses.allows(request.client[0]),
            client=client,
            key_presented=bool(presented),
        )
        return route, client, verdict

    async def handle(self, request: Request, responder: Responder) -> None:
        route, client_name, verdict = self._caller(request)
        dialect = guess_client_dialect(request.path, request.headers)
        if verdict is None:
            assert route is not None and client_name is not None
            if route.operation in (Operation.LIST_MODELS, Operation.GET_MODEL):
                # A listing's shape follows the client (guess_client_dialect).
                verdict = answer_models(self.config, route, dialect, table=self.usage.table)
            else:
                assert route.dialect is not None
                await self._generate_kept(request, responder, route, route.dialect, client_name)
                return
        await answer(responder, dialect, verdict)

    async def _generate_kept(
        self, request: Request, responder: Responder, route: Route, dialect: Dialect, client: str
    ) -> None:
        retention = self.config.retention
        if not retention.store_bodies:
            await self._generate(request, responder, route, dialect, client)
            return
        # retention.store_bodies: a bounded copy of the answer goes to the row (twserve.bodies).
        tap = BodyTap(responder, retention.body_max_bytes, request.body)
        try:
            await self._generate(request, tap, route, dialect, client, tap=tap)
        finally:
            # A request that ended without storing its row leaves no copy behind.
            for request_id in [i for i, t in self._taps.items() if t is tap]:
                del self._taps[request_id]

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
        verdict = admit(
            AdmissionRequest(
                route=route,
                dialect=dialect,
                body=request.body,
                client=client_name,
                headers=request.headers,
            ),
            router=self.router,
            config=self.config,
            now=self.clock(),
        )
        view = verdict.view
        row.model, row.stream, row.session = view.model, view.stream, view.session
        row.routing = dict(view.routing) if view.routing is not None else None
        match verdict:
            case Refusal(error=err):
                row.status, row.error_code = err.status, err.code
            case LocalAnswer(status=status, input_tokens=tokens):
                row.local, row.status, row.cost_micros, row.cost_state = True, status, 0, "local"
                row.input_tokens = tokens
            case Routed():
                pass
            case _:
                assert_never(verdict)
        if not isinstance(verdict, Routed):
            self._record(row)
            await answer(responder, dialect, verdict)
            return
        plan, model, conversation = verdict.plan, verdict.model, verdict.conversation
        body, summary = verdict.body, verdict.summary
        counting = route.operation is Operation.COUNT_TOKENS
        built = [
            destination(self.config, c, plan.sticky, self.env, self.catalog)
            for c in verdict.candidates
        ]
        candidates = [c for c in built if isinstance(c, Destination)]
        faults = [c for c in built if isinstance(c, CredentialFault)]
        if faults:
            assert row.routing is not None
            row.routing["attempts"] = [credential_skip_view(f) for f in faults]
        if faults and not candidates:
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
        if counting:
            # The first same-format upstream whose credentials resolve; with none, estimated.
            candidates = candidates[:1]
            if not candidates:
                row.local, row.status, row.cost_micros, row.cost_state = True, 200, 0, "local"
                row.input_tokens = summary.input_tokens
                self._record(row)
                await answer_locally(responder, dialect, summary.input_tokens)
                return
        # Never retried (docs/operations.md); an upstream without the endpoint is estimated.
        fallback = LocalFallbackResponder(responder) if counting else None
        efforts: dict[str, dict[str, Any]] = {}
        if not counting:
            candidates, efforts = self.efforts.apply(candidates, body, dialect)
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
            call=ClientCall(
                dialect=dialect,
                operation=route.operation,
                stream=verdict.stream,
                sse=route.sse,
                query=strip_key_param(request.query),
                headers=request.headers,
            ),
            body=request.body,
            model=model,
            owner=row.id,
            arrival=started,
        )
        turn = await key_turn(
            self.hooks,
            self.usage,
            self.config,
            client_name,
            row.id,
            deadline=started + self.config.failover.wait_secs,
            estimate=(verdict.summary.input_tokens, [(c.name, c.target.model) for c in candidates]),
            counted=not counting,
        )
        if isinstance(turn, GatewayError):
            row.status, row.error_code = turn.status, turn.code
            self._record(row)
            await respond_error(responder, dialect, turn)
            return
        key_permit, admission = turn
        outcome = RelayOutcome()
        finished = False
        try:
            await relay(
                self.upstream,
                self.hooks,
                candidates,
                req,
                fallback or responder,
                settings=_settings_for(settings, counting, body, dialect),
                clock=self.clock,
                wall=self.wall,
                rng=self.rng.random,
                out=outcome,
                observer=retry_observer(self.events, row.id, self.clock),
            )
            if fallback is not None and fallback.held:
                await answer_locally(responder, dialect, summary.input_tokens)
            finished = True
        finally:
            if key_permit is not None:
                self.hooks.release(key_permit)
            row.duration_ms = int((self.clock() - started) * 1000)
            row.cancelled = outcome.cancelled or (not finished and not outcome.delivered)
            models = {c.name: c.target.model for c in candidates}
            fill_row(row, outcome, models, efforts)
            if finished and not counting:
                self.efforts.remember(outcome, candidates, efforts, body, dialect)
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
            if fallback is not None and fallback.held and finished:
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


def _settings_for(
    settings: AttemptSettings, counting: bool, body: dict[str, Any], dialect: Dialect
) -> AttemptSettings:
    if counting:
        return replace(settings, wait_secs=0)  # a token count is never retried
    if sets_only_budget(body, dialect):
        return replace(settings, resend_effort=False)  # docs/operations.md: not resent
    return settings
