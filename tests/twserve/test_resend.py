"""Refused effort and sealed reasoning are resent once to the same upstream, rewritten
(docs/failover.md, docs/failures.md)."""

from __future__ import annotations

import json
from pathlib import Path

import httpcore

from tests.twserve.stack import KEY, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script

THINKING = {"type": "enabled", "budget_tokens": 31999}


def _settings(shape: str) -> MockSettings:
    return MockSettings(script=Script(fail_first=1, error=ErrorSpec(shape=shape)))


def _ask(url: str, body: dict[str, object]) -> int:
    return httpcore.request(
        "POST",
        url + "/v1/messages",
        headers=[(b"x-api-key", KEY.encode())],
        content=json.dumps(body).encode(),
    ).status


def test_refused_effort_is_resent_without_it(tmp_path: Path) -> None:
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    body = {
        "model": "m",
        "max_tokens": 32000,
        "thinking": THINKING,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, body) == 200
        first, second = (r.json() for r in st.mock("a").received)
        (row,) = st.wait_rows(1)
    assert first["thinking"] == THINKING
    assert second["thinking"] == {"type": "disabled"}
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["outcome"], a["resend"]) for a in attempts] == [
        ("resent", None),
        ("ok", "effort_refused"),
    ]


def test_sealed_reasoning_is_resent_without_it(tmp_path: Path) -> None:
    up = {"a": Upstream("anthropic", _settings("anthropic-invalid-signature"))}
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "let me see",
                    "signature": "c2lnbmVkLWVsc2V3aGVyZQ==",
                },
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": "and now?"},
    ]
    body = {"model": "m", "max_tokens": 32000, "thinking": THINKING, "messages": messages}
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, body) == 200
        first, second = (r.json() for r in st.mock("a").received)
        (row,) = st.wait_rows(1)
    assert first["messages"][1]["content"][0]["type"] == "thinking"
    assert [b["type"] for b in second["messages"][1]["content"]] == ["text"]
    assert "reasoning:sealed_for_account" in json.loads(row["translated"])
