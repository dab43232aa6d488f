"""Key limits shared through Redis: the Lua scripts against a real redis-server.

The scripts must give `twengine.limits.KeyLimits`'s answers (the same admissions, waits and
refusals, the same `until` and `used`), stay exact when instances race, and let a dead
instance's reservations lapse.
"""

from __future__ import annotations

import datetime as dt
import random
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest

from tests.support.servers import RedisServer, start_redis
from twengine.config import Client, KeyLimit, LimitMeasure, LimitPeriod
from twengine.limits import Admitted, KeyLimits, Refused, Reservation, Spend, Wait
from twserve.shared.limits import SharedLimits, admit_args, read_verdict, windows
from twserve.shared.redis import RedisDown, RedisState

pytestmark = pytest.mark.anyio
UTC = dt.UTC


def lim(per: str, measure: str, amount: int, cache_reads: bool = False) -> KeyLimit:
    return KeyLimit(
        per=LimitPeriod(per), measure=LimitMeasure(measure), amount=amount, cache_reads=cache_reads
    )


def one(tokens: int = 0, cost: int = 0, reads: int = 0) -> Spend:
    return Spend(requests=1, tokens=tokens, cost_micros=cost, cache_reads=reads)


async def connected(url: str, prefix: str, **kw: float) -> RedisState:
    state = RedisState(url, prefix=prefix, **kw)
    assert await state.connect()
    return state


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    yield f"t{uuid.uuid4().hex[:8]}:"


def test_windows_and_arguments_name_each_limit() -> None:
    now = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC).timestamp()
    lims = (lim("minute", "requests", 5), lim("day", "tokens", 900, cache_reads=True))
    wins = windows("p:", "k", lims, now, UTC)
    assert wins[0].key == "p:lim:{k}:roll:60" and wins[0].rolling
    start = dt.datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    assert wins[1].key == f"p:lim:{{k}}:cal:day:{int(start)}"
    assert (wins[1].start, wins[1].end) == (start, start + 86400)
    args = admit_args(lims, wins, one(tokens=7), now, "rid", 30.0)
    assert args[1:8] == ["rid", str(int(now * 1000) + 30000), "1", "7", "0", "0", "120000"]
    assert args[8:17] == ["r", "60", "0", "r", "0", "5", "c", repr(start), repr(start + 86400)]
    assert args[-3:] == ["t", "1", "900"]
    # The script's answers, read back as the engine's verdicts.
    assert isinstance(read_verdict([b"admitted", 0, 0, b""], "k", lims, wins, one()), Admitted)
    refused = read_verdict([b"refused", 2, 900, b""], "k", lims, wins, one())
    assert refused == Refused(limit=lims[1], used=900, reset=start + 86400)
    wait = read_verdict([b"wait", 1, 5, b"1800000060.250000"], "k", lims, wins, one())
    assert wait == Wait(limit=lims[0], used=5, until=1800000060.25)


async def test_instances_racing_a_limit_never_pass_it_together(
    redis_server: RedisServer, prefix: str
) -> None:
    lims = (lim("minute", "requests", 10),)
    instances = [SharedLimits(await connected(redis_server.url, prefix)) for _ in range(3)]
    now = time.time()
    verdicts: list[Admitted | Wait | Refused] = []

    async def ask(shared: SharedLimits) -> None:
        verdict, _ = await shared.admit("k", lims, one(), now, UTC)
        verdicts.append(verdict)

    async with anyio.create_task_group() as tg:
        for i in range(60):
            tg.start_soon(ask, instances[i % 3])
    assert sum(isinstance(v, Admitted) for v in verdicts) == 10
    # The others wait: only reservations hold the window, so it frees when one settles.
    assert {(type(v), getattr(v, "until", 0)) for v in verdicts if not isinstance(v, Admitted)} == {
        (Wait, None)
    }
    for shared in instances:
        await shared.state.aclose()


async def test_settle_books_the_spend_in_place_of_the_reservation(
    redis_server: RedisServer, prefix: str
) -> None:
    lims = (lim("minute", "tokens", 100), lim("day", "requests", 3))
    shared = SharedLimits(await connected(redis_server.url, prefix))
    now = time.time()
    verdict, rid = await shared.admit("k", lims, one(tokens=60), now, UTC)
    assert isinstance(verdict, Admitted) and rid in shared.held
    # 60 reserved: an estimate of 50 does not fit beside it, and only a settle can make room.
    blocked, _ = await shared.admit("k", lims, one(tokens=50), now, UTC)
    assert blocked == Wait(limit=lims[0], used=60, until=None)
    used = await shared.settle("k", rid, lims, one(tokens=20), now + 1, UTC)
    assert used == [20, 1] and rid not in shared.held
    verdict, rid2 = await shared.admit("k", lims, one(tokens=50), now + 2, UTC)
    assert isinstance(verdict, Admitted)
    await shared.settle("k", rid2, lims, one(tokens=70), now + 3, UTC)
    # 90 settled: 20 must roll off first, at the first spend's time plus the window.
    blocked, _ = await shared.admit("k", lims, one(tokens=30), now + 4, UTC)
    assert isinstance(blocked, Wait) and blocked.used == 90
    assert blocked.until == pytest.approx(now + 1 + 60, abs=1e-3)
    # Released without reaching an upstream: the reservation goes and nothing is booked.
    verdict, rid3 = await shared.admit("k", lims, one(tokens=5), now + 5, UTC)
    assert isinstance(verdict, Admitted)
    assert await shared.settle("k", rid3, lims, None, now + 5, UTC) is None
    # The day's third request fits; a fourth is refused until the day ends.
    verdict, rid4 = await shared.admit("k", lims, one(tokens=5), now + 6, UTC)
    assert isinstance(verdict, Admitted)
    await shared.settle("k", rid4, lims, one(tokens=5), now + 6, UTC)
    refused, _ = await shared.admit("k", lims, one(), now + 7, UTC)
    day_end = windows("", "k", lims, now + 7, UTC)[1].end
    assert refused == Refused(limit=lims[1], used=3, reset=day_end)
    # An estimate over a rolling limit on its own can never fit.
    huge, _ = await shared.admit("k", (lims[0],), one(tokens=101), now + 8, UTC)
    assert huge == Refused(limit=lims[0], used=95, reset=None)
    await shared.state.aclose()


async def test_a_dead_instance_s_reservations_lapse_and_renewed_ones_stay(
    redis_server: RedisServer, prefix: str
) -> None:
    lims = (lim("minute", "requests", 2),)
    dead = SharedLimits(await connected(redis_server.url, prefix), reservation_secs=5.0)
    alive = SharedLimits(await connected(redis_server.url, prefix), reservation_secs=5.0)
    now = time.time()
    assert isinstance((await dead.admit("k", lims, one(), now, UTC))[0], Admitted)
    assert isinstance((await alive.admit("k", lims, one(), now, UTC))[0], Admitted)
    blocked, _ = await alive.admit("k", lims, one(), now + 4, UTC)
    assert isinstance(blocked, Wait)
    # `alive` renews at +4 (to +9); `dead` never does, so its reservation lapses at +5.
    await alive.renew(now + 4)
    verdict, _ = await alive.admit("k", lims, one(), now + 6, UTC)
    assert isinstance(verdict, Admitted)
    blocked, _ = await alive.admit("k", lims, one(), now + 8, UTC)
    assert blocked == Wait(limit=lims[0], used=2, until=None)
    await dead.state.aclose()
    await alive.state.aclose()


async def test_the_scripts_answer_as_the_in_process_limits_do(
    redis_server: RedisServer, prefix: str
) -> None:
    """A random run of admissions, settles and releases, given to both: same answers."""
    rng = random.Random(15)
    lims = (
        lim("minute", "requests", 6),
        lim("hour", "tokens", 400, cache_reads=True),
        lim("day", "cost", 3000),
    )
    local = KeyLimits([Client(name="k", key="x", limits=lims)], UTC)
    shared = SharedLimits(await connected(redis_server.url, prefix), reservation_secs=600.0)
    now = time.time()
    held: list[tuple[Reservation, str]] = []
    seen: set[type] = set()
    for step in range(150):
        now += rng.uniform(0, 9)
        if step % 10 == 0:
            # The usage views agree too (the control plane's /keys).
            theirs = await shared.status("k", lims, now, UTC)
            for got_status, want_status in zip(theirs, local.status("k", now), strict=True):
                assert (got_status.used, got_status.reserved) == (
                    want_status.used,
                    want_status.reserved,
                )
                assert got_status.window_start == pytest.approx(want_status.window_start)
                if want_status.reset is None:
                    assert got_status.reset is None
                else:
                    assert got_status.reset == pytest.approx(want_status.reset, abs=1e-3)
        if held and rng.random() < 0.45:
            reservation, rid = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.2:
                local.release(reservation)
                await shared.settle("k", rid, lims, None, now, UTC)
            else:
                spend = one(
                    tokens=rng.randint(0, 80), cost=rng.randint(0, 600), reads=rng.randint(0, 30)
                )
                local.settle(reservation, spend, now)
                await shared.settle("k", rid, lims, spend, now, UTC)
            continue
        tokens = rng.randint(0, 120) if rng.random() < 0.9 else 401  # 401: over on its own
        estimate = one(tokens=tokens, cost=rng.randint(0, 300))
        expected = local.admit("k", estimate, now)
        got, rid = await shared.admit("k", lims, estimate, now, UTC)
        seen.add(type(expected))
        if isinstance(expected, Admitted):
            assert isinstance(got, Admitted)
            held.append((expected.reservation, rid))
        elif isinstance(expected, Wait):
            assert isinstance(got, Wait) and (got.limit, got.used) == (
                expected.limit,
                expected.used,
            )
            if expected.until is None:
                assert got.until is None
            else:
                assert got.until == pytest.approx(expected.until, abs=1e-3)
        else:
            assert got == expected
    assert seen == {Admitted, Wait, Refused}
    await shared.state.aclose()


async def test_losing_redis_is_told_and_its_return_too(prefix: str) -> None:
    told: list[tuple[bool, str]] = []
    with start_redis() as server:
        state = await connected(server.url, prefix, timeout=0.5, retry_secs=0.1)
        state.listeners.append(lambda up, detail: told.append((up, detail)))
        shared = SharedLimits(state)
        lims = (lim("minute", "requests", 1),)
        async with anyio.create_task_group() as tg:
            tg.start_soon(state.run)
            server.stop()
            with pytest.raises(RedisDown):
                await shared.admit("k", lims, one(), time.time(), UTC)
            assert not state.up and told[0][0] is False and "127.0.0.1" in told[0][1]
            # Lost: later calls give up at once, without trying Redis.
            with pytest.raises(RedisDown):
                await shared.admit("k", lims, one(), time.time(), UTC)
            server.start()
            with anyio.fail_after(20):
                while not state.up:
                    await anyio.sleep(0.05)
            verdict, _ = await shared.admit("k", lims, one(), time.time(), UTC)
            assert isinstance(verdict, Admitted)
            tg.cancel_scope.cancel()
        assert [up for up, _ in told] == [False, True]
        await state.aclose()
