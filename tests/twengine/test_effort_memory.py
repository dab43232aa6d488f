"""Effort memory: remembered choices, their expiry, and dropping them when an upstream changes."""

from __future__ import annotations

import json

from twengine.effort_memory import (
    EFFORT_MEMORY_TTL_SECS,
    EffortKey,
    EffortMemory,
    upstream_identity,
)

KEY = EffortKey(upstream="a", model="m", client_format="anthropic", level="xhigh")
ID_A = upstream_identity("https://a.example", "anthropic", "sk-1")


def test_remember_and_recall() -> None:
    memory = EffortMemory()
    assert memory.recall(KEY, now=0.0, identity=ID_A) is None
    assert memory.remember(KEY, "high", now=10.0, identity=ID_A)
    assert not memory.remember(KEY, "high", now=11.0, identity=ID_A)  # nothing new to persist
    assert memory.recall(KEY, now=20.0, identity=ID_A) == "high"
    # Another model, format or level asked is another entry.
    assert (
        memory.recall(
            EffortKey(upstream="a", model="m", client_format="openai-chat", level="xhigh"),
            now=20.0,
            identity=ID_A,
        )
        is None
    )


def test_expires_after_seven_days() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    assert EFFORT_MEMORY_TTL_SECS == 7 * 24 * 3600
    assert memory.recall(KEY, now=EFFORT_MEMORY_TTL_SECS - 1, identity=ID_A) == "high"
    assert memory.recall(KEY, now=EFFORT_MEMORY_TTL_SECS, identity=ID_A) is None
    assert len(memory) == 0


def test_identity_covers_address_protocol_and_key() -> None:
    others = {
        upstream_identity("https://b.example", "anthropic", "sk-1"),
        upstream_identity("https://a.example", "openai-chat", "sk-1"),
        upstream_identity("https://a.example", "anthropic", "sk-2"),
    }
    assert ID_A not in others and len(others) == 3
    assert "sk-1" not in ID_A
    assert upstream_identity("https://a.example/", "anthropic", "sk-1") == ID_A


def test_changed_or_removed_upstreams_are_forgotten() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    other = EffortKey(upstream="b", model="m", client_format="anthropic", level="max")
    memory.remember(other, "off", now=0.0, identity="id-b")
    assert not memory.keep_only({"a": ID_A, "b": "id-b"})
    assert memory.keep_only({"a": ID_A})  # b removed
    assert memory.keep_only({"a": upstream_identity("https://a.example", "anthropic", "sk-9")})
    assert len(memory) == 0


def test_round_trip_through_json_skips_bad_and_expired_entries() -> None:
    memory = EffortMemory()
    memory.remember(KEY, "high", now=0.0, identity=ID_A)
    data = json.loads(json.dumps(memory.to_json()))
    data["entries"] += [
        {"upstream": "x"},
        "junk",
        {**data["entries"][0], "upstream": "old", "expires_at": 5.0},
    ]
    loaded = EffortMemory.from_json(data, now=10.0)
    assert len(loaded) == 1 and loaded.recall(KEY, now=10.0, identity=ID_A) == "high"
    assert len(EffortMemory.from_json("not an object", now=0.0)) == 0
