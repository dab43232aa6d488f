"""Model names clients choose, through the real gateway: a name longer than
``listen.gateway.max_model_name_chars`` is refused before anything echoes it, and the metrics
label series only with names the config or the price table knows (docs/operations.md)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script, Usage
from twserve.events import RequestFailed

pytestmark = pytest.mark.sdk

# An upstream without a model list takes any name; its usage makes token series per model.
ANY = {"any": Upstream("openai-chat", MockSettings(script=Script(usage=Usage(input=7, output=3))))}
CONFIG: dict[str, Any] = {"aliases": {"fast": "gpt-e2e-1"}}
HUGE = "m" * (1 << 20)


def _metrics(st: Stack) -> str:
    resp = httpx2.get(
        st.control_url + "/metrics", headers={"authorization": f"Bearer {CONTROL_KEY}"}
    )
    assert resp.status_code == 200
    return resp.text


def _model_labels(text: str) -> set[str]:
    return set(re.findall(r'model="([^"]*)"', text))


def test_a_model_name_past_the_limit_is_refused_in_every_format(tmp_path: Path) -> None:
    failed: list[RequestFailed] = []
    with running_stack(tmp_path, ANY, config=CONFIG, control=True) as st:
        st.app.events.listeners.append(
            lambda e: failed.append(e) if isinstance(e, RequestFailed) else None
        )
        oa = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as chat:
            oa.chat.completions.create(model=HUGE, messages=[{"role": "user", "content": "hi"}])
        ant = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=30)
        with pytest.raises(anthropic.BadRequestError) as msg:
            ant.messages.create(
                model="x" * 257, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
        gem = genai.Client(api_key=KEY, http_options=gtypes.HttpOptions(base_url=st.url))
        with pytest.raises(genai_errors.ClientError) as gemini:
            gem.models.generate_content(model="g" * 300, contents="hi")  # the name is in the path
        gem.close()
        # 256 characters pass, and the answer names the model it was sent.
        ok = oa.chat.completions.with_raw_response.create(
            model="k" * 256, messages=[{"role": "user", "content": "hi"}]
        )
        rows = st.wait_rows(4)
        deadline = time.monotonic() + 10
        while len(failed) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        text = _metrics(st)
    assert chat.value.code == "gw.request.model_name_too_long"
    assert "1048576 characters long; at most 256" in chat.value.message
    assert len(chat.value.response.content) < 1000  # the answer does not echo the name
    assert msg.value.status_code == 400 and "257 characters" in msg.value.message
    assert gemini.value.code == 400 and "300 characters" in (gemini.value.message or "")
    assert ok.headers["x-twserve-model"] == "k" * 256
    refused = rows[:3]
    assert [r["error_code"] for r in refused] == ["gw.request.model_name_too_long"] * 3
    # Rows and events keep the name cut at the limit, marked.
    assert [r["model"] for r in refused] == ["m" * 256 + "…", "x" * 256 + "…", "g" * 256 + "…"]
    assert [e.model for e in failed[:3]] == [r["model"] for r in refused]
    assert max(len(label) for label in _model_labels(text)) < 300


def test_metrics_label_only_models_the_config_or_price_table_knows(tmp_path: Path) -> None:
    with running_stack(tmp_path, ANY, config=CONFIG, control=True) as st:
        oa = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        for model in ("fast", "claude-sonnet-4-6", *(f"made-up-{n}" for n in range(20))):
            oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        st.wait_rows(22)
        text = _metrics(st)
        rows = st.wait_rows(22)
    # The alias (the config's) and a priced model keep their names; the twenty names only
    # clients know are one series, `other`, however many there are.
    assert _model_labels(text) == {"fast", "claude-sonnet-4-6", "other"}
    assert 'gateway_tokens_total{key="tester",kind="input",model="other",provider="any"} 140.0' in (
        text
    )
    assert 'gateway_unpriced_requests_total{model="other",provider="any"} 20.0' in text
    # The rows keep what was asked.
    assert {r["model"] for r in rows} >= {"made-up-0", "made-up-19"}
