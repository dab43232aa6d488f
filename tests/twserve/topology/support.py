"""Gateways over one shared Redis given by its URL (a Sentinel set's, a Cluster's), and the
requests the Sentinel and Cluster tests send through them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.events import RequestRouted, SharedStateChanged

OTHER_KEY = "test-key-exact"


def until(check: Callable[[], bool], what: str, secs: float = 20.0) -> None:
    deadline = time.monotonic() + secs
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def clients(hourly: int, exact: int) -> list[dict[str, Any]]:
    """Two keys: ``tester`` (`KEY`, `hourly` requests an hour) and ``exact`` (`OTHER_KEY`)."""
    return [
        {"name": "tester", "key": KEY, "limits": [{"per": "hour", "requests": hourly}]},
        {"name": "exact", "key": OTHER_KEY, "limits": [{"per": "hour", "requests": exact}]},
    ]


@contextmanager
def gateways(
    tmp: Path,
    redis_url: str,
    *,
    config: dict[str, Any] | None = None,
    scripts: Sequence[Script] = (Script(), Script()),
    upstream: dict[str, Any] | None = None,
    timeout_secs: float = 1.0,
) -> Iterator[tuple[list[Stack], list[list[Any]]]]:
    """One gateway per script, all on `redis_url` (each Redis call bounded by `timeout_secs`),
    each over its own mock upstream ``mock``; with the events each published. Yields once every
    one has reached Redis."""
    state = {"redis_url": redis_url, "timeout_secs": timeout_secs}
    shared = {"state": state} | (config or {})
    seen: list[list[Any]] = [[] for _ in scripts]
    with ExitStack() as exits:
        stacks = []
        for i, script in enumerate(scripts):
            up = Upstream("openai-chat", MockSettings(script=script), extra=upstream or {})
            stack = exits.enter_context(running_stack(tmp / f"g{i}", {"mock": up}, config=shared))
            stack.app.events.listeners.append(seen[i].append)
            stacks.append(stack)
        for stack in stacks:
            sharing = stack.app.sharing
            assert sharing is not None
            until(lambda s=sharing: s.state.up, "connected to Redis")
        yield stacks, seen


def chat(stack: Stack, text: str | list[dict[str, Any]], session: str, key: str = KEY) -> str:
    """One streamed chat through `stack` with the OpenAI SDK (usage included, so that the
    answer leaves affinity behind): `text` as the user's message, or the messages."""
    client = openai.OpenAI(
        base_url=stack.url + "/v1", api_key=key, max_retries=0, timeout=15,
        default_headers={"session_id": session},
    )  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": text}] if isinstance(text, str) else text
    stream = client.chat.completions.create(
        model="gpt-e2e-1",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def shared_changes(events: list[Any]) -> list[tuple[bool, str]]:
    return [(e.shared, e.code) for e in events if isinstance(e, SharedStateChanged)]


def paused(stack: Stack) -> bool:
    return stack.app.gateway.router.health.is_paused("mock", stack.app.gateway.clock())


def continues_elsewhere(first: Stack, second: Stack, seen_second: list[Any], session: str) -> None:
    """A conversation answered by `first` continues on the same upstream at `second` (its
    tool turn is routed there as sticky): the answer's affinity travelled through Redis."""
    opening: list[dict[str, Any]] = [
        {"role": "user", "content": f"look something up for {session}"}
    ]

    def count() -> int:
        return second.app.gateway.router.conversations

    # What `second` knows once the announcements of earlier answers have all arrived.
    known, since = count(), time.monotonic()
    while time.monotonic() - since < 0.5:
        time.sleep(0.02)
        if count() != known:
            known, since = count(), time.monotonic()
    assert chat(first, opening, session)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turn: list[dict[str, Any]] = [
        *opening,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ]
    # The announcement travels in the background: the turn goes to `second` once it has heard.
    until(lambda: count() > known, "the second gateway heard the answer")
    seen_second.clear()
    assert chat(second, turn, session)
    assert [e.sticky for e in seen_second if isinstance(e, RequestRouted)] == ["mock"]
