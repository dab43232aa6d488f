"""``store.commit_before_end`` (docs/deployment.md, "Killed instances"): with the store's commit
held by the test, a whole answer and a stream reach the SDK client in full but do not end; the
row is not in the file yet. Released, the client's call returns, and the row is already there."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import pytest

from tests.twserve.conftest import MODELS
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twserve.store.sqlite import RequestStore

CONFIG = {"store": {"commit_before_end": True, "commit_wait_secs": 600}}


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.01)


def _ids(st: Stack) -> set[str]:
    with closing(sqlite3.connect(st.data_dir / "requests.sqlite3")) as db:
        return {r[0] for r in db.execute("SELECT id FROM requests")}


@contextmanager
def held_commits(st: Stack) -> Iterator[Callable[[], None]]:
    """The store writer's transactions wait until the yielded function is called."""
    store = st.app.store
    assert isinstance(store, RequestStore)
    gate = st.portal.call(anyio.Event)
    holding = st.portal.call(anyio.Event)

    async def hold() -> None:
        async with store._lock:
            holding.set()
            await gate.wait()

    done = st.portal.start_task_soon(hold)
    st.portal.call(holding.wait)
    try:
        yield lambda: st.portal.call(gate.set)
    finally:
        st.portal.call(gate.set)
        done.result()


@pytest.fixture
def st(tmp_path: Path) -> Iterator[Stack]:
    upstreams = {"up": Upstream("anthropic")}
    with running_stack(tmp_path, upstreams, config=CONFIG) as running:
        yield running


def _held_until_committed(st: Stack, call: Callable[[], Any], seen: Callable[[], bool]) -> Any:
    """Run `call` in a thread with the store's commit held: once its row waits and `seen()`
    (what the client already has), the call has not returned; released, it returns with the
    row already in the file."""
    store = st.app.store
    assert isinstance(store, RequestStore)
    before = _ids(st)
    with held_commits(st) as release, ThreadPoolExecutor(1) as pool:
        result: Future[Any] = pool.submit(call)
        _until(lambda: bool(store.commits) and seen())
        assert not result.done()
        assert _ids(st) == before  # nothing committed meanwhile
        release()
        answer = result.result(timeout=60)
        assert len(_ids(st) - before) == 1  # the row was committed before the end went out
    assert store.status()["commit_waits_late"] == 0
    return answer


def test_a_whole_answer_ends_only_after_its_row_is_committed(st: Stack) -> None:
    client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=60)

    def call() -> anthropic.types.Message:
        return client.messages.create(
            model=MODELS["anthropic"],
            max_tokens=32,
            messages=[{"role": "user", "content": "hi"}],
        )

    message = _held_until_committed(st, call, lambda: True)
    assert message.stop_reason is not None and message.content


def test_a_stream_ends_only_after_its_row_is_committed(st: Stack) -> None:
    client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=60)
    events: list[str] = []

    def call() -> list[str]:
        with client.messages.create(
            model=MODELS["anthropic"],
            max_tokens=32,
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
        ) as stream:
            for event in stream:
                events.append(event.type)
        return events

    # Every event, message_stop included, reaches the client while the end is held.
    types = _held_until_committed(st, call, lambda: "message_stop" in events)
    assert types[-1] == "message_stop"


def test_over_http2_the_end_stream_waits_for_the_row(st: Stack) -> None:
    versions: list[str] = []
    events: list[str] = []
    with httpx2.Client(
        http1=False,
        http2=True,
        timeout=60,
        event_hooks={"response": [lambda r: versions.append(r.http_version)]},
    ) as http:
        client = anthropic.Anthropic(
            base_url=st.url, api_key=KEY, max_retries=0, timeout=60, http_client=http
        )

        def call() -> list[str]:
            with client.messages.create(
                model=MODELS["anthropic"],
                max_tokens=32,
                stream=True,
                messages=[{"role": "user", "content": "hi"}],
            ) as stream:
                for event in stream:
                    events.append(event.type)
            return events

        types = _held_until_committed(st, call, lambda: "message_stop" in events)
    assert versions == ["HTTP/2"] and types[-1] == "message_stop"
