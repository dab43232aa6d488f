"""The gateway's request handler: recognise, authenticate, admit, relay, record.

The decisions are twengine's: `check_caller` (the client address against ``allow_from`` before the
key, the path, the gateway key), `admit` (the body, routing, token counts answered here),
`answer_models` (the listing). This handler carries them out in order — the caller checks
(twserve.gateway.callers), the destinations and their credentials (twserve.relay.reader), what
upstreams get of the reasoning (twserve.relay.reasoning), the key's turn (twserve.gateway.key_turn),
the relay — and records the row (twserve.gateway.row, twserve.gateway.responders;
docs/operations.md). A request refused at any check never reaches an upstream; every request that
got as far as a key check leaves one row in the request store.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

from twengine.admission import AdmissionRequest, Routed, admit, no_usable_credentials
from twengine.attempt import AttemptSettings
from twengine.config import Config
from twengine.model_listing import answer_models
from twengine.pricing import PriceTable, TableCatalog
from twengine.router import Router
from twengine.rules import resumes
from twproto.dialect import Dialect
from twproto.effort import sets_only_budget
from twproto.errors import GatewayError
from twproto.paths import Operation, Route, guess_client_dialect
from twproto.upstream_request import ClientCall
from twserve.events import EventBus
from twserve.gateway import responders
from twserve.gateway.answers import answer, respond_error
from twserve.gateway.auth import strip_key_param
from twserve.gateway.callers import Callers
from twserve.gateway.key_turn import EarlyHead, key_turn
from twserve.gateway.row import (
    fill_row,
    note_admission,
    note_credential_skips,
    note_local,
    request_ids,
    retry_observer,
)
from twserve.relay.efforts import Efforts
from twserve.relay.holds import RouterHooks
from twserve.relay.loop import RelayOutcome, RelayRequest, relay
from twserve.relay.reader import destinations
from twserve.relay.reasoning import Reasoning
from twserve.server import http1
from twserve.server.base import Request, Responder
from twserve.store.sqlite import RequestRow, Store
from twserve.upstream.client import UpstreamClient
from twserve.usage.keeper import UsageKeeper

__all__ = ["Gateway"]


class Gateway:
    """Holds what every request needs; `handle` is the HTTP handler."""

    router: Router
    hooks: RouterHooks
    _LISTINGS = (Operation.LIST_MODELS, Operation.GET_MODEL)

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        upstream: UpstreamClient,
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        usage: UsageKeeper | None = None,
    ) -> None:
        self.store = store
        # Prices, cost and key limits (twserve.usage.keeper): one admit and one finish per request.
        self.usage = usage or UsageKeeper(config, PriceTable.from_data({}), wall=wall, clock=clock)
        # Body copies of requests in progress, by request id (retention.store_bodies); answers
        # whose end waits for their row (store.commit_before_end).
        self.taps, self.ends = responders.BodyTaps(), responders.EndsAfterCommit()
        self.upstream, self.env, self.clock, self.wall = upstream, env, clock, wall
        self.on_finished: Callable[[RequestRow], None] | None = None
        # Called with every stored row, after `on_finished` (metrics, the control plane).
        self.row_listeners: list[Callable[[RequestRow], None]] = []
        # RequestStarted/Routed/Finished/Failed go here when the app wires a bus.
        self.events: EventBus | None = None
        self._configured = False
        # A new request id per call (twserve.gateway.realtime records rows of its own, too).
        self.next_request_id = request_ids()
        self.rng = random.Random()
        # Reasoning levels upstreams accepted in place of refused ones (docs/operations.md); the
        # app loads and persists them (effort-memory.json) through `efforts`.
        self.efforts = Efforts(lambda: self.config, env, wall)
        # With the conversations whose sealed reasoning an upstream refused
        # (twserve.relay.reasoning).
        self.reasoning = Reasoning(self.efforts, lambda: self.clock())
        self.apply_config(config)
        self.efforts.use(self.efforts.memory)

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
        self.callers = Callers(config)
        # No body copy (retention.store_bodies), no commit wait (store.commit_before_end).
        store = config.store
        self._bare = not config.retention.store_bodies and not (store and store.commit_before_end)

    def check_head(self, request: Request) -> http1.Refusal | None:
        """The refusal a request's head is enough for (address, key), asked by the transport
        before it reads the body; `handle` makes the same checks again."""
        return self.callers.head_refusal(request)

    async def handle(self, request: Request, responder: Responder) -> None:
        route, client_name, verdict = self.callers.check(request)
        listing = route is not None and route.operation in self._LISTINGS
        if verdict is None and not listing:
            assert route is not None and route.dialect is not None and client_name is not None
            rid, config = self.next_request_id(), self.config
            if self._bare:  # nothing wraps the responder: no context managers to enter
                await self._generate(request, responder, route, route.dialect, client_name, rid)
                return
            async with self.ends.hold(rid, responder, config.store) as held:
                with self.taps.keep(rid, held, config.retention, request.body) as kept:
                    await self._generate(request, kept, route, route.dialect, client_name, rid)
            return
        # A refusal's or a listing's shape follows the client (a generated answer's, its path).
        dialect = guess_client_dialect(request.path, request.headers)
        if verdict is None:
            assert route is not None
            verdict = answer_models(
                self.config, route, dialect, client=client_name, table=self.usage.table
            )
        await answer(responder, dialect, verdict)

    async def _generate(
        self,
        request: Request,
        responder: Responder,
        route: Route,
        dialect: Dialect,
        client_name: str,
        request_id: str,
    ) -> None:
        started = self.clock()
        # A reload may swap the config while this request waits for a key permit; it keeps the
        # settings it was admitted with (its candidates are fixed below, before any wait).
        settings = self.settings
        row = RequestRow(
            id=request_id,
            ts=self.wall(),
            path=request.path,
            key_name=client_name,
            format=dialect.value,
        )
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
        note_admission(row, verdict)
        if not isinstance(verdict, Routed):
            self.record_row(row)
            await answer(responder, dialect, verdict)
            return
        plan, summary = verdict.plan, verdict.summary
        counting = route.operation is Operation.COUNT_TOKENS
        usable, faults = destinations(
            self.config, verdict.candidates, plan.sticky, self.env, self.catalog
        )
        note_credential_skips(row, faults)
        if faults and not usable:
            await self._refuse(row, responder, dialect, no_usable_credentials(faults))
            return
        if counting:
            # The first same-format upstream whose credentials resolve; with none, estimated.
            usable = usable[:1]
            if not usable:
                note_local(row, summary.input_tokens)
                self.record_row(row)
                await responders.answer_locally(responder, dialect, summary.input_tokens)
                return
        # Never retried (docs/operations.md); an upstream without the endpoint is estimated.
        fallback = responders.LocalFallbackResponder(responder, dialect, summary.input_tokens)
        reasoning = self.reasoning.prepare(
            usable, verdict.body, dialect, verdict.conversation, counting=counting
        )
        candidates = reasoning.destinations
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
            model=verdict.model,
            owner=row.id,
            arrival=started,
            sockets=request.upstream_sockets,  # a client Responses socket's turn
        )
        head = EarlyHead(responder, req, started, settings, self.clock, self.wall)
        turn = await key_turn(
            self.hooks,
            self.usage,
            self.config,
            client_name,
            row.id,
            deadline=started + self.config.failover.wait_secs,
            estimate=(summary.input_tokens, [(c.name, c.target.model) for c in candidates]),
            counted=not counting,
            head=head,  # a streamed client's 200 and keep-alives while it waits
        )
        if isinstance(turn, GatewayError):
            await self._refuse(row, responder, dialect, turn, head)
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
                settings=settings.for_request(
                    counting=counting,
                    budget_only=sets_only_budget(verdict.body, dialect),
                    resume=resumes(plan.decision),
                ),
                clock=self.clock,
                wall=self.wall,
                rng=self.rng.random,
                out=outcome,
                observer=retry_observer(self.events, row.id, self.clock),
            )
            await fallback.answer_held()
            finished = True
        finally:
            row.duration_ms = int((self.clock() - started) * 1000)
            row.cancelled = outcome.cancelled or (not finished and not outcome.delivered)
            models = {c.name: c.target.model for c in candidates}
            fill_row(row, outcome, models, reasoning.efforts)
            self.reasoning.settle(reasoning, outcome, finished=finished or outcome.delivered)
            turn.end(row, outcome, models)
            if fallback.held and finished:
                note_local(row, summary.input_tokens)
            self.hooks.record_answer(verdict.conversation, outcome.provider, outcome.usage)
            self.record_row(row)

    async def _refuse(
        self,
        row: RequestRow,
        responder: Responder,
        dialect: Dialect,
        err: GatewayError,
        head: EarlyHead | None = None,  # a refused key wait may have its 200 out already
    ) -> None:
        row.status, row.error_code = err.status if head is None else head.row_status(err), err.code
        self.record_row(row)
        await (respond_error(responder, dialect, err) if head is None else head.refuse(err))

    def record_row(self, row: RequestRow) -> None:
        """Store a finished row and tell the listeners."""
        self.taps.take(row)
        self.ends.record(self.store, row)
        if self.on_finished is not None:
            self.on_finished(row)
        for listener in self.row_listeners:
            listener(row)
        if self.events is not None:
            self.events.request_ended(row)
