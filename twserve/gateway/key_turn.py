"""A request's turn on its gateway key: the key's ``max_concurrent`` permit, then its usage
limits, each waited for until the request's deadline (docs/operations.md, "Keys and
concurrency"; docs/limits-and-costs.md).

Waiting is IO, so it lives here; what the limits allow is `twserve.usage.keeper`'s (over
`twengine.limits`), and the refusal for a key still busy is `twengine.admission.key_busy`.

A streamed client is kept alive while it waits here as while it waits for an upstream
(`EarlyHead`): its 200 and headers ``keepalive_after`` from arrival, then keep-alive comments,
by the same schedule the attempt machine keeps
(`twengine.attempt.AttemptSettings.keepalive_due`); the relay then goes on from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import anyio

from twengine.admission import key_busy
from twengine.attempt import AttemptSettings
from twengine.config import Config
from twengine.destinations import Destination
from twengine.router import RoutePlan
from twengine.slots import Permit
from twproto.errors import GatewayError
from twproto.paths import Operation
from twproto.sse import encode_comment
from twproto.stream import keepalive_comments
from twserve.gateway.answers import respond_error
from twserve.relay.abort import ABORTED_CODE, Running
from twserve.relay.client import ClientAnswer, RelayOutcome, stream_head
from twserve.relay.holds import RouterHooks
from twserve.relay.loop import RelayRequest
from twserve.server.base import ClientGone, Responder
from twserve.store.sqlite import RequestRow
from twserve.usage.keeper import Admission, UsageKeeper

if TYPE_CHECKING:  # the redis extra may be absent
    from twserve.shared.admission import Ride

__all__ = ["EarlyHead", "KeyTurn", "key_turn", "note_refusal"]

T = TypeVar("T")
KEEPALIVE = encode_comment("keep-alive")


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyTurn:
    """A request's turn on its key: the ``max_concurrent`` permit (None for a key without one)
    and the usage admission, both settled by `end`; `plan` the request's plan with the
    deployment's load-balance turn taken (the plan given when none was)."""

    hooks: RouterHooks
    usage: UsageKeeper
    permit: Permit | None
    admission: Admission
    plan: RoutePlan | None = None

    def ordered(self, destinations: list[Destination]) -> list[Destination]:
        """`destinations` in the order of `plan`'s candidates (the deployment's pick first)."""
        if self.plan is None:
            return destinations
        rank = {c.provider: i for i, c in enumerate(self.plan.candidates)}
        return sorted(destinations, key=lambda d: rank.get(d.name, len(rank)))

    def give_back(self) -> None:
        """The request was aborted before it used its turn: the permit and the reservation
        go back, nothing is booked."""
        if self.permit is not None:
            self.hooks.release(self.permit)
        self.usage.settle(self.admission, None)

    def end(self, row: RequestRow, outcome: RelayOutcome, models: Mapping[str, str]) -> None:
        """Give the permit back; price the row and settle the key's limits (`models`: the model
        sent to each upstream)."""
        if self.permit is not None:
            self.hooks.release(self.permit)
        self.usage.finish(
            row,
            self.admission,
            usage=outcome.usage,
            attempts=outcome.attempts,
            attempt_usage=outcome.attempt_usage,
            models=models,
        )


class EarlyHead:
    """A streamed client's 200, headers and keep-alive comments, written while its request
    `req` waits for its key's turn. When the last of them went out is noted in
    `req.last_keepalive` (None: nothing yet), for the relay to carry on from. A request that
    is not streamed gets nothing here."""

    def __init__(
        self,
        responder: Responder,
        req: RelayRequest,
        arrival: float,
        settings: AttemptSettings,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.responder = responder
        self.req = req
        self.active = req.call.stream and req.call.operation is not Operation.COUNT_TOKENS
        self.comments = keepalive_comments(req.call.dialect)
        self.arrival = arrival
        self.settings = settings
        self.clock = clock
        self.wall = wall

    async def run(self) -> None:
        """Write each keep-alive when due, until cancelled."""
        req = self.req
        while True:
            due = self.settings.keepalive_due(
                arrival=self.arrival, last=req.last_keepalive, comments=self.comments
            )
            if due is None:
                await anyio.sleep_forever()
                return
            await anyio.sleep(max(0.0, due - self.clock()))
            # Shielded: cancelled half-way, a write would leave the stream torn.
            with anyio.CancelScope(shield=True):
                if req.last_keepalive is None:
                    await self.responder.start(200, stream_head(req.call.sse))
                else:
                    await self.responder.send(KEEPALIVE)
                req.last_keepalive = self.clock()

    async def keeping_alive(self, wait: Awaitable[T]) -> T:
        """`wait`'s result, with the client kept alive meanwhile. A client that is gone by a
        keep-alive's write ends the wait with `ClientGone`."""
        if not self.active:
            return await wait
        gone = False
        result: T
        async with anyio.create_task_group() as tg:

            async def keep() -> None:
                nonlocal gone
                try:
                    await self.run()
                except ClientGone:
                    gone = True
                    tg.cancel_scope.cancel()

            tg.start_soon(keep)
            result = await wait
            tg.cancel_scope.cancel()
        if gone:
            raise ClientGone()
        return result

    def row_status(self, err: GatewayError) -> int:
        """The status the request row records for a refusal `err`: 200 once that went out."""
        return err.status if self.req.last_keepalive is None else 200

    async def refuse(self, err: GatewayError) -> None:
        """Refuse the request with `err`: an error response, or once the 200 is out, an error
        event that ends the stream, in the client's format."""
        call = self.req.call
        if self.req.last_keepalive is None:
            await respond_error(self.responder, call.dialect, err)
            return
        answer = ClientAnswer(
            self.responder, call, self.req.model, RelayOutcome(), self.wall, self.req.last_keepalive
        )
        await answer.end_stream_with_error(err, None)


async def key_turn(
    hooks: RouterHooks,
    usage: UsageKeeper,
    config: Config,
    client: str,
    owner: str,
    *,
    deadline: float,
    estimate: tuple[int, list[tuple[str, str]]],
    counted: bool,
    head: EarlyHead | None = None,
    plan: RoutePlan | None = None,
) -> KeyTurn | GatewayError:
    """Request `owner`'s turn on its key, or the error to refuse it with. `estimate` is the
    input tokens and the (provider, model) candidates a cost estimate reads; `counted` False for
    requests that count toward no limit (token counts). The permit is given back on a refusal or
    if the client leaves while waiting. `head` keeps a streamed client alive while it waits.

    With shared state, `plan`'s load-balance turn (None: none to take) and the candidates'
    slot leases are taken with the key limit's check, in its round trip, once it admits
    (twserve.shared.admission); on their own after it otherwise."""
    names = [name for name, _ in estimate[1]]
    ride = hooks.rides.ride(plan, names, owner) if hooks.rides is not None else None
    turn = _ready(
        ride, _turn(hooks, usage, config, client, owner, deadline, estimate, counted, ride)
    )
    if head is None or not _may_wait(usage, config, client, counted):
        # Nothing to wait for: no keep-alive task (and its task group) for the request.
        return await turn
    if head.req.running is None:
        return await head.keeping_alive(turn)
    return await _abortable(head.req.running, head.keeping_alive(turn))


async def _ready(
    ride: Ride | None, turn: Awaitable[KeyTurn | GatewayError]
) -> KeyTurn | GatewayError:
    """`turn`, then the shared turn and slot leases if its limit check did not take them
    (`Ride.run`); the key's turn goes back if the client left meanwhile."""
    result = await turn
    if ride is None or not isinstance(result, KeyTurn):
        return result
    try:
        await ride.run()
    except BaseException:
        result.give_back()
        raise
    return replace(result, plan=ride.plan)


async def _abortable(
    running: Running, waiting: Awaitable[KeyTurn | GatewayError]
) -> KeyTurn | GatewayError:
    """`waiting` (the key's turn), cut short by an abort from the control plane
    (twserve.relay.abort): then the abort's error, and a turn that came meanwhile goes back."""
    result: KeyTurn | GatewayError | None = None
    try:
        with anyio.CancelScope() as running.wait_scope:
            result = await waiting
    finally:
        running.wait_scope = None
    if running.error is None:
        assert result is not None
        return result
    if isinstance(result, KeyTurn):
        result.give_back()
    return running.error


def note_refusal(row: RequestRow, err: GatewayError, head: EarlyHead | None) -> None:
    """A refused request's row: its status (`EarlyHead.row_status` once its head is out) and
    code; an aborted one is cancelled."""
    row.status = err.status if head is None else head.row_status(err)
    row.error_code, row.cancelled = err.code, row.cancelled or err.code == ABORTED_CODE


def _may_wait(usage: UsageKeeper, config: Config, client: str, counted: bool) -> bool:
    """Whether `_turn` may wait: a key with max_concurrent, or limits that apply."""
    return config.client(client).max_concurrent is not None or (counted and usage.may_wait(client))


async def _turn(
    hooks: RouterHooks,
    usage: UsageKeeper,
    config: Config,
    client: str,
    owner: str,
    deadline: float,
    estimate: tuple[int, list[tuple[str, str]]],
    counted: bool,
    ride: Ride | None,
) -> KeyTurn | GatewayError:
    limit = config.client(client).max_concurrent
    permit = None
    if limit is not None:
        # A key at its max_concurrent queues, within failover.wait_secs of arrival.
        permit = await hooks.key_permit(client, owner, deadline)
        if permit is None:
            return key_busy(limit)
    if not counted:
        return KeyTurn(
            hooks=hooks, usage=usage, permit=permit, admission=Admission.uncounted(client)
        )
    try:
        admitted = await usage.admit(
            client, usage.estimate(*estimate), deadline=deadline, along=ride
        )
    except BaseException:  # the client left while waiting
        if permit is not None:
            hooks.release(permit)
        raise
    if isinstance(admitted, Admission):
        return KeyTurn(hooks=hooks, usage=usage, permit=permit, admission=admitted)
    if permit is not None:
        hooks.release(permit)
    return admitted
