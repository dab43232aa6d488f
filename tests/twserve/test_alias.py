"""An alias sends another model name upstream; the client still reads the name it asked for."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.twserve.stack import KEY, Upstream, running_stack


@pytest.mark.sdk
def test_same_format_answer_names_the_alias(tmp_path: Path) -> None:
    ups = {"a": Upstream("anthropic", models=["real-model"])}
    with running_stack(tmp_path, ups, config={"aliases": {"nice": "real-model"}}) as st:
        client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=10)
        ask = {"model": "nice", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        whole = client.messages.create(**ask)
        with client.messages.stream(**ask) as stream:
            streamed = stream.get_final_message()
        sent = [json.loads(r.body)["model"] for r in st.mock("a").received]
    assert whole.model == "nice" and streamed.model == "nice"
    assert streamed.content[0].text == whole.content[0].text
    assert sent == ["real-model", "real-model"]
