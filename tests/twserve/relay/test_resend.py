"""Refused effort and sealed reasoning are resent once to the same upstream, rewritten
(docs/failover.md, docs/failures.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpcore
import openai

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twengine.reasoning import EffortKey
from twmock.script import ErrorSpec, MockSettings, Script
from twserve.config.effort_store import load_effort_memory

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
    # docs/operations.md: a request that sets only a thinking budget keeps the upstream's 400.
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


def _effort_body() -> dict[str, object]:
    return {
        "model": "m",
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "xhigh"},
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_an_accepted_level_is_remembered_across_restarts(tmp_path: Path) -> None:
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, _effort_body()) == 200  # refused, resent with high
        assert _ask(st.url, _effort_body()) == 200  # high sent up front
        sent = [r.json()["output_config"]["effort"] for r in st.mock("a").received]
        rows = st.wait_rows(2)
    assert sent == ["xhigh", "high", "high"]
    views = [[a["effort"] for a in json.loads(r["routing"])["attempts"]] for r in rows]
    assert views == [
        [None, {"asked": "xhigh", "sent": "high", "reason": "rejected"}],
        [{"asked": "xhigh", "sent": "high", "reason": "remembered"}],
    ]
    saved = json.loads((tmp_path / "effort-memory.json").read_text())
    assert [(e["upstream"], e["level"], e["sent"]) for e in saved["entries"]] == [
        ("a", "xhigh", "high")
    ]
    assert "upstream-key-a" not in json.dumps(saved)
    assert (tmp_path / "effort-memory.json").stat().st_mode & 0o777 == 0o600
    # What the file holds is what a restart starts with.
    loaded = load_effort_memory(tmp_path)
    key = EffortKey(upstream="a", model="m", client_format="anthropic", level="xhigh")
    assert loaded.recall(key, now=time.time(), identity=saved["entries"][0]["identity"]) == "high"


def test_a_changed_upstream_forgets_its_levels(tmp_path: Path) -> None:
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    with running_stack(tmp_path, up) as st:
        assert _ask(st.url, _effort_body()) == 200
    assert len(json.loads((tmp_path / "effort-memory.json").read_text())["entries"]) == 1
    # Restarted with a new key (and its mock on a new port): the choice is dropped at start.
    rotated = {"a": Upstream("anthropic", MockSettings(), extra={"key": "a-new-key"})}
    with running_stack(tmp_path, rotated) as st:
        assert _ask(st.url, _effort_body()) == 200
        assert [r.json()["output_config"]["effort"] for r in st.mock("a").received] == ["xhigh"]
    assert json.loads((tmp_path / "effort-memory.json").read_text())["entries"] == []


def test_sealed_reasoning_is_left_out_on_later_turns(tmp_path: Path) -> None:
    up = {"a": Upstream("anthropic", _settings("anthropic-invalid-signature"))}
    history: list[dict[str, object]] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "c2VhbGVkLWVsc2V3aGVyZQ=="},
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": "and now?"},
    ]

    def turn(url: str, messages: list[dict[str, object]]) -> int:
        body = {"model": "m", "max_tokens": 32000, "thinking": THINKING, "messages": messages}
        return httpcore.request(
            "POST",
            url + "/v1/messages",
            headers=[(b"x-api-key", KEY.encode()), (b"x-claude-code-session-id", b"s-1")],
            content=json.dumps(body).encode(),
        ).status

    with running_stack(tmp_path, up) as st:
        assert turn(st.url, history) == 200  # refused, resent without the sealed block
        later = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]
        assert turn(st.url, later) == 200
        bodies = [r.json() for r in st.mock("a").received]
    assert len(bodies) == 3  # the later turn went once, already without the sealed block
    assert [b["type"] for b in bodies[2]["messages"][1]["content"]] == ["text"]


def test_a_websocket_turn_with_a_refused_effort_is_resent(tmp_path: Path) -> None:
    """Unlike the seed, a Responses WebSocket turn is resent too (docs/transports.md): the
    refusal comes before anything of the turn reached the client, so the resend is invisible."""
    up = {"a": Upstream("anthropic", _settings("anthropic-effort-unsupported"))}
    with running_stack(tmp_path, up) as st:

        async def turn() -> list[str]:
            client = openai.AsyncOpenAI(
                base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=10
            )
            types: list[str] = []
            async with client.responses.connect() as conn:
                await conn.send(
                    {
                        "type": "response.create",
                        "model": "m",
                        "input": "hi",
                        "reasoning": {"effort": "xhigh"},
                    }
                )
                with anyio.fail_after(10):
                    async for event in conn:
                        types.append(event.type)
                        if event.type in ("response.completed", "response.failed", "error"):
                            break
            return types

        types = anyio.run(turn)
        received = [r.json() for r in st.mock("a").received]
        (row,) = st.wait_rows(1)
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert "error" not in types and "response.failed" not in types
    assert types.count("response.created") == 1
    assert len(received) == 2
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["outcome"], a["resend"]) for a in attempts] == [
        ("resent", None),
        ("ok", "effort_refused"),
    ]
