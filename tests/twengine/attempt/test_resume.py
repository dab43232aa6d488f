"""The attempt machine and ledger resuming a broken stream on the next candidate (docs/failover.md,
"Resuming a broken stream"): driven by hand with injected time."""

from __future__ import annotations

from tests.twengine.attempt.test_machine import (
    ALL,
    K,
    answer,
    fail,
    failure,
    make,
    only,
    start,
    timer,
)
from twengine.attempt import (
    AcquireSlot,
    AttemptLedger,
    AttemptSettings,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    FinishRequest,
    Outcome,
    ReleaseSlot,
    Resend,
    ResendReason,
    Send,
    State,
)
from twproto.failures import Failure, classify_response

PREFILL_400 = (
    b'{"type":"error","error":{"type":"invalid_request_error","message":"This model does not '
    b'support assistant message prefill. The conversation must end with a user message."}}'
)


def _prefill_refusal() -> Failure:
    return classify_response(400, [], PREFILL_400, now=0.0)


def test_a_break_with_resume_on_sends_the_next_candidate() -> None:
    m = make(("a", "b", "c"), resume=True)
    start(m)
    answer(m)
    actions = m.ended(5.0, clean=False, resume_from=12, free=ALL, paused=())
    assert actions == [Send(provider="b", index=1, resumed_from=12)]
    assert m.state is State.DISPATCHED and m.resuming
    broken, resumed = m.attempts
    assert (broken.outcome, broken.error) == (Outcome.FAILED, "gw.upstream.broken_after_content")
    assert resumed.resumed_from == 12
    # The continuing upstream's first content commits without another 200.
    assert answer(m, 6.0) == [Commit(provider="b", send_headers=False)]
    assert m.ended(7.0, clean=True) == [FinishRequest(provider="b")]


def test_a_break_ends_the_stream_without_resume_or_without_a_resume_point() -> None:
    for settings, resume_from in (({}, 12), ({"resume": True}, None)):
        m = make(("a", "b"), **settings)
        start(m)
        answer(m)
        action = only(m.ended(5.0, clean=False, resume_from=resume_from, free=ALL, paused=()))
        assert isinstance(action, EndStreamWithError)
        assert action.error.code == "gw.upstream.broken_after_content"


def test_a_break_on_the_last_candidate_ends_the_stream() -> None:
    m = make(("a",), resume=True)
    start(m)
    answer(m)
    action = only(m.ended(5.0, clean=False, resume_from=3, free=ALL, paused=()))
    assert isinstance(action, EndStreamWithError)


def test_an_idle_answer_is_cancelled_and_resumed() -> None:
    m = make(("a", "b"), resume=True, idle_timeout_secs=30.0)
    start(m)
    answer(m)
    m.content(2.0)
    assert m.on_timer(40.0, free=ALL, paused=(), resume_from=8) == [
        CancelAttempt(provider="a", index=0, outcome=Outcome.FAILED, failure=m.attempts[0].failure),
        Send(provider="b", index=1, resumed_from=8),
    ]
    assert m.attempts[0].error == "idle_timeout"


def test_a_continuing_attempt_that_fails_moves_on_without_retry_rounds() -> None:
    m = make(("a", "b", "c"), resume=True)
    start(m)
    answer(m)
    m.ended(5.0, clean=False, resume_from=4, free=ALL, paused=())
    # b is overloaded (temporary): the resume moves on to c, as any failover.
    assert fail(m, failure(K.OVERLOADED), 6.0) == [Send(provider="c", index=2, resumed_from=4)]
    # c fails temporarily too: no retry round while the client waits mid-answer.
    action = only(fail(m, failure(K.OVERLOADED), 7.0))
    assert isinstance(action, EndStreamWithError)
    assert action.error.status == 529


def test_a_paused_rest_of_the_round_ends_with_the_break() -> None:
    m = make(("a", "b"), resume=True)
    start(m, paused={"b"})
    answer(m)
    action = only(m.ended(5.0, clean=False, resume_from=4, free=ALL, paused={"b"}))
    assert isinstance(action, EndStreamWithError)
    assert action.error.code == "gw.upstream.broken_after_content"


def test_a_refused_prefill_is_resent_once_without_it() -> None:
    refusal = _prefill_refusal()
    m = make(("a", "b"), resume=True)
    start(m)
    answer(m)
    m.ended(5.0, clean=False, resume_from=4, free=ALL, paused=())
    assert fail(m, refusal, 6.0) == [
        Resend(provider="b", index=2, reason=ResendReason.PREFILL_REFUSED, failure=refusal)
    ]
    assert m.attempts[1].outcome is Outcome.RESENT
    assert m.attempts[2].resumed_from == 4
    # Refused again: the request's 400 is not passed through (the 200 is out), it is an event.
    action = only(fail(m, refusal, 7.0))
    assert isinstance(action, EndStreamWithError)
    assert action.error.status == 400


def test_a_prefill_refusal_outside_a_resume_is_an_ordinary_client_error() -> None:
    m = make(("a", "b"), resume=True)
    start(m)
    action = only(fail(m, _prefill_refusal(), 1.0))
    assert not isinstance(action, Resend)


def test_no_keepalive_while_an_answer_is_resumed() -> None:
    m = make(("a", "b"), resume=True)
    start(m)
    answer(m)
    m.ended(5.0, clean=False, resume_from=4, free=ALL, paused=())
    m.attempt_sent(5.0)
    assert timer(m, 200.0) == []  # long after a keep-alive would have been due
    assert m.state is State.AWAITING_HEAD


def test_for_request_turns_resume_on() -> None:
    base = AttemptSettings()
    assert base.for_request(counting=False, budget_only=False, resume=True).resume
    assert not base.for_request(counting=False, budget_only=False).resume
    both = base.for_request(counting=False, budget_only=True, resume=True)
    assert both.resume and not both.resend_effort


def test_the_ledger_gives_the_broken_answers_slot_back_at_the_resume() -> None:
    ledger = AttemptLedger(
        candidates=[CandidateRef(name="a"), CandidateRef(name="b")],
        client_stream=True,
        keepalive_comments=True,
        arrival=0.0,
        settings=AttemptSettings(resume=True),
        rng=lambda: 0.5,
    )
    assert ledger.start(0.0, free=ALL, paused=())[0] == AcquireSlot(provider="a")
    ledger.attempt_sent(0.0)
    ledger.response_head(0.0, status=200)
    ledger.first_content(1.0)
    actions = ledger.ended(2.0, clean=False, resume_from=3, free=ALL, paused=())
    assert actions == [
        ReleaseSlot(provider="a"),
        AcquireSlot(provider="b"),
        Send(provider="b", index=1, resumed_from=3),
    ]
    assert ledger.holding == frozenset({"b"})
