"""Model listings in each client shape, checked against the official SDKs' own parsers."""

from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from twproto import json_loads
from twproto.dialect import Dialect
from twproto.model_listing import ModelInfo, encode_model, encode_model_list

MODELS = (
    ModelInfo(
        id="claude-sonnet",
        display_name="Claude Sonnet",
        context_window=200_000,
        max_output_tokens=64_000,
        created=1_700_000_000,
    ),
    ModelInfo(id="fast", context_window=None, max_output_tokens=8192),
)


def _client(body: bytes) -> httpx2.Client:
    return httpx2.Client(
        transport=httpx2.MockTransport(
            lambda request: httpx2.Response(
                200, headers={"content-type": "application/json"}, content=body
            )
        )
    )


def test_openai_shape_and_sdk() -> None:
    body = encode_model_list(Dialect.OPENAI_CHAT, MODELS)
    obj = json_loads(body)
    assert obj["object"] == "list"
    assert obj["data"][0] == {
        "id": "claude-sonnet",
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "twserve",
        "context_window": 200_000,
        "max_output_tokens": 64_000,
    }
    client = openai.OpenAI(api_key="k", base_url="http://t/v1", http_client=_client(body))
    assert [m.id for m in client.models.list()] == ["claude-sonnet", "fast"]
    one = openai.OpenAI(
        api_key="k",
        base_url="http://t/v1",
        http_client=_client(encode_model(Dialect.OPENAI_CHAT, MODELS[1])),
    ).models.retrieve("fast")
    assert one.id == "fast"


def test_anthropic_shape_and_sdk() -> None:
    body = encode_model_list(Dialect.ANTHROPIC, MODELS)
    obj = json_loads(body)
    assert obj["has_more"] is False
    assert (obj["first_id"], obj["last_id"]) == ("claude-sonnet", "fast")
    assert obj["data"][0]["created_at"] == "2023-11-14T22:13:20Z"
    assert obj["data"][0]["max_input_tokens"] == 200_000
    client = anthropic.Anthropic(api_key="k", base_url="http://t", http_client=_client(body))
    listed = list(client.models.list())
    assert [(m.id, m.display_name) for m in listed] == [
        ("claude-sonnet", "Claude Sonnet"),
        ("fast", "fast"),
    ]


def test_gemini_shape_and_sdk() -> None:
    body = encode_model_list(Dialect.GEMINI, MODELS)
    obj = json_loads(body)
    first = obj["models"][0]
    assert first["name"] == "models/claude-sonnet"
    assert (first["inputTokenLimit"], first["outputTokenLimit"]) == (200_000, 64_000)
    assert "inputTokenLimit" not in obj["models"][1]
    client = genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(base_url="http://t", httpx_client=_client(body)),
    )
    listed = list(client.models.list())
    assert [m.name for m in listed] == ["models/claude-sonnet", "models/fast"]
    assert listed[0].input_token_limit == 200_000


def test_empty_listing_and_validation() -> None:
    assert json_loads(encode_model_list(Dialect.ANTHROPIC, ())) == {
        "data": [],
        "has_more": False,
        "first_id": None,
        "last_id": None,
    }
    assert json_loads(encode_model_list(Dialect.GEMINI, [])) == {"models": []}
    with pytest.raises(ValueError):
        ModelInfo(id="")
