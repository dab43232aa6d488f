"""The effort memory and the sealed-reasoning marks shared by in-process gateways through a real
redis-server (twserve.shared.memory): what one instance learned, the next sends up front."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpcore
import pytest
import redis

from tests.support.servers import RedisServer, start_redis
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script

THINKING = {"type": "enabled", "budget_tokens": 31999}


def until(check: Callable[[], bool], what: str, secs: float = 20.0) -> None:
    deadline = time.monotonic() + secs
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def _db_url(server: RedisServer, db: int) -> str:
    """A database of its own on the session's server, emptied first."""
    url = f"redis://127.0.0.1:{server.port}/{db}"
    redis.Redis.from_url(url).flushdb()
    return url


@contextmanager
def gateway(tmp: Path, url: str, name: str, up: Upstream) -> Iterator[Stack]:
    """One gateway sharing Redis at `url`, with its upstream ``a``; connected before it yields."""
    config = {"state": {"redis_url": url}}
    with ExitStack() as exits:
        stack = exits.enter_context(running_stack(tmp / name, {"a": up}, config=config))
        sharing = stack.app.sharing
        assert sharing is not None
        until(lambda: sharing.state.up, f"{name} connected to Redis")
        yield stack


def base_url(stack: Stack) -> str:
    (provider,) = stack.app.gateway.config.providers
    return provider.base_url


def ask(stack: Stack, body: dict[str, Any], session: str | None = None) -> int:
    headers = [(b"x-api-key", KEY.encode())]
    if session is not None:
        headers.append((b"x-claude-code-session-id", session.encode()))
    return httpcore.request(
        "POST", stack.url + "/v1/messages", headers=headers, content=json.dumps(body).encode()
    ).status


def effort_body() -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "xhigh"},
        "messages": [{"role": "user", "content": "hi"}],
    }


def saved_levels(stack: Stack) -> list[tuple[str, str, str]]:
    path = stack.data_dir / "effort-memory.json"
    if not path.exists():
        return []
    entries = json.loads(path.read_text())["entries"]
    return [(e["upstream"], e["level"], e["sent"]) for e in entries]


def test_an_effort_refused_on_one_instance_is_sent_lowered_by_the_others(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 7)
    # One real upstream behind all three: it refuses ``xhigh`` once, with Anthropic's 400 text.
    refusing = MockSettings(
        script=Script(fail_first=1, error=ErrorSpec(shape="anthropic-effort-unsupported"))
    )
    with gateway(tmp_path, url, "A", Upstream("anthropic", refusing)) as a:
        same = Upstream("anthropic", MockSettings(), extra={"base_url": base_url(a)})
        with gateway(tmp_path, url, "B", same) as b:
            assert ask(a, effort_body()) == 200  # refused, resent with high: learned on A
            until(lambda: saved_levels(b) == [("a", "xhigh", "high")], "B took A's level")
            assert ask(b, effort_body()) == 200  # B's first request
            sent = [r.json()["output_config"]["effort"] for r in a.mock("a").received]
            assert sent == ["xhigh", "high", "high"]
            (row,) = b.wait_rows(1)
            (attempt,) = json.loads(row["routing"])["attempts"]
            assert attempt["effort"] == {"asked": "xhigh", "sent": "high", "reason": "remembered"}
            # Kept in Redis with its 7-day expiry, for instances that start later.
            db = redis.Redis.from_url(url)
            (key,) = db.keys("twserve:effort:*")
            assert key == b"twserve:effort:a:m:anthropic:xhigh"
            assert 6.9 * 86400 < db.pttl(key) / 1000 <= 7 * 86400
            # An instance started now reads it back on connecting: its first request is lowered.
            with gateway(tmp_path, url, "C", same) as c:
                until(lambda: saved_levels(c) == [("a", "xhigh", "high")], "C read it back")
                assert ask(c, effort_body()) == 200
            sent = [r.json()["output_config"]["effort"] for r in a.mock("a").received]
            assert sent == ["xhigh", "high", "high", "high"]


def test_an_effort_from_an_upstream_of_another_identity_is_not_used(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 8)
    refusing = MockSettings(
        script=Script(fail_first=1, error=ErrorSpec(shape="anthropic-effort-unsupported"))
    )
    with gateway(tmp_path, url, "A", Upstream("anthropic", refusing)) as a:
        # B's upstream ``a`` is another endpoint (its own mock): A's choice is not B's to use.
        with gateway(tmp_path, url, "B", Upstream("anthropic", MockSettings())) as b:
            assert ask(a, effort_body()) == 200
            until(lambda: saved_levels(b) == [("a", "xhigh", "high")], "B heard A's level")
            assert ask(b, effort_body()) == 200
            assert [r.json()["output_config"]["effort"] for r in b.mock("a").received] == ["xhigh"]


def sealed_history(later: bool = False) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [
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
    if later:
        history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]
    return history


def sealed_body(later: bool = False) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 32000,
        "thinking": THINKING,
        "messages": sealed_history(later),
    }


def test_a_sealed_reasoning_refusal_on_one_instance_is_left_out_by_the_others(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = _db_url(redis_server, 9)
    refusing = MockSettings(
        script=Script(fail_first=1, error=ErrorSpec(shape="anthropic-invalid-signature"))
    )
    with gateway(tmp_path, url, "A", Upstream("anthropic", refusing)) as a:
        with gateway(tmp_path, url, "B", Upstream("anthropic", MockSettings())) as b:
            assert ask(a, sealed_body(), session="s-1") == 200  # refused, resent without it
            assert len(a.mock("a").received) == 2
            sealed = b.app.gateway.reasoning.sealed
            until(lambda: len(sealed) == 1, "B took A's mark")
            # The conversation's next turn reaches B: the sealed block is left out up front.
            assert ask(b, sealed_body(later=True), session="s-1") == 200
            # Another conversation on B still sends its reasoning as it is.
            assert ask(b, sealed_body(), session="s-2") == 200
            first, other = (r.json() for r in b.mock("a").received)
            assert [blk["type"] for blk in first["messages"][1]["content"]] == ["text"]
            assert [blk["type"] for blk in other["messages"][1]["content"]] == ["thinking", "text"]
            db = redis.Redis.from_url(url)
            (key,) = db.keys("twserve:sealed:*")
            # The conversation's id (percent-encoded), then the upstream.
            assert key.startswith(b"twserve:sealed:") and key.endswith(b":a")
            assert 23.9 * 3600 < db.pttl(key) / 1000 <= 24 * 3600


def test_efforts_learned_while_redis_is_away_reach_the_others_when_it_is_back(
    tmp_path: Path,
) -> None:
    refusing = MockSettings(
        script=Script(fail_first=1, error=ErrorSpec(shape="anthropic-effort-unsupported"))
    )
    with start_redis() as server:
        url = server.url
        with gateway(tmp_path, url, "A", Upstream("anthropic", refusing)) as a:
            same = Upstream("anthropic", MockSettings(), extra={"base_url": base_url(a)})
            with gateway(tmp_path, url, "B", same) as b:
                server.stop()
                # A learns alone: into its file, and its requests still get their answers.
                assert ask(a, effort_body()) == 200
                until(lambda: saved_levels(a) == [("a", "xhigh", "high")], "A kept it")
                sharing = a.app.sharing
                assert sharing is not None
                until(lambda: not sharing.state.up, "A found Redis gone")
                assert saved_levels(b) == []
                server.start()
                # Back: A writes what only it holds (SET NX); B reads it back on reconnecting.
                until(lambda: saved_levels(b) == [("a", "xhigh", "high")], "B got it", 30.0)
                assert ask(b, effort_body()) == 200
                sent = [r.json()["output_config"]["effort"] for r in a.mock("a").received]
                assert sent == ["xhigh", "high", "high"]
