"""``protocol: bedrock-anthropic`` in the config and at send time: its AWS fields, the standard
AWS variables they fall back to, a Bedrock API key, and credentials that cannot sign."""

from __future__ import annotations

from typing import Any

import pytest

from twengine import Candidate, build_config, destination
from twengine.config import ConfigError
from twengine.config.credentials import CredentialFault, credential_faults
from twproto.dialect import Dialect

BASE: dict[str, Any] = {"version": 1, "clients": [{"name": "k", "key": "k-1"}]}
AWS_ENV = {
    "AWS_REGION": "eu-central-1",
    "AWS_ACCESS_KEY_ID": "AKIDENV",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
    "AWS_SESSION_TOKEN": "env-token",
}


def _config(provider: dict[str, Any]) -> Any:
    entry = {"name": "br", "protocol": "bedrock-anthropic", **provider}
    return build_config({**BASE, "providers": [entry]}, {})


def _dest(provider: dict[str, Any], env: dict[str, str]) -> Any:
    config = _config(provider)
    return destination(config, Candidate(provider="br", model="anthropic.claude-v2"), None, env)


def test_protocol_is_anthropic_with_the_regions_endpoint() -> None:
    dest = _dest({"region": "us-west-2"}, AWS_ENV)
    assert dest.target.dialect is Dialect.ANTHROPIC
    assert dest.target.base_url == "https://bedrock-runtime.us-west-2.amazonaws.com"
    assert dest.target.aws is not None and dest.target.aws.region == "us-west-2"
    creds = dest.target.aws.credentials
    assert creds is not None
    assert (creds.access_key_id, creds.secret_access_key, creds.session_token) == (
        "AKIDENV",
        "env-secret",
        "env-token",
    )


def test_config_fields_are_templates_and_the_envs_token_stays_with_the_envs_key() -> None:
    fields = {"aws_access_key_id": "${MY_ID}", "aws_secret_access_key": "${MY_SECRET}"}
    dest = _dest(fields, {**AWS_ENV, "MY_ID": "AKIDCONF", "MY_SECRET": "conf-secret"})
    creds = dest.target.aws.credentials
    assert (creds.access_key_id, creds.session_token) == ("AKIDCONF", None)
    assert dest.target.aws.region == "eu-central-1"  # AWS_REGION
    assert dest.target.base_url == "https://bedrock-runtime.eu-central-1.amazonaws.com"


def test_a_key_is_a_bedrock_api_key_and_so_is_aws_bearer_token_bedrock() -> None:
    dest = _dest({"key": "${BK}", "region": "us-east-1"}, {"BK": "brk-1"})
    assert dest.target.aws.credentials is None and dest.target.key == "brk-1"
    dest = _dest({"region": "us-east-1"}, {"AWS_BEARER_TOKEN_BEDROCK": "brk-2"})
    assert dest.target.aws.credentials is None and dest.target.key == "brk-2"


@pytest.mark.parametrize(
    ("fields", "env", "field"),
    [
        ({}, {"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "s"}, "region"),
        ({"region": "r"}, {"AWS_SECRET_ACCESS_KEY": "s"}, "aws_access_key_id"),
        ({"region": "r"}, {"AWS_ACCESS_KEY_ID": "A"}, "aws_secret_access_key"),
        (
            {"region": "r", "aws_secret_access_key": "${S}"},
            {"AWS_ACCESS_KEY_ID": "A"},
            "aws_secret_access_key",
        ),
        (
            {"region": "r"},
            {"AWS_ACCESS_KEY_ID": "A\n", "AWS_SECRET_ACCESS_KEY": "s"},
            "aws_access_key_id",
        ),
    ],
)
def test_credentials_that_cannot_sign_are_a_fault_without_the_value(
    fields: dict[str, Any], env: dict[str, str], field: str
) -> None:
    found = _dest(fields, env)
    assert isinstance(found, CredentialFault)
    assert found.field == field
    assert found.code in ("gw.upstream.credentials_missing", "gw.upstream.credentials_invalid")
    assert "A\n" not in found.message
    # The config validator sees the same fault.
    assert credential_faults(_config(fields).provider("br"), env)


def test_aws_fields_belong_to_bedrock_only() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(
            {**BASE, "providers": [{"name": "a", "base_url": "http://x", "region": "r"}]}, {}
        )
    assert "config.aws_field_protocol" in str(caught.value)


def test_count_tokens_belongs_to_bedrock_and_takes_three_values() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(
            {
                **BASE,
                "providers": [{"name": "a", "base_url": "http://x", "count_tokens": "estimate"}],
            },
            {},
        )
    assert "config.aws_field_protocol" in str(caught.value)
    for value in ("upstream", "estimate", "refuse"):
        assert _config({"count_tokens": value}).provider("br").bedrock.count_tokens == value  # type: ignore[union-attr]
    assert _config({}).provider("br").bedrock.count_tokens == "upstream"  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        _config({"count_tokens": "sometimes"})


def test_bedrock_converse_is_an_anthropic_upstream_sent_as_converse() -> None:
    config = build_config(
        {
            **BASE,
            "providers": [
                {"name": "cv", "protocol": "bedrock-converse", "region": "eu-west-1", "key": "k"}
            ],
        },
        {},
    )
    provider = config.provider("cv")
    assert provider.protocol == "anthropic"
    assert provider.bedrock is not None and provider.bedrock.converse
    found = destination(config, Candidate(provider="cv", model="amazon.nova-pro-v1:0"), None, {})
    assert not isinstance(found, CredentialFault)
    assert found.target.converse and found.target.aws is not None
    assert found.target.base_url == "https://bedrock-runtime.eu-west-1.amazonaws.com"
    # bedrock-anthropic is InvokeModel.
    invoke = _dest({"region": "eu-west-1", "key": "k"}, {})
    assert not invoke.target.converse
