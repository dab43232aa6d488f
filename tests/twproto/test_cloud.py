"""twproto.cloud through `upstream_request`: Vertex AI's and Azure OpenAI's paths, bodies and
credential headers, for every client format; and the mock reads every path the gateway writes
(a Hypothesis property over project, location and model names)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twmock.serve.cloud import cloud_call
from twproto import Dialect
from twproto.cloud import (
    VERTEX_ANTHROPIC_VERSION,
    AzureRoute,
    VertexPublisher,
    VertexRoute,
    azure_body,
    azure_path,
    vertex_anthropic_body,
    vertex_base_url,
    vertex_path,
)
from twproto.paths import Operation
from twproto.upstream_request import ClientCall, UpstreamRequest, UpstreamTarget, upstream_request

GEMINI = VertexRoute(project="proj-1", location="us-central1", publisher=VertexPublisher.GOOGLE)
CLAUDE = VertexRoute(project="proj-1", location="us-east5", publisher=VertexPublisher.ANTHROPIC)


def _request(
    target: UpstreamTarget,
    client: Dialect,
    *,
    stream: bool,
    sse: bool = True,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> UpstreamRequest:
    body = json.dumps({"model": target.model, "max_tokens": 5, "messages": []}).encode()
    call = ClientCall(
        dialect=client, operation=Operation.GENERATE, stream=stream, sse=sse, headers=headers or []
    )
    return upstream_request(target, call, body)


def test_vertex_endpoints_by_location() -> None:
    assert vertex_base_url("global") == "https://aiplatform.googleapis.com"
    assert vertex_base_url("europe-west4") == "https://europe-west4-aiplatform.googleapis.com"


@pytest.mark.parametrize(
    ("stream", "sse", "method"),
    [
        (False, True, "generateContent"),
        (True, True, "streamGenerateContent?alt=sse"),
        (True, False, "streamGenerateContent"),
    ],
)
def test_vertex_gemini_paths(stream: bool, sse: bool, method: str) -> None:
    path = vertex_path(GEMINI, "gemini-2.5-flash", stream=stream, sse=sse)
    assert path == (
        "/v1/projects/proj-1/locations/us-central1/publishers/google/models/"
        f"gemini-2.5-flash:{method}"
    )
    counted = vertex_path(GEMINI, "gemini-2.5-flash", stream=False, count=True)
    assert counted.endswith(":countTokens")


def test_vertex_anthropic_paths_keep_the_at_of_a_dated_model() -> None:
    assert vertex_path(CLAUDE, "claude-sonnet-4-5@20250929", stream=True).endswith(
        "/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict"
    )
    assert vertex_path(CLAUDE, "claude-opus-4-1", stream=False).endswith(":rawPredict")


def test_vertex_anthropic_body_loses_model_keeps_stream_gains_version() -> None:
    out = json.loads(vertex_anthropic_body(b'{"model":"m","stream":true,"max_tokens":5}'))
    assert out == {"stream": True, "max_tokens": 5, "anthropic_version": VERTEX_ANTHROPIC_VERSION}
    own = json.loads(vertex_anthropic_body(b'{"model":"m","anthropic_version":"vertex-2099"}'))
    assert own["anthropic_version"] == "vertex-2099"


@pytest.mark.parametrize("client", list(Dialect))
def test_a_vertex_anthropic_request_from_any_client(client: Dialect) -> None:
    target = UpstreamTarget(
        dialect=Dialect.ANTHROPIC,
        base_url="https://us-east5-aiplatform.googleapis.com/",
        key="ya29.token",
        model="claude-sonnet-4-5@20250929",
        cloud=CLAUDE,
    )
    headers = [(b"anthropic-beta", b"flag-1"), (b"x-api-key", b"gateway-key")]
    req = _request(target, client, stream=True, headers=headers)
    assert req.url == (
        "https://us-east5-aiplatform.googleapis.com/v1/projects/proj-1/locations/us-east5/"
        "publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict"
    )
    sent = dict(req.headers)
    assert sent[b"authorization"] == b"Bearer ya29.token"
    assert b"x-api-key" not in sent and b"anthropic-version" not in sent
    # An Anthropic client's beta flags go along as a header; other clients' headers never do.
    assert (sent.get(b"anthropic-beta") == b"flag-1") is (client is Dialect.ANTHROPIC)
    body = json.loads(req.body)
    assert "model" not in body and body["anthropic_version"] == VERTEX_ANTHROPIC_VERSION


def test_a_gemini_clients_json_array_stream_stays_one_on_vertex() -> None:
    target = UpstreamTarget(
        dialect=Dialect.GEMINI, base_url="http://h", key="t", model="gemini-2.5-pro", cloud=GEMINI
    )
    array = _request(target, Dialect.GEMINI, stream=True, sse=False)
    assert array.url.endswith(":streamGenerateContent") and not array.sse
    chat = _request(target, Dialect.OPENAI_CHAT, stream=True)
    assert chat.url.endswith(":streamGenerateContent?alt=sse") and chat.sse
    assert dict(chat.headers)[b"authorization"] == b"Bearer t"
    assert b"x-goog-api-key" not in dict(chat.headers)


@pytest.mark.parametrize(
    ("route", "dialect", "path"),
    [
        (
            AzureRoute(deployment="dep-1", api_version="2024-10-21"),
            Dialect.OPENAI_CHAT,
            "/openai/deployments/dep-1/chat/completions?api-version=2024-10-21",
        ),
        (
            AzureRoute(deployment="dep-1", api_version="2025-04-01-preview"),
            Dialect.OPENAI_RESPONSES,
            "/openai/responses?api-version=2025-04-01-preview",
        ),
        (AzureRoute(deployment="dep-1"), Dialect.OPENAI_CHAT, "/openai/v1/chat/completions"),
        (
            AzureRoute(deployment="d", api_version="v1"),
            Dialect.OPENAI_RESPONSES,
            "/openai/v1/responses",
        ),
    ],
)
def test_azure_paths(route: AzureRoute, dialect: Dialect, path: str) -> None:
    assert azure_path(route, dialect) == path


def test_azure_body_names_the_deployment() -> None:
    route = AzureRoute(deployment="my-gpt4o")
    assert json.loads(azure_body(b'{"model":"gpt-4o","n":1}', route, "gpt-4o")) == {
        "model": "my-gpt4o",
        "n": 1,
    }
    same = b'{"model":"gpt-4o"}'
    assert azure_body(same, AzureRoute(deployment="gpt-4o"), "gpt-4o") is same


@pytest.mark.parametrize("entra", [False, True])
def test_azure_request_key_header(entra: bool) -> None:
    target = UpstreamTarget(
        dialect=Dialect.OPENAI_CHAT,
        base_url="https://res.openai.azure.com",
        key="secret",
        model="gpt-4o",
        cloud=AzureRoute(deployment="dep", api_version="2024-10-21", entra=entra),
    )
    req = _request(target, Dialect.OPENAI_CHAT, stream=False, headers=[(b"openai-beta", b"x")])
    sent = dict(req.headers)
    if entra:
        assert sent[b"authorization"] == b"Bearer secret" and b"api-key" not in sent
    else:
        assert sent[b"api-key"] == b"secret" and b"authorization" not in sent
    assert sent[b"openai-beta"] == b"x"
    assert req.url == (
        "https://res.openai.azure.com/openai/deployments/dep/chat/completions"
        "?api-version=2024-10-21"
    )


_NAME = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30
)


@given(project=_NAME, location=_NAME, model=_NAME, stream=st.booleans(), google=st.booleans())
def test_the_mock_reads_every_vertex_path_the_gateway_writes(
    project: str, location: str, model: str, stream: bool, google: bool
) -> None:
    publisher = VertexPublisher.GOOGLE if google else VertexPublisher.ANTHROPIC
    route = VertexRoute(project=project, location=location, publisher=publisher)
    path, _, _query = vertex_path(route, model, stream=stream).partition("?")
    call = cloud_call("POST", path)
    assert call is not None and call.platform == "vertex"
    assert call.model == model and call.anthropic is not google


@given(deployment=_NAME, version=st.none() | st.sampled_from(["2024-10-21", "preview", "v1"]))
def test_the_mock_reads_every_azure_path_the_gateway_writes(
    deployment: str, version: str | None
) -> None:
    for dialect in (Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES):
        route = AzureRoute(deployment=deployment, api_version=version)
        path, _, _query = azure_path(route, dialect).partition("?")
        call = cloud_call("POST", path)
        assert call is not None and call.platform == "azure"
        if dialect is Dialect.OPENAI_CHAT and call.versioned:
            assert call.model == deployment
