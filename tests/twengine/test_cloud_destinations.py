"""``protocol: vertex-gemini``, ``vertex-anthropic`` and ``azure-openai`` in the config and at
send time: their fields, the platforms' standard variables they fall back to, where the token
comes from, and what skips the upstream."""

from __future__ import annotations

from typing import Any

import pytest

from twengine import Candidate, build_config, destination
from twengine.config import ConfigError, GoogleTokenSource
from twengine.config import build_config as build
from twengine.config.credentials import CredentialFault
from twproto.cloud import AzureRoute, VertexPublisher, VertexRoute
from twproto.dialect import Dialect

BASE: dict[str, Any] = {"version": 1, "clients": [{"name": "k", "key": "k-1"}]}


def _config(provider: dict[str, Any]) -> Any:
    return build_config({**BASE, "providers": [{"name": "up", **provider}]}, {})


def _dest(provider: dict[str, Any], env: dict[str, str], model: str = "m-1") -> Any:
    return destination(_config(provider), Candidate(provider="up", model=model), None, env)


def test_vertex_gemini_defaults_to_the_global_endpoint_and_adc() -> None:
    dest = _dest({"protocol": "vertex-gemini", "project": "${P}"}, {"P": "proj"})
    assert dest.target.dialect is Dialect.GEMINI
    assert dest.target.base_url == "https://aiplatform.googleapis.com"
    assert dest.target.cloud == VertexRoute(
        project="proj", location="global", publisher=VertexPublisher.GOOGLE
    )
    assert dest.target.key == "" and dest.token_source == GoogleTokenSource(file=None)


def test_vertex_reads_googles_variables() -> None:
    env = {
        "GOOGLE_CLOUD_PROJECT": "env-proj",
        "GOOGLE_CLOUD_LOCATION": "europe-west4",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
    }
    dest = _dest({"protocol": "vertex-anthropic"}, env)
    assert dest.target.dialect is Dialect.ANTHROPIC
    assert dest.target.base_url == "https://europe-west4-aiplatform.googleapis.com"
    assert dest.target.cloud.publisher is VertexPublisher.ANTHROPIC
    assert dest.target.cloud.project == "env-proj"
    assert dest.token_source == GoogleTokenSource(file="/keys/sa.json")


def test_vertex_static_token_and_base_url_override() -> None:
    fields = {
        "protocol": "vertex-gemini",
        "project": "p",
        "location": "us-east5",
        "key": "${TOKEN}",
        "base_url": "http://127.0.0.1:9100",
    }
    dest = _dest(fields, {"TOKEN": "ya29.x"})
    assert dest.target.key == "ya29.x" and dest.token_source is None
    assert dest.target.base_url == "http://127.0.0.1:9100"


def test_vertex_credentials_file_is_a_template() -> None:
    fields = {"protocol": "vertex-gemini", "project": "p", "credentials_file": "${SA}"}
    assert _dest(fields, {"SA": "/run/sa.json"}).token_source == GoogleTokenSource(
        file="/run/sa.json"
    )
    missing = _dest(fields, {})
    assert isinstance(missing, CredentialFault) and missing.variable == "SA"


@pytest.mark.parametrize(
    ("fields", "field", "code"),
    [
        ({}, "project", "gw.upstream.credentials_missing"),
        ({"project": "p", "location": "${BAD}"}, "location", "gw.upstream.credentials_invalid"),
        ({"project": "p", "location": "${LOC}"}, "location", "gw.upstream.credentials_missing"),
    ],
)
def test_vertex_fields_that_cannot_be_used_skip_the_upstream(
    fields: dict[str, Any], field: str, code: str
) -> None:
    fault = _dest({"protocol": "vertex-gemini", **fields}, {"BAD": "US East"})
    assert isinstance(fault, CredentialFault)
    assert (fault.field, fault.code) == (field, code)


def test_azure_chat_on_a_deployment() -> None:
    fields = {
        "protocol": "azure-openai",
        "base_url": "https://res.openai.azure.com",
        "key": "${K}",
        "api_version": "2024-10-21",
        "deployments": {"gpt-4o": "prod-4o"},
    }
    dest = _dest(fields, {"K": "secret"}, model="gpt-4o")
    assert dest.target.dialect is Dialect.OPENAI_CHAT
    assert dest.target.model == "gpt-4o"  # the model, for prices and rows
    assert dest.target.cloud == AzureRoute(deployment="prod-4o", api_version="2024-10-21")
    other = _dest(fields, {"K": "secret"}, model="gpt-4.1")
    assert other.target.cloud.deployment == "gpt-4.1"


def test_azure_responses_with_entra_id_from_azures_variable() -> None:
    fields = {
        "protocol": "azure-openai",
        "base_url": "https://res.openai.azure.com",
        "api": "responses",
        "auth": "entra-id",
    }
    dest = _dest(fields, {"AZURE_OPENAI_AD_TOKEN": "eyJ.t"})
    assert dest.target.dialect is Dialect.OPENAI_RESPONSES
    assert dest.target.key == "eyJ.t" and dest.target.cloud.entra
    assert dest.target.cloud.api_version is None
    fault = _dest(fields, {"AZURE_OPENAI_API_KEY": "not-this-one"})
    assert isinstance(fault, CredentialFault) and fault.variable == "AZURE_OPENAI_AD_TOKEN"


def test_a_platforms_field_on_another_protocol_is_refused() -> None:
    entries = [
        {"name": "a", "protocol": "gemini", "base_url": "https://x", "project": "p"},
        {"name": "b", "protocol": "vertex-gemini", "deployments": {"a": "b"}},
        {"name": "c", "protocol": "azure-openai", "base_url": "https://x", "location": "l"},
    ]
    with pytest.raises(ConfigError) as refused:
        build({**BASE, "providers": entries}, {})
    codes = [(p.path, p.code) for p in refused.value.problems]
    assert codes == [
        ("providers[0].project", "config.cloud_field_protocol"),
        ("providers[1].deployments", "config.cloud_field_protocol"),
        ("providers[2].location", "config.cloud_field_protocol"),
    ]


def test_azure_needs_its_base_url_and_takes_only_its_apis() -> None:
    with pytest.raises(ConfigError) as refused:
        build({**BASE, "providers": [{"name": "a", "protocol": "azure-openai", "api": "x"}]}, {})
    codes = {p.code for p in refused.value.problems}
    assert "config.missing_field" in codes and len(refused.value.problems) == 2


def test_a_location_written_out_that_names_no_host_refuses_the_config() -> None:
    with pytest.raises(ConfigError) as refused:
        _config({"protocol": "vertex-gemini", "project": "p", "location": "US East"})
    assert [p.path for p in refused.value.problems] == ["providers[0].location"]


def test_the_check_warns_about_a_vertex_project_not_set() -> None:
    config = build(
        {**BASE, "providers": [{"name": "v", "protocol": "vertex-gemini", "key": "t"}]}, {}
    )
    assert [(w.path, w.code) for w in config.warnings] == [
        ("providers[0].project", "config.env_missing")
    ]
