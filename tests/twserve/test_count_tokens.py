"""Token counting: forwarded to an upstream of the client's format, else estimated locally
(docs/operations.md, "What goes upstream")."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest
from google import genai
from google.genai import types

from tests.twserve.stack import KEY, Upstream, running_stack


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
