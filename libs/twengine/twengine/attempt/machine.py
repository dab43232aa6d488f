"""The per-request attempt state machine: which upstream next, when to wait, when to give up.

Theory of operation
-------------------

One client request has an ordered list of candidate upstreams (routing decided the order). The
machine decides, hop by hop, which candidate the request goes to, whether it waits for a slot or
backs off before a retry, when the client's 200 goes out, and how the request ends. It does no IO
and reads no clock: every input carries ``now``, the caller learns when the machine next needs
attention from `next_deadline()` and calls `on_timer(now, ...)` then, the way aioquic's
connection does. Inputs return a list of actions — frozen dataclasses named for what the IO layer
must do (`Send`, `WaitForSlot`, `Commit`, `RespondError`…) — in the order it must do them.

The machine does not consult the health, pause or slot bookkeeping. At each input that may choose
a hop the caller passes two snapshots: ``free`` (candidates with a free slot right now) and
``paused`` (candidates paused right now). The caller records outcomes itself, from the actions
(`CancelAttempt` carries the failure it counts, `FinishRequest` means success) and from `attempts`.

States. `State` is where the *request* is; at most one attempt is in flight at a time. "A hop"
below leads to DISPATCHED (`Send`), WAITING_SLOT, BACKOFF or DONE::

    state               input                                leads to
    IDLE                start                                a hop
    WAITING_SLOT        slot_granted                         DISPATCHED
                        timer at the deadline                a hop, without waiting
    DISPATCHED          attempt_sent                         AWAITING_HEAD
    AWAITING_HEAD       response_head (2xx / other)          AWAITING_CONTENT / READING_ERROR
    AWAITING_CONTENT    first_content                        STREAMING, with `Commit`
    any of the four     failed, idle timer, slow-start timer a hop (`Resend`: DISPATCHED)
    BACKOFF             timer at its end                     a hop in the next retry round
    STREAMING           content                              STREAMING
                        ended, failed, idle timer            DONE
    any but DONE        client_gone                          DONE

* A **hop** picks the first candidate of the current round that is neither tried nor skipped.
  Paused ones are skipped (recorded ``skipped=paused``) unless every candidate of the round is
  paused — then pauses are ignored, which also means a lone candidate is never held back. A full
  candidate is passed over for a later free one (recorded ``skipped=full``) but stays in the
  round, so it may be asked again after a later failure. A *sticky* candidate (the conversation
  is held there) that is full is waited for instead. When every remaining candidate is full the
  request waits for the first free slot among them (`WaitForSlot`).
* All waiting — slots and retry backoffs — ends at the **deadline**, ``arrival + wait_secs``
  (``wait_secs == 0`` turns waiting and retrying off). Past it, a full candidate is skipped for
  good. If no attempt ever reached an upstream the client gets 429 with ``Retry-After``
  (``gw.busy_all``, or ``gw.busy_upstream`` when it waited for its conversation's upstream);
  otherwise it gets the last real failure.
* A **context overflow** (the request does not fit the model's context window) blames nobody:
  from then on only candidates whose ``context_window`` is known to be larger than the
  overflowing one's are asked — the others are skipped (``skipped=context_window``), in this
  round and in retry rounds. With none larger the request ends with the overflow, as any
  client error would.
* A **failure** reported before content (`failed`, or the idle timer) is judged by its flags.
  ``effort_refused`` and ``sealed_reasoning`` are first answered with `Resend` to the same
  upstream (once per reason per hop; a second one is an ordinary failure, and as neither fails
  over, it ends the request with the upstream's own 400). A failure that does not fail over ends
  the request. Otherwise the next hop is chosen. When the round has no candidate
  left and the last attempt failed *temporarily*, a new **retry round** starts after `Backoff`,
  holding the candidates that failed temporarily (only the sticky one for a held conversation);
  `twengine.attempt.retry.next_backoff` says how long, and says no once the pause would end
  after the deadline. Anything else ends the request with the last failure.
* **First content** commits the answer to its upstream (`Commit`): held bytes go out, and from
  then on there is no failover and no retry. After that the upstream's end (`ended`), an error
  (`failed`) or the idle timer end the request.
* The **idle timeout** runs from dispatch (restarted by `attempt_sent`) and from each piece of
  content; keep-alives and pings are not content. Before content it is an ordinary failure of the
  attempt (`CancelAttempt` carrying an ``idle_timeout`` failure, then the next hop); after content
  it ends the request.
* **Keep-alive** (streamed client requests only): ``keepalive_after`` seconds after arrival with
  no content the client gets its 200 and stream headers (`Commit` with no provider), then a
  `SendKeepAlive` comment after each ``keepalive_every`` seconds — unless the client's format
  takes no comments (``keepalive_comments=False``, Gemini clients): then the headers only.
  Failover and retries carry on under that 200; an error then ends the stream
  (`EndStreamWithError`) instead of being an error response. Keep-alives stop at first
  content: from then on the upstream's own events carry the stream and the idle timer guards it.
* **Slow-start switch** (``next_on_slow_start``, streamed client requests only): once per attempt,
  ``stream_start_wait_secs`` after send with no content, if another untried candidate of the round
  is unpaused and free at that moment, the attempt is cancelled (outcome ``slow_start``, not a
  failure) and the request sent there. Otherwise — including on the last candidate — it waits.
* `client_gone` ends everything at once: `CancelAttempt` (outcome ``cancelled``, not counted
  against the upstream) for an attempt in flight, then ``FinishRequest(cancelled=True)``.

Terminal actions are `FinishRequest`, `RespondError`, `EndStreamWithError` and
`PassThroughUpstreamError`; after one, `done` is true. Whatever upstream request is still open
is then the IO layer's to close, and its slot to release.

An input that is not valid in the current state (``first_content`` while waiting for a slot, any
input after the end except a late `client_gone` or timer) raises `AttemptStateError` and leaves
the machine unchanged: it is a bug in the caller, as h11's ``LocalProtocolError`` is. The allowed
``(state, input)`` pairs and the states each can lead to are the table `TRANSITIONS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any

from twengine.attempt.actions import (
    Action,
    AttemptRecord,
    AttemptSettings,
    AttemptSkipReason,
    Backoff,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    FinishRequest,
    Outcome,
    PassThroughUpstreamError,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
    WaitForSlot,
)
from twengine.attempt.retry import next_backoff
from twproto.errors import ErrorCategory, GatewayError, error_for_failure, passes_through
from twproto.failures import Failure, FailureKind, idle_timeout
from twproto.stream.resume import refuses_prefill

__all__ = ("TRANSITIONS", "AttemptMachine", "AttemptStateError", "Input", "State")


class AttemptStateError(Exception):
    """An input the machine cannot take in its current state: a bug in the caller."""


_RESEND_REASONS: Mapping[FailureKind, ResendReason] = {
    FailureKind.EFFORT_REFUSED: ResendReason.EFFORT_REFUSED,
    FailureKind.SEALED_REASONING: ResendReason.SEALED_REASONING,
}


# --- states and the transition table -----------------------------------------------------------


class State(StrEnum):
    IDLE = "idle"  # constructed; start() not called
    WAITING_SLOT = "waiting_slot"  # WaitForSlot returned
    DISPATCHED = "dispatched"  # Send or Resend returned; the request is on its way
    AWAITING_HEAD = "awaiting_head"  # the request went out; no response head yet
    AWAITING_CONTENT = "awaiting_content"  # a 2xx head; the answer is held until first content
    READING_ERROR = "reading_error"  # an error head; its body is being classified
    BACKOFF = "backoff"  # Backoff returned; the next retry round starts at its end
    STREAMING = "streaming"  # committed: content flows from one upstream
    DONE = "done"


class Input(StrEnum):
    START = "start"
    SLOT_GRANTED = "slot_granted"
    ATTEMPT_SENT = "attempt_sent"
    RESPONSE_HEAD = "response_head"
    FIRST_CONTENT = "first_content"
    CONTENT = "content"
    FAILED = "failed"
    ENDED = "ended"
    CLIENT_GONE = "client_gone"
    TIMER = "timer"


_S = State
# Where a hop can lead: an attempt, a wait, a backoff, or the end.
_HOP = frozenset({_S.DISPATCHED, _S.WAITING_SLOT, _S.BACKOFF, _S.DONE})
_IN_FLIGHT = (_S.DISPATCHED, _S.AWAITING_HEAD, _S.AWAITING_CONTENT, _S.READING_ERROR)


def _table() -> dict[tuple[State, Input], frozenset[State]]:
    table: dict[tuple[State, Input], frozenset[State]] = {
        (_S.IDLE, Input.START): _HOP,
        (_S.WAITING_SLOT, Input.SLOT_GRANTED): frozenset({_S.DISPATCHED}),
        (_S.WAITING_SLOT, Input.TIMER): _HOP,
        (_S.BACKOFF, Input.TIMER): _HOP,
        (_S.DISPATCHED, Input.ATTEMPT_SENT): frozenset({_S.AWAITING_HEAD}),
        (_S.AWAITING_HEAD, Input.RESPONSE_HEAD): frozenset({_S.AWAITING_CONTENT, _S.READING_ERROR}),
        (_S.AWAITING_CONTENT, Input.FIRST_CONTENT): frozenset({_S.STREAMING}),
        (_S.STREAMING, Input.CONTENT): frozenset({_S.STREAMING}),
        # With resuming on, a broken or idle committed stream goes to a hop instead of the end.
        (_S.STREAMING, Input.ENDED): _HOP,
        (_S.STREAMING, Input.FAILED): frozenset({_S.DONE}),
        (_S.STREAMING, Input.TIMER): _HOP | {_S.STREAMING},
        # A late timer or disconnect after the end is a race, not a bug: both are no-ops.
        (_S.DONE, Input.TIMER): frozenset({_S.DONE}),
        (_S.DONE, Input.CLIENT_GONE): frozenset({_S.DONE}),
    }
    for state in _IN_FLIGHT:
        table[state, Input.FAILED] = _HOP
        # The idle timer fails the attempt and a slow start moves on, both to a hop; a keep-alive
        # or a slow start that finds nobody free leaves the state as it was.
        table[state, Input.TIMER] = _HOP | {state}
    for state in State:
        if state is not _S.DONE:
            table[state, Input.CLIENT_GONE] = frozenset({_S.DONE})
    return table


#: ``(state, input) → states it may lead to``. A pair missing here raises `AttemptStateError`.
TRANSITIONS: Mapping[tuple[State, Input], frozenset[State]] = _table()


# --- the machine -------------------------------------------------------------------------------


class AttemptMachine:
    """The attempt state machine of one request (see the module docstring).

    `candidates` in routing order; `arrival` is when the request arrived (the clock of
    keep-alive and of the ``wait_secs`` deadline). `rng` draws the jitter handed to
    `twengine.attempt.retry.next_backoff`, a float in [0, 1). `last_keepalive` is set when the
    client's 200 and headers went out before the machine started (while the request waited for
    its key's ``max_concurrent`` permit): when the last of them, or of the comments after them,
    did.
    """

    # Slots: one machine lives as long as its request, thousands at once (its dict was 1.4 KiB).
    __slots__ = (
        "_activity_at",
        "_arrival",
        "_backoff_until",
        "_candidates",
        "_client_stream",
        "_current",
        "_deadline",
        "_headers_sent",
        "_hops",
        "_keepalive_comments",
        "_last_failure",
        "_last_keepalive",
        "_open",
        "_overflowed_at",
        "_pending",
        "_records",
        "_resent",
        "_resume_error",
        "_resumed_from",
        "_rng",
        "_round",
        "_round_backoff_ms",
        "_round_candidates",
        "_settings",
        "_slow_start_at",
        "_state",
        "_sticky",
        "_temporary",
        "_wait_started",
        "_waited_sticky",
        "_waiting",
        "_windows",
    )

    def __init__(
        self,
        *,
        candidates: Sequence[CandidateRef],
        client_stream: bool,
        keepalive_comments: bool = True,
        arrival: float,
        settings: AttemptSettings,
        rng: Callable[[], float],
        last_keepalive: float | None = None,
    ) -> None:
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise ValueError("a candidate is listed twice")
        self._candidates = tuple(names)
        self._windows = {c.name: c.context_window for c in candidates}
        # After a context overflow: a candidate whose window is not known to be larger than this
        # is not asked (infinite when the overflowing one's window is not known).
        self._overflowed_at: float | None = None
        sticky = [c.name for c in candidates if c.sticky]
        self._sticky = sticky[0] if sticky else None
        self._client_stream = client_stream
        self._keepalive_comments = keepalive_comments
        self._arrival = arrival
        self._settings = settings
        self._rng = rng
        self._deadline = arrival + settings.wait_secs

        self._state = State.IDLE
        self._records: list[AttemptRecord] = []
        # What the attempt in flight learned (its status and times) that its record does not
        # show yet: one replace when it closes or is read, not one per stamp (`_settle`).
        self._open: dict[str, Any] = {}
        self._headers_sent = last_keepalive is not None
        # When the headers or a keep-alive went out.
        self._last_keepalive: float | None = last_keepalive

        # The current round: its candidates, those not yet tried or skipped for good, and the
        # temporary failures a retry round would repeat.
        self._round = 0
        self._round_candidates = self._candidates
        self._pending: list[str] = list(self._candidates)
        self._temporary: dict[str, Failure] = {}
        self._round_backoff_ms: int | None = None  # given to the round's first Send

        self._last_failure: tuple[int, Failure] | None = None
        self._hops: list[str] = []  # providers actually sent to, for "(tried: a → b)"

        self._current: int | None = None  # the entry in flight
        self._resent: set[ResendReason] = set()  # resends made within the current hop
        self._activity_at = 0.0  # idle timer base: dispatch, send, or latest content
        self._slow_start_at: float | None = None  # armed per attempt, cleared once checked

        # Resuming: the text the client had at the last break, and the error that break would
        # have ended the request with (when no candidate can continue).
        self._resumed_from: int | None = None
        self._resume_error: tuple[GatewayError, str] | None = None

        self._waiting: tuple[str, ...] = ()
        self._wait_started = 0.0
        self._waited_sticky = False
        self._backoff_until = 0.0

    # --- read-only views ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        """Where the request is."""
        return self._state

    @property
    def done(self) -> bool:
        """True once a terminal action has been returned."""
        return self._state is State.DONE

    @property
    def headers_sent(self) -> bool:
        """True once the client has its 200 (at first content, or early for keep-alive)."""
        return self._headers_sent

    @property
    def attempts(self) -> tuple[AttemptRecord, ...]:
        """Every attempt and skip so far, in order, for the request row."""
        self._settle()
        return tuple(self._records)

    @property
    def in_flight(self) -> str | None:
        """The provider of the attempt in flight, or None."""
        return None if self._current is None else self._records[self._current].provider

    @property
    def retry_round(self) -> int:
        """The current retry round; 0 until the first retry."""
        return self._round

    # --- inputs ------------------------------------------------------------------------------

    def start(self, now: float, *, free: Collection[str], paused: Collection[str]) -> list[Action]:
        """Choose the first hop."""
        self._check(Input.START)
        if not self._candidates:
            return self._run(
                Input.START,
                lambda: self._end_with(
                    GatewayError(
                        status=503,
                        category=ErrorCategory.CONFIG,
                        code="gw.no_upstream",
                        message="no upstream can take this request",
                    )
                ),
            )
        return self._run(Input.START, lambda: self._hop(now, free, paused))

    def slot_granted(self, provider: str, now: float) -> list[Action]:
        """A slot at `provider`, one of those `WaitForSlot` named, is now this request's."""
        self._check(Input.SLOT_GRANTED)
        if provider not in self._waiting:
            raise AttemptStateError(f"slot_granted for {provider!r}, not waited for")

        def step() -> list[Action]:
            queued = _ms(now - self._wait_started)
            self._waiting = ()
            return self._send(provider, now, queued_ms=queued)

        return self._run(Input.SLOT_GRANTED, step)

    def attempt_sent(self, now: float) -> list[Action]:
        """The request has gone out to the upstream; the idle clock restarts here."""
        self._check(Input.ATTEMPT_SENT)

        def step() -> list[Action]:
            self._stamp(sent_at=now)
            self._activity_at = now
            self._arm_slow_start(now)
            self._state = State.AWAITING_HEAD
            return []

        return self._run(Input.ATTEMPT_SENT, step)

    def response_head(self, now: float, *, status: int) -> list[Action]:
        """The response head arrived. A non-2xx `status` must be followed by `failed`."""
        self._check(Input.RESPONSE_HEAD)

        def step() -> list[Action]:
            index = self._current
            assert index is not None
            self._open["status"] = status
            if 200 <= status < 300:
                self._state = State.AWAITING_CONTENT
            else:
                # No slow start while an error body is read: it is about to be judged anyway.
                self._slow_start_at = None
                self._state = State.READING_ERROR
            return []

        return self._run(Input.RESPONSE_HEAD, step)

    def first_content(self, now: float) -> list[Action]:
        """The answer's first content arrived: commit to this upstream."""
        self._check(Input.FIRST_CONTENT)

        def step() -> list[Action]:
            provider = self._current_provider()
            self._stamp(first_content_at=now)
            self._activity_at = now
            self._slow_start_at = None
            send_headers = self._client_stream and not self._headers_sent
            self._headers_sent = self._headers_sent or send_headers
            self._state = State.STREAMING
            return [Commit(provider=provider, send_headers=send_headers)]

        return self._run(Input.FIRST_CONTENT, step)

    def content(self, now: float) -> list[Action]:
        """Another piece of content (not a keep-alive or ping): restarts the idle clock."""
        self._check(Input.CONTENT)

        def step() -> list[Action]:
            self._activity_at = now
            return []

        return self._run(Input.CONTENT, step)

    def failed(
        self, failure: Failure, now: float, *, free: Collection[str], paused: Collection[str]
    ) -> list[Action]:
        """The attempt in flight failed (error response, in-stream error, transport fault)."""
        self._check(Input.FAILED)
        return self._run(Input.FAILED, lambda: self._on_failure(failure, now, free, paused))

    def ended(
        self,
        now: float,
        *,
        clean: bool,
        resume_from: int | None = None,
        free: Collection[str] = (),
        paused: Collection[str] = (),
        too_large: bool = False,
    ) -> list[Action]:
        """The committed answer ended: cleanly, or broken off. `resume_from` is the characters
        of text the client has when the answer can be continued elsewhere (None: it cannot).
        `too_large`: it broke on an event over the provider's ``max_answer_bytes``."""
        self._check(Input.ENDED)

        def step() -> list[Action]:
            provider = self._current_provider()
            if clean:
                self._close_current(Outcome.OK, now)
                self._state = State.DONE
                return [FinishRequest(provider=provider)]
            code = (
                "gw.upstream.answer_too_large" if too_large else "gw.upstream.broken_after_content"
            )
            self._close_current(Outcome.FAILED, now, error=code)
            message = (
                f"the answer from {provider} has an event over its max_answer_bytes"
                if too_large
                else f"the answer from {provider} broke off"
            )
            error = GatewayError(
                status=502, category=ErrorCategory.UPSTREAM, code=code, message=message
            )
            resumed = self._resume(error, provider, resume_from, now, free, paused)
            return resumed if resumed is not None else self._end_with(error, provider=provider)

        return self._run(Input.ENDED, step)

    def client_gone(self, now: float) -> list[Action]:
        """The client disconnected: cancel everything; nothing counts against the upstream."""
        self._check(Input.CLIENT_GONE)

        def step() -> list[Action]:
            if self._state is State.DONE:
                return []
            actions: list[Action] = []
            if self._current is not None:
                actions.append(self._cancel_current(Outcome.CANCELLED, now))
            self._state = State.DONE
            actions.append(FinishRequest(provider=None, cancelled=True))
            return actions

        return self._run(Input.CLIENT_GONE, step)

    # --- timers ------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `on_timer` is next due, or None when no timer runs."""
        times = [t for t in (self._state_deadline(), self._keepalive_deadline()) if t is not None]
        return min(times) if times else None

    def _resume(
        self,
        error: GatewayError,
        provider: str,
        resume_from: int | None,
        now: float,
        free: Collection[str],
        paused: Collection[str],
    ) -> list[Action] | None:
        """A committed answer broke: continue it on the round's next candidate, if resuming is
        on, the answer can be continued and a candidate is left; else None."""
        if not self._settings.resume or resume_from is None or not self._pending:
            return None
        self._resumed_from = resume_from
        self._resume_error = (error, provider)
        self._last_failure = None
        self._slow_start_at = None
        return self._hop(now, free, paused)

    @property
    def resuming(self) -> bool:
        """True once a broken answer is being continued elsewhere."""
        return self._resumed_from is not None

    def on_timer(
        self,
        now: float,
        *,
        free: Collection[str],
        paused: Collection[str],
        resume_from: int | None = None,
    ) -> list[Action]:
        """Fire whatever is due at `now` (nothing if called early). `resume_from`: as for
        `ended`, for an idle timeout after content."""
        self._check(Input.TIMER)

        def step() -> list[Action]:
            actions = self._fire_state_timer(now, free, paused, resume_from)
            # Keep-alive last: if the request just ended, an error response beats a 200.
            if self._state is not State.DONE:
                actions += self._fire_keepalive(now)
            return actions

        return self._run(Input.TIMER, step)

    # --- transitions -------------------------------------------------------------------------

    def _check(self, event: Input) -> None:
        if (self._state, event) not in TRANSITIONS:
            raise AttemptStateError(f"{event.value} is not valid in state {self._state.value}")

    def _run(self, event: Input, step: Callable[[], list[Action]]) -> list[Action]:
        before = self._state
        actions = step()
        allowed = TRANSITIONS[before, event]
        if self._state not in allowed:  # a bug in this module, not in the caller
            raise RuntimeError(f"{before.value} --{event.value}--> {self._state.value}")
        return actions

    def _state_deadline(self) -> float | None:
        state = self._state
        if state is State.WAITING_SLOT:
            return self._deadline
        if state is State.BACKOFF:
            return self._backoff_until
        if state in _IN_FLIGHT or state is State.STREAMING:
            idle = self._activity_at + self._settings.idle_timeout_secs
            if self._slow_start_at is not None:
                return min(idle, self._slow_start_at)
            return idle
        return None

    def _keepalive_deadline(self) -> float | None:
        if not self._client_stream or self._state in (State.IDLE, State.STREAMING, State.DONE):
            return None
        if self._resumed_from is not None:
            return None  # keep-alives stop at first content, also while an answer is resumed
        return self._settings.keepalive_due(
            arrival=self._arrival, last=self._last_keepalive, comments=self._keepalive_comments
        )

    def _fire_keepalive(self, now: float) -> list[Action]:
        due = self._keepalive_deadline()
        if due is None or now < due:
            return []
        self._last_keepalive = now
        if not self._headers_sent:
            self._headers_sent = True
            return [Commit(provider=None, send_headers=True)]
        return [SendKeepAlive()]

    def _fire_state_timer(
        self,
        now: float,
        free: Collection[str],
        paused: Collection[str],
        resume_from: int | None = None,
    ) -> list[Action]:
        state = self._state
        if state is State.WAITING_SLOT:
            if now < self._deadline:
                return []
            # The deadline passed: every waited candidate is skipped for good unless the fresh
            # snapshot shows it free after all.
            self._waiting = ()
            return self._hop(now, free, paused, queued_since=self._wait_started)
        if state is State.BACKOFF:
            if now < self._backoff_until:
                return []
            return self._hop(now, free, paused)
        if state in _IN_FLIGHT or state is State.STREAMING:
            if now >= self._activity_at + self._settings.idle_timeout_secs:
                return self._on_idle_timeout(now, free, paused, resume_from)
            if self._slow_start_at is not None and now >= self._slow_start_at:
                self._slow_start_at = None
                return self._on_slow_start(now, free, paused)
        return []

    def _on_idle_timeout(
        self,
        now: float,
        free: Collection[str],
        paused: Collection[str],
        resume_from: int | None = None,
    ) -> list[Action]:
        failure = idle_timeout()
        if self._state is State.STREAMING:
            cancel = self._cancel_current(Outcome.FAILED, now, failure=failure)
            error = self._error_from(failure, after_content=True)
            resumed = self._resume(error, cancel.provider, resume_from, now, free, paused)
            if resumed is None:
                resumed = self._end_with(error, provider=cancel.provider)
            return [cancel, *resumed]
        cancel = self._cancel_current(Outcome.FAILED, now, failure=failure)
        return [cancel, *self._after_failure(cancel.index, failure, now, free, paused)]

    def _on_slow_start(
        self, now: float, free: Collection[str], paused: Collection[str]
    ) -> list[Action]:
        everyone_paused = self._everyone_paused(paused)
        for name in self._pending:
            if name in free and (everyone_paused or name not in paused):
                # Straight there: this is the one that can take the request at this moment.
                cancel = self._cancel_current(Outcome.SLOW_START, now)
                return [cancel, *self._send(name, now, queued_ms=0)]
        return []  # nobody can take it now: keep waiting on this one

    def _on_failure(
        self, failure: Failure, now: float, free: Collection[str], paused: Collection[str]
    ) -> list[Action]:
        provider = self._current_provider()
        if self._state is State.STREAMING:
            # After content there is no failover: the answer is this upstream's, broken.
            index = self._close_current(Outcome.FAILED, now, failure=failure)
            self._last_failure = (index, failure)
            error = self._error_from(failure, after_content=True)
            return self._end_with(error, provider=provider)
        reason = _RESEND_REASONS.get(failure.kind)
        if reason is ResendReason.EFFORT_REFUSED and not self._settings.resend_effort:
            reason = None
        if self._resumed_from is not None and refuses_prefill(failure):
            reason = ResendReason.PREFILL_REFUSED
        if reason is not None and reason not in self._resent:
            self._resent.add(reason)
            self._close_current(Outcome.RESENT, now, failure=failure)
            new = self._add(
                AttemptRecord(
                    provider=provider,
                    outcome=Outcome.IN_FLIGHT,
                    retry_round=self._round,
                    resend=reason,
                    resumed_from=self._resumed_from,
                )
            )
            self._dispatch(new, now)
            return [Resend(provider=provider, index=new, reason=reason, failure=failure)]
        index = self._close_current(Outcome.FAILED, now, failure=failure)
        return self._after_failure(index, failure, now, free, paused)

    def _after_failure(
        self,
        index: int,
        failure: Failure,
        now: float,
        free: Collection[str],
        paused: Collection[str],
    ) -> list[Action]:
        self._last_failure = (index, failure)
        if failure.temporary:
            self._temporary[self._records[index].provider] = failure
        if failure.kind is FailureKind.CONTEXT_OVERFLOW:
            self._overflowed(self._records[index].provider)
        if not failure.failover:
            return self._fail_request()
        return self._hop(now, free, paused)

    def _overflowed(self, provider: str) -> None:
        """`provider`'s context window was too small: from now on only a candidate whose window
        is known to be larger is asked; the others are skipped, and none is blamed."""
        window = self._windows.get(provider)
        size = math.inf if window is None else float(window)
        if self._overflowed_at is None or size > self._overflowed_at:
            self._overflowed_at = size
        for name in list(self._pending):
            if not self._fits(name):
                self._pending.remove(name)
                self._add(self._skip(name, AttemptSkipReason.CONTEXT_WINDOW))

    def _fits(self, name: str) -> bool:
        """Whether `name` may be asked after the context overflows so far."""
        if self._overflowed_at is None:
            return True
        window = self._windows.get(name)
        return window is not None and window > self._overflowed_at

    # --- hops --------------------------------------------------------------------------------

    def _everyone_paused(self, paused: Collection[str]) -> bool:
        return all(name in paused for name in self._round_candidates)

    def _can_wait(self, now: float) -> bool:
        return self._settings.wait_secs > 0 and now < self._deadline

    def _hop(
        self,
        now: float,
        free: Collection[str],
        paused: Collection[str],
        *,
        queued_since: float | None = None,
    ) -> list[Action]:
        """Send to the round's next candidate, wait for one, or close the round."""
        queued = _ms(now - queued_since) if queued_since is not None else 0
        everyone_paused = self._everyone_paused(paused)
        full: list[str] = []
        for name in list(self._pending):
            if name in paused and not everyone_paused:
                self._pending.remove(name)
                self._add(self._skip(name, AttemptSkipReason.PAUSED))
                continue
            if name in free:
                for passed in full:  # passed over, but still in the round
                    self._add(self._skip(passed, AttemptSkipReason.FULL, queued))
                return self._send(name, now, queued_ms=queued)
            if name == self._sticky and self._can_wait(now):
                self._waited_sticky = True
                return self._wait((name,), now)
            full.append(name)
        if full and self._can_wait(now):
            return self._wait(tuple(full), now)
        for name in full:  # too late to wait for them
            self._pending.remove(name)
            self._add(self._skip(name, AttemptSkipReason.FULL, queued))
        return self._close_round(now)

    def _skip(self, name: str, reason: AttemptSkipReason, queued_ms: int = 0) -> AttemptRecord:
        return AttemptRecord(
            provider=name,
            outcome=Outcome.SKIPPED,
            skipped=reason,
            retry_round=self._round,
            queued_ms=queued_ms,
        )

    def _wait(self, names: tuple[str, ...], now: float) -> list[Action]:
        self._waiting = names
        self._wait_started = now
        self._state = State.WAITING_SLOT
        return [WaitForSlot(providers=names, until=self._deadline)]

    def _send(self, name: str, now: float, *, queued_ms: int) -> list[Action]:
        self._pending.remove(name)
        backoff_ms, self._round_backoff_ms = self._round_backoff_ms, None
        index = self._add(
            AttemptRecord(
                provider=name,
                outcome=Outcome.IN_FLIGHT,
                retry_round=self._round,
                backoff_ms=backoff_ms,
                queued_ms=queued_ms,
                resumed_from=self._resumed_from,
            )
        )
        self._hops.append(name)
        self._resent = set()
        self._dispatch(index, now)
        return [
            Send(
                provider=name,
                index=index,
                retry_round=self._round,
                backoff_ms=backoff_ms,
                queued_ms=queued_ms,
                resumed_from=self._resumed_from,
            )
        ]

    def _dispatch(self, index: int, now: float) -> None:
        self._settle()  # what an attempt left open learned stays its own
        self._current = index
        self._stamp(sent_at=now)
        # The idle clock covers connecting too, so a hung connect cannot hang the request.
        self._activity_at = now
        self._arm_slow_start(now)
        self._state = State.DISPATCHED

    def _arm_slow_start(self, now: float) -> None:
        if self._settings.next_on_slow_start and self._client_stream:
            self._slow_start_at = now + self._settings.stream_start_wait_secs
        else:
            self._slow_start_at = None

    def _close_round(self, now: float) -> list[Action]:
        """No candidate is left in this round: retry, or end with the last failure."""
        if self._resumed_from is not None:
            # A resumed answer is not retried in rounds: the client is waiting mid-answer.
            if self._last_failure is None:
                assert self._resume_error is not None
                error, provider = self._resume_error
                return self._end_with(error, provider=provider)
            return self._fail_request()
        if self._last_failure is None:
            return self._end_busy()
        _, last = self._last_failure
        retry = [
            name for name in self._round_candidates if name in self._temporary and self._fits(name)
        ]
        if self._sticky is not None:
            retry = [name for name in retry if name == self._sticky]
        if last.temporary and retry and self._settings.wait_secs > 0:
            hints = [
                f.retry_after_secs
                for name in retry
                if (f := self._temporary[name]).retry_after_secs is not None
            ]
            pause = next_backoff(
                self._round + 1,
                max(hints) if hints else None,
                self._rng(),
                now,
                self._deadline,
            )
            if pause is not None:
                self._round += 1
                self._round_candidates = tuple(retry)
                self._pending = list(retry)
                self._temporary = {}
                self._round_backoff_ms = _ms(pause)
                self._backoff_until = now + pause
                self._state = State.BACKOFF
                return [Backoff(until=self._backoff_until, retry_round=self._round)]
        return self._fail_request()

    # --- endings -----------------------------------------------------------------------------

    def _fail_request(self) -> list[Action]:
        assert self._last_failure is not None
        index, failure = self._last_failure
        provider = self._records[index].provider
        if not self._headers_sent and passes_through(failure):
            self._settle()
            self._current = None
            self._state = State.DONE
            return [PassThroughUpstreamError(provider=provider, index=index, failure=failure)]
        return self._end_with(self._error_from(failure, after_content=False), provider=provider)

    def _end_busy(self) -> list[Action]:
        wait = f"{self._settings.wait_secs:g} s"
        if self._waited_sticky:
            code = "gw.busy_upstream"
            message = f"the upstream this conversation is held to stayed busy for {wait}"
        else:
            code = "gw.busy_all"
            message = f"every upstream for this request stayed busy for {wait}"
        return self._end_with(
            GatewayError(
                status=429,
                category=ErrorCategory.RATE_LIMITED,
                code=code,
                message=message,
                retry_after=self._settings.busy_retry_after_secs,
            )
        )

    def _error_from(self, failure: Failure, *, after_content: bool) -> GatewayError:
        return error_for_failure(failure, after_content=after_content, tried=self._hops)

    def _end_with(self, error: GatewayError, *, provider: str | None = None) -> list[Action]:
        self._settle()
        self._current = None
        self._state = State.DONE
        if self._headers_sent:
            return [EndStreamWithError(error=error, provider=provider)]
        return [RespondError(error=error, provider=provider)]

    # --- records -----------------------------------------------------------------------------

    def _add(self, record: AttemptRecord) -> int:
        self._records.append(record)
        return len(self._records) - 1

    def _current_provider(self) -> str:
        assert self._current is not None
        return self._records[self._current].provider

    def _stamp(
        self, *, sent_at: float | None = None, first_content_at: float | None = None
    ) -> None:
        assert self._current is not None
        if sent_at is not None:
            self._open["sent_at"] = sent_at
        if first_content_at is not None:
            self._open["first_content_at"] = first_content_at

    def _settle(self) -> None:
        """Write what the attempt in flight learned into its record."""
        if self._open:
            assert self._current is not None
            index = self._current
            self._records[index] = replace(self._records[index], **self._open)
            self._open = {}

    def _close_current(
        self,
        outcome: Outcome,
        now: float,
        *,
        failure: Failure | None = None,
        error: str | None = None,
    ) -> int:
        """End the attempt in flight with `outcome`; return its index."""
        index = self._current
        assert index is not None
        record = self._records[index]
        changes, self._open = self._open, {}
        if error is None and failure is not None:
            error = failure.kind.value
        status = changes.get("status", record.status)
        if failure is not None and failure.status:
            status = failure.status
        changes.update(outcome=outcome, ended_at=now, failure=failure, error=error, status=status)
        self._records[index] = replace(record, **changes)
        self._current = None
        self._slow_start_at = None
        return index

    def _cancel_current(
        self, outcome: Outcome, now: float, *, failure: Failure | None = None
    ) -> CancelAttempt:
        # A slow start is no failure, but the request row says why the attempt was dropped.
        error = "gw.slow_start" if outcome is Outcome.SLOW_START else None
        index = self._close_current(outcome, now, failure=failure, error=error)
        return CancelAttempt(
            provider=self._records[index].provider, index=index, outcome=outcome, failure=failure
        )


def _ms(secs: float) -> int:
    return max(0, round(secs * 1000))
