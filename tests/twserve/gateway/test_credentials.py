"""Keys and headers written as ``${VAR}``, through the running gateway and the official SDKs.

Gateway keys are resolved when the config loads (the secret is what clients present; the
template text is not a key); `default_key` serves keyless requests. Upstream keys and headers are
read at send time: a variable that is not set, or a value that cannot travel in a header (a
pasted trailing newline), skips that upstream — the request goes on to a healthy one, and the
secret appears in no answer, log line or row (docs/configuration.md, docs/failover.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anthropic
import httpcore
import openai
import pytest

from tests.twserve.conftest import (
    KEY,
    MODELS,
    Sdks,
    StackFactory,
    ask,
    attempts,
    fallback,
    http,
)
from tests.twserve.support.stack import CONTROL_KEY, Upstream, running_stack
from twmock.script import MockSettings, parse_script

TEXT = "An answer from upstream b."
SECRET = "sk-live-0123456789abcdef"


def _up(protocol: str, **extra: Any) -> Upstream:
    return Upstream(
        protocol, MockSettings(script=parse_script({"text": TEXT}), seed=3), extra=extra
    )


def _chat(stack_url: str, key: str | None) -> tuple[int, Any]:
    headers = [("content-type", "application/json")]
    if key is not None:
        headers.append(("authorization", f"Bearer {key}"))
    body = {"model": MODELS["openai-chat"], "messages": [{"role": "user", "content": "hi"}]}
    reply = http(
        stack_url + "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers
    )
    return reply.status, reply.json()


# --- gateway keys -----------------------------------------------------------------------------


def test_gateway_key_template_is_resolved_at_load(stack: StackFactory, sdks: Sdks) -> None:
    s = stack(
        {"b": _up("openai-chat")},
        config={"clients": [{"name": "tester", "key": "${GATEWAY_KEY}"}]},
        env={"GATEWAY_KEY": SECRET},
    )
    # The secret is the key: the official SDK presenting it is served.
    answer = ask(sdks, s, "openai-chat", stream=False, key=SECRET)
    assert answer.text == TEXT
    # The template's text is not a key.
    with pytest.raises(openai.AuthenticationError):
        ask(sdks, s, "openai-chat", stream=False, key="${GATEWAY_KEY}")


def test_gateway_key_variable_not_set_refuses_the_config(stack: StackFactory) -> None:
    from twengine.config import ConfigError

    with pytest.raises(ConfigError) as info:
        stack(
            {"b": _up("openai-chat")},
            config={"clients": [{"name": "tester", "key": "${GATEWAY_KEY}"}]},
            env={},
        )
    assert [(p.code, p.path) for p in info.value.problems] == [
        ("config.env_missing", "clients[0].key")
    ]


def test_keys_view_shows_neither_template_nor_secret(tmp_path: Path) -> None:
    config = {"clients": [{"name": "tester", "key": "${GATEWAY_KEY}"}]}
    with running_stack(
        tmp_path,
        {"b": _up("openai-chat")},
        config=config,
        control=True,
        env={"GATEWAY_KEY": SECRET},
    ) as s:
        resp = httpcore.request(
            "GET",
            s.control_url + "/keys",
            headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
        )
    assert resp.status == 200
    text = resp.content.decode()
    assert "${" not in text and "GATEWAY_KEY" not in text and SECRET not in text
    assert json.loads(text)["keys"][0]["key"] == "…" + SECRET[-4:]


def test_default_key_serves_keyless_requests(stack: StackFactory) -> None:
    s = stack(
        {"b": _up("openai-chat")},
        config={
            "clients": [{"name": "tester", "key": KEY}, {"name": "local", "key": "other-key"}],
            "default_key": "local",
        },
    )
    status, body = _chat(s.url, None)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == TEXT
    # A wrong key is not a missing one: it is refused even with a default_key.
    status, body = _chat(s.url, "not-a-key")
    assert status == 401, body
    assert [r["key_name"] for r in s.wait_rows(1)] == ["local"]


def test_keyless_request_without_default_key_is_refused(stack: StackFactory) -> None:
    s = stack({"b": _up("openai-chat")})
    status, body = _chat(s.url, None)
    assert status == 401 and body["error"]["code"] == "gw.auth.missing_key"


# --- upstream credentials ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "env", "skipped"),
    [
        ({"key": "${A_KEY}"}, {}, "credentials_missing"),
        ({"key": "${A_KEY}"}, {"A_KEY": SECRET + "\n"}, "credentials_invalid"),
        ({"headers": {"x-team": "${TEAM}"}}, {"TEAM": "core\r\nx-evil: 1"}, "credentials_invalid"),
    ],
    ids=["variable-not-set", "trailing-newline", "header-with-crlf"],
)
def test_unusable_credentials_skip_to_a_healthy_upstream(
    stack: StackFactory,
    sdks: Sdks,
    caplog: pytest.LogCaptureFixture,
    extra: dict[str, Any],
    env: dict[str, str],
    skipped: str,
) -> None:
    # The value is checked at load only when the variable is set; a variable set to a bad value
    # refuses the config there, so these upstreams get theirs after loading, as a rotation would.
    s = stack(
        {"a": _up("anthropic", **extra), "b": _up("anthropic")},
        config=fallback("a", "b"),
        env={},
    )
    s.app.gateway.env = env
    caplog.set_level(logging.DEBUG)
    answer = ask(sdks, s, "anthropic", stream=True)
    assert answer.text == TEXT
    assert s.mock("a").count() == 0
    row = s.wait_rows(1)[0]
    assert row["status"] == 200 and row["provider"] == "b"
    tried = attempts(row)
    assert [(a["provider"], a["outcome"], a["skipped"]) for a in tried] == [
        ("a", "skipped", skipped),
        ("b", "ok", None),
    ]
    assert tried[0]["error"] == f"gw.upstream.{skipped}"
    assert SECRET not in caplog.text and SECRET not in json.dumps(row)


def test_only_candidate_without_credentials_is_a_config_error(
    stack: StackFactory, sdks: Sdks
) -> None:
    s = stack({"a": _up("anthropic", key="${A_KEY}")}, env={})
    with pytest.raises(anthropic.APIStatusError) as info:
        ask(sdks, s, "anthropic", stream=False)
    assert info.value.status_code == 503
    assert "A_KEY" in str(info.value.message)
    row = s.wait_rows(1)[0]
    assert row["error_code"] == "gw.upstream.credentials_missing"


def test_upstream_variable_not_set_is_a_load_warning(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="twserve")
    stack({"a": _up("anthropic", key="${A_KEY}"), "b": _up("anthropic")}, env={})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("providers[0].key" in w and "A_KEY" in w for w in warnings), warnings


def test_upstream_secret_with_newline_refuses_the_config(stack: StackFactory) -> None:
    from twengine.config import ConfigError

    with pytest.raises(ConfigError) as info:
        stack({"a": _up("anthropic", key="${A_KEY}")}, env={"A_KEY": SECRET + "\n"})
    assert [(p.code, p.path) for p in info.value.problems] == [
        ("config.secret_invalid", "providers[0].key")
    ]
    assert SECRET not in str(info.value)
