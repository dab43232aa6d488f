"""Upstream slots counted across instances under leases, against a real redis-server."""

from __future__ import annotations

import time
import uuid

import anyio
import pytest

from tests.support.servers import RedisServer
from twengine.config import build_config
from twengine.router import Router
from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisState
from twserve.shared.slots import SharedSlots

pytestmark = pytest.mark.anyio

CONFIG = {
    "version": 1,
    "providers": [
        {"name": "a", "base_url": "http://127.0.0.1:9/v1", "key": "k", "max_concurrent": 3},
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "key": "k"},
    ],
}


async def instance(url: str, prefix: str, lease_secs: float = 60.0) -> SharedSlots:
    state = RedisState(url, prefix=prefix)
    assert await state.connect()
    hooks = RouterHooks(Router(build_config(CONFIG)))
    return SharedSlots(
        state, hooks, instance=uuid.uuid4().hex, wall=time.time, lease_secs=lease_secs
    )


async def test_slots_held_by_one_instance_count_on_the_others_until_its_lease_runs_out(
    redis_server: RedisServer,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    one = await instance(redis_server.url, prefix, lease_secs=1.0)
    two = await instance(redis_server.url, prefix)
    slots_one, slots_two = one.hooks.router.slots, two.hooks.router.slots
    held = [one.hooks.acquire("a", f"r{i}") for i in range(2)]
    assert all(held)
    await one.sync()
    await two.sync()
    assert slots_two.outside("a") == 2 and slots_two.outside("b") == 0
    mine = two.hooks.acquire("a", "s1")
    assert mine is not None and slots_two.is_full("a")
    # A request at `two` waits; the slot `one` gives back reaches it at the next round.
    granted = []
    ticket = two.hooks.wait(
        ("a",), "s2", deadline=1e12, deliver=lambda p: granted.append(p) or True
    )
    assert ticket is not None and not granted
    permit = held[0]
    assert permit is not None
    one.hooks.release(permit)
    await one.sync()
    await two.sync()
    assert [p.owner for p in granted] == ["s2"] and slots_two.outside("a") == 1
    await two.sync()  # the grant was made after `two` wrote its count: the next round has it
    await one.sync()
    assert slots_one.outside("a") == 2
    # `one` dies holding a slot: once its lease has run out, the slot is back.
    with anyio.fail_after(20):
        while slots_two.outside("a"):
            await anyio.sleep(0.1)
            await two.sync()
    for shared in (one, two):
        await shared.state.aclose()
