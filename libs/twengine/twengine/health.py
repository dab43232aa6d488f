"""Per-upstream health: first-content times, success rate, and pauses.

Theory of operation
-------------------
`Health` keeps three things per upstream, all fed by the caller with ``now`` (seconds on a
monotonic clock):

*Speed.* The time from sending a request to an upstream to the first content of its streamed
answer, wherever the upstream sat among the candidates (slot waits and earlier attempts are not
part of it). The last 32 samples are kept; the median is what ``url-test`` ranks by and what the
``latency`` balance factor compares. A silent upstream's sample is its whole idle wait.

*Success rate.* The outcome of the last 50 attempts, of those no older than 30 minutes; fewer
than 5 such attempts and the rate is unknown (None), which the balancer treats as average.
Only outcomes that say something about the upstream count: a success, or a failure whose pause
rule is not ``none``. Client errors (4xx handed to the client), a missing model, refused effort,
sealed reasoning, requests the client aborted and skips for full slots are not recorded at all;
the caller simply does not report them.

*Pauses.* A paused upstream sits out of balancing and is tried after the others (unless it is
the only candidate, or all are paused — the caller's decision). The failure's pause rule (from
the failure classifier) says how long:

==============  =========================================================================
rule            pause
==============  =========================================================================
unexplained     after `HealthSettings.failures_to_pause` (3) in a row, `pause_secs` (60),
                doubling with each further pause up to `max_pause_secs` (600)
no_balance      `no_balance_pause_secs` (1800)
quota           until the reset the upstream named (``reset_at``, or ``pause_secs`` from
                now), else `quota_pause_secs` (3600)
rate_limit      the Retry-After-derived seconds, capped at `rate_limit_max_pause_secs`
                (3600); without them the failure counts as unexplained
none            no pause, not counted
==============  =========================================================================

A success clears the run of failures and the doubling, and ends any pause. Unexplained failures
that arrive while the upstream is already paused (requests that were in flight, or sent because
every candidate was paused) do not lengthen the pause; but the run is not cleared, so the first
unexplained failure after a pause ends pauses it again, for twice as long — the pause acts as a
circuit breaker whose probe is the next real request. An explained pause never shortens a longer
pause already running.

Pauses start and end as values: `PauseChanged` events, returned by the calls that cause them.
A pause that simply runs out ends at `next_deadline`; the caller calls `on_timer` then, which
returns the end events. `is_paused` consults the clock given, so a late timer never keeps an
upstream paused for longer.

Times named by an upstream (a quota's reset) are wall-clock; ``reset_at`` given to
`record_failure` is on the caller's monotonic clock, and `record` converts a failure's wall-clock
``reset_at`` when told the wall time at ``now``.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from twproto.failures import Failure, PauseRule

__all__ = (
    "Health",
    "HealthReason",
    "HealthSettings",
    "PauseChanged",
    "UpstreamHealth",
)


class HealthReason(StrEnum):
    """Why a pause started (a pause rule) or ended (``success``, ``expired``)."""

    UNEXPLAINED = "unexplained"
    NO_BALANCE = "no_balance"
    QUOTA = "quota"
    RATE_LIMIT = "rate_limit"
    SUCCESS = "success"
    EXPIRED = "expired"
    # Started or ended by an operator (the control plane), not by what the upstream did.
    MANUAL = "manual"


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthSettings:
    """Thresholds of health bookkeeping; the defaults are the documented ones."""

    failures_to_pause: int = 3
    pause_secs: float = 60.0
    max_pause_secs: float = 600.0
    no_balance_pause_secs: float = 1800.0
    quota_pause_secs: float = 3600.0
    rate_limit_max_pause_secs: float = 3600.0
    samples: int = 32
    attempts: int = 50
    attempts_window_secs: float = 1800.0
    min_attempts: int = 5

    def __post_init__(self) -> None:
        if self.failures_to_pause < 1:
            raise ValueError("failures_to_pause must be at least 1")
        if not 0 < self.pause_secs <= self.max_pause_secs:
            raise ValueError("need 0 < pause_secs <= max_pause_secs")
        for name in ("no_balance_pause_secs", "quota_pause_secs", "rate_limit_max_pause_secs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.samples < 1 or self.attempts < 1 or self.min_attempts < 1:
            raise ValueError("sample and attempt counts must be at least 1")
        if self.attempts_window_secs <= 0:
            raise ValueError("attempts_window_secs must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseChanged:
    """An upstream's pause started (`paused` true, until `until`) or ended, at time `at`."""

    upstream: str
    paused: bool
    reason: HealthReason
    at: float
    until: float | None = None
    failures_in_row: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamHealth:
    """A snapshot of one upstream's health, for dry-run and the control plane."""

    upstream: str
    paused_until: float | None
    pause_reason: HealthReason | None
    failures_in_row: int
    first_content_median: float | None
    first_content_samples: int
    success_rate: float | None
    attempts: int


class _Upstream:
    __slots__ = ("attempts", "failures", "pauses", "reason", "samples", "until")

    def __init__(self, settings: HealthSettings) -> None:
        self.samples: deque[float] = deque(maxlen=settings.samples)
        self.attempts: deque[tuple[float, bool]] = deque(maxlen=settings.attempts)
        self.failures = 0  # unexplained failures in a row
        self.pauses = 0  # unexplained pauses since the last success: the doubling exponent
        self.until: float | None = None
        self.reason: HealthReason | None = None


class Health:
    """Health of every upstream; see the module docstring."""

    __slots__ = ("_settings", "_upstreams")

    def __init__(self, settings: HealthSettings | None = None) -> None:
        self._settings = settings or HealthSettings()
        self._upstreams: dict[str, _Upstream] = {}

    @property
    def settings(self) -> HealthSettings:
        return self._settings

    def configure(self, settings: HealthSettings) -> None:
        """Apply new settings; samples and pauses carry over (window sizes re-trim them)."""
        self._settings = settings
        for state in self._upstreams.values():
            state.samples = deque(state.samples, maxlen=settings.samples)
            state.attempts = deque(state.attempts, maxlen=settings.attempts)

    def forget(self, name: str) -> None:
        """Drop everything known about an upstream (it left the configuration)."""
        self._upstreams.pop(name, None)

    def _state(self, name: str) -> _Upstream:
        state = self._upstreams.get(name)
        if state is None:
            state = self._upstreams[name] = _Upstream(self._settings)
        return state

    # -- speed ---------------------------------------------------------------------------

    def record_first_content(self, name: str, secs: float) -> None:
        """A streamed answer's time from send to first content (or the full idle wait)."""
        if secs < 0:
            raise ValueError("a first-content time cannot be negative")
        self._state(name).samples.append(secs)

    def first_content_median(self, name: str, *, min_samples: int = 1) -> float | None:
        """Median of the last samples, or None with fewer than `min_samples`."""
        state = self._upstreams.get(name)
        if state is None or len(state.samples) < max(1, min_samples):
            return None
        return statistics.median(state.samples)

    def sample_count(self, name: str) -> int:
        state = self._upstreams.get(name)
        return 0 if state is None else len(state.samples)

    def take_shared(
        self,
        name: str,
        *,
        samples: Iterable[float],
        attempts: Iterable[tuple[float, bool]],
    ) -> None:
        """Replace the upstream's samples and attempts with those of a whole deployment.

        Several instances sharing health (twserve.shared.health) write every outcome to one
        list per upstream and read the lists back: `samples` oldest first, `attempts` as
        ``(time on this clock, success)``. The same windows and minimum counts then apply to
        what every instance saw, so every instance ranks and weighs alike. Failure runs and
        pauses are not touched (the run that pauses is counted where it is shared)."""
        state = self._state(name)
        settings = self._settings
        state.samples = deque((s for s in samples if s >= 0), maxlen=settings.samples)
        state.attempts = deque(sorted(attempts), maxlen=settings.attempts)

    # -- outcomes ------------------------------------------------------------------------

    def success_rate(self, name: str, now: float) -> float | None:
        """Share of successes among recent attempts; None with too few of them."""
        state = self._upstreams.get(name)
        if state is None:
            return None
        recent = self._recent(state, now)
        if len(recent) < self._settings.min_attempts:
            return None
        return sum(1 for ok in recent if ok) / len(recent)

    def _recent(self, state: _Upstream, now: float) -> list[bool]:
        oldest = now - self._settings.attempts_window_secs
        return [ok for at, ok in state.attempts if at > oldest]

    def record_success(self, name: str, now: float) -> list[PauseChanged]:
        """An attempt that got its answer: clears the run and ends a pause."""
        state = self._state(name)
        state.attempts.append((now, True))
        state.failures = 0
        state.pauses = 0
        if state.until is None:
            return []
        if state.reason is HealthReason.MANUAL and state.until > now:
            # An operator's pause lasts until they end it or it runs out.
            return []
        why = HealthReason.SUCCESS if state.until > now else HealthReason.EXPIRED
        return [self._end(name, state, now, why)]

    def record_failure(
        self,
        name: str,
        now: float,
        rule: PauseRule | str,
        *,
        pause_secs: float | None = None,
        reset_at: float | None = None,
    ) -> list[PauseChanged]:
        """A failed attempt whose failure carries pause rule `rule`.

        `pause_secs`: for ``rate_limit`` the Retry-After-derived wait, for ``quota`` the time
        until the reset; `reset_at`: for ``quota``, the reset on the caller's clock. Both are
        ignored by other rules. Returns the event of a pause that starts.
        """
        kind = PauseRule(rule)
        if kind is PauseRule.NONE:
            return []
        state = self._state(name)
        state.attempts.append((now, False))
        settings = self._settings
        if kind is PauseRule.NO_BALANCE:
            return self._pause(name, state, now, now + settings.no_balance_pause_secs, kind)
        if kind is PauseRule.QUOTA:
            if reset_at is not None and reset_at > now:
                until = reset_at
            elif pause_secs is not None and pause_secs > 0:
                until = now + pause_secs
            else:
                until = now + settings.quota_pause_secs
            return self._pause(name, state, now, until, kind)
        if kind is PauseRule.RATE_LIMIT and pause_secs is not None and pause_secs > 0:
            secs = min(pause_secs, settings.rate_limit_max_pause_secs)
            return self._pause(name, state, now, now + secs, kind)
        # Unexplained, or a rate limit that named no wait.
        state.failures += 1
        if state.failures < settings.failures_to_pause or self._paused(state, now):
            return []
        secs = min(settings.pause_secs * 2.0**state.pauses, settings.max_pause_secs)
        state.pauses += 1
        return self._pause(name, state, now, now + secs, PauseRule.UNEXPLAINED)

    def record(
        self, name: str, now: float, failure: Failure, *, wall_now: float | None = None
    ) -> list[PauseChanged]:
        """`record_failure` with the fields of a classified failure.

        The failure's ``reset_at`` is wall-clock (epoch seconds); with `wall_now`, the wall
        clock at `now`, it becomes a time on the monotonic clock. Without it ``reset_at`` is
        not used and the quota pause falls back to ``pause_secs`` or the default.
        """
        secs = failure.pause_secs
        if secs is None and failure.pause is PauseRule.RATE_LIMIT:
            secs = failure.retry_after_secs
        reset_at = None
        if failure.reset_at is not None and wall_now is not None:
            reset_at = now + (failure.reset_at - wall_now)
        return self.record_failure(name, now, failure.pause, pause_secs=secs, reset_at=reset_at)

    # -- pauses --------------------------------------------------------------------------

    @staticmethod
    def _paused(state: _Upstream, now: float) -> bool:
        return state.until is not None and state.until > now

    def _pause(
        self, name: str, state: _Upstream, now: float, until: float, rule: PauseRule
    ) -> list[PauseChanged]:
        if self._paused(state, now) and state.until is not None and state.until >= until:
            return []
        state.until = until
        state.reason = HealthReason(rule.value)
        return [
            PauseChanged(
                upstream=name,
                paused=True,
                reason=state.reason,
                at=now,
                until=until,
                failures_in_row=state.failures,
            )
        ]

    def _end(self, name: str, state: _Upstream, now: float, why: HealthReason) -> PauseChanged:
        state.until = None
        state.reason = None
        return PauseChanged(
            upstream=name, paused=False, reason=why, at=now, failures_in_row=state.failures
        )

    def pause(
        self, name: str, now: float, until: float, reason: HealthReason = HealthReason.MANUAL
    ) -> list[PauseChanged]:
        """An operator's pause of `name` until `until`; answers succeeding do not end it.

        With another `reason`, a pause decided elsewhere (another instance sharing its pauses)
        taken as it is: it ends as a pause of that kind would, and counts no failure here."""
        state = self._state(name)
        state.until = until
        state.reason = reason
        return [
            PauseChanged(
                upstream=name,
                paused=True,
                reason=reason,
                at=now,
                until=until,
                failures_in_row=state.failures,
            )
        ]

    def resume(
        self, name: str, now: float, reason: HealthReason = HealthReason.MANUAL
    ) -> list[PauseChanged]:
        """End any pause of `name` now (an operator's resume; with another `reason`, a pause
        ended elsewhere, such as by a success on another instance)."""
        state = self._upstreams.get(name)
        if state is None or state.until is None:
            return []
        return [self._end(name, state, now, reason)]

    def is_paused(self, name: str, now: float) -> bool:
        state = self._upstreams.get(name)
        return state is not None and self._paused(state, now)

    def paused_until(self, name: str) -> float | None:
        """When the upstream's pause ends (None: not paused, or the pause was seen to end)."""
        state = self._upstreams.get(name)
        return None if state is None else state.until

    def paused(self, names: Iterable[str], now: float) -> set[str]:
        """The names among `names` that are paused at `now`."""
        return {name for name in names if self.is_paused(name, now)}

    def next_deadline(self) -> float | None:
        """The earliest time a pause ends, for the caller's timer."""
        ends = [state.until for state in self._upstreams.values() if state.until is not None]
        return min(ends) if ends else None

    def on_timer(self, now: float) -> list[PauseChanged]:
        """End the pauses that have run out by `now`."""
        return [
            self._end(name, state, now, HealthReason.EXPIRED)
            for name, state in self._upstreams.items()
            if state.until is not None and state.until <= now
        ]

    def snapshot(self, name: str, now: float) -> UpstreamHealth:
        state = self._upstreams.get(name)
        if state is None:
            return UpstreamHealth(
                upstream=name,
                paused_until=None,
                pause_reason=None,
                failures_in_row=0,
                first_content_median=None,
                first_content_samples=0,
                success_rate=None,
                attempts=0,
            )
        paused = self._paused(state, now)
        return UpstreamHealth(
            upstream=name,
            paused_until=state.until if paused else None,
            pause_reason=state.reason if paused else None,
            failures_in_row=state.failures,
            first_content_median=self.first_content_median(name),
            first_content_samples=len(state.samples),
            success_rate=self.success_rate(name, now),
            attempts=len(self._recent(state, now)),
        )
