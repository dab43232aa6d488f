"""The backoff schedule of retry rounds.

When every candidate has been tried and the last attempt failed temporarily before any content
reached the client, the request pauses and tries again (which failures qualify is the attempt
machine's decision; this module only says how long to pause, and when to stop).

* Round 1 pauses 2 s, round 2 4 s, round 3 8 s, every later round 16 s.
* Each pause is spread by ±20% jitter, so that requests failed by the same outage do not all
  come back in the same instant. The caller draws the jitter (a float in [0, 1)); 0.5 means no
  change.
* A hint from the upstream (``retry-after-ms``, ``Retry-After``, a body's ``retryDelay``)
  lengthens a pause, never shortens it: the pause is the longer of the two. A hint of 0 is
  ignored; under 250 ms it counts as 250 ms.
* Retrying stops when the pause would end after the request's deadline (``arrival +
  wait_secs``): the last error is handed over instead of a retry that could not finish in time.
"""

from __future__ import annotations

__all__ = ("HINT_FLOOR_SECS", "JITTER", "SCHEDULE_SECS", "base_backoff", "next_backoff")

SCHEDULE_SECS = (2.0, 4.0, 8.0, 16.0)
JITTER = 0.2
HINT_FLOOR_SECS = 0.25


def base_backoff(round_: int) -> float:
    """The pause before retry round `round_` (1 is the first retry), before jitter."""
    if round_ < 1:
        raise ValueError(f"retry rounds start at 1, not {round_}")
    return SCHEDULE_SECS[min(round_, len(SCHEDULE_SECS)) - 1]


def next_backoff(
    round_: int, hint_secs: float | None, jitter: float, now: float, deadline: float
) -> float | None:
    """Seconds to pause before retry round `round_`, or None when retrying must stop.

    `hint_secs`: the upstream's retry hint, if any. `jitter`: a draw in [0, 1). `now` and
    `deadline` are on the same clock; the pause must end no later than `deadline`.
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be a draw in [0, 1), not {jitter}")
    pause = base_backoff(round_) * (1.0 + JITTER * (2.0 * jitter - 1.0))
    if hint_secs is not None and hint_secs > 0:
        pause = max(pause, hint_secs, HINT_FLOOR_SECS)
    if now + pause > deadline:
        return None
    return pause
