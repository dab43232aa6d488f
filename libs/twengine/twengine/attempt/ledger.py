"""What one request holds and reports while the attempt machine runs: slots and health records.

`twengine.attempt.machine.AttemptMachine` decides where a request goes; it does not take slots or
tell the health bookkeeping how an upstream did. `AttemptLedger` wraps it, input for input, and adds
to its actions the bookkeeping they imply, as actions too, so the IO layer only carries out a
list (docs/failover.md, "The attempt machine"; docs/balancing.md for slots and health):

* `AcquireSlot` before a `Send` to an upstream the request holds no slot at yet; a slot that a
  `WaitForSlot` ticket delivered (`slot_granted`) is already held. A `Resend` keeps its slot.
* `ReleaseSlot` when the attempt holding it ends: it failed, it was cancelled (idle timeout,
  slow start, the client left), or the request ended. A successful answer keeps its slot until
  it has been passed on in full, so the release follows `FinishRequest`.
* `CancelWait` when the request stops waiting for a slot without getting one (the deadline
  passed, the client left). A grant that arrives after that is given straight back.
* `RecordFailure` for every failure the request counts against an upstream (the `failed` input,
  an idle timeout's `CancelAttempt`), before anything else happens; `RecordSuccess` before
  `FinishRequest`, with the time from sending to first content for a streamed answer. A streamed
  answer that stays silent until its idle timeout is slow as well as failed: its
  `RecordFailure` carries the whole wait as its first-content sample (docs/balancing.md).

A slot the request holds counts as free for it in the machine's ``free`` snapshot. Requests that
take no slot at all (token counts) pass ``takes_slots=False``: every candidate is then free and
no slot action is emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from twengine.attempt.actions import (
    TERMINAL_ACTIONS,
    Action,
    AttemptRecord,
    AttemptSettings,
    CancelAttempt,
    CandidateRef,
    FinishRequest,
    Resend,
    Send,
)
from twengine.attempt.machine import AttemptMachine, State
from twproto.failures import Failure, FailureKind

__all__ = (
    "AcquireSlot",
    "AttemptLedger",
    "CancelWait",
    "LedgerAction",
    "RecordFailure",
    "RecordSuccess",
    "ReleaseSlot",
    "attempt_view",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcquireSlot:
    """Take a slot at `provider` for the `Send` that follows (send even if none is free)."""

    provider: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseSlot:
    """Give back the request's slot at `provider`."""

    provider: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelWait:
    """Stop waiting for a slot (the `WaitForSlot` ticket); a late grant goes straight back."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordFailure:
    """Count `failure` against `provider` (health, pauses). `first_content_secs`: a streamed
    answer's idle timeout before any content, whose whole wait is also its speed sample."""

    provider: str
    failure: Failure
    first_content_secs: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordSuccess:
    """`provider` answered; `first_content_secs` (streams only) feeds its speed estimate."""

    provider: str
    first_content_secs: float | None


LedgerAction = Action | AcquireSlot | ReleaseSlot | CancelWait | RecordFailure | RecordSuccess


class AttemptLedger:
    """The attempt machine of one request, with its slot and health bookkeeping as actions.

    The arguments are the machine's; `takes_slots` False for requests that take no slot.
    Inputs mirror `AttemptMachine`'s and return the actions to carry out, in order.
    """

    __slots__ = ("_client_stream", "_holding", "_names", "_takes_slots", "_waiting", "machine")

    def __init__(
        self,
        *,
        candidates: Sequence[CandidateRef],
        client_stream: bool,
        keepalive_comments: bool,
        arrival: float,
        settings: AttemptSettings,
        rng: Callable[[], float],
        takes_slots: bool = True,
        last_keepalive: float | None = None,
    ) -> None:
        self.machine = AttemptMachine(
            candidates=candidates,
            client_stream=client_stream,
            keepalive_comments=keepalive_comments,
            arrival=arrival,
            settings=settings,
            rng=rng,
            last_keepalive=last_keepalive,
        )
        self._names = frozenset(c.name for c in candidates)
        self._client_stream = client_stream
        self._takes_slots = takes_slots
        self._holding: set[str] = set()
        self._waiting = False  # a WaitForSlot ticket is out

    # --- views ----------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the request has ended."""
        return self.machine.done

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """Every attempt and skip so far (see `AttemptMachine.attempts`)."""
        return self.machine.attempts

    @property
    def holding(self) -> frozenset[str]:
        """The upstreams at which the request holds a slot now."""
        return frozenset(self._holding)

    def next_deadline(self) -> float | None:
        """When `on_timer` is next due, or None."""
        return self.machine.next_deadline()

    # --- inputs ---------------------------------------------------------------------------

    def start(
        self, now: float, *, free: Collection[str], paused: Collection[str]
    ) -> list[LedgerAction]:
        """Choose the first hop."""
        return self._book(self.machine.start(now, free=self._free(free), paused=paused))

    def slot_granted(self, provider: str, now: float) -> list[LedgerAction]:
        """A `WaitForSlot` ticket got a slot at `provider`; the request holds it now."""
        if self.machine.state is not State.WAITING_SLOT:
            return [ReleaseSlot(provider=provider)]  # too late: the wait had ended
        self._holding.add(provider)
        self._waiting = False  # the ticket is used up
        return self._book(self.machine.slot_granted(provider, now))

    def attempt_sent(self, now: float) -> list[LedgerAction]:
        """The request went out to the upstream."""
        return self._book(self.machine.attempt_sent(now))

    def response_head(self, now: float, *, status: int) -> list[LedgerAction]:
        """The upstream's status line arrived."""
        return self._book(self.machine.response_head(now, status=status))

    def first_content(self, now: float) -> list[LedgerAction]:
        """The answer's first content arrived."""
        return self._book(self.machine.first_content(now))

    def content(self, now: float) -> list[LedgerAction]:
        """More content arrived (the latest at `now`)."""
        return self._book(self.machine.content(now))

    def failed(
        self, failure: Failure, now: float, *, free: Collection[str], paused: Collection[str]
    ) -> list[LedgerAction]:
        """The attempt in flight failed."""
        provider = self.machine.in_flight
        actions = self.machine.failed(failure, now, free=self._free(free), paused=paused)
        before: list[LedgerAction] = []
        if provider is not None:
            before.append(RecordFailure(provider=provider, failure=failure))
            resent = any(isinstance(a, Resend) and a.provider == provider for a in actions)
            if not resent:
                before += self._release(provider)
        return before + self._book(actions)

    def ended(
        self,
        now: float,
        *,
        clean: bool,
        resume_from: int | None = None,
        free: Collection[str] = (),
        paused: Collection[str] = (),
        too_large: bool = False,
    ) -> list[LedgerAction]:
        """The committed answer ended, cleanly or broken (`resume_from`, `too_large`: see the
        machine's)."""
        provider = self.machine.in_flight
        actions = self.machine.ended(
            now,
            clean=clean,
            resume_from=resume_from,
            free=self._free(free),
            paused=paused,
            too_large=too_large,
        )
        # Resumed elsewhere: the broken answer's slot goes back now.
        before = self._release(provider) if provider and not self.machine.done else []
        return before + self._book(actions)

    def client_gone(self, now: float) -> list[LedgerAction]:
        """The client disconnected."""
        return self._book(self.machine.client_gone(now))

    def on_timer(
        self,
        now: float,
        *,
        free: Collection[str],
        paused: Collection[str],
        resume_from: int | None = None,
    ) -> list[LedgerAction]:
        """Fire whatever is due at `now`."""
        return self._book(
            self.machine.on_timer(
                now, free=self._free(free), paused=paused, resume_from=resume_from
            )
        )

    # --- bookkeeping ----------------------------------------------------------------------

    def _free(self, free: Collection[str]) -> Collection[str]:
        if not self._takes_slots:
            return self._names
        if not self._holding:
            return free
        return {*free, *self._holding}

    def _release(self, provider: str) -> list[LedgerAction]:
        if provider not in self._holding:
            return []
        self._holding.discard(provider)
        return [ReleaseSlot(provider=provider)]

    def _book(self, actions: list[Action]) -> list[LedgerAction]:
        machine = self.machine
        out: list[LedgerAction] = []
        for action in actions:
            if isinstance(action, Send):
                if self._takes_slots and action.provider not in self._holding:
                    self._holding.add(action.provider)
                    out.append(AcquireSlot(provider=action.provider))
                out.append(action)
            elif isinstance(action, CancelAttempt):
                out.append(action)
                if action.failure is not None:
                    out.append(
                        RecordFailure(
                            provider=action.provider,
                            failure=action.failure,
                            first_content_secs=self._silent_secs(action),
                        )
                    )
                out += self._release(action.provider)
            elif isinstance(action, FinishRequest) and not action.cancelled and action.provider:
                out.append(
                    RecordSuccess(
                        provider=action.provider, first_content_secs=self._first_content_secs()
                    )
                )
                out.append(action)
            else:
                out.append(action)
        if self._waiting and machine.state is not State.WAITING_SLOT:
            # The wait ended without this request's grant (deadline, the client left): the
            # ticket goes before anything the wait's end led to.
            out.insert(0, CancelWait())
        self._waiting = machine.state is State.WAITING_SLOT
        if machine.done and any(isinstance(a, TERMINAL_ACTIONS) for a in actions):
            for provider in sorted(self._holding):
                out.append(ReleaseSlot(provider=provider))
            self._holding.clear()
        return out

    def _silent_secs(self, cancel: CancelAttempt) -> float | None:
        """The whole wait of a streamed attempt its idle timeout cancelled before any content
        (None for any other cancel): a silent upstream is a slow one."""
        if not self._client_stream or cancel.failure is None:
            return None
        if cancel.failure.kind is not FailureKind.IDLE_TIMEOUT:
            return None
        record = self.machine.attempts[cancel.index]
        if record.first_content_at is not None or record.sent_at is None:
            return None
        if record.ended_at is None:
            return None
        return max(0.0, record.ended_at - record.sent_at)

    def _first_content_secs(self) -> float | None:
        if not self._client_stream:
            return None
        for record in reversed(self.machine.attempts):
            if record.first_content_at is not None and record.sent_at is not None:
                return record.first_content_at - record.sent_at
        return None


def attempt_view(
    record: AttemptRecord, model: str | None, effort: dict[str, object] | None = None
) -> dict[str, object]:
    """One attempt as the request row's routing JSON keeps it; `model` is the model name sent
    to that upstream, `effort` what became of its reasoning level (docs/operations.md, "The
    request row")."""
    return {
        "provider": record.provider,
        "model": model,
        "outcome": record.outcome.value,
        "status": record.status,
        "error": record.error,
        "ms": _span_ms(record.sent_at, record.ended_at),
        "queued_ms": record.queued_ms,
        "skipped": record.skipped.value if record.skipped else None,
        "retry": record.retry_round,
        "backoff_ms": record.backoff_ms,
        "resend": record.resend.value if record.resend else None,
        "effort": effort,
        "resumed_from": record.resumed_from,
    }


def _span_ms(start: float | None, end: float | None) -> int | None:
    if start is None or end is None:
        return None
    return int((end - start) * 1000)
