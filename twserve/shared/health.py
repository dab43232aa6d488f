"""Upstream health shared by every instance: failure runs, success rates, first-content times.

*Writing.* Every outcome the relay reports for an upstream (`RouterHooks.outcome_listeners`) is
queued as a background job (`RedisState.later`, never on the request's path) that runs
`RECORD` — one ``EVALSHA`` on three keys under one hash tag, ``<prefix>{health:<upstream>}:``
``run``, ``attempts`` and ``samples`` (one Redis Cluster slot):

* a first-content sample is pushed to ``samples``, trimmed to the last `HealthSettings.samples`;
* an attempt that counts for the success rate (a success, or a failure whose pause rule is not
  ``none``) is pushed to ``attempts`` as ``<wall ms>:<1|0>``, trimmed to the last
  `HealthSettings.attempts`;
* the failure run in ``run`` is counted atomically: an unexplained failure (or a rate limit that
  named no wait) increments it, a success resets it and the doubling. When it reaches
  ``failures_to_pause`` and no shared pause of its own is running, the script starts one —
  ``pause_secs`` doubled per pause since the last success, at most ``max_pause_secs`` — and
  returns its length; the instance whose job it was pauses the upstream, and the pause travels to
  the others as every pause does (twserve.shared.router). So three failures in a row, one on each
  of three instances, pause the upstream for all: exactly at the third, in the order the
  outcomes reached Redis.

*Reading.* Every `interval` seconds (default 1) each instance reads every configured upstream's
``attempts`` and ``samples`` in one pipelined round trip and gives them to
`twengine.health.Health.take_shared`: success rates (window and minimum count as on one
instance) and first-content medians are then the deployment's, and ``balance_by: latency`` or
``health`` ranks alike everywhere, within `interval` plus the time an outcome waits in the job
queue. Between reads an instance adds its own outcomes to what it last read.

*Redis away.* Jobs are skipped and reads stop: each instance carries on from the last shared
figures with its own outcomes only, counting its own failure runs (which pause as on one
instance; they always do, so a run seen by one instance alone pauses there too). Once Redis is
back, outcomes are written and read again; those of the time away are not replayed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from redis.asyncio import Redis

from twengine.health import HealthReason
from twproto.failures import Failure, PauseRule
from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisDown, RedisState

__all__ = ["RECORD", "SharedHealth"]

log = logging.getLogger("twserve.shared")

# The run and the samples of an upstream nobody has used for this long are forgotten.
HEALTH_TTL_MS = 86_400_000

#: KEYS: run, attempts, samples. ARGV: wall ms now; the attempt ('1' success, '0' failure, ''
#: none); '1' if it counts in the failure run; the first-content sample ('' none);
#: failures_to_pause; pause ms; max pause ms; attempts kept; samples kept; the attempts' lifetime
#: in ms; the other keys' lifetime in ms. Returns {failures in the run, pause ms started (0: none)}.
RECORD = """
local now = tonumber(ARGV[1])
if ARGV[4] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[4])
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[9]), -1)
  redis.call('PEXPIRE', KEYS[3], ARGV[11])
end
if ARGV[2] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ':' .. ARGV[2])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[8]), -1)
  redis.call('PEXPIRE', KEYS[2], ARGV[10])
end
local failures, pause = 0, 0
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] == '1' then
  failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
  local running = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
  if failures >= tonumber(ARGV[5]) and now >= running then
    local pauses = tonumber(redis.call('HGET', KEYS[1], 'pauses') or '0')
    pause = math.min(tonumber(ARGV[6]) * (2 ^ pauses), tonumber(ARGV[7]))
    pause = math.floor(pause)
    redis.call('HSET', KEYS[1], 'pauses', pauses + 1, 'until', now + pause)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[11])
else
  failures = tonumber(redis.call('HGET', KEYS[1], 'failures') or '0')
end
return {failures, pause}
"""


def _in_run(failure: Failure) -> bool:
    """Whether `failure` counts in the run that pauses (`Health.record_failure`'s rule)."""
    if failure.pause is PauseRule.UNEXPLAINED:
        return True
    if failure.pause is PauseRule.RATE_LIMIT:
        secs = failure.pause_secs if failure.pause_secs is not None else failure.retry_after_secs
        return secs is None or secs <= 0
    return False


class SharedHealth:
    """This instance's outcomes written for all, and everyone's read back (module docs)."""

    def __init__(
        self,
        state: RedisState,
        hooks: RouterHooks,
        *,
        wall: Callable[[], float],
        clock: Callable[[], float],
        interval: float = 1.0,
    ) -> None:
        self.state = state
        self.hooks = hooks
        self.wall = wall
        self.clock = clock
        self.interval = interval
        self._record = state.script(RECORD)
        # Pauses this instance started because the shared run reached the threshold.
        self.pauses = 0
        hooks.outcome_listeners.append(self.outcome)

    def keys(self, upstream: str) -> list[str]:
        """The run, attempts and samples keys of `upstream` (one hash slot)."""
        tag = "{health:" + upstream + "}"
        return [self.state.key(tag, part) for part in ("run", "attempts", "samples")]

    def outcome(
        self, provider: str, now: float, failure: Failure | None, first_content_secs: float | None
    ) -> None:
        """A `RouterHooks` outcome listener: write the outcome in the background."""
        router = self.hooks.router
        if not router.config.has_provider(provider):
            return
        if failure is None:
            attempt, run = "1", "0"
        elif failure.pause is PauseRule.NONE:
            attempt, run = "", "0"
        else:
            attempt, run = "0", "1" if _in_run(failure) else "0"
        sample = "" if first_content_secs is None else repr(max(0.0, first_content_secs))
        if not attempt and not sample:
            return
        at_ms = int((self.wall() - (self.clock() - now)) * 1000)
        settings = router.health.settings
        args: list[str | int] = [
            at_ms,
            attempt,
            run,
            sample,
            settings.failures_to_pause,
            int(settings.pause_secs * 1000),
            int(settings.max_pause_secs * 1000),
            settings.attempts,
            settings.samples,
            int(settings.attempts_window_secs * 1000),
            HEALTH_TTL_MS,
        ]
        keys = self.keys(provider)

        async def record(client: Redis) -> None:
            found = await self._record(keys=keys, args=args, client=client)
            pause_ms = int(found[1])
            if pause_ms > 0:
                self._pause(provider, at_ms, pause_ms)

        self.state.later(record)

    def _pause(self, provider: str, at_ms: int, pause_ms: int) -> None:
        """The shared run reached the threshold with this instance's outcome: pause for all."""
        health = self.hooks.router.health
        now = self.clock()
        until = now + (at_ms + pause_ms) / 1000 - self.wall()
        current = health.paused_until(provider)
        if until <= now or (
            health.is_paused(provider, now) and current is not None and current >= until
        ):
            return
        self.pauses += 1
        # Published as this instance's own pause: twserve.shared.router announces it.
        self.hooks.publish(health.pause(provider, now, until, HealthReason.UNEXPLAINED))

    async def sync(self) -> None:
        """Read every upstream's shared attempts and samples (one pipelined round trip)."""
        router = self.hooks.router
        names = [p.name for p in router.config.providers]
        if not names:
            return

        async def read(client: Redis) -> list[list[bytes]]:
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    _, attempts, samples = self.keys(name)
                    pipe.lrange(attempts, 0, -1)
                    pipe.lrange(samples, 0, -1)
                found: list[list[bytes]] = await pipe.execute()
            return found

        found = await self.state.call(read)
        now, wall = self.clock(), self.wall()
        health = router.health
        for i, name in enumerate(names):
            attempts: list[tuple[float, bool]] = []
            for entry in found[2 * i]:
                at, _, ok = entry.decode().partition(":")
                attempts.append((now - (wall - int(at) / 1000), ok == "1"))
            samples = [float(value) for value in found[2 * i + 1]]
            if attempts or samples:
                health.take_shared(name, samples=samples, attempts=attempts)

    async def run(self) -> None:
        """Read every `interval` while Redis answers; until cancelled."""
        while True:
            if self.state.up:
                try:
                    await self.sync()
                except RedisDown:
                    pass
                except (ValueError, IndexError):
                    log.info("shared state: ignored malformed shared health")
            await anyio.sleep(self.interval)
