"""Three in-process gateways on one real Redis taking load-balance turns and keeping upstream
health as one gateway would (twserve.shared.turns, twserve.shared.health), and going on alone
when Redis stops."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from tests.support.servers import RedisServer, start_redis
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twengine.balance import SmoothWeightedRoundRobin, milli_weights, swrr_step
from twengine.rules import RequestFacts
from twmock.script import ErrorSpec, MockSettings, Script
from twproto.dialect import Dialect
from twserve.events import HealthChanged, RequestRouted
from twserve.shared.turns import SWRR_STEP

POOL = {
    "groups": [
        {
            "name": "pool",
            "type": "load-balance",
            "providers": [{"name": "a", "weight": 7}, {"name": "b", "weight": 3}],
        }
    ],
    "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
}


def until(check: Callable[[], bool], what: str, secs: float = 20.0) -> None:
    deadline = time.monotonic() + secs
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


@contextmanager
def three_gateways(
    tmp: Path,
    server: RedisServer,
    upstreams: dict[str, Script] | list[dict[str, Script]],
    config: dict[str, Any] | None = None,
) -> Iterator[list[tuple[Stack, list[Any]]]]:
    """Three gateways sharing `server`, each over its own mocks named as `upstreams` (played by
    the scripts given; a list: per instance), with the events each published."""
    shared = {"state": {"redis_url": server.url}} | (config or {})
    out: list[tuple[Stack, list[Any]]] = []
    with ExitStack() as exits:
        for i in range(3):
            scripts = upstreams[i] if isinstance(upstreams, list) else upstreams
            ups = {
                name: Upstream("openai-chat", MockSettings(script=script))
                for name, script in scripts.items()
            }
            stack = exits.enter_context(running_stack(tmp / f"g{i}", ups, config=shared))
            seen: list[Any] = []
            stack.app.events.listeners.append(seen.append)
            out.append((stack, seen))
        for stack, _ in out:
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "connected to Redis")
        yield out


def ask(stack: Stack, text: str) -> str:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    stream = client.chat.completions.create(
        model="gpt-e2e-1", messages=[{"role": "user", "content": text}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def first_routed(seen: list[Any]) -> str:
    routed = [e for e in seen if isinstance(e, RequestRouted)]
    return routed[-1].candidates[0]


def longest_run(sequence: str) -> int:
    return max(len(list(run)) for _, run in itertools.groupby(sequence))


def one_gateway(n: int) -> str:
    rr = SmoothWeightedRoundRobin()
    return "".join(rr.pick([("a", 7.0), ("b", 3.0)], {"a", "b"}) for _ in range(n))


def test_a_7_3_group_interleaves_across_three_instances_as_on_one(tmp_path: Path) -> None:
    with (
        start_redis() as server,
        three_gateways(tmp_path, server, {"a": Script(), "b": Script()}, POOL) as gateways,
    ):
        picks = ""
        for n in range(20):
            stack, seen = gateways[n % 3]
            assert ask(stack, f"request {n}")
            picks += first_routed(seen)
        # The deployment's sequence is one gateway's: 14 a and 6 b, a never more than 3 in a row.
        assert picks == one_gateway(20), picks
        assert picks.count("a") == 14 and longest_run(picks) <= 3
        for stack, _ in gateways:
            sharing = stack.app.sharing
            assert sharing is not None and sharing.turns.local == 0
        assert sum(s.app.sharing.turns.shared for s, _ in gateways if s.app.sharing) == 20
        # The shared current weights are one hash under a Cluster hash tag.
        db = redis.Redis(port=server.port)
        assert db.keys("twserve:{swrr:*") == [b"twserve:{swrr:pool}:current"]
        db.close()


def test_a_group_with_one_member_takes_no_shared_turn(tmp_path: Path) -> None:
    config = {
        "groups": [{"name": "solo", "type": "load-balance", "providers": ["a"]}],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "solo"}]}],
    }
    with start_redis() as server, three_gateways(tmp_path, server, {"a": Script()}, config) as g:
        for n in range(3):
            assert ask(g[n][0], f"request {n}")
        for stack, _ in g:
            assert stack.app.sharing is not None and stack.app.sharing.turns.shared == 0


def test_three_failures_one_on_each_instance_pause_the_upstream_for_all(tmp_path: Path) -> None:
    failing = Script(error=ErrorSpec(status=500, message="upstream exploded"))
    with (
        start_redis() as server,
        # A 500 is retried after 2 s within `wait_secs`: with 1 s, one attempt per request.
        three_gateways(
            tmp_path, server, {"mock": failing}, {"failover": {"wait_secs": 1}}
        ) as gateways,
    ):
        db = redis.Redis(port=server.port)
        run = "twserve:{health:mock}:run"
        for n, (stack, _) in enumerate(gateways):
            with pytest.raises(openai.APIError):
                ask(stack, f"request {n}")
            # Outcomes are written in the background: wait for this one before the next.
            until(lambda n=n: int(db.hget(run, "failures") or 0) == n + 1, f"failure {n + 1}")
            if n < 2:
                for other, _ in gateways:
                    router = other.app.gateway.router
                    assert not router.health.is_paused("mock", other.app.gateway.clock())
        for stack, seen in gateways:
            router = stack.app.gateway.router
            until(
                lambda s=stack: s.app.gateway.router.health.is_paused(
                    "mock", s.app.gateway.clock()
                ),
                "paused everywhere",
            )
            snap = router.health.snapshot("mock", stack.app.gateway.clock())
            # Each instance saw one failure of its own: the shared run paused it.
            assert snap.failures_in_row == 1
            assert snap.pause_reason is not None and snap.pause_reason.value == "unexplained"
            assert [(e.paused, e.reason) for e in seen if isinstance(e, HealthChanged)] == [
                (True, "unexplained")
            ]
        third = gateways[2][0].app.sharing
        assert third is not None and third.health.pauses == 1
        # The shared success rate covers all three instances' attempts.
        for stack, _ in gateways:
            sharing = stack.app.sharing
            assert sharing is not None
            stack.portal.call(sharing.health.sync)
            snap = stack.app.gateway.router.health.snapshot("mock", stack.app.gateway.clock())
            assert snap.attempts == 3
        db.close()


def test_a_success_on_another_instance_breaks_the_shared_run(tmp_path: Path) -> None:
    failing = {"mock": Script(error=ErrorSpec(status=500, message="upstream exploded"))}
    with (
        start_redis() as server,
        three_gateways(
            tmp_path,
            server,
            [failing, {"mock": Script()}, failing],
            {"failover": {"wait_secs": 1}},
        ) as gateways,
    ):
        db = redis.Redis(port=server.port)
        run = "twserve:{health:mock}:run"
        attempts = "twserve:{health:mock}:attempts"
        # Fail on 0, fail on 2, succeed on 1, fail on 0, fail on 2: four failures, two in a row.
        for n, which in enumerate((0, 2, 1, 0, 2)):
            stack = gateways[which][0]
            if which == 1:
                assert ask(stack, f"request {n}")
            else:
                with pytest.raises(openai.APIError):
                    ask(stack, f"request {n}")
            until(lambda n=n: db.llen(attempts) == n + 1, f"outcome {n + 1} written")
        assert int(db.hget(run, "failures") or 0) == 2
        for stack, seen in gateways:
            assert not stack.app.gateway.router.health.is_paused("mock", stack.app.gateway.clock())
            assert not [e for e in seen if isinstance(e, HealthChanged)]
        db.close()


def test_latency_ranks_alike_on_every_instance(tmp_path: Path) -> None:
    config = {
        "groups": [
            {
                "name": "pool",
                "type": "load-balance",
                "balance_by": "latency",
                "providers": ["fast", "slow"],
            }
        ],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
    }
    scripts = {"fast": Script(first_delay=0.01), "slow": Script(first_delay=0.3)}
    with start_redis() as server, three_gateways(tmp_path, server, scripts, config) as gateways:
        # Only the first instance sends requests: 4 to each upstream.
        first = gateways[0][0]
        for n in range(8):
            assert ask(first, f"request {n}")
        for stack, _ in gateways:
            health = stack.app.gateway.router.health
            until(
                lambda h=health: h.sample_count("fast") >= 3 and h.sample_count("slow") >= 3,
                "the samples shared",
            )
        medians = []
        for stack, _ in gateways:
            sharing = stack.app.sharing
            assert sharing is not None
            stack.portal.call(sharing.health.sync)
            health = stack.app.gateway.router.health
            medians.append(
                (health.first_content_median("fast"), health.first_content_median("slow"))
            )
            report = stack.app.gateway.router.dryrun(_facts(), now=stack.app.gateway.clock())
            factors = {c.provider: c.balance_factor for c in report.candidates}
            fast, slow = factors["fast"], factors["slow"]
            assert fast is not None and slow is not None and fast > slow
        # The same samples, the same medians, on every instance.
        assert medians[0] == medians[1] == medians[2], medians
        fast_median, slow_median = medians[0]
        assert fast_median is not None and slow_median is not None and fast_median < slow_median


def _facts() -> RequestFacts:
    return RequestFacts(model="gpt-e2e-1", dialect=Dialect.OPENAI_CHAT, client="tester")


def test_redis_stopped_each_instance_takes_its_own_turns_and_shares_again(
    tmp_path: Path,
) -> None:
    with (
        start_redis() as server,
        three_gateways(tmp_path, server, {"a": Script(), "b": Script()}, POOL) as gateways,
    ):
        for n in range(6):
            assert ask(gateways[n % 3][0], f"shared {n}")
        server.stop()
        own: list[str] = ["", "", ""]
        for n in range(30):
            stack, seen = gateways[n % 3]
            assert ask(stack, f"alone {n}")  # served all the same
            own[n % 3] += first_routed(seen)
        for stack, _ in gateways:
            sharing = stack.app.sharing
            assert sharing is not None and not sharing.state.up and sharing.turns.local >= 9
        # Each instance's own sequence stays smooth: 7 a and 3 b per 10, no long runs.
        for picks in own:
            assert picks.count("a") == 7 and longest_run(picks) <= 3, own
        server.start()
        for stack, _ in gateways:
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "Redis back")
        before = [s.app.sharing.turns.shared for s, _ in gateways if s.app.sharing]
        for n in range(3):
            assert ask(gateways[n][0], f"back {n}")
        after = [s.app.sharing.turns.shared for s, _ in gateways if s.app.sharing]
        assert [y - x for x, y in zip(before, after, strict=True)] == [1, 1, 1]


def test_the_script_steps_exactly_as_twengine(redis_server: RedisServer) -> None:
    """`SWRR_STEP` on a real Redis against `swrr_step`: random members, weights (fractional
    ones too, as balance factors make), members sitting out, sticky requests forced, and
    forced steps refused beyond max_lead — 2000 steps over 40 groups, the same picks and the
    same current weights at every step."""
    db = redis.Redis(port=redis_server.port)
    step = db.register_script(SWRR_STEP)
    rng = random.Random(27)
    max_lead = 2.0
    refused = 0
    try:
        for group in range(40):
            key = f"twserve:{{swrr:prop{group}}}:current"
            names = [f"m{i}" for i in range(rng.randint(2, 6))]
            local: dict[str, int] = {}
            for _ in range(50):
                members = [(n, rng.choice([1, 3, 7, 0.35, 2.5, 100])) for n in names]
                eligible = {n for n in names if rng.random() < 0.7}
                forced = rng.choice(names) if rng.random() < 0.3 else None
                weights = milli_weights(members)
                args: list[str | int | float] = ["sig", forced or "", max_lead, 60_000]
                for name, weight in weights:
                    args += [name, weight, "1" if name in eligible else "0"]
                found = step(keys=[key], args=args)
                winner, new = swrr_step(local, members, eligible, forced=forced)
                total = sum(w for n, w in weights if n in (eligible or set(names)) or n == forced)
                taken = not (forced is not None and new[forced] < -max_lead * total)
                if taken:
                    local = new
                refused += not taken
                shared = {found[i].decode(): int(found[i + 1]) for i in range(2, len(found), 2)}
                assert (found[0].decode(), bool(found[1])) == (winner, taken)
                assert shared == {n: local.get(n, 0) for n in names}
        assert refused > 10  # max_lead's refusals were exercised too
    finally:
        db.close()
