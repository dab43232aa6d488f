"""Token counting: forwarded to an upstream of the client's format, else estimated locally
(docs/operations.md, "What goes upstream")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import pytest
from google import genai
from google.genai import types

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twmock.script import MockSettings, parse_script


@pytest.mark.sdk
def test_counts_are_local_without_a_same_format_upstream(tmp_path: Path) -> None:
    with running_stack(tmp_path, {"c": Upstream("openai-chat")}) as st:
        ant = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=5)
        raw = ant.messages.with_raw_response.count_tokens(
            model="m", messages=[{"role": "user", "content": "hello there, " * 40}]
        )
        counted = raw.parse()
        gem = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=st.url))
        g = gem.models.count_tokens(model="m", contents="你好世界" * 10)
        rows = st.wait_rows(2)
        upstream_calls = len(st.mock("c").received)
    assert raw.headers["x-thinkwatch-local"] == "1"
    assert 120 <= counted.input_tokens <= 140  # 520 ASCII characters: about 4 a token
    assert g.total_tokens is not None and 40 <= g.total_tokens <= 50  # one per CJK character
    assert upstream_calls == 0
    assert all(r["local"] == 1 and r["cost_micros"] == 0 for r in rows)


@pytest.mark.sdk
def test_counts_go_to_a_same_format_upstream(tmp_path: Path) -> None:
    with running_stack(tmp_path, {"a": Upstream("anthropic")}) as st:
        ant = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=5)
        counted = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
        received = st.mock("a").received[-1]
    assert received.path == "/v1/messages/count_tokens"
    assert json.loads(received.body)["messages"][0]["content"] == "hi"
    assert counted.input_tokens > 0


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=5)


@pytest.mark.sdk
@pytest.mark.parametrize("status", [404, 405])
def test_a_same_format_upstream_without_the_endpoint_is_estimated_locally(
    tmp_path: Path, status: int
) -> None:
    up = Upstream("anthropic", MockSettings(script=parse_script({"error": status})))
    with running_stack(tmp_path, {"a": up}) as st:
        raw = _anthropic(st.url).messages.with_raw_response.count_tokens(
            model="m", messages=[{"role": "user", "content": "hello there, " * 40}]
        )
        (row,) = st.wait_rows(1)
        calls = len(st.mock("a").received)
    assert raw.headers["x-thinkwatch-local"] == "1"
    assert 120 <= raw.parse().input_tokens <= 140
    assert calls == 1
    assert (row["status"], row["local"], row["cost_micros"]) == (200, 1, 0)


@pytest.mark.sdk
def test_a_failed_count_is_never_retried(tmp_path: Path) -> None:
    # 503 is temporary: a generation would back off and retry within wait_secs; a count does not.
    up = Upstream("anthropic", MockSettings(script=parse_script({"error": 503})))
    with running_stack(tmp_path, {"a": up}, config={"failover": {"wait_secs": 30}}) as st:
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError) as info:
            _anthropic(st.url).messages.count_tokens(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        elapsed = time.monotonic() - started
        calls = len(st.mock("a").received)
    assert info.value.status_code == 503
    assert calls == 1 and elapsed < 1.5


@pytest.mark.sdk
def test_counts_take_no_balancer_turn(tmp_path: Path) -> None:
    ups = {"a": Upstream("anthropic"), "b": Upstream("anthropic")}
    config = {
        "groups": [{"name": "lb", "type": "load-balance", "providers": ["a", "b"]}],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "lb"}]}],
    }
    with running_stack(tmp_path, ups, config=config) as st:
        client = _anthropic(st.url)
        for i in range(4):
            # Each generation starts a conversation of its own; a count sits between them.
            client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": f"q{i}"}]
            )
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x"}])
        rows = st.wait_rows(8)
    generated = [r["provider"] for r in rows if "count_tokens" not in r["path"]]
    # Weights 1:1 interleave; counts moving the balancer would make this a, a, a, a.
    assert generated == ["a", "b", "a", "b"]
