"""A request's key limit, load-balance turn and slot leases in one script on one server
(twserve.shared.admission), against a real redis-server: taken together when the limit admits,
none of the turn and the leases when it refuses or holds the request waiting."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

from tests.support.servers import RedisServer
from twengine.config import Config, build_config
from twengine.limits import Admitted, Refused, Spend, Wait
from twengine.router import RoutePlan, Router
from twengine.rules import RequestFacts
from twproto.dialect import Dialect
from twserve.relay.holds import RouterHooks
from twserve.shared.admission import SharedAdmissions
from twserve.shared.limits import SharedLimits
from twserve.shared.redis import RedisState
from twserve.shared.slots import SharedSlots
from twserve.shared.turns import SharedTurns

pytestmark = pytest.mark.anyio


def _config(per: str) -> Config:
    return build_config(
        {
            "version": 1,
            "providers": [
                {"name": n, "base_url": "http://127.0.0.1:9/v1", "key": "k", "max_concurrent": 2}
                for n in ("a", "b")
            ],
            "groups": [
                {
                    "name": "pool",
                    "type": "load-balance",
                    "providers": [{"name": "a", "weight": 7}, {"name": "b", "weight": 3}],
                }
            ],
            "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
            "clients": [{"name": "tester", "key": "sk-t", "limits": [{"per": per, "requests": 1}]}],
        }
    )


@dataclass
class Instance:
    state: RedisState
    router: Router
    slots: SharedSlots
    turns: SharedTurns
    admissions: SharedAdmissions
    limits: SharedLimits
    config: Config
    db: redis.asyncio.Redis

    def plan(self) -> RoutePlan:
        facts = RequestFacts(model="m", dialect=Dialect.OPENAI_CHAT, client="tester")
        return self.router.plan(facts, now=time.monotonic())

    async def admit(self, owner: str) -> tuple[Admitted | Wait | Refused, str, Any]:
        ride = self.admissions.ride(self.plan(), ["a", "b"], owner)
        verdict, rid = await self.limits.admit(
            "tester",
            self.config.client("tester").limits,
            Spend(requests=1),
            time.time(),
            dt.UTC,
            ride,
        )
        return verdict, rid, ride

    async def shared(self) -> tuple[dict[bytes, bytes], int, int]:
        """The group's weights in Redis and the leases of each upstream."""
        weights = await self.db.hgetall(self.turns.key("pool"))
        a = await self.db.zcard(self.slots.lease_key("a"))
        b = await self.db.zcard(self.slots.lease_key("b"))
        return weights, a, b


def count_calls(state: RedisState) -> list[int]:
    """A one-item list counting the round trips `state` is asked for from now on."""
    calls = [0]
    call = state.call

    async def counted(fn: Any) -> Any:
        calls[0] += 1
        return await call(fn)

    state.call = counted  # type: ignore[method-assign]
    return calls


@asynccontextmanager
async def _instance(url: str, per: str) -> AsyncIterator[Instance]:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    state = RedisState(url, prefix=prefix)
    assert await state.connect()
    config = _config(per)
    router = Router(config)
    slots = SharedSlots(state, RouterHooks(router), instance=uuid.uuid4().hex, clock=time.monotonic)
    turns = SharedTurns(state, router)
    db = redis.asyncio.Redis.from_url(url)
    try:
        yield Instance(
            state=state,
            router=router,
            slots=slots,
            turns=turns,
            admissions=SharedAdmissions(state, turns, slots),
            limits=SharedLimits(state),
            config=config,
            db=db,
        )
    finally:
        await db.aclose()
        await state.aclose()


@pytest.fixture(params=["day", "minute"])
async def one(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Instance]:
    """An instance whose key may make one request a day (a refusal past it) or a rolling
    minute (a wait while the first request's reservation holds the window)."""
    async with _instance(redis_server.url, request.param) as found:
        yield found


async def test_an_admitted_request_takes_its_turn_and_leases_in_the_same_script(
    one: Instance,
) -> None:
    calls = count_calls(one.state)
    verdict, _, ride = await one.admit("r1")
    assert isinstance(verdict, Admitted)
    assert calls == [1] and ride.done
    # The group's first pick at 7:3 is a; the plan has it first, as the turn's weights say.
    assert ride.plan.balance.lead == "a" and ride.plan.candidates[0].provider == "a"
    assert one.turns.shared == 1 and one.turns.local == 0
    weights, a, b = await one.shared()
    assert weights[b"a"] == b"-3000" and weights[b"b"] == b"3000"
    # Both candidates have max_concurrent and no spare lease here: one lease of each.
    assert (a, b) == (1, 1) and len(one.slots.leases["a"]) == len(one.slots.leases["b"]) == 1
    # Nothing is left for `run` to do.
    await ride.run()
    assert calls == [1]


async def test_a_request_the_limit_does_not_admit_takes_no_turn_and_no_lease(
    one: Instance,
) -> None:
    first, _, _ = await one.admit("r1")
    assert isinstance(first, Admitted)
    before = await one.shared()
    verdict, _, ride = await one.admit("r2")
    # Refused (the day's one request is spent) or waiting (the minute's is reserved).
    assert isinstance(verdict, Refused | Wait)
    assert not ride.done
    # The group's weights are as the admitted request left them, and no lease was taken:
    # SWRR goes on with the requests that run.
    assert await one.shared() == before
    assert one.turns.shared == 1
    # The leases set aside for it were put back: only r1's claims remain.
    assert all("r2" not in claims for claims in one.slots.claims.values())
    assert all("r1" in claims for claims in one.slots.claims.values())


async def test_without_a_limit_to_check_the_turn_and_leases_take_one_round_trip(
    redis_server: RedisServer,
) -> None:
    async with _instance(redis_server.url, "day") as one:
        calls = count_calls(one.state)
        picks = ""
        for n in range(4):
            ride = one.admissions.ride(one.plan(), ["a", "b"], f"r{n}")
            await ride.run()
            assert ride.done
            picks += ride.plan.candidates[0].provider
        # One script per request, the turns interleaved 7:3 as one balancer would.
        assert calls == [4]
        assert picks == "abaa"
        _, a, b = await one.shared()
        assert (a, b) == (2, 2)  # two slots each: a lease per request up to the limit
