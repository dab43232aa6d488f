"""The gateway's request handler: recognise, authenticate, admit, relay, record.

Every decision is twengine's; this handler carries them out in order: caller checks
(twengine.callers), admission (`admit`: body, routing, token counts) or the listing
(`answer_models`), destinations and credentials (twengine.destinations), the reasoning upstreams
get (twengine.reasoning), the key's turn (gateway.key_turn), the relay, the row (gateway.row,
gateway.responders; docs/operations.md). A request refused at any check never reaches an
upstream; every request that got as far as a key check leaves one row in the request store.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

from twengine.admission import AdmissionRequest, Routed, admit
from twengine.attempt import AttemptSettings
from twengine.callers import Callers
from twengine.catalog import TableCatalog
from twengine.config import Config
from twengine.model_listing import answer_models
from twengine.pricing import PriceTable
from twengine.reasoning import EffortMemory, ReasoningMemory
from twengine.router import Router
from twengine.rules import resumes
from twengine.shedding import LoadGauge
from twproto.dialect import Dialect
from twproto.effort import sets_only_budget
from twproto.errors import GatewayError
from twproto.keys import strip_key_param
from twproto.paths import Operation, PathRoute, guess_client_dialect
from twproto.upstream_request import ClientCall
from twserve.events import EventBus
from twserve.gateway import responders
from twserve.gateway.answers import answer, respond_error
from twserve.gateway.callers import head_refusal
from twserve.gateway.conversations import Conversations, socket_turn
from twserve.gateway.key_turn import EarlyHead, key_turn, note_refusal
from twserve.gateway.row import (
    fill_row,
    new_row,
    note_admission,
    note_credential_skips,
    note_local,
    request_ids,
    retry_observer,
)
from twserve.observe.request_ids import IdentifiedResponder
from twserve.relay.abort import Aborts, Running
from twserve.relay.holds import RouterHooks
from twserve.relay.loop import RelayOutcome, RelayRequest, relay
from twserve.server.base import HeadRefusal, Request, Responder
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
        # Prices, cost and key limits (twserve.usage.keeper): one admit and one finish per request.
        self.usage = usage or UsageKeeper(config, PriceTable.from_data({}), wall=wall, clock=clock)
        # Body copies by request id (retention.store_bodies); ends waiting for their row.
        self.taps, self.ends = responders.BodyTaps(), responders.EndsAfterCommit()
        self.store = store
        self.upstream, self.env, self.clock, self.wall = upstream, env, clock, wall
        self.on_finished: Callable[[RequestRow], None] | None = None
        self.row_listeners: list[Callable[[RequestRow], None]] = []  # after `on_finished`
        # RequestStarted/Routed/Finished/Failed go here when the app wires a bus.
        self.events: EventBus | None = None
        self._configured, self.next_request_id, self.rng = False, request_ids(), random.Random()
        # Requests by id, to abort; load shedding (loop lag sampled by the app, requests relayed).
        self.aborts, self.load = Aborts(), LoadGauge()
        # twengine.reasoning's memories; the app loads (`use_effort_memory`) and saves efforts.
        self.reasoning = ReasoningMemory()
        self.on_efforts_changed: Callable[[], None] = lambda: None
        self.conversations = Conversations(None, wall, self.record_row)  # records: the app's
        self.apply_config(config)

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
        store = config.store  # bare: no body copy (retention.store_bodies), no commit wait
        self._bare = not config.retention.store_bodies and not (store and store.commit_before_end)

    def use_effort_memory(self, memory: EffortMemory) -> None:
        """Take `memory` (effort-memory.json) for the configured upstreams (ReasoningMemory.use)."""
        if self.reasoning.use(memory, self.config, self.env):
            self.on_efforts_changed()

    def check_head(self, request: Request) -> HeadRefusal | None:
        """The refusal a request's head is enough for, asked before the body is read."""
        return head_refusal(self.callers, request, self.load, self.config, now=self.wall())

    async def handle(self, request: Request, responder: Responder) -> None:
        route, client_name, verdict = self.callers.check(request, now=self.wall())
        listing = route is not None and route.operation in self._LISTINGS
        if verdict is None and not listing:
            assert route is not None and route.dialect is not None and client_name is not None
            run, config = self.aborts.begin(self.next_request_id()), self.config
            if self._bare:  # nothing wraps the responder: no context managers to enter
                await self._generate(request, responder, route, route.dialect, client_name, run)
                return
            async with self.ends.hold(run.id, responder, config.store) as held:
                with self.taps.keep(run.id, held, config.retention, request.body) as kept:
                    await self._generate(request, kept, route, route.dialect, client_name, run)
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
        self, request: Request, plain: Responder, route: PathRoute, dialect: Dialect,
        client_name: str, running: Running,  # its id, and where an abort reaches it
    ) -> None:  # fmt: skip
        # A reload during a key wait leaves the request the settings it was admitted with.
        started, settings = self.clock(), self.settings
        row = new_row(running.id, self.wall(), request, client_name, dialect)
        counting = route.operation is Operation.COUNT_TOKENS
        if self.events is not None:
            self.events.request_started(row)
        # previous_response_id expanded, the answer kept (gateway.conversations).
        opened = await self.conversations.open(request, plain, route, client_name, self.config)
        if not isinstance(opened, tuple):
            return await self.conversations.answer(opened, row, plain, running.id)
        request, plain = opened
        responder = IdentifiedResponder(plain, running.id)  # x-request-id; the answer's bytes
        verdict = admit(
            AdmissionRequest(
                route=route,
                dialect=dialect,
                body=request.body,
                client=client_name,
                headers=request.headers,
                parsed=request.parsed,  # a socket's turn, read from its message
            ),
            router=self.router,
            config=self.config,
            now=self.clock(),
        )
        note_admission(row, verdict)
        if not isinstance(verdict, Routed):
            self.record_row(row, responder)
            await answer(responder, dialect, verdict)
            return
        plan, summary = verdict.plan, verdict.summary
        # Vertex AI access tokens are obtained there too (twserve.upstream.cloud_tokens).
        usable, faults, refused = await self.upstream.tokens.destinations(
            self.config, verdict.candidates, plan.sticky, self.env, self.catalog, counting=counting
        )
        note_credential_skips(row, faults)
        if refused is not None:
            return await self._refuse(row, responder, dialect, refused)
        fallback = responders.LocalFallbackResponder(responder, dialect, summary.input_tokens)
        reasoning = self.reasoning.prepare(
            usable, verdict.body, dialect, verdict.conversation, counting=counting,
            now=self.clock(), wall=self.wall(),
        )  # fmt: skip
        candidates = self.conversations.destinations(request, verdict.body, reasoning.destinations)
        if isinstance(candidates, bytes):  # a warm-up turn that no upstream socket takes
            return await self.conversations.answer(candidates, row, plain, running.id)
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
            parsed=verdict.body,  # parsed once, by admission
            running=running,
            arrival=started,
            sockets=socket_turn(request),  # a client Responses socket's turn
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
            plan=None if counting else plan,  # its load-balance turn, taken with the limit's
        )
        if isinstance(turn, GatewayError):
            await self._refuse(row, responder, dialect, turn, head)
            return
        plan, candidates = turn.plan or plan, turn.ordered(candidates)  # the deployment's pick
        if self.events is not None:
            self.events.request_routed(row, plan)
        outcome, finished = RelayOutcome(), False
        self.load.in_progress += 1
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
            self.load.in_progress -= 1
            row.duration_ms = int((self.clock() - started) * 1000)
            row.cancelled = outcome.cancelled or (not finished and not outcome.delivered)
            models = {c.name: c.target.model for c in candidates}
            fill_row(row, outcome, models, reasoning.efforts)
            if self.reasoning.settle(
                reasoning,
                outcome.attempts,
                outcome.effort_resent,
                finished=finished or outcome.delivered,
                now=self.clock(),
                wall=self.wall(),
            ):
                self.on_efforts_changed()
            turn.end(row, outcome, models)
            if fallback.held and finished:
                note_local(row, summary.input_tokens)
            self.hooks.record_answer(verdict.conversation, outcome.provider, outcome.usage)
            self.record_row(row, responder)

    async def _refuse(
        self,
        row: RequestRow,
        responder: IdentifiedResponder,
        dialect: Dialect,
        err: GatewayError,
        head: EarlyHead | None = None,  # a refused key wait may have its 200 out already
    ) -> None:
        note_refusal(row, err, head)
        self.record_row(row, responder)
        await (respond_error(responder, dialect, err) if head is None else head.refuse(err))

    def record_row(self, row: RequestRow, answered: IdentifiedResponder | None = None) -> None:
        """Store a finished row and tell the listeners; `answered` counted the answer's bytes."""
        row.answer_bytes = answered.sent if answered is not None else row.answer_bytes
        self.taps.take(row)
        self.ends.record(self.store, row)
        if self.on_finished is not None:
            self.on_finished(row)
        for listener in self.row_listeners:
            listener(row)
        if self.events is not None:
            self.events.request_ended(row)
