"""Conversations, turns and sticky upstreams."""

from __future__ import annotations

import pytest

from twengine.affinity import (
    Affinity,
    MessageKind,
    conversation_key,
    fingerprint,
    is_new_turn,
    near_context_limit,
    session_id,
)

CANDIDATES = {"a", "b"}


def book() -> Affinity[str]:
    return Affinity[str]()


# -- identity ---------------------------------------------------------------------------------


def test_session_id_from_headers_in_order() -> None:
    headers = [(b"Session_ID", b"codex-1"), (b"X-Claude-Code-Session-Id", b"cc-1")]
    assert session_id(headers) == "cc-1"
    assert session_id({"thread-id": "t", "x-session-id": "x"}) == "x"
    assert session_id([("session-id", "  ")], prompt_cache_key="pck") == "pck"
    assert session_id({}) is None
    assert session_id({"other": "v"}, prompt_cache_key="") is None


def test_fingerprint_is_stable_and_separates_fields() -> None:
    system = "You are Claude Code."
    first = "Fix the failing test."
    assert fingerprint(system, first) == fingerprint(system, first)
    assert len(fingerprint(system, first)) == 32
    assert fingerprint(system, first) != fingerprint(system, first + "!")
    assert fingerprint("ab", "c") != fingerprint("a", "bc")
    assert fingerprint("", "\ud800") == fingerprint("", "\ud800")  # lone surrogate survives


def test_fingerprint_is_the_same_on_every_turn() -> None:
    """Later turns replay the conversation's start, so its key does not move."""
    turns = [
        [("system", "sys"), ("user", "hello"), ("assistant", "hi")],
        [("system", "sys"), ("user", "hello"), ("assistant", "hi"), ("user", "more")],
    ]
    keys = set()
    for messages in turns:
        system = next(text for role, text in messages if role == "system")
        first_user = next(text for role, text in messages if role == "user")
        keys.add(conversation_key("sess", fingerprint(system, first_user)))
    assert len(keys) == 1


def test_conversation_key() -> None:
    fp = fingerprint("s", "u")
    assert conversation_key("sess", fp) == f"s:sess|f:{fp}"
    assert conversation_key(None, fp) == f"f:{fp}"
    assert conversation_key("sess", None) == "s:sess"
    assert conversation_key(None, None) is None
    # The same session running two sub-conversations keeps them apart.
    assert conversation_key("sess", fp) != conversation_key("sess", fingerprint("s", "other"))


# -- turns ------------------------------------------------------------------------------------


def test_turns() -> None:
    assert is_new_turn(MessageKind.USER)
    assert is_new_turn("assistant")
    assert is_new_turn(None)
    assert not is_new_turn(MessageKind.TOOL_RESULT)
    assert not is_new_turn("system")
    with pytest.raises(ValueError):
        is_new_turn("function")


def test_turn_decision_holds_within_the_turn() -> None:
    aff = book()
    assert aff.turn_decision("c", 0.0, new_turn=True) is None
    aff.begin_turn("c", 0.0, "rule-1")
    assert aff.turn_decision("c", 5.0, new_turn=False) == "rule-1"
    assert aff.turn_decision("c", 6.0, new_turn=True) is None
    assert aff.turn_decision("unknown", 6.0, new_turn=False) is None


def test_turn_decision_is_remade_near_the_context_window() -> None:
    aff = book()
    aff.begin_turn("c", 0.0, "rule-1")
    windows = [200_000, None, 128_000]
    assert aff.turn_decision(
        "c", 1.0, new_turn=False, input_tokens=115_000, context_windows=windows
    )
    assert (
        aff.turn_decision("c", 1.0, new_turn=False, input_tokens=115_200, context_windows=windows)
        is None
    )
    assert near_context_limit(90, [100])
    assert not near_context_limit(89, [100])
    assert not near_context_limit(None, [100])
    assert not near_context_limit(10**9, [None])


# -- stickiness -------------------------------------------------------------------------------


def test_within_a_turn_always_sticky() -> None:
    aff = book()
    aff.record_answer("c", 0.0, upstream="a", cached_tokens=0)
    # Hours later, no cache: within a turn it still holds.
    assert aff.sticky_upstream("c", 3000.0, CANDIDATES, set(), new_turn=False) == "a"


def test_across_turns_only_with_a_warm_cache() -> None:
    aff = book()
    aff.record_answer("c", 100.0, upstream="a", cached_tokens=1024)
    assert aff.sticky_upstream("c", 399.9, CANDIDATES, set(), new_turn=True) == "a"
    assert aff.sticky_upstream("c", 400.0, CANDIDATES, set(), new_turn=True) is None
    aff.record_answer("c", 500.0, upstream="a", cached_tokens=1023)
    assert aff.sticky_upstream("c", 501.0, CANDIDATES, set(), new_turn=True) is None


def test_the_last_answer_decides_including_after_failover() -> None:
    aff = book()
    aff.record_answer("c", 0.0, upstream="a", cached_tokens=50_000)
    # The next request failed over to `b`, which answered without cache.
    aff.record_answer("c", 10.0, upstream="b", cached_tokens=0)
    assert aff.sticky_upstream("c", 11.0, CANDIDATES, set(), new_turn=False) == "b"
    assert aff.sticky_upstream("c", 11.0, CANDIDATES, set(), new_turn=True) is None
    aff.record_answer("c", 20.0, upstream="b", cached_tokens=4096)
    assert aff.sticky_upstream("c", 21.0, CANDIDATES, set(), new_turn=True) == "b"


def test_paused_or_not_a_candidate_is_not_held() -> None:
    aff = book()
    aff.record_answer("c", 0.0, upstream="a", cached_tokens=5000)
    assert aff.sticky_upstream("c", 1.0, CANDIDATES, {"a"}, new_turn=False) is None
    assert aff.sticky_upstream("c", 1.0, {"b", "z"}, set(), new_turn=False) is None
    assert aff.sticky_upstream("c", 1.0, {"b", "z"}, set(), new_turn=True) is None
    assert aff.sticky_upstream("unknown", 1.0, CANDIDATES, set(), new_turn=False) is None


def test_stickiness_says_why_the_last_upstream_is_kept_or_not() -> None:
    aff = book()
    assert aff.stickiness("c", 0.0, CANDIDATES, set(), new_turn=True) == (None, None, None)
    aff.record_answer("c", 100.0, upstream="a", cached_tokens=1024)
    cases = [
        (CANDIDATES, set(), False, 101.0, ("a", "a", "same_turn")),
        (CANDIDATES, set(), True, 101.0, ("a", "a", "cache_warm")),
        (CANDIDATES, set(), True, 400.0, (None, "a", "cache_cold")),
        (CANDIDATES, {"a"}, False, 101.0, (None, "a", "paused")),
        ({"b"}, set(), False, 101.0, (None, "a", "not_a_candidate")),
    ]
    for names, paused, new_turn, now, want in cases:
        assert aff.stickiness("c", now, names, paused, new_turn=new_turn) == want
        assert aff.sticky_upstream("c", now, names, paused, new_turn=new_turn) == want[0]


def test_conversations_expire_and_are_bounded() -> None:
    aff = Affinity[str](max_conversations=3, ttl_secs=100.0)
    for i in range(5):
        aff.record_answer(f"c{i}", float(i), upstream="a", cached_tokens=0)
    assert len(aff) == 3
    assert aff.get("c0", 5.0) is None
    assert aff.get("c4", 5.0) is not None
    # Using c2 keeps it; c3 is now the least recently used.
    aff.begin_turn("c2", 6.0, "r")
    aff.record_answer("c5", 7.0, upstream="b", cached_tokens=0)
    assert aff.get("c3", 7.0) is None
    assert aff.get("c2", 7.0) is not None
    # Idle for the TTL: forgotten.
    assert aff.sticky_upstream("c4", 104.0, CANDIDATES, set(), new_turn=False) is None
    assert aff.prune(106.0) == 1  # c2 (seen at 6) goes; c5 (seen at 7) stays
    assert len(aff) == 1
    aff.forget("c5")
    assert len(aff) == 0


def test_view() -> None:
    aff = book()
    aff.begin_turn("c", 1.0, "rule")
    aff.record_answer("c", 2.0, upstream="a", cached_tokens=-5)
    view = aff.get("c", 3.0)
    assert view is not None
    assert (view.upstream, view.decision, view.turn_started_at) == ("a", "rule", 1.0)
    assert (view.answered_at, view.cached_tokens, view.seen_at) == (2.0, 0, 2.0)
