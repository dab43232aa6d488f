"""Load shedding (docs/operations.md, "Shedding load"): past `listen.gateway.max_requests`, or
while the event loop lags past `shed_loop_lag_ms`, a new request is refused at once with 503 and
Retry-After in the client's own format, and the streams already running keep going."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpcore
import openai
import pytest

from tests.twserve.support.live import wait_for
from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script

TEXT = "one two three four five six seven eight nine ten"
SLOW = Script(text=TEXT, chunk_size=4, chunk_delay=0.1)


def listen(gateway: dict[str, Any]) -> dict[str, Any]:
    control = {"bind": "127.0.0.1", "key": CONTROL_KEY}
    return {"listen": {"gateway": {"bind": "127.0.0.1", **gateway}, "control": control}}


def status(stack: Stack) -> dict[str, Any]:
    answer = httpcore.request(
        "GET", stack.control_url + "/status", headers={"authorization": f"Bearer {CONTROL_KEY}"}
    )
    loaded = json.loads(answer.content)
    assert isinstance(loaded, dict)
    return loaded


def chat(stack: Stack) -> httpcore.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpcore.request(
        "POST",
        stack.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        content=json.dumps(body).encode(),
    )


def test_past_max_requests_a_new_request_is_refused_and_the_running_one_goes_on(
    tmp_path: Path,
) -> None:
    config = listen({"max_requests": 1})
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SLOW), models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        started, text = threading.Event(), []

        def run() -> None:
            with sdk_clients(stack.url, timeout=20) as clients:
                with clients.anthropic.messages.stream(
                    model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
                ) as stream:
                    for piece in stream.text_stream:
                        text.append(piece)
                        started.set()

        holder = threading.Thread(target=run)
        holder.start()
        assert started.wait(10)
        begun = time.monotonic()
        with sdk_clients(stack.url) as clients:
            with pytest.raises(openai.InternalServerError) as chat_refused:
                clients.openai.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}]
                )
            with pytest.raises(anthropic.InternalServerError) as claude_refused:
                clients.anthropic.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
                )
        assert time.monotonic() - begun < 2  # at once, not after the running stream
        for refused in (chat_refused.value, claude_refused.value):
            assert refused.status_code == 503
            assert refused.response.headers["retry-after"] == "1"
            assert "max_requests" in refused.message
            # The gateway's load, not the upstream's.
            assert refused.response.headers["x-thinkwatch-error"] == "rate_limited"
        assert chat_refused.value.code == "gw.overloaded"
        assert status(stack)["load"]["shed"] == 2
        holder.join(20)
        assert "".join(text) == TEXT  # the admitted stream kept going to its end
        assert chat(stack).status == 200  # and once it ended, there is room again


def test_a_lagging_loop_sheds_new_requests_until_it_catches_up(tmp_path: Path) -> None:
    config = listen({"shed_loop_lag_ms": 50})
    upstreams = {"a": Upstream("openai-chat", models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        assert chat(stack).status == 200
        stop = threading.Event()

        async def hog() -> None:
            # The loop's own work taking 80 ms at a stretch, as thousands of streams would.
            while not stop.is_set():
                time.sleep(0.08)
                await anyio.sleep(0)

        stack.portal.start_task_soon(hog)
        try:
            wait_for(lambda: status(stack)["load"]["shedding"], timeout=10)
            refused = chat(stack)
            assert refused.status == 503
            assert dict(refused.headers)[b"retry-after"] == b"1"
            error = json.loads(refused.content)["error"]
            assert error["code"] == "gw.overloaded" and "event loop" in error["message"]
        finally:
            stop.set()
        # Once the loop catches up (the median of a second under half the bound), it serves.
        # (The door may still refuse a request arriving during a stray pause of the test
        # process past the bound: it reads the lag as it stands.)
        wait_for(lambda: not status(stack)["load"]["shedding"], timeout=10)
        wait_for(lambda: chat(stack).status == 200, timeout=10)
        assert status(stack)["load"]["shed"] >= 1


def test_a_client_arriving_while_the_loop_is_held_up_is_refused_at_the_door(
    tmp_path: Path,
) -> None:
    config = listen({"shed_loop_lag_ms": 50})
    upstreams = {"a": Upstream("anthropic", models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        with sdk_clients(stack.url) as clients:
            assert clients.anthropic.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            ).content
        held, stretch, stretches = threading.Event(), 0.4, 6
        hold = stretch * stretches

        async def hold_up() -> None:
            # Stretches of the loop's own work as long as a flood of chunks makes them.
            for n in range(stretches):
                if n == 2:
                    held.set()
                time.sleep(stretch)
                await anyio.sleep(0)

        stack.portal.start_task_soon(hold_up)
        assert held.wait(5)
        time.sleep(0.1)  # a lagging loop, now well past shed_loop_lag_ms behind again
        begun = time.monotonic()
        with sdk_clients(stack.url) as clients:
            with pytest.raises(anthropic.InternalServerError) as refused:
                clients.anthropic.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
                )
        with sdk_clients(stack.url, key="not-a-key") as clients:
            with pytest.raises(anthropic.AuthenticationError):  # the key's verdict comes first
                clients.anthropic.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
                )
        took = time.monotonic() - begun
        # Answered by the door while the loop was still held (the loop itself would have
        # answered only once the stretches ended).
        assert took < hold - 1.0, took
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"
        assert "event loop" in refused.value.message
        assert refused.value.body["type"] == "error"  # type: ignore[index]  # Anthropic's shape
        wait_for(lambda: status(stack)["load"]["shed_at_door"] == 1, timeout=10)
        assert status(stack)["load"]["accept_wait_ms"] >= 0.0  # the door's last look at the queue
        # Once the loop catches up the door takes nobody: served as before.
        wait_for(lambda: chat(stack).status == 200, timeout=10)
