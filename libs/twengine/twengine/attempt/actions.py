"""What the attempt machine takes and returns: its candidates and settings, its actions, and
the records of its attempts (the machine itself: `twengine.attempt.machine`).

These are the values an IO shell imports: a `CandidateRef` per upstream routing chose and the
`AttemptSettings` of the config's ``failover`` section go in; the actions (`Send` … `FinishRequest`)
come out, each a frozen dataclass named for what the shell must do; `AttemptRecord` is one
attempt as the request row keeps it. Like h11's ``_events.py`` beside its ``_state.py``, the
vocabulary is apart from the machine that speaks it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from twproto.errors import GatewayError
from twproto.failures import Failure

if TYPE_CHECKING:
    from twengine.config.model import Failover

__all__ = (
    "TERMINAL_ACTIONS",
    "Action",
    "AttemptRecord",
    "AttemptSettings",
    "AttemptSkipReason",
    "Backoff",
    "CancelAttempt",
    "CandidateRef",
    "Commit",
    "EndStreamWithError",
    "FinishRequest",
    "Outcome",
    "PassThroughUpstreamError",
    "Resend",
    "ResendReason",
    "RespondError",
    "Send",
    "SendKeepAlive",
    "WaitForSlot",
)


# --- inputs: candidates and settings ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateRef:
    """One candidate upstream. `sticky`: the conversation is held there (docs/balancing.md,
    "Conversations and affinity")."""

    name: str
    sticky: bool = False
    # The model's context window in tokens, where known: after a context overflow only a
    # candidate with a larger one is asked.
    context_window: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a candidate needs a name")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSettings:
    """The ``failover`` figures the machine uses (docs/failover.md; docs/configuration.md,
    ``failover``); seconds throughout.

    `busy_retry_after_secs` is the ``Retry-After`` sent with the 429 when every candidate stayed
    full: nothing says when a slot will free, so it is a short, fixed hint.
    """

    idle_timeout_secs: float = 300.0
    wait_secs: float = 120.0
    keepalive_after: float = 15.0
    keepalive_every: float = 15.0
    next_on_slow_start: bool = False
    stream_start_wait_secs: float = 30.0
    busy_retry_after_secs: float = 5.0
    # False for a request that sets only a thinking budget: a refused effort is not resent then
    # (docs/operations.md), the refusal is an ordinary client error.
    resend_effort: bool = True
    # A committed stream that breaks is continued by the next candidate (its route or group has
    # ``resume: true``; docs/failover.md, "Resuming a broken stream").
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("idle_timeout_secs", "keepalive_after", "keepalive_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("wait_secs", "stream_start_wait_secs", "busy_retry_after_secs"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must not be negative")

    def keepalive_due(self, *, arrival: float, last: float | None, comments: bool) -> float | None:
        """When a streamed client's next keep-alive is due: its 200 and headers
        ``keepalive_after`` after `arrival`, then — for a format that takes comments — a comment
        ``keepalive_every`` after the `last` one went out; None when nothing more is due."""
        if last is None:
            return arrival + self.keepalive_after
        if not comments:
            return None
        return last + self.keepalive_every

    @classmethod
    def from_failover(cls, failover: Failover) -> AttemptSettings:
        """The settings of a loaded config's ``failover`` section (keep-alive times are fixed)."""
        return cls(
            idle_timeout_secs=failover.idle_timeout_secs,
            wait_secs=failover.wait_secs,
            next_on_slow_start=failover.next_on_slow_start,
            stream_start_wait_secs=failover.stream_start_wait_secs,
        )

    def for_request(
        self, *, counting: bool, budget_only: bool, resume: bool = False
    ) -> AttemptSettings:
        """These settings for one request: a token count is never retried, and a request that
        sets only a thinking budget does not have a refused effort resent (docs/operations.md);
        `resume` turns resuming a broken stream on."""
        if counting:
            return replace(self, wait_secs=0)
        if budget_only or resume:
            return replace(
                self, resend_effort=self.resend_effort and not budget_only, resume=resume
            )
        return self


# --- attempt records ---------------------------------------------------------------------------


class Outcome(StrEnum):
    """How one attempt (one entry of `AttemptMachine.attempts`) ended."""

    IN_FLIGHT = "in_flight"  # not ended yet
    OK = "ok"  # the answer came from here
    FAILED = "failed"
    RESENT = "resent"  # refused for its effort or sealed reasoning; the next entry re-sends it
    SLOW_START = "slow_start"  # dropped for a faster start elsewhere; not a failure
    CANCELLED = "cancelled"  # the client left; not counted against the upstream
    SKIPPED = "skipped"  # never sent; `skipped` says why


class AttemptSkipReason(StrEnum):
    PAUSED = "paused"
    FULL = "full"
    # An earlier candidate's context window overflowed and this one's is not known to be larger.
    CONTEXT_WINDOW = "context_window"


class ResendReason(StrEnum):
    """Why an attempt is sent again to the same upstream (docs/operations.md, "What goes
    upstream")."""

    EFFORT_REFUSED = "effort_refused"  # resend with an effort level the upstream accepts
    SEALED_REASONING = "sealed_reasoning"  # resend without the sealed reasoning items
    PREFILL_REFUSED = "prefill_refused"  # a resumed answer resent without the prefill


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt, or one skipped candidate, as the request row keeps it (docs/operations.md,
    "The request row").

    Times are the caller's clock. `error` is the failure's kind, or a ``gw.`` code for an end
    that has no `Failure` (a stream broken after content). `resend` is set on an entry that
    re-sends the one before it. `resumed_from` is set on an attempt that continues an answer
    that broke off: the characters of text the client had when the break happened.
    """

    provider: str
    outcome: Outcome
    retry_round: int = 0
    backoff_ms: int | None = None
    queued_ms: int = 0
    skipped: AttemptSkipReason | None = None
    resend: ResendReason | None = None
    status: int | None = None
    error: str | None = None
    failure: Failure | None = None
    sent_at: float | None = None
    first_content_at: float | None = None
    ended_at: float | None = None
    resumed_from: int | None = None


# --- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Send the request to `provider`, taking a slot there (one `slot_granted` already holds).

    `index` is the attempt's entry in `AttemptMachine.attempts`. `retry_round` > 0 marks a retry
    (event ``RequestRetrying``); `backoff_ms` is the pause before it, on a round's first hop.
    `resumed_from` set: the request continues the answer that broke off (the characters of
    text the client has).
    """

    provider: str
    index: int
    retry_round: int = 0
    backoff_ms: int | None = None
    queued_ms: int = 0
    resumed_from: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitForSlot:
    """Wait until one of `providers` has a free slot, then call `slot_granted`; or until `until`,
    then call `on_timer`."""

    providers: tuple[str, ...]
    until: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Every candidate was tried and the last failed temporarily: wait until `until` (call
    `on_timer` then), then retry round `retry_round` begins."""

    until: float
    retry_round: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """The client's answer is settled.

    `send_headers`: write the 200 and the streaming headers now. `provider` None is the early
    commit of keep-alive: headers only, no upstream chosen yet. Otherwise the answer comes from
    `provider`: write what was held, and pass the rest through; no failover from here on. For a
    client that asked for a whole answer `send_headers` is always false: its status, headers and
    body go out together at `FinishRequest`.
    """

    provider: str | None
    send_headers: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SendKeepAlive:
    """Write an SSE comment ``: keep-alive`` to the client."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelAttempt:
    """Abort the upstream request of attempt `index` and release its slot.

    `failure` is what the caller counts against the upstream (an idle timeout); None for a
    cancel that is not the upstream's fault (slow start, the client left).
    """

    provider: str
    index: int
    outcome: Outcome
    failure: Failure | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resend:
    """Send the request to `provider` again, keeping the slot, rewritten for `reason`.

    `index` is the new attempt's entry in `AttemptMachine.attempts`.
    """

    provider: str
    index: int
    reason: ResendReason
    # The refusal that asked for the resend (its message may name the levels accepted).
    failure: Failure | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RespondError:
    """Answer the client with `error` (in its format); nothing has been sent to it yet.

    `provider` is the upstream whose failure `error` reports; None for the gateway's own answer
    (no upstream, every one busy)."""

    error: GatewayError
    provider: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndStreamWithError:
    """The 200 is out: write `error` as an error event in the client's format and end.

    `provider` as for `RespondError`."""

    error: GatewayError
    provider: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PassThroughUpstreamError:
    """Answer the client with attempt `index`'s own error response, as the upstream wrote it."""

    provider: str
    index: int
    failure: Failure


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishRequest:
    """The request is over: the answer from `provider` ended cleanly, or the client left."""

    provider: str | None
    cancelled: bool = False


Action = (
    Send
    | WaitForSlot
    | Backoff
    | Commit
    | SendKeepAlive
    | CancelAttempt
    | Resend
    | RespondError
    | EndStreamWithError
    | PassThroughUpstreamError
    | FinishRequest
)

#: After one of these the machine is done.
TERMINAL_ACTIONS: tuple[type[Action], ...] = (
    FinishRequest,
    RespondError,
    EndStreamWithError,
    PassThroughUpstreamError,
)
