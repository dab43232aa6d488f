"""Token counts for a Bedrock upstream through Bedrock's CountTokens, driven by the Anthropic SDK.

The mock answers ``POST /model/{id}/count-tokens`` as Bedrock does: it verifies the signature,
reads the InvokeModel body from ``input.invokeModel.body`` (base64), answers
``{"inputTokens": N}``, and refuses a model that cannot count (any non-Anthropic model id) with
Bedrock's 400 ``ValidationException``. The gateway then answers with its own estimate, as it
does when ``count_tokens: estimate`` says not to ask, while ``count_tokens: refuse`` is the 501.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import pytest
from google.genai import types as gtypes

from tests.twserve.conftest import MODELS, Sdks, StackFactory
from tests.twserve.upstream.test_bedrock_anthropic import ENV, MODEL_ID, _bedrock, _config

MESSAGES = [{"role": "user", "content": "How many tokens is this?"}]


def _count(sdks: Sdks, st: Any, **kw: Any) -> Any:
    return sdks.anthropic(st).messages.with_raw_response.count_tokens(
        model=MODELS["anthropic"], messages=MESSAGES, **kw
    )


def test_a_count_goes_to_count_tokens_and_answers_bedrocks_figure(
    stack: StackFactory, sdks: Sdks
) -> None:
    st = stack(
        {"bedrock": _bedrock({"usage": {"input": 1234}})}, config=_config("bedrock"), env=ENV
    )
    raw = _count(
        sdks, st, system="Be brief.", extra_headers={"anthropic-beta": "token-counting-2024-11-01"}
    )
    assert raw.parse().input_tokens == 1234
    assert raw.headers.get("x-thinkwatch-local") is None
    (seen,) = st.mock("bedrock").received
    assert seen.path == f"/model/{MODEL_ID.replace(':', '%3A')}/count-tokens"
    assert seen.status == 200
    assert (seen.header("authorization") or "").startswith("AWS4-HMAC-SHA256 Credential=AKID")
    inner = json.loads(base64.b64decode(seen.json()["input"]["invokeModel"]["body"]))
    assert inner["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in inner and inner["max_tokens"] == 1
    assert inner["system"] == "Be brief." and inner["messages"] == MESSAGES
    assert inner["anthropic_beta"] == ["token-counting-2024-11-01"]
    (row,) = st.wait_rows(1)
    assert row["provider"] == "bedrock" and row["status"] == 200


def test_a_model_without_token_counting_is_estimated_here(stack: StackFactory, sdks: Sdks) -> None:
    config = _config("bedrock")
    config["aliases"] = {MODELS["anthropic"]: ["meta.llama3-70b-instruct-v1:0"]}
    st = stack({"bedrock": _bedrock({"usage": {"input": 1234}})}, config=config, env=ENV)
    raw = _count(sdks, st)
    assert raw.headers.get("x-thinkwatch-local") == "1"
    assert 0 < raw.parse().input_tokens < 100
    (seen,) = st.mock("bedrock").received
    assert seen.status == 400 and seen.path.endswith("/count-tokens")
    st.wait_rows(1)


@pytest.mark.parametrize(
    ("setting", "asked"), [("estimate", False), ("upstream", True)], ids=["estimate", "upstream"]
)
def test_count_tokens_estimate_never_asks_bedrock(
    stack: StackFactory, sdks: Sdks, setting: str, asked: bool
) -> None:
    st = stack(
        {"bedrock": _bedrock({"usage": {"input": 55}}, extra={"count_tokens": setting})},
        config=_config("bedrock"),
        env=ENV,
    )
    raw = _count(sdks, st)
    assert (raw.headers.get("x-thinkwatch-local") is None) is asked
    assert (raw.parse().input_tokens == 55) is asked
    assert len(st.mock("bedrock").received) == int(asked)


def test_count_tokens_refuse_is_the_501(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(
        {"bedrock": _bedrock({}, extra={"count_tokens": "refuse"})},
        config=_config("bedrock"),
        env=ENV,
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        _count(sdks, st)
    assert caught.value.status_code == 501
    assert "count_tokens: refuse" in caught.value.message
    assert st.mock("bedrock").received == type(st.mock("bedrock").received)()


@pytest.mark.parametrize("protocol", ["bedrock-anthropic", "bedrock-converse"])
def test_a_gemini_count_goes_to_count_tokens_too(
    stack: StackFactory, sdks: Sdks, protocol: str
) -> None:
    up = _bedrock({"usage": {"input": 77}})
    up.protocol = protocol
    st = stack({"bedrock": up}, config=_config("bedrock"), env=ENV)
    client, options = sdks.genai(st)
    counted = client.models.count_tokens(
        model=MODELS["gemini"],
        contents="How many tokens?",
        config=gtypes.CountTokensConfig(http_options=options),
    )
    assert counted.total_tokens == 77
    (seen,) = st.mock("bedrock").received
    assert seen.path.endswith("/count-tokens") and seen.status == 200
    sent = seen.json()["input"]
    if protocol == "bedrock-converse":
        assert sent["converse"]["messages"] == [
            {"role": "user", "content": [{"text": "How many tokens?"}]}
        ]
    else:
        inner = json.loads(base64.b64decode(sent["invokeModel"]["body"]))
        assert inner["messages"][0]["role"] == "user"
