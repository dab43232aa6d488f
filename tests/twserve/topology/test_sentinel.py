"""Shared state through Redis Sentinel (``redis+sentinel://``), with real processes on loopback:
a master, its replica and three sentinels. The master is killed (SIGKILL) while two gateways
carry load: every request is answered (limits fail open while no master answers), and once the
sentinels have promoted the replica both gateways share limits and announcements through it
without a restart."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import anyio
import openai
import pytest
import redis

from tests.support.servers import SentinelSet, start_sentinels
from tests.twserve.support.stack import KEY, Stack
from tests.twserve.topology.support import (
    OTHER_KEY,
    chat,
    clients,
    continues_elsewhere,
    gateways,
    shared_changes,
    until,
)

pytestmark = pytest.mark.anyio

# Answers after the promotion the load goes on for, at least.
AFTER_PROMOTION = 40


async def _load(
    stacks: list[Stack], found: SentinelSet
) -> tuple[Counter[str], dict[str, int], float]:
    """Streamed requests over `stacks`, 8 at a time; the master is killed after 60 answers, and
    the load goes on until `AFTER_PROMOTION` more have been answered after the sentinels name
    the replica the master. Returns the outcomes, the answers when killed and promoted, and the
    seconds from the kill to the promotion."""
    sdk = [
        openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        for s in stacks
    ]
    outcomes: Counter[str] = Counter()
    answered = 0
    marks: dict[str, int] = {}
    gap: list[float] = []

    def done() -> bool:
        return "promoted" in marks and answered >= marks["promoted"] + AFTER_PROMOTION

    async def worker(w: int) -> None:
        nonlocal answered
        n = w
        while not done() and answered < 3000:
            try:
                stream = await sdk[n % len(sdk)].chat.completions.create(
                    model="gpt-e2e-1", messages=[{"role": "user", "content": f"n{n}"}], stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )
                outcomes["ok" if text else "empty"] += 1
            except openai.APIError as exc:
                outcomes[f"error {exc.code or exc.message}"] += 1
            answered += 1
            n += 8

    async def failover() -> None:
        while answered < 60:
            await anyio.sleep(0.01)
        await anyio.to_thread.run_sync(found.master.kill)
        marks["killed"], killed_at = answered, time.monotonic()
        while await anyio.to_thread.run_sync(found.master_port) != found.replica.port:
            await anyio.sleep(0.1)
        marks["promoted"] = answered
        gap.append(time.monotonic() - killed_at)

    async with anyio.create_task_group() as tg:
        tg.start_soon(failover)
        for w in range(8):
            tg.start_soon(worker, w)
    for client in sdk:
        await client.close()
    return outcomes, marks, gap[0]


def test_the_master_killed_mid_load_every_request_answered_then_shared_via_the_new_master(
    tmp_path: Path,
) -> None:
    config = {"clients": clients(hourly=100_000, exact=6)}
    with (
        start_sentinels(down_after_ms=1000) as found,
        gateways(tmp_path, found.url(), config=config, upstream={"max_concurrent": 8}) as (
            stacks,
            seen,
        ),
    ):
        a, b = stacks
        started = time.monotonic()
        outcomes, marks, gap = anyio.run(_load, stacks, found)
        killed, promoted = marks["killed"], marks["promoted"]
        took = time.monotonic() - started
        total = sum(outcomes.values())
        assert outcomes == {"ok": total}, outcomes
        assert promoted > killed and total >= promoted + 40, (killed, promoted, total)
        for stack, events in zip(stacks, seen, strict=True):
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "back on Redis, through the new master")
            changes = shared_changes(events)
            assert changes[:2] == [
                (False, "gw.shared_state.lost"),
                (True, "gw.shared_state.back"),
            ], changes
        # The new master is the old replica.
        db = redis.Redis(port=found.replica.port)
        try:
            assert db.info("replication")["role"] == "master"
        finally:
            db.close()
        # Limits are shared again: 6 an hour for the key, 12 requests alternating over the two
        # gateways, 6 answered.
        results = []
        for n in range(12):
            try:
                results.append(bool(chat(stacks[n % 2], f"exact {n}", f"x{n}", key=OTHER_KEY)))
            except openai.RateLimitError:
                results.append(False)
        assert results.count(True) == 6, results
        # The announcements channel was subscribed again at the new master: a conversation
        # answered by A is known to B.
        continues_elsewhere(a, b, seen[1], "after-failover")
        print(f"sentinel failover: {total} requests, killed after {killed}, promoted after "
              f"{promoted} ({gap:.1f} s later), load {took:.1f} s")  # fmt: skip
