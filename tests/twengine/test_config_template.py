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
