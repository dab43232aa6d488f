"""The upstream pool's cap (`pool.max_connections`) and its wait (`pool.wait_secs`), through the
gateway: a request that finds every connection in use waits, then fails over, and the upstream is
not blamed for the gateway's own bound."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anthropic
import httpcore
import pytest

from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script

SLOW = Script(text="one two three four five six seven eight", chunk_size=4, chunk_delay=0.15)


def providers(stack: Stack) -> dict[str, dict[str, object]]:
    answer = httpcore.request(
        "GET",
        stack.control_url + "/providers",
        headers={"authorization": f"Bearer {CONTROL_KEY}"},
    )
    return {p["name"]: p for p in json.loads(answer.content)["providers"]}


def stream_in_background(stack: Stack, started: threading.Event) -> threading.Thread:
    def run() -> None:
        with sdk_clients(stack.url, timeout=20) as clients:
            with clients.anthropic.messages.stream(
                model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                for _ in stream.text_stream:
                    started.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_full_pool_fails_the_attempt_without_pausing_the_upstream(tmp_path: Path) -> None:
    config = {
        "pool": {"max_connections": 1, "wait_secs": 0.2},
        "failover": {"failures_to_pause": 1, "wait_secs": 0},
    }
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SLOW), models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        started = threading.Event()
        holder = stream_in_background(stack, started)
        assert started.wait(10)
        with sdk_clients(stack.url) as clients:
            for _ in range(3):
                with pytest.raises(anthropic.APIStatusError) as raised:
                    clients.anthropic.messages.create(
                        model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
                    )
                # In the client's own format, saying which bound it met.
                assert raised.value.status_code == 502
                assert "pool.max_connections" in raised.value.message
        state = providers(stack)["a"]
        # failures_to_pause is 1: one counted failure would have paused it.
        assert state["paused_until"] is None and state["failures_in_row"] == 0, state
        holder.join(20)
        # The connection is back: the next request goes through.
        with sdk_clients(stack.url) as clients:
            answer = clients.anthropic.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
            )
        assert answer.content
        rows = stack.wait_rows(5)
        refused = [r for r in rows if r["status"] != 200]
        assert len(refused) == 3
        for row in refused:
            assert row["error_code"] == "gw.upstream.connect"
            (attempt,) = json.loads(row["routing"])["attempts"]
            # It waited pool.wait_secs for a connection, then failed as one not made.
            assert attempt["error"] == "connect" and attempt["ms"] >= 190, attempt
