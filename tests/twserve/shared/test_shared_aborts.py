"""An abort sent to one instance's control listener reaches the request another instance runs,
through a real Redis (``state.redis_url``): the client's SDK raises, the instance that ran it
publishes ``RequestAborted``; an id no instance runs is still 404."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpcore
import openai
import pytest

from tests.support.servers import start_redis
from tests.twserve.support.live import wait_for
from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.events import RequestAborted, RequestStarted

SLOW = Script(text="slow words " * 120, chunk_size=4, chunk_delay=0.03)


def control(st: Stack, method: str, path: str) -> tuple[int, Any]:
    resp = httpcore.request(
        method,
        st.control_url + path,
        headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
        extensions={"timeout": {"connect": 5.0, "read": 10.0, "write": 5.0, "pool": 5.0}},
    )
    return resp.status, json.loads(resp.content)


@contextmanager
def two_instances(tmp: Path) -> Iterator[tuple[Stack, Stack, list[Any], list[Any]]]:
    seen: tuple[list[Any], list[Any]] = ([], [])
    with start_redis() as server, ExitStack() as exits:
        stacks = []
        for i in range(2):
            up = Upstream("openai-chat", MockSettings(script=SLOW))
            shared = {"state": {"redis_url": server.url}}
            st = exits.enter_context(
                running_stack(tmp / f"g{i}", {"mock": up}, config=shared, control=True)
            )
            st.app.events.listeners.append(seen[i].append)
            stacks.append(st)
        for st in stacks:
            sharing = st.app.sharing
            assert sharing is not None
            wait_for(lambda s=sharing: s.state.up)
        yield stacks[0], stacks[1], seen[0], seen[1]


@pytest.mark.sdk
def test_an_abort_sent_to_another_instance_reaches_the_request(tmp_path: Path) -> None:
    with two_instances(tmp_path) as (a, b, seen_a, seen_b):
        # Both instances listen on the channel before the request starts.
        wait_for(lambda: all(st.app.sharing and st.app.sharing.state.up for st in (a, b)))
        client = openai.OpenAI(base_url=b.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
        content = threading.Event()
        raised: list[BaseException] = []

        def stream() -> None:
            try:
                for chunk in client.chat.completions.create(
                    model="gpt-e2e-1", messages=[{"role": "user", "content": "hi"}], stream=True
                ):
                    if chunk.choices and chunk.choices[0].delta.content:
                        content.set()
            except openai.APIError as exc:
                raised.append(exc)

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        assert content.wait(10)
        (started,) = [e for e in seen_b if isinstance(e, RequestStarted)]
        # A runs nothing of that id: it asks B over Redis, and B aborts it.
        deadline = time.monotonic() + 10
        while True:  # until B's subscription hears the channel (it resubscribes on connect)
            status, body = control(a, "POST", f"/requests/{started.id}/abort")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (status, body) == (
            200,
            {"id": started.id, "aborted": True, "stage": "relay", "elsewhere": True},
        )
        thread.join(15)
        client.close()
        assert raised and "aborted" in str(raised[0])
        wait_for(lambda: any(isinstance(e, RequestAborted) for e in seen_b))
        assert not any(isinstance(e, RequestAborted) for e in seen_a)
        # Not the upstream's fault on B either.
        health = b.app.gateway.router.health.snapshot("mock", b.app.gateway.clock())
        assert health.failures_in_row == 0 and health.paused_until is None
        # An id that runs nowhere: A waits for an answer that does not come, then 404.
        started_at = time.monotonic()
        status, body = control(a, "POST", "/requests/nowhere/abort")
        assert (status, body["error"]["code"]) == (404, "control.abort.unknown_request")
        assert time.monotonic() - started_at < 5
