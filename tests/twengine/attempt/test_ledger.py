"""The attempt ledger: the slot and health bookkeeping each machine action implies, as actions."""

from __future__ import annotations

from typing import Any

from twengine.attempt import (
    AcquireSlot,
    AttemptLedger,
    AttemptSettings,
    Backoff,
    CancelAttempt,
    CancelWait,
    CandidateRef,
    Commit,
    FinishRequest,
    LedgerAction,
    Outcome,
    RecordFailure,
    RecordSuccess,
    ReleaseSlot,
    Resend,
    RespondError,
    Send,
    WaitForSlot,
)
from twproto.failures import Failure, FailureKind, PauseRule

SERVER = Failure(
    kind=FailureKind.SERVER, failover=True, temporary=True, pause=PauseRule.UNEXPLAINED, status=500
)
EFFORT = Failure(
    kind=FailureKind.EFFORT_REFUSED,
    failover=False,
    temporary=False,
    pause=PauseRule.NONE,
    status=400,
)


def ledger(*names: str, takes_slots: bool = True, **settings: Any) -> AttemptLedger:
    return AttemptLedger(
        candidates=[CandidateRef(name=n) for n in names],
        client_stream=True,
        keepalive_comments=True,
        arrival=0.0,
        settings=AttemptSettings(**settings),
        rng=lambda: 0.5,
        takes_slots=takes_slots,
    )


def kinds(actions: list[LedgerAction]) -> list[str]:
    return [type(a).__name__ for a in actions]


def to_content(book: AttemptLedger, now: float = 1.0) -> list[LedgerAction]:
    return [
        *book.attempt_sent(now),
        *book.response_head(now, status=200),
        *book.first_content(now + 0.5),
    ]


def test_a_send_takes_a_slot_and_a_clean_end_records_and_gives_it_back() -> None:
    book = ledger("a")
    assert book.start(0.0, free={"a"}, paused=set()) == [
        AcquireSlot(provider="a"),
        Send(provider="a", index=0),
    ]
    assert book.holding == {"a"}
    assert kinds(to_content(book)) == ["Commit"]
    assert book.ended(3.0, clean=True) == [
        RecordSuccess(provider="a", first_content_secs=0.5),
        FinishRequest(provider="a"),
        ReleaseSlot(provider="a"),
    ]
    assert book.holding == frozenset()


def test_a_failure_is_recorded_and_its_slot_freed_before_the_next_hop() -> None:
    book = ledger("a", "b")
    book.start(0.0, free={"a", "b"}, paused=set())
    book.attempt_sent(0.1)
    assert book.failed(SERVER, 0.2, free={"b"}, paused=set()) == [
        RecordFailure(provider="a", failure=SERVER),
        ReleaseSlot(provider="a"),
        AcquireSlot(provider="b"),
        Send(provider="b", index=1),
    ]


def test_a_resend_keeps_its_slot() -> None:
    book = ledger("a")
    book.start(0.0, free={"a"}, paused=set())
    book.attempt_sent(0.1)
    actions = book.failed(EFFORT, 0.2, free=set(), paused=set())
    assert kinds(actions) == ["RecordFailure", "Resend"]
    assert isinstance(actions[1], Resend)
    assert book.holding == {"a"}


def test_a_slow_start_switch_moves_the_slot() -> None:
    book = ledger("a", "b", next_on_slow_start=True, stream_start_wait_secs=1.0)
    book.start(0.0, free={"a", "b"}, paused=set())
    book.attempt_sent(0.0)
    actions = book.on_timer(1.0, free={"b"}, paused=set())
    assert kinds(actions) == ["CancelAttempt", "ReleaseSlot", "AcquireSlot", "Send"]


def test_an_idle_timeout_is_recorded_after_its_cancel() -> None:
    book = ledger("a", "b", idle_timeout_secs=5)
    book.start(0.0, free={"a", "b"}, paused=set())
    book.attempt_sent(0.0)
    actions = book.on_timer(5.0, free={"b"}, paused=set())
    assert kinds(actions) == [
        "CancelAttempt",
        "RecordFailure",
        "ReleaseSlot",
        "AcquireSlot",
        "Send",
    ]
    cancel = actions[0]
    assert isinstance(cancel, CancelAttempt) and cancel.outcome is Outcome.FAILED
    # Silent from the send to the timeout: a slow upstream too, sampled at its whole wait.
    record = actions[1]
    assert isinstance(record, RecordFailure) and record.first_content_secs == 5.0


def test_an_idle_timeout_after_content_is_no_speed_sample() -> None:
    book = ledger("a", idle_timeout_secs=5)
    book.start(0.0, free={"a"}, paused=set())
    to_content(book, now=0.0)
    actions = book.on_timer(5.5, free=set(), paused=set())
    (record,) = [a for a in actions if isinstance(a, RecordFailure)]
    assert record.first_content_secs is None  # its first content came at 0.5 s


def test_a_whole_answers_idle_timeout_is_no_speed_sample() -> None:
    book = AttemptLedger(
        candidates=[CandidateRef(name="a"), CandidateRef(name="b")],
        client_stream=False,
        keepalive_comments=True,
        arrival=0.0,
        settings=AttemptSettings(idle_timeout_secs=5),
        rng=lambda: 0.5,
    )
    book.start(0.0, free={"a", "b"}, paused=set())
    book.attempt_sent(0.0)
    actions = book.on_timer(5.0, free={"b"}, paused=set())
    (record,) = [a for a in actions if isinstance(a, RecordFailure)]
    assert record.first_content_secs is None  # samples are of streamed answers


def test_a_wait_that_ends_without_a_grant_cancels_its_ticket() -> None:
    book = ledger("a", wait_secs=2)
    assert kinds(book.start(0.0, free=set(), paused=set())) == ["WaitForSlot"]
    actions = book.on_timer(2.0, free=set(), paused=set())
    assert isinstance(actions[0], CancelWait)
    assert isinstance(actions[-1], RespondError) and actions[-1].error.code == "gw.busy_all"


def test_a_grant_is_held_and_a_late_one_goes_back() -> None:
    book = ledger("a", wait_secs=2)
    start = book.start(0.0, free=set(), paused=set())
    assert start == [WaitForSlot(providers=("a",), until=2.0)]
    assert book.slot_granted("a", 0.5) == [Send(provider="a", index=0, queued_ms=500)]
    assert book.holding == {"a"}
    assert book.slot_granted("a", 0.6) == [ReleaseSlot(provider="a")]


def test_a_client_that_leaves_gives_back_the_slot_and_the_ticket() -> None:
    book = ledger("a", "b", wait_secs=2)
    book.start(0.0, free={"a"}, paused=set())
    book.attempt_sent(0.0)
    assert book.client_gone(0.5) == [
        CancelAttempt(provider="a", index=0, outcome=Outcome.CANCELLED),
        ReleaseSlot(provider="a"),
        FinishRequest(provider=None, cancelled=True),
    ]
    waiting = ledger("a", wait_secs=2)
    waiting.start(0.0, free=set(), paused=set())
    assert kinds(waiting.client_gone(0.5)) == ["CancelWait", "FinishRequest"]


def test_a_backoff_holds_no_slot() -> None:
    book = ledger("a", wait_secs=60)
    book.start(0.0, free={"a"}, paused=set())
    book.attempt_sent(0.0)
    actions = book.failed(SERVER, 0.1, free={"a"}, paused=set())
    assert kinds(actions) == ["RecordFailure", "ReleaseSlot", "Backoff"]
    backoff = actions[-1]
    assert isinstance(backoff, Backoff)
    assert kinds(book.on_timer(backoff.until, free={"a"}, paused=set())) == ["AcquireSlot", "Send"]


def test_requests_without_slots_take_none_and_see_every_candidate_free() -> None:
    book = ledger("a", takes_slots=False)
    assert book.start(0.0, free=set(), paused=set()) == [Send(provider="a", index=0)]
    to_content(book)
    assert kinds(book.ended(1.0, clean=True)) == ["RecordSuccess", "FinishRequest"]


def test_a_whole_answer_reports_no_first_content_time() -> None:
    book = AttemptLedger(
        candidates=[CandidateRef(name="a")],
        client_stream=False,
        keepalive_comments=True,
        arrival=0.0,
        settings=AttemptSettings(),
        rng=lambda: 0.5,
    )
    book.start(0.0, free={"a"}, paused=set())
    assert isinstance(to_content(book)[0], Commit)
    assert book.ended(1.0, clean=True)[0] == RecordSuccess(provider="a", first_content_secs=None)
