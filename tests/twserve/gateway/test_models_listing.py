"""Model listings in the shape of the client's format, with aliases and model specs."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from tests.twserve.support.stack import KEY, Upstream, running_stack

CONFIG = {
    "aliases": {"fast": "small-model"},
}
UPSTREAMS = {
    "a": Upstream(
        "anthropic",
        models=["big-model", "small-model"],
        extra={
            "model_specs": {"big-model": {"context_window": 200000, "max_output_tokens": 64000}}
        },
    ),
    "c": Upstream("openai-chat", models=["small-model", "chat-model", "gpt-5"]),
}


@pytest.mark.sdk
def test_each_sdk_lists_models_and_aliases(tmp_path: Path) -> None:
    with running_stack(tmp_path, UPSTREAMS, config=CONFIG) as st:
        oai = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=5)
        ant = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=5)
        gem = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=st.url))
        openai_ids = [m.id for m in oai.models.list()]
        anthropic_ids = [m.id for m in ant.models.list()]
        gemini = {m.name: m for m in gem.models.list()}
        one = oai.models.retrieve("fast")
        with pytest.raises(openai.NotFoundError):
            oai.models.retrieve("nope")
    expected = ["big-model", "small-model", "chat-model", "gpt-5", "fast"]
    assert openai_ids == expected and anthropic_ids == expected
    assert one.id == "fast"
    big = gemini["models/big-model"]
    assert (big.input_token_limit, big.output_token_limit) == (200000, 64000)
    assert set(gemini) == {f"models/{name}" for name in expected}
    # Without model_specs, the shipped price table gives the limits (GPT-5: 272k in, 128k out).
    gpt5 = gemini["models/gpt-5"]
    assert (gpt5.input_token_limit, gpt5.output_token_limit) == (272_000, 128_000)


NARROW_KEY = "narrow-key"
NARROW = {
    **CONFIG,
    "clients": [
        {"name": "tester", "key": KEY},
        {"name": "narrow", "key": NARROW_KEY, "route": "chat-only"},
    ],
    "routes": [
        {
            "name": "chat-only",
            "rules": [
                {"name": "no-gpt5", "when": {"model": "gpt-5"}, "deny": True},
                {"name": "to-c", "to": "c"},
            ],
        }
    ],
}


@pytest.mark.sdk
def test_a_key_sees_only_the_models_its_route_reaches(tmp_path: Path) -> None:
    with running_stack(tmp_path, UPSTREAMS, config=NARROW) as st:
        oai = openai.OpenAI(base_url=st.url + "/v1", api_key=NARROW_KEY, max_retries=0)
        ant = anthropic.Anthropic(base_url=st.url, api_key=NARROW_KEY, max_retries=0)
        gem = genai.Client(api_key=NARROW_KEY, http_options=types.HttpOptions(base_url=st.url))
        openai_ids = [m.id for m in oai.models.list()]
        anthropic_ids = [m.id for m in ant.models.list()]
        gemini_ids = [m.name for m in gem.models.list()]
        with pytest.raises(openai.NotFoundError):
            oai.models.retrieve("big-model")  # only upstream a has it
        with pytest.raises(anthropic.NotFoundError):
            ant.models.retrieve("gpt-5")  # denied by the key's route
        wide = [m.id for m in openai.OpenAI(base_url=st.url + "/v1", api_key=KEY).models.list()]
    # The route sends everything to c and denies gpt-5: c's other models, and the alias fast
    # (small-model, which c offers).
    expected = ["small-model", "chat-model", "fast"]
    assert openai_ids == expected and anthropic_ids == expected
    assert gemini_ids == [f"models/{name}" for name in expected]
    assert wide == ["big-model", "small-model", "chat-model", "gpt-5", "fast"]
