"""The attempt state machine, driven by hand with injected time: no event loop, no clock."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.attempt import (
    TERMINAL_ACTIONS,
    TRANSITIONS,
    Action,
    AttemptMachine,
    AttemptSettings,
    AttemptSkipReason,
    AttemptStateError,
    Backoff,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    FinishRequest,
    Input,
    Outcome,
    PassThroughUpstreamError,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
    State,
    WaitForSlot,
)
from twproto.errors import ErrorCategory
from twproto.failures import KIND_POLICY, Failure, FailureKind, classify_response

K = FailureKind
FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "errors"

# The status each kind typically arrives with (None: a transport fault or an in-stream error).
STATUS: dict[FailureKind, int | None] = {
    K.NO_BALANCE: 402,
    K.QUOTA_USED_UP: 429,
    K.RATE_LIMITED: 429,
    K.AUTH_REJECTED: 401,
    K.MODEL_UNAVAILABLE: 404,
    K.OVERLOADED: 529,
    K.SERVER: 500,
    K.CONNECT: None,
    K.STREAM_ENDED_EARLY: None,
    K.IDLE_TIMEOUT: None,
    K.EFFORT_REFUSED: 400,
    K.SEALED_REASONING: 400,
    K.CONTEXT_OVERFLOW: 400,
    K.CLIENT_ERROR: 400,
    K.GATEWAY_BUSY: None,
}
TYPICAL = -1  # failure(): the kind's usual status from STATUS
RESEND = {
    K.EFFORT_REFUSED: ResendReason.EFFORT_REFUSED,
    K.SEALED_REASONING: ResendReason.SEALED_REASONING,
}


def failure(
    kind: FailureKind,
    *,
    status: int | None = TYPICAL,
    retry_after: float | None = None,
    message: str = "",
) -> Failure:
    policy = KIND_POLICY[kind]
    return Failure(
        kind=kind,
        failover=policy.failover,
        temporary=policy.temporary,
        pause=policy.pause,
        status=STATUS[kind] if status == TYPICAL else status,
        retry_after_secs=retry_after,
        message=message or f"{kind.value} upstream said so",
    )


def make(
    names: Sequence[str] = ("a", "b"),
    *,
    sticky: Collection[str] = (),
    stream: bool = True,
    gemini: bool = False,
    arrival: float = 0.0,
    jitter: float = 0.5,
    windows: dict[str, int] | None = None,
    **figures: float | bool,
) -> AttemptMachine:
    sizes = windows or {}
    return AttemptMachine(
        candidates=[
            CandidateRef(name=n, sticky=n in sticky, context_window=sizes.get(n)) for n in names
        ],
        client_stream=stream,
        keepalive_comments=not gemini,
        arrival=arrival,
        settings=AttemptSettings(**figures),  # type: ignore[arg-type]  # figures by name
        rng=lambda: jitter,
    )


ALL = frozenset({"a", "b", "c"})
NONE: frozenset[str] = frozenset()


def start(
    m: AttemptMachine,
    now: float = 0.0,
    *,
    free: Collection[str] = ALL,
    paused: Collection[str] = NONE,
) -> list[Action]:
    return m.start(now, free=free, paused=paused)


def fail(
    m: AttemptMachine,
    f: Failure,
    now: float = 1.0,
    *,
    free: Collection[str] = ALL,
    paused: Collection[str] = NONE,
) -> list[Action]:
    """Carry the attempt in flight as far as `f` implies, then report it."""
    if m.state is State.DISPATCHED and f.kind is not K.CONNECT:
        m.attempt_sent(now)
    if m.state is State.AWAITING_HEAD and f.status is not None:
        m.response_head(now, status=f.status)
    return m.failed(f, now, free=free, paused=paused)


def answer(m: AttemptMachine, now: float = 1.0) -> list[Action]:
    m.attempt_sent(now)
    m.response_head(now, status=200)
    return m.first_content(now)


def timer(
    m: AttemptMachine, now: float, *, free: Collection[str] = ALL, paused: Collection[str] = NONE
) -> list[Action]:
    return m.on_timer(now, free=free, paused=paused)


def only(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


# --- the first hop -----------------------------------------------------------------------------


def test_first_hop_goes_to_the_first_candidate() -> None:
    m = make()
    assert start(m) == [Send(provider="a", index=0)]
    assert m.state is State.DISPATCHED
    assert m.attempts[0].outcome is Outcome.IN_FLIGHT
    assert m.attempts[0].sent_at == 0.0


def test_duplicate_candidates_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        make(("a", "a"))


def test_no_candidate_at_all_is_a_503() -> None:
    m = make(())
    action = only(start(m))
    assert isinstance(action, RespondError)
    assert (action.error.status, action.error.code) == (503, "gw.no_upstream")


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="idle_timeout_secs"):
        AttemptSettings(idle_timeout_secs=0)
    with pytest.raises(ValueError, match="wait_secs"):
        AttemptSettings(wait_secs=-1)


def test_settings_from_config() -> None:
    from twengine.config import Failover

    s = AttemptSettings.from_failover(
        Failover(
            idle_timeout_secs=60, wait_secs=0, next_on_slow_start=True, stream_start_wait_secs=9
        )
    )
    assert (s.idle_timeout_secs, s.wait_secs, s.next_on_slow_start, s.stream_start_wait_secs) == (
        60,
        0,
        True,
        9,
    )


# --- docs/failover.md's table, row by row -------------------------------------------------------

FAILOVER_KINDS = [k for k in K if KIND_POLICY[k].failover]


@pytest.mark.parametrize("kind", FAILOVER_KINDS)
def test_a_failover_kind_moves_to_the_next_candidate(kind: FailureKind) -> None:
    # A context overflow moves on only to a larger window (its own tests below).
    m = make(windows={"a": 8_000, "b": 128_000})
    start(m)
    assert fail(m, failure(kind)) == [Send(provider="b", index=1)]
    first = m.attempts[0]
    assert (first.outcome, first.error, first.status) == (Outcome.FAILED, kind.value, STATUS[kind])


@pytest.mark.parametrize("kind", list(RESEND))
def test_effort_and_sealed_reasoning_resend_once_to_the_same_upstream(kind: FailureKind) -> None:
    m = make()
    start(m)
    refusal = failure(kind)
    assert fail(m, refusal, 1.0) == [
        Resend(provider="a", index=1, reason=RESEND[kind], failure=refusal)
    ]
    assert m.attempts[0].outcome is Outcome.RESENT
    assert m.attempts[1].resend is RESEND[kind]
    assert m.state is State.DISPATCHED
    # A second refusal of the same kind is an ordinary failure: it does not fail over, and the
    # upstream's own 400 reaches the client.
    again = only(fail(m, failure(kind), 2.0))
    assert again == PassThroughUpstreamError(provider="a", index=1, failure=failure(kind))
    assert m.done


def test_each_resend_reason_is_used_once_per_hop() -> None:
    m = make()
    start(m)
    assert isinstance(only(fail(m, failure(K.EFFORT_REFUSED))), Resend)
    assert isinstance(only(fail(m, failure(K.SEALED_REASONING))), Resend)
    assert isinstance(only(fail(m, failure(K.EFFORT_REFUSED))), PassThroughUpstreamError)
    # The resends are not hops: the tried list would be "a" alone.
    assert [r.outcome for r in m.attempts] == [Outcome.RESENT, Outcome.RESENT, Outcome.FAILED]


def test_resend_allowance_is_fresh_on_the_next_hop() -> None:
    m = make(wait_secs=0)
    start(m)
    fail(m, failure(K.EFFORT_REFUSED))
    assert fail(m, failure(K.SERVER)) == [Send(provider="b", index=2)]
    refusal = failure(K.EFFORT_REFUSED)
    assert fail(m, refusal) == [
        Resend(provider="b", index=3, reason=ResendReason.EFFORT_REFUSED, failure=refusal)
    ]


def test_client_error_passes_the_upstreams_answer_through_without_failover() -> None:
    m = make()
    start(m)
    f = failure(K.CLIENT_ERROR)
    assert fail(m, f) == [PassThroughUpstreamError(provider="a", index=0, failure=f)]
    assert m.done
    assert m.attempts[0].outcome is Outcome.FAILED


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # Temporary failures of the last candidate start a retry round (docs/failover.md, "Retry
        # rounds").
        (K.OVERLOADED, Backoff),
        (K.SERVER, Backoff),
        (K.CONNECT, Backoff),
        (K.STREAM_ENDED_EARLY, Backoff),
        # The last candidate's own 4xx other than 429 reaches the client unchanged.
        (K.NO_BALANCE, PassThroughUpstreamError),
        (K.MODEL_UNAVAILABLE, PassThroughUpstreamError),
        (K.CLIENT_ERROR, PassThroughUpstreamError),
        # 429s and faults without a response of their own become the gateway's error.
        (K.RATE_LIMITED, RespondError),
        (K.QUOTA_USED_UP, RespondError),
        # A refusal of the gateway's credentials is written by the gateway, never passed on.
        (K.AUTH_REJECTED, RespondError),
        (K.IDLE_TIMEOUT, RespondError),
    ],
)
def test_the_last_candidates_failure(kind: FailureKind, expected: type[Action]) -> None:
    m = make(("a",), stream=False)
    start(m)
    assert isinstance(only(fail(m, failure(kind))), expected)


def test_a_rate_limit_at_the_end_is_a_429_with_retry_after() -> None:
    m = make(("a",), stream=False)
    start(m)
    action = only(fail(m, failure(K.RATE_LIMITED, retry_after=7.0)))
    assert isinstance(action, RespondError)
    err = action.error
    assert (err.status, err.category, err.retry_after) == (429, ErrorCategory.RATE_LIMITED, 7.0)


def test_an_in_stream_no_balance_error_is_the_gateways_402() -> None:
    m = make(("a",), stream=False)
    start(m)
    action = only(fail(m, failure(K.NO_BALANCE, status=None)))
    assert isinstance(action, RespondError)
    assert (action.error.status, action.error.openai_type) == (402, "insufficient_quota")


def test_an_upstream_401_does_not_read_as_the_clients_bad_key() -> None:
    m = make(("a",), stream=False)
    start(m)
    answer_head = failure(K.AUTH_REJECTED, status=None)
    action = only(fail(m, answer_head))
    assert isinstance(action, RespondError)
    assert action.error.status == 502


def test_an_overloaded_status_is_kept_in_the_final_error() -> None:
    m = make(("a", "b"), wait_secs=0)
    start(m)
    fail(m, failure(K.OVERLOADED, status=529))
    action = only(fail(m, failure(K.OVERLOADED, status=529)))
    assert isinstance(action, RespondError)
    assert action.error.status == 529


def test_an_error_event_that_opens_the_stream_has_its_own_code() -> None:
    m = make(("a",), stream=False, wait_secs=0)
    start(m)
    action = only(fail(m, failure(K.OVERLOADED, status=None)))
    assert isinstance(action, RespondError)
    # An overload keeps its status (529, overloaded_error for Anthropic clients) without one.
    assert (action.error.status, action.error.code) == (529, "gw.upstream.stream_opening_error")


def test_an_error_event_after_content_is_an_upstream_error() -> None:
    m = make()
    start(m)
    answer(m)
    action = only(m.failed(failure(K.SERVER, status=None), 5.0, free=ALL, paused=NONE))
    assert isinstance(action, EndStreamWithError)
    assert (action.error.status, action.error.code) == (502, "gw.upstream.error")


def _fixture_cases() -> list[tuple[str, int, dict[str, str], str]]:
    cases = []
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if (
            isinstance(data.get("status"), int)
            and data["status"] >= 400
            and "stream" not in path.name
        ):
            cases.append((path.name, data["status"], data.get("headers") or {}, data["body"]))
    return cases


@pytest.mark.parametrize(("name", "status", "headers", "body"), _fixture_cases())
def test_recorded_error_responses_lead_to_the_action_their_kind_calls_for(
    name: str, status: int, headers: dict[str, str], body: str
) -> None:
    f = classify_response(
        status,
        [(k.encode(), str(v).encode()) for k, v in headers.items()],
        body.encode(),
        now=1_700_000_000.0,
    )
    m = make(windows={"a": 8_000, "b": 128_000})
    start(m)
    action = only(fail(m, f))
    if f.kind in RESEND:
        assert action == Resend(provider="a", index=1, reason=RESEND[f.kind], failure=f)
    elif f.failover:
        assert action == Send(provider="b", index=1)
    else:
        assert action == PassThroughUpstreamError(provider="a", index=0, failure=f)


# --- the final message -------------------------------------------------------------------------


def test_the_final_error_names_every_upstream_tried() -> None:
    m = make(("a", "b", "c"), wait_secs=0, stream=False)
    start(m)
    fail(m, failure(K.CONNECT))
    fail(m, failure(K.AUTH_REJECTED, status=None))
    action = only(fail(m, failure(K.CONNECT, message="refused")))
    assert isinstance(action, RespondError)
    assert action.error.code == "gw.upstream.connect"
    assert action.error.message == "refused (tried: a → b → c)"


def test_a_single_attempt_has_no_tried_list() -> None:
    m = make(("a",), wait_secs=0, stream=False)
    start(m)
    action = only(fail(m, failure(K.CONNECT, message="refused")))
    assert isinstance(action, RespondError)
    assert action.error.message == "refused"


def test_skipped_candidates_are_not_listed_as_tried() -> None:
    m = make(("a", "b", "c"), wait_secs=0, stream=False)
    start(m, paused={"b"})
    fail(m, failure(K.CONNECT), paused={"b"})
    action = only(fail(m, failure(K.CONNECT, message="refused"), paused={"b"}))
    assert isinstance(action, RespondError)
    assert action.error.message.endswith("(tried: a → c)")
    assert [(r.provider, r.skipped) for r in m.attempts] == [
        ("a", None),
        ("b", AttemptSkipReason.PAUSED),
        ("c", None),
    ]


# --- pauses ------------------------------------------------------------------------------------


def test_a_paused_candidate_is_skipped() -> None:
    m = make()
    assert start(m, paused={"a"}) == [Send(provider="b", index=1)]
    skip = m.attempts[0]
    assert (skip.provider, skip.outcome, skip.skipped) == (
        "a",
        Outcome.SKIPPED,
        AttemptSkipReason.PAUSED,
    )


def test_when_every_candidate_is_paused_all_are_tried() -> None:
    m = make(wait_secs=0)
    assert start(m, paused={"a", "b"}) == [Send(provider="a", index=0)]
    assert fail(m, failure(K.SERVER), paused={"a", "b"}) == [Send(provider="b", index=1)]


def test_a_single_candidate_is_never_held_back_by_a_pause() -> None:
    m = make(("a",))
    assert start(m, paused={"a"}) == [Send(provider="a", index=0)]


def test_a_candidate_paused_by_this_requests_own_failures_is_skipped() -> None:
    m = make(("a", "b", "c"))
    start(m)
    # a's failure paused it; b is paused too, but c is not: b sits out.
    assert fail(m, failure(K.SERVER), paused={"a", "b"}) == [Send(provider="c", index=2)]


# --- full slots and waiting (docs/failover.md, "Waiting and the deadline") ------------------------


def test_a_full_candidate_is_skipped_at_once_but_stays_in_the_round() -> None:
    m = make(("a", "b"))
    assert start(m, free={"b"}) == [Send(provider="b", index=1)]
    assert m.attempts[0].skipped is AttemptSkipReason.FULL
    # b fails; a has a free slot by now and is asked.
    assert fail(m, failure(K.SERVER)) == [Send(provider="a", index=2)]


def test_when_every_candidate_is_full_the_request_waits_for_the_first_free_slot() -> None:
    m = make(("a", "b"), arrival=100.0)
    assert start(m, 100.0, free=()) == [WaitForSlot(providers=("a", "b"), until=220.0)]
    assert m.next_deadline() == 15.0 + 100.0  # keep-alive comes first for a stream
    assert m.state is State.WAITING_SLOT
    assert timer(m, 110.0, free=()) == []
    assert m.slot_granted("b", 112.5) == [Send(provider="b", index=0, queued_ms=12_500)]
    assert m.attempts[0].queued_ms == 12_500


def test_slot_granted_for_an_upstream_not_waited_for_is_a_caller_bug() -> None:
    m = make(("a", "b"))
    start(m, free={"b"})  # sent to b, nothing waited for
    with pytest.raises(AttemptStateError):
        m.slot_granted("a", 1.0)
    m2 = make(("a", "b"))
    start(m2, free=())
    with pytest.raises(AttemptStateError, match="'c'"):
        m2.slot_granted("c", 1.0)
    assert m2.state is State.WAITING_SLOT


def test_busy_all_until_the_deadline_is_a_429_with_retry_after() -> None:
    m = make(("a", "b"), stream=False)
    start(m, free=())
    assert m.next_deadline() == 120.0
    action = only(timer(m, 120.0, free=()))
    assert isinstance(action, RespondError)
    err = action.error
    assert (err.status, err.code, err.retry_after) == (429, "gw.busy_all", 5.0)
    assert [(r.outcome, r.skipped, r.queued_ms) for r in m.attempts] == [
        (Outcome.SKIPPED, AttemptSkipReason.FULL, 120_000),
        (Outcome.SKIPPED, AttemptSkipReason.FULL, 120_000),
    ]


def test_a_slot_found_free_at_the_deadline_is_still_taken() -> None:
    m = make(("a", "b"), stream=False)
    start(m, free=())
    assert timer(m, 120.0, free={"b"}) == [Send(provider="b", index=1, queued_ms=120_000)]


def test_wait_secs_zero_turns_waiting_off() -> None:
    m = make(("a", "b"), wait_secs=0, stream=False)
    action = only(start(m, free=()))
    assert isinstance(action, RespondError)
    assert action.error.code == "gw.busy_all"


def test_after_a_real_failure_the_deadline_hands_over_that_failure() -> None:
    m = make(("a", "b"), stream=False)
    start(m, free={"a"})
    f = failure(K.NO_BALANCE)
    assert fail(m, f, 3.0, free=()) == [WaitForSlot(providers=("b",), until=120.0)]
    assert only(timer(m, 120.0, free=())) == PassThroughUpstreamError(
        provider="a", index=0, failure=f
    )


def test_after_a_rate_limit_the_deadline_gives_a_429_not_busy() -> None:
    m = make(("a", "b"), stream=False)
    start(m, free={"a"})
    fail(m, failure(K.RATE_LIMITED, retry_after=30.0), free=())
    action = only(timer(m, 120.0, free=()))
    assert isinstance(action, RespondError)
    assert (action.error.code, action.error.retry_after) == ("gw.upstream.error", 30.0)


# --- sticky conversations ----------------------------------------------------------------------


def test_a_sticky_candidate_that_is_full_is_waited_for() -> None:
    m = make(("a", "b"), sticky={"a"})
    assert start(m, free={"b"}) == [WaitForSlot(providers=("a",), until=120.0)]
    assert m.slot_granted("a", 4.0) == [Send(provider="a", index=0, queued_ms=4000)]


def test_a_sticky_wait_moves_on_at_the_deadline() -> None:
    m = make(("a", "b"), sticky={"a"}, stream=False)
    start(m, free={"b"})
    assert timer(m, 120.0, free={"b"}) == [Send(provider="b", index=1, queued_ms=120_000)]
    assert (m.attempts[0].provider, m.attempts[0].skipped) == ("a", AttemptSkipReason.FULL)


def test_a_sticky_upstream_that_stays_full_is_busy_upstream() -> None:
    m = make(("a", "b"), sticky={"a"}, stream=False)
    start(m, free=())
    action = only(timer(m, 120.0, free=()))
    assert isinstance(action, RespondError)
    assert (action.error.status, action.error.code) == (429, "gw.busy_upstream")


# --- commit, content, end ----------------------------------------------------------------------


def test_first_content_commits_and_a_clean_end_finishes() -> None:
    m = make()
    start(m)
    assert answer(m, 2.0) == [Commit(provider="a", send_headers=True)]
    assert m.headers_sent
    assert m.content(3.0) == []
    assert m.ended(4.0, clean=True) == [FinishRequest(provider="a")]
    record = m.attempts[0]
    assert (record.outcome, record.status, record.first_content_at, record.ended_at) == (
        Outcome.OK,
        200,
        2.0,
        4.0,
    )
    assert m.next_deadline() is None


def test_a_whole_answer_sends_no_headers_at_commit() -> None:
    m = make(stream=False)
    start(m)
    assert answer(m) == [Commit(provider="a", send_headers=False)]
    assert not m.headers_sent


def test_no_failover_after_commit() -> None:
    m = make()
    start(m)
    answer(m)
    action = only(m.failed(failure(K.OVERLOADED), 5.0, free=ALL, paused=NONE))
    assert isinstance(action, EndStreamWithError)
    assert action.error.status == 529
    assert m.done


def test_a_break_after_content_ends_the_stream_with_an_error() -> None:
    m = make()
    start(m)
    answer(m)
    action = only(m.ended(9.0, clean=False))
    assert isinstance(action, EndStreamWithError)
    assert action.error.code == "gw.upstream.broken_after_content"
    assert m.attempts[0].error == "gw.upstream.broken_after_content"


def test_a_break_after_content_of_a_whole_answer_is_an_error_response() -> None:
    m = make(stream=False)
    start(m)
    answer(m)
    action = only(m.ended(9.0, clean=False))
    assert isinstance(action, RespondError)
    assert action.error.status == 502


def test_content_before_first_content_is_a_caller_bug() -> None:
    m = make()
    start(m)
    m.attempt_sent(1.0)
    with pytest.raises(AttemptStateError, match="content is not valid in state awaiting_head"):
        m.content(2.0)
    assert m.state is State.AWAITING_HEAD


# --- keep-alive (docs/failover.md, "Keep-alive") -----------------------------------------------


def test_keep_alive_after_15_s_then_every_15_s() -> None:
    m = make(arrival=10.0)
    start(m, 10.0)
    m.attempt_sent(10.0)
    assert m.next_deadline() == 25.0
    assert timer(m, 24.9) == []
    assert timer(m, 25.0) == [Commit(provider=None, send_headers=True)]
    assert m.next_deadline() == 40.0
    assert timer(m, 40.0) == [SendKeepAlive()]
    assert timer(m, 55.0) == [SendKeepAlive()]
    # First content: held bytes go out under the 200 already sent; keep-alives stop.
    m.response_head(60.0, status=200)
    assert m.first_content(60.0) == [Commit(provider="a", send_headers=False)]
    assert m.next_deadline() == 60.0 + 300.0


def test_gemini_clients_get_the_headers_but_no_comments() -> None:
    m = make(gemini=True)
    start(m)
    m.attempt_sent(0.0)
    assert timer(m, 15.0) == [Commit(provider=None, send_headers=True)]
    assert m.next_deadline() == 300.0  # only the idle timer is left
    assert timer(m, 30.0) == []


def test_no_keep_alive_for_a_whole_answer() -> None:
    m = make(stream=False)
    start(m)
    m.attempt_sent(0.0)
    assert m.next_deadline() == 300.0
    assert timer(m, 15.0) == []
    assert not m.headers_sent


def test_keep_alive_runs_while_waiting_for_a_slot() -> None:
    m = make(("a",))
    start(m, free=())
    assert timer(m, 15.0, free=()) == [Commit(provider=None, send_headers=True)]
    assert timer(m, 30.0, free=()) == [SendKeepAlive()]


def test_keep_alive_carries_on_from_a_wait_for_the_key() -> None:
    # The 200 and comments went out while the request waited for its key (last one at 45):
    # the machine sends no second head, and its next comment is 15 s after that last one.
    m = AttemptMachine(
        candidates=[CandidateRef(name="a", sticky=False)],
        client_stream=True,
        arrival=0.0,
        settings=AttemptSettings(),
        rng=lambda: 0.5,
        last_keepalive=45.0,
    )
    assert m.headers_sent
    start(m, 50.0)
    m.attempt_sent(50.0)
    assert m.next_deadline() == 60.0
    assert timer(m, 60.0) == [SendKeepAlive()]
    m.response_head(61.0, status=200)
    assert m.first_content(61.0) == [Commit(provider="a", send_headers=False)]


def test_keep_alive_schedule() -> None:
    s = AttemptSettings(keepalive_after=15.0, keepalive_every=10.0)
    assert s.keepalive_due(arrival=5.0, last=None, comments=True) == 20.0
    assert s.keepalive_due(arrival=5.0, last=20.0, comments=True) == 30.0
    assert s.keepalive_due(arrival=5.0, last=None, comments=False) == 20.0
    assert s.keepalive_due(arrival=5.0, last=20.0, comments=False) is None


def test_failover_continues_under_the_early_200_and_ends_the_stream_with_an_error() -> None:
    m = make(("a", "b"), wait_secs=0)
    start(m)
    timer(m, 15.0)
    assert fail(m, failure(K.CONNECT), 16.0) == [Send(provider="b", index=1)]
    action = only(fail(m, failure(K.CONNECT, message="refused"), 17.0))
    assert isinstance(action, EndStreamWithError)
    assert action.error.message == "refused (tried: a → b)"


def test_a_client_error_under_the_early_200_cannot_pass_through() -> None:
    m = make(("a",))
    start(m)
    timer(m, 15.0)
    action = only(fail(m, failure(K.CLIENT_ERROR), 16.0))
    assert isinstance(action, EndStreamWithError)
    assert action.error.status == 400


def test_busy_under_the_early_200_ends_the_stream() -> None:
    m = make(("a",))
    start(m, free=())
    timer(m, 15.0, free=())
    action = only(timer(m, 120.0, free=()))
    assert isinstance(action, EndStreamWithError)
    assert action.error.code == "gw.busy_all"


# --- idle timeout ------------------------------------------------------------------------------


def test_idle_timeout_before_content_fails_over() -> None:
    m = make(("a", "b"), stream=False)
    start(m, 0.0)
    m.attempt_sent(2.0)  # the clock restarts when the request has gone out
    assert m.next_deadline() == 302.0
    assert timer(m, 301.0) == []
    actions = timer(m, 302.0)
    cancel, send = actions
    assert isinstance(cancel, CancelAttempt)
    assert (cancel.provider, cancel.index, cancel.outcome) == ("a", 0, Outcome.FAILED)
    assert cancel.failure is not None and cancel.failure.kind is K.IDLE_TIMEOUT
    assert send == Send(provider="b", index=1)
    assert m.attempts[0].error == "idle_timeout"


def test_idle_timeout_of_the_last_candidate_is_a_504_and_not_retried() -> None:
    m = make(("a",), stream=False)
    start(m)
    m.attempt_sent(0.0)
    m.response_head(1.0, status=200)
    cancel, end = timer(m, 300.0)
    assert isinstance(cancel, CancelAttempt)
    assert isinstance(end, RespondError)
    err = end.error
    assert (err.status, err.category, err.code) == (
        504,
        ErrorCategory.TIMEOUT,
        "gw.upstream.idle_timeout",
    )


def test_idle_timeout_covers_a_hung_connect() -> None:
    m = make(("a",), stream=False)
    start(m, 5.0)
    assert m.next_deadline() == 305.0


def test_idle_timeout_after_content_ends_the_stream() -> None:
    m = make()
    start(m)
    answer(m, 100.0)
    assert m.next_deadline() == 400.0
    m.content(350.0)  # each piece of content restarts the clock
    assert timer(m, 400.0) == []
    cancel, end = timer(m, 650.0)
    assert isinstance(cancel, CancelAttempt) and cancel.failure is not None
    assert isinstance(end, EndStreamWithError)
    assert end.error.code == "gw.upstream.idle_timeout"


def test_idle_timeout_after_content_of_a_whole_answer_is_a_504() -> None:
    m = make(stream=False)
    start(m)
    answer(m, 1.0)
    _, end = timer(m, 301.0)
    assert isinstance(end, RespondError)
    assert end.error.status == 504


# --- slow-start switch -------------------------------------------------------------------------

SLOW = {"next_on_slow_start": True, "stream_start_wait_secs": 30.0}


def test_slow_start_moves_to_a_candidate_that_can_take_the_request() -> None:
    m = make(("a", "b"), keepalive_after=100.0, **SLOW)
    start(m)
    m.attempt_sent(1.0)  # the wait counts from here
    m.response_head(2.0, status=200)
    assert m.next_deadline() == 31.0
    cancel, send = timer(m, 31.0)
    assert cancel == CancelAttempt(provider="a", index=0, outcome=Outcome.SLOW_START)
    assert send == Send(provider="b", index=1)
    assert m.attempts[0].outcome is Outcome.SLOW_START
    assert m.attempts[0].error == "gw.slow_start"  # the request row's reason, not a failure


def test_slow_start_keeps_streaming_when_nobody_can_take_it() -> None:
    m = make(("a", "b"), keepalive_after=100.0, **SLOW)
    start(m, free={"a"})
    m.attempt_sent(0.0)
    assert timer(m, 30.0, free={"a"}) == []
    # Checked once: only the keep-alive and idle timers remain.
    assert m.next_deadline() == 100.0


def test_slow_start_does_not_move_to_a_paused_candidate() -> None:
    m = make(("a", "b"), keepalive_after=100.0, **SLOW)
    start(m)
    m.attempt_sent(0.0)
    assert timer(m, 30.0, paused={"b"}) == []


def test_the_last_candidate_always_waits() -> None:
    m = make(("a",), keepalive_after=100.0, **SLOW)
    start(m)
    m.attempt_sent(0.0)
    assert timer(m, 30.0) == []
    m2 = make(("a", "b"), keepalive_after=100.0, **SLOW)
    start(m2)
    fail(m2, failure(K.SERVER), 1.0)  # now on b, the last one
    m2.attempt_sent(2.0)
    assert timer(m2, 32.0) == []


def test_slow_start_is_for_streamed_requests_only() -> None:
    m = make(("a", "b"), stream=False, **SLOW)
    start(m)
    m.attempt_sent(0.0)
    assert m.next_deadline() == 300.0
    assert timer(m, 30.0) == []


def test_slow_start_is_off_by_default() -> None:
    m = make(("a", "b"), keepalive_after=100.0)
    start(m)
    m.attempt_sent(0.0)
    assert timer(m, 30.0) == []
    assert m.next_deadline() == 100.0


# --- retry rounds (docs/failover.md, "Retry rounds") ------------------------------------------


def _backoffs(jitter: float, *, wait_secs: float = 600.0, hint: float | None = None) -> list[float]:
    """The pauses of a single candidate that keeps failing with 503 until the machine stops."""
    m = make(("a",), stream=False, jitter=jitter, wait_secs=wait_secs)
    now = 0.0
    start(m, now)
    pauses = []
    while True:
        actions = fail(m, failure(K.SERVER, status=503, retry_after=hint), now)
        action = only(actions)
        if not isinstance(action, Backoff):
            assert isinstance(action, RespondError)
            assert action.error.status == 503
            return pauses
        pauses.append(action.until - now)
        assert action.retry_round == len(pauses)
        assert m.next_deadline() == action.until
        now = action.until
        send = only(timer(m, now))
        assert isinstance(send, Send)
        assert send.retry_round == len(pauses)
        assert send.backoff_ms == round(pauses[-1] * 1000)


@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.5, 0.75, 0.999999])
def test_retry_rounds_back_off_2_4_8_then_16_s_within_20_percent(jitter: float) -> None:
    pauses = _backoffs(jitter)
    bases = [2.0, 4.0, 8.0] + [16.0] * (len(pauses) - 3)
    assert len(pauses) > 5
    for pause, base in zip(pauses, bases, strict=True):
        assert 0.8 * base - 1e-9 <= pause <= 1.2 * base + 1e-9


def test_retrying_stops_when_the_next_pause_would_end_after_the_deadline() -> None:
    pauses = _backoffs(0.5, wait_secs=20.0)
    assert sum(pauses) <= 20.0
    # 2 + 4 + 8 = 14 fits; another 16 would not.
    assert len(pauses) == 3


def test_a_retry_hint_lengthens_a_pause() -> None:
    pauses = _backoffs(0.5, wait_secs=120.0, hint=10.0)
    assert pauses[0] >= 10.0


def test_each_round_retries_only_the_temporary_failures_and_records_round_and_backoff() -> None:
    m = make(("a", "b", "c"))
    start(m)
    fail(m, failure(K.SERVER), 1.0)
    fail(m, failure(K.RATE_LIMITED), 2.0)
    backoff = only(fail(m, failure(K.CONNECT), 3.0))
    assert isinstance(backoff, Backoff) and backoff.retry_round == 1
    assert timer(m, backoff.until - 0.001) == []
    first = only(timer(m, backoff.until))
    assert isinstance(first, Send)
    assert (first.provider, first.retry_round) == ("a", 1)
    assert first.backoff_ms is not None
    second = only(fail(m, failure(K.SERVER), backoff.until + 1))
    assert isinstance(second, Send)
    assert (second.provider, second.retry_round, second.backoff_ms) == ("c", 1, None)
    record = m.attempts[first.index]
    assert (record.retry_round, record.backoff_ms) == (1, first.backoff_ms)


def test_no_retry_when_the_last_attempt_failed_for_good() -> None:
    m = make(("a", "b"), stream=False)
    start(m)
    fail(m, failure(K.SERVER), 1.0)
    action = only(fail(m, failure(K.RATE_LIMITED, retry_after=3.0), 2.0))
    assert isinstance(action, RespondError)
    assert action.error.status == 429
    assert action.error.message.endswith("(tried: a → b)")


def test_a_sticky_conversation_retries_only_its_upstream() -> None:
    m = make(("a", "b"), sticky={"a"})
    start(m)
    fail(m, failure(K.SERVER), 1.0)
    backoff = only(fail(m, failure(K.SERVER), 2.0))
    assert isinstance(backoff, Backoff)
    assert only(timer(m, backoff.until)) == Send(
        provider="a", index=2, retry_round=1, backoff_ms=round((backoff.until - 2.0) * 1000)
    )
    again = only(fail(m, failure(K.SERVER), backoff.until + 1))
    assert isinstance(again, Backoff) and again.retry_round == 2


def test_a_sticky_conversation_whose_upstream_failed_for_good_is_not_retried() -> None:
    m = make(("a", "b"), sticky={"a"}, stream=False)
    start(m)
    fail(m, failure(K.RATE_LIMITED), 1.0)
    assert isinstance(only(fail(m, failure(K.SERVER), 2.0)), RespondError)


def test_wait_secs_zero_turns_retrying_off() -> None:
    m = make(("a",), wait_secs=0, stream=False)
    start(m)
    assert isinstance(only(fail(m, failure(K.SERVER))), RespondError)


# --- the client leaves -------------------------------------------------------------------------


def test_client_gone_cancels_the_attempt_without_blame() -> None:
    m = make()
    start(m)
    m.attempt_sent(1.0)
    assert m.client_gone(2.0) == [
        CancelAttempt(provider="a", index=0, outcome=Outcome.CANCELLED),
        FinishRequest(provider=None, cancelled=True),
    ]
    assert m.attempts[0].outcome is Outcome.CANCELLED
    assert m.done
    assert m.client_gone(3.0) == []  # a late second notice is harmless
    assert timer(m, 400.0) == []


def test_client_gone_after_commit_cancels_the_stream() -> None:
    m = make()
    start(m)
    answer(m)
    cancel, finish = m.client_gone(5.0)
    assert isinstance(cancel, CancelAttempt) and cancel.failure is None
    assert finish == FinishRequest(provider=None, cancelled=True)


@pytest.mark.parametrize("free", [(), ("x",)])
def test_client_gone_while_waiting_has_nothing_to_cancel(free: tuple[str, ...]) -> None:
    m = make(("a",))
    start(m, free=free)
    assert m.client_gone(1.0) == [FinishRequest(provider=None, cancelled=True)]


# --- the transition table ----------------------------------------------------------------------


def _in_state(state: State) -> AttemptMachine:
    m = make(("a",), stream=False)
    if state is State.IDLE:
        return m
    if state is State.WAITING_SLOT:
        start(m, free=())
        return m
    start(m)
    if state is State.BACKOFF:
        fail(m, failure(K.SERVER))
    elif state is State.DONE:
        m.client_gone(0.0)
    elif state is not State.DISPATCHED:
        m.attempt_sent(0.0)
        if state is State.AWAITING_CONTENT:
            m.response_head(0.0, status=200)
        elif state is State.READING_ERROR:
            m.response_head(0.0, status=500)
        elif state is State.STREAMING:
            m.response_head(0.0, status=200)
            m.first_content(0.0)
    assert m.state is state
    return m


def _feed(m: AttemptMachine, event: Input, now: float) -> list[Action]:
    kw = {"free": ALL, "paused": NONE}
    match event:
        case Input.START:
            return m.start(now, **kw)
        case Input.SLOT_GRANTED:
            return m.slot_granted("a", now)
        case Input.ATTEMPT_SENT:
            return m.attempt_sent(now)
        case Input.RESPONSE_HEAD:
            return m.response_head(now, status=200)
        case Input.FIRST_CONTENT:
            return m.first_content(now)
        case Input.CONTENT:
            return m.content(now)
        case Input.FAILED:
            return m.failed(failure(K.SERVER), now, **kw)
        case Input.ENDED:
            return m.ended(now, clean=True)
        case Input.CLIENT_GONE:
            return m.client_gone(now)
        case Input.TIMER:
            return m.on_timer(now, **kw)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", list(Input))
def test_every_state_input_pair_follows_the_table(state: State, event: Input) -> None:
    m = _in_state(state)
    before = (m.state, m.attempts)
    if (state, event) not in TRANSITIONS:
        with pytest.raises(AttemptStateError):
            _feed(m, event, 1.0)
        assert (m.state, m.attempts) == before
    else:
        _feed(m, event, 1.0)
        assert m.state in TRANSITIONS[state, event]


def test_timer_before_start_is_a_caller_bug() -> None:
    m = make()
    assert m.next_deadline() is None
    with pytest.raises(AttemptStateError):
        timer(m, 1.0)


# --- any sequence of inputs --------------------------------------------------------------------

names_st = st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True)
subset_st = st.frozensets(st.sampled_from("abcd"))
kind_st = st.sampled_from(list(K))


@settings(max_examples=300, deadline=None)
@given(
    names=names_st,
    sticky=st.booleans(),
    stream=st.booleans(),
    gemini=st.booleans(),
    slow=st.booleans(),
    wait_secs=st.sampled_from([0.0, 20.0, 120.0]),
    jitter=st.floats(0.0, 0.999),
    data=st.data(),
)
def test_any_sequence_of_inputs_keeps_the_invariants(
    names: list[str],
    sticky: bool,
    stream: bool,
    gemini: bool,
    slow: bool,
    wait_secs: float,
    jitter: float,
    data: st.DataObject,
) -> None:
    m = make(
        names,
        sticky={names[0]} if sticky else set(),
        stream=stream,
        gemini=gemini,
        jitter=jitter,
        wait_secs=wait_secs,
        next_on_slow_start=slow,
        stream_start_wait_secs=20.0,
        idle_timeout_secs=60.0,
    )
    now = 0.0
    committed_to: str | None = None
    terminal_seen = False
    for _ in range(data.draw(st.integers(1, 40))):
        now += data.draw(st.sampled_from([0.0, 0.5, 5.0, 15.0, 30.0, 61.0]))
        due = m.next_deadline()
        if due is not None and data.draw(st.booleans()):
            now = max(now, due)  # often land exactly on a deadline
        free = data.draw(subset_st)
        paused = data.draw(subset_st)
        event = data.draw(st.sampled_from(list(Input)))
        before = (m.state, m.attempts)
        try:
            if event is Input.FAILED:
                f = failure(
                    data.draw(kind_st), status=data.draw(st.sampled_from([None, 400, 429, 503]))
                )
                actions = m.failed(f, now, free=free, paused=paused)
            elif event is Input.SLOT_GRANTED:
                actions = m.slot_granted(data.draw(st.sampled_from(names)), now)
            elif event is Input.RESPONSE_HEAD:
                actions = m.response_head(now, status=data.draw(st.sampled_from([200, 500])))
            elif event is Input.ENDED:
                actions = m.ended(now, clean=data.draw(st.booleans()))
            elif event is Input.START:
                actions = m.start(now, free=free, paused=paused)
            elif event is Input.TIMER:
                actions = m.on_timer(now, free=free, paused=paused)
            else:
                actions = _feed(m, event, now)
        except AttemptStateError:
            assert (m.state, m.attempts) == before  # a refused input changes nothing
            continue
        assert m.state in TRANSITIONS[before[0], event]
        for i, action in enumerate(actions):
            if isinstance(action, TERMINAL_ACTIONS):
                assert not terminal_seen, "two terminal actions"
                assert i == len(actions) - 1, "a terminal action is the last"
                terminal_seen = True
            if isinstance(action, Send | Resend | WaitForSlot | Backoff):
                assert committed_to is None, "no new hop after commit"
            if isinstance(action, Send | Resend):
                assert action.provider in names
                assert m.attempts[action.index].provider == action.provider
            if isinstance(action, Send) and event is not Input.SLOT_GRANTED:
                assert action.provider in free
            if isinstance(action, Commit) and action.provider is not None:
                committed_to = action.provider
            if isinstance(action, SendKeepAlive):
                assert stream and not gemini
            if isinstance(action, PassThroughUpstreamError):
                assert not m.headers_sent
        assert m.done == terminal_seen
        in_flight = [r for r in m.attempts if r.outcome is Outcome.IN_FLIGHT]
        assert len(in_flight) <= (0 if m.done else 1)
        assert (m.next_deadline() is None) == (m.state in (State.IDLE, State.DONE))
        if m.headers_sent:
            assert stream


@pytest.mark.parametrize("status", [401, 403, 400, None])
def test_an_upstream_credential_refusal_is_the_gateways_own_words(status: int | None) -> None:
    # An upstream that echoes the key it was sent must not hand it to the client.
    m = make(("a", "b"), stream=False, wait_secs=0)
    start(m)
    leaked = failure(K.AUTH_REJECTED, status=status, message="bad key sk-SECRET-9")
    fail(m, leaked)
    action = only(fail(m, leaked))
    assert isinstance(action, RespondError)
    err = action.error
    assert (err.status, err.code) == (502, "gw.upstream.auth_rejected")
    assert "SECRET" not in err.message and "credentials" in err.message
    assert err.message.endswith("(tried: a → b)")


# --- context overflow ----------------------------------------------------------------------------


def test_a_context_overflow_moves_on_to_a_larger_window_only() -> None:
    m = make(
        ("a", "b", "c", "d"), windows={"a": 128_000, "b": 64_000, "c": 128_000, "d": 1_000_000}
    )
    start(m, free={"a", "b", "c", "d"})
    overflow = failure(K.CONTEXT_OVERFLOW)
    actions = fail(m, overflow, free={"a", "b", "c", "d"})
    # b and c are not larger than a: skipped; d is asked.
    assert actions == [Send(provider="d", index=3)]
    assert [(r.provider, r.outcome, r.skipped) for r in m.attempts] == [
        ("a", Outcome.FAILED, None),
        ("b", Outcome.SKIPPED, AttemptSkipReason.CONTEXT_WINDOW),
        ("c", Outcome.SKIPPED, AttemptSkipReason.CONTEXT_WINDOW),
        ("d", Outcome.IN_FLIGHT, None),
    ]
    # Nobody is blamed: the failure carries no pause and is not temporary.
    assert m.attempts[0].failure == overflow
    assert overflow.pause.value == "none" and not overflow.temporary


def test_a_context_overflow_with_none_larger_is_the_upstreams_error_as_before() -> None:
    m = make(("a", "b"), windows={"a": 200_000, "b": 128_000})
    start(m)
    overflow = failure(K.CONTEXT_OVERFLOW)
    assert fail(m, overflow) == [PassThroughUpstreamError(provider="a", index=0, failure=overflow)]
    assert m.attempts[1].skipped is AttemptSkipReason.CONTEXT_WINDOW


def test_an_unknown_window_is_never_taken_for_a_larger_one() -> None:
    # The overflowing model's window is not known: nothing is known to be larger.
    m = make(("a", "b"), windows={"b": 1_000_000})
    start(m)
    assert isinstance(only(fail(m, failure(K.CONTEXT_OVERFLOW))), PassThroughUpstreamError)
    # A candidate whose window is not known is not asked either.
    m = make(("a", "b", "c"), windows={"a": 8_000, "c": 32_000})
    start(m)
    assert fail(m, failure(K.CONTEXT_OVERFLOW)) == [Send(provider="c", index=2)]


def test_a_second_overflow_raises_the_bar_again() -> None:
    m = make(("a", "b", "c"), windows={"a": 8_000, "b": 32_000, "c": 16_000})
    start(m)
    assert fail(m, failure(K.CONTEXT_OVERFLOW)) == [Send(provider="b", index=1)]
    # c (16k) was larger than a but is not larger than b.
    last = failure(K.CONTEXT_OVERFLOW, message="still too long")
    assert fail(m, last) == [PassThroughUpstreamError(provider="b", index=1, failure=last)]


def test_an_overflow_under_the_early_200_ends_the_stream_naming_its_upstream() -> None:
    m = make(("a", "b"), windows={"a": 8_000, "b": 4_000})
    start(m)
    m.attempt_sent(0.0)
    m.on_timer(15.0, free=ALL, paused=NONE)  # the early 200
    action = only(fail(m, failure(K.CONTEXT_OVERFLOW), 16.0))
    assert isinstance(action, EndStreamWithError) and action.provider == "a"
    assert action.error.status == 400


def test_a_retry_round_leaves_out_windows_known_too_small() -> None:
    m = make(("a", "b", "c"), windows={"a": 8_000, "b": 16_000, "c": 64_000})
    start(m)
    # a fails temporarily, b overflows, c fails temporarily: the retry round holds c alone, as
    # a's window is smaller than b's.
    assert fail(m, failure(K.SERVER)) == [Send(provider="b", index=1)]
    assert fail(m, failure(K.CONTEXT_OVERFLOW)) == [Send(provider="c", index=2)]
    backoff = only(fail(m, failure(K.SERVER), 2.0))
    assert isinstance(backoff, Backoff)
    assert m.on_timer(backoff.until, free=ALL, paused=NONE) == [
        Send(provider="c", index=3, retry_round=1, backoff_ms=round((backoff.until - 2.0) * 1000))
    ]


def test_errors_name_the_upstream_whose_failure_they_report() -> None:
    m = make(("a", "b"), wait_secs=0, stream=False)
    start(m)
    fail(m, failure(K.SERVER))
    action = only(fail(m, failure(K.RATE_LIMITED)))
    assert isinstance(action, RespondError) and action.provider == "b"
    # The gateway's own answers name none.
    busy = make(("a",), wait_secs=0)
    action = only(start(busy, free=NONE))
    assert isinstance(action, RespondError) and action.provider is None


def test_the_attempt_in_flight_shows_what_it_learned_before_it_closes() -> None:
    # The machine keeps the in-flight attempt's status and times aside and writes them into its
    # record once (when it closes, or when the attempts are read): a read mid-way sees them.
    m = make(["a"])
    start(m)
    m.attempt_sent(0.5)
    m.response_head(0.6, status=200)
    (record,) = m.attempts
    assert (record.provider, record.sent_at, record.status) == ("a", 0.5, 200)
    assert record.first_content_at is None and record.ended_at is None
    m.first_content(0.7)
    m.ended(2.0, clean=True)
    (record,) = m.attempts
    assert (record.sent_at, record.first_content_at, record.status) == (0.5, 0.7, 200)
    assert (record.outcome, record.ended_at) == (Outcome.OK, 2.0)


def test_a_failure_status_overrides_the_heads_and_the_next_attempt_starts_clean() -> None:
    m = make(["a", "b"])
    start(m)
    m.attempt_sent(0.5)
    m.response_head(0.6, status=503)
    m.failed(failure(K.OVERLOADED, status=529), 0.7, free=ALL, paused=NONE)
    m.attempt_sent(0.8)
    first, second = m.attempts
    assert (first.status, first.sent_at, first.ended_at) == (529, 0.5, 0.7)
    assert (second.provider, second.sent_at, second.status, second.ended_at) == (
        "b",
        0.8,
        None,
        None,
    )
