"""``${VAR}`` templates: expansion, escapes, malformed templates and missing variables."""

from __future__ import annotations

import pytest

from twengine.config import TemplateError, resolve_template, template_variables

ENV = {"KEY": "sk-123", "TEAM": "core", "EMPTY": ""}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("${KEY}", "sk-123"),
        ("Bearer ${KEY}", "Bearer sk-123"),
        ("${TEAM}-${KEY}", "core-sk-123"),
        ("plain", "plain"),
        ("", ""),
        ("${EMPTY}", ""),
        ("cost $5", "cost $5"),
        ("a$b$", "a$b$"),
        ("$${KEY}", "${KEY}"),
    ],
)
def test_resolve(template: str, expected: str) -> None:
    assert resolve_template(template, ENV) == expected


def test_missing_variable() -> None:
    with pytest.raises(TemplateError) as info:
        resolve_template("x-${NOPE}", ENV)
    assert info.value.code == "config.env_missing"
    assert info.value.variable == "NOPE"
    assert "NOPE" in str(info.value)


@pytest.mark.parametrize("template", ["${KEY", "${}", "${1A}", "${A-B}", "${ KEY}"])
def test_malformed(template: str) -> None:
    with pytest.raises(TemplateError) as info:
        resolve_template(template, ENV)
    assert info.value.code == "config.template_invalid"
    with pytest.raises(TemplateError):
        template_variables(template)


def test_variables() -> None:
    assert template_variables("${A}:${B_2}$${C}") == ("A", "B_2")
    assert template_variables("none") == ()


def test_config_keeps_the_template() -> None:
    from twengine.config import build_config

    config = build_config(
        {
            "version": 1,
            "providers": [{"name": "p", "base_url": "https://x.example", "key": "${KEY}"}],
        }
    )
    assert config.provider("p").key == "${KEY}"


@pytest.mark.parametrize(
    "template",
    ["sk-live-SECRET${", "sk-live-SECRET${oops", "${sk-live-SECRET}", "Bearer ${a b SECRET}"],
)
def test_malformed_messages_never_quote_the_value(template: str) -> None:
    # The value is a secret or holds one: a message that quotes it puts it in logs and answers.
    with pytest.raises(TemplateError) as info:
        template_variables(template)
    assert "SECRET" not in info.value.message and "SECRET" not in str(info.value)


def test_config_problems_never_quote_a_malformed_secret() -> None:
    from twengine.config import ConfigError, build_config

    data = {
        "version": 1,
        "listen": {"control": {"key": "ctl-SECRET-${"}},
        "clients": [{"name": "c", "key": "gw-SECRET-${x"}],
        "providers": [
            {
                "name": "p",
                "base_url": "https://user:SECRET@relay.example/v1?x",
                "key": "up-SECRET-${",
                "headers": {"x-token": "${SECRET-1}"},
            }
        ],
    }
    with pytest.raises(ConfigError) as info:
        build_config(data, {})
    assert len(info.value.problems) == 5
    assert "SECRET" not in str(info.value)


def test_gateway_keys_are_resolved_with_an_environment() -> None:
    from twengine.config import build_config

    data = {"version": 1, "clients": [{"name": "c", "key": "gw-${PART}"}]}
    assert build_config(data, {"PART": "abc"}).clients[0].key == "gw-abc"
    # Without an environment (checking the shape only) the template is kept as written.
    assert build_config(data).clients[0].key == "gw-${PART}"
