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


def test_refused_effort_is_resent_with_the_nearest_accepted_level(tmp_path: Path) -> None:
    # "does not support effort level 'xhigh'. Supported levels: high, low, max, medium": high and
    # max are as near to xhigh; the lower is taken.
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    body = {
        "model": "m",
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "xhigh"},
        "messages": [{"role": "user", "content": "hi"}],
    }
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, body) == 200
        first, second = (r.json() for r in st.mock("a").received)
        (row,) = st.wait_rows(1)
    assert first["output_config"] == {"effort": "xhigh"}
    assert second["thinking"] == {"type": "adaptive"}
    assert second["output_config"] == {"effort": "high"}
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["outcome"], a["resend"]) for a in attempts] == [
        ("resent", None),
        ("ok", "effort_refused"),
    ]


def test_a_budget_only_request_is_not_resent(tmp_path: Path) -> None:
    # SPEC §13: a request that sets only a thinking budget keeps the upstream's 400.
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    body = {
        "model": "m",
        "max_tokens": 32000,
        "thinking": THINKING,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, body) == 400
        calls = len(st.mock("a").received)
        (row,) = st.wait_rows(1)
    assert calls == 1
    assert [a["outcome"] for a in json.loads(row["routing"])["attempts"]] == ["failed"]


def test_a_refused_effort_naming_no_level_is_resent_without_it(tmp_path: Path) -> None:
    up = {
        "a": Upstream(
            "openai-chat",
            MockSettings(
                script=Script(
                    fail_first=1,
                    error=ErrorSpec(status=400, message="reasoning_effort is not supported"),
                )
            ),
        )
    }
    body = {
        "model": "m",
        "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "hi"}],
    }
    with running_stack(tmp_path, up) as st:
        status = httpcore.request(
            "POST",
            st.url + "/v1/chat/completions",
            headers=[(b"authorization", b"Bearer " + KEY.encode())],
            content=json.dumps(body).encode(),
        ).status
        first, second = (r.json() for r in st.mock("a").received)
    assert status == 200
    assert first["reasoning_effort"] == "high" and "reasoning_effort" not in second


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
