"""`twserve connect CLIENT`: the lines for every client, filled in from the config or the
options, and good enough that the official SDKs reach a running gateway with nothing else."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai

from tests.twserve.conftest import KEY, StackFactory
from tests.twserve.support.stack import Upstream
from twmock import MockSettings, parse_script
from twserve.cli.connect import CLIENTS, Target, connect_lines, gateway_url
from twserve.cli.main import main

CONFIG = """\
version: 1
listen:
  gateway:
    bind: {bind}
    port: 9123
clients:
  - name: team
    key: ${{TEAM_KEY}}
  - name: ops
    key: tw-ops-key
providers: []
"""


def _config(tmp_path: Path, bind: str = "0.0.0.0") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(bind=bind))
    return path


def shell_env(lines: list[str]) -> dict[str, str | None]:
    """What the printed shell lines do to the environment: name → value, None for an unset."""
    env: dict[str, str | None] = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words[:1] == ["unset"]:
            env.update(dict.fromkeys(words[1:]))
    return env


TARGET = Target(url="http://10.1.2.3:8788", key="sk-tw-abc", model="m-1")


def test_claude_code_gets_the_base_url_a_bearer_key_and_the_model_slots() -> None:
    env = shell_env(connect_lines("claude-code", TARGET))
    assert env == {
        "ANTHROPIC_BASE_URL": "http://10.1.2.3:8788",
        "ANTHROPIC_AUTH_TOKEN": "sk-tw-abc",
        "ANTHROPIC_API_KEY": None,
        "ANTHROPIC_MODEL": "m-1",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "m-1",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "m-1",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "m-1",
    }
    # Without a model the slots are shown, commented out.
    plain = connect_lines("claude-code", Target(url=TARGET.url, key=TARGET.key))
    assert "ANTHROPIC_MODEL" not in shell_env(plain)
    assert any(line.startswith("# export ANTHROPIC_DEFAULT_HAIKU_MODEL=") for line in plain)


def test_codex_gets_a_responses_provider_that_parses_as_toml() -> None:
    lines = connect_lines("codex", TARGET)
    toml_start = next(i for i, line in enumerate(lines) if line.startswith("model_provider"))
    shell = lines[:toml_start]
    config = tomllib.loads("\n".join(lines[toml_start:]))
    assert shell_env(shell) == {"TWSERVE_API_KEY": "sk-tw-abc"}
    assert config == {
        "model_provider": "twserve",
        "model": "m-1",
        "model_providers": {
            "twserve": {
                "name": "twserve",
                "base_url": "http://10.1.2.3:8788/v1",
                "env_key": "TWSERVE_API_KEY",
                "wire_api": "responses",
                "supports_websockets": True,
            }
        },
    }


def test_gemini_cli_gets_its_base_url_key_and_auth_setting() -> None:
    lines = connect_lines("gemini-cli", TARGET)
    assert shell_env(lines) == {
        "GOOGLE_GEMINI_BASE_URL": "http://10.1.2.3:8788",
        "GEMINI_API_KEY": "sk-tw-abc",
        "GEMINI_MODEL": "m-1",
    }
    assert '#   {"security": {"auth": {"selectedType": "gemini-api-key"}}}' in lines


def test_curl_lines_run_as_shell_words_in_every_format() -> None:
    lines = [line for line in connect_lines("curl", TARGET) if line.startswith("curl")]
    urls = [shlex.split(line)[2] for line in lines]
    assert urls == [
        "http://10.1.2.3:8788/v1/messages",
        "http://10.1.2.3:8788/v1/chat/completions",
        "http://10.1.2.3:8788/v1/responses",
        "http://10.1.2.3:8788/v1beta/models/m-1:streamGenerateContent?alt=sse",
    ]
    headers = [shlex.split(line)[4] for line in lines]
    assert headers[0] == "x-api-key: sk-tw-abc" and headers[3] == "x-goog-api-key: sk-tw-abc"


def test_values_are_quoted_for_the_shell() -> None:
    odd = Target(url="http://h:1", key="k'ey $HOME")
    assert shell_env(connect_lines("openai", odd))["OPENAI_API_KEY"] == "k'ey $HOME"


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8788"),
        ("::", "http://[::1]:8788"),
        ("10.0.0.7", "http://10.0.0.7:8788"),
        ("fd00::7", "http://[fd00::7]:8788"),
        ("gw.internal", "http://gw.internal:8788"),
    ],
)
def test_gateway_url_from_the_bind(bind: str, url: str) -> None:
    assert gateway_url(bind, 8788) == url


def test_address_and_key_come_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config(tmp_path)
    monkeypatch.setenv("TEAM_KEY", "tw-team-from-env")
    assert main(["connect", "openai", "--config", str(path), "--key-name", "team"]) == 0
    assert shell_env(capsys.readouterr().out.splitlines()) == {
        "OPENAI_BASE_URL": "http://127.0.0.1:9123/v1",
        "OPENAI_API_KEY": "tw-team-from-env",
    }
    assert main(["connect", "anthropic", "--config", str(path), "--key-name", "ops"]) == 0
    assert shell_env(capsys.readouterr().out.splitlines())["ANTHROPIC_API_KEY"] == "tw-ops-key"


def test_a_key_must_be_named_when_the_config_has_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config(tmp_path)
    monkeypatch.setenv("TEAM_KEY", "tw-team-from-env")
    assert main(["connect", "codex", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--key-name NAME (one of: team, ops)" in err
    assert main(["connect", "codex", "--config", str(path), "--key-name", "nobody"]) == 2
    assert "no key named 'nobody'" in capsys.readouterr().err
    assert main(["connect", "codex", "--config", str(tmp_path / "none.yaml"), "--key", "k"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["connect", "codex", "--url", "127.0.0.1:1", "--key", "k"]) == 2
    assert "--url must start with http://" in capsys.readouterr().err


def test_the_command_runs(tmp_path: Path) -> None:
    # The installed console script, as an operator runs it.
    twserve = Path(sys.executable).with_name("twserve")
    path = _config(tmp_path, bind="127.0.0.1")
    env = {**os.environ, "TEAM_KEY": "tw-team-from-env"}
    for client in ("claude-code", "codex"):
        argv = [str(twserve), "connect", client, "--config", str(path), "--key-name", "team"]
        out = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=60, check=True
        ).stdout
        assert "tw-team-from-env" in out and "http://127.0.0.1:9123" in out, client
    assert sorted(CLIENTS) == [
        "anthropic",
        "claude-code",
        "codex",
        "curl",
        "gemini-cli",
        "genai",
        "openai",
    ]


# --- the official SDKs, configured by nothing but the printed lines ---------------------------

TEXT = "Hello from the mock, through the printed lines."


@pytest.mark.sdk
def test_sdks_reach_the_gateway_with_only_the_printed_variables(
    stack: StackFactory, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    st = stack({"up": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT})))})
    for name in (
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "GOOGLE_GEMINI_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    # A key left over in the shell would win over GEMINI_API_KEY; the genai lines unset it.
    monkeypatch.setenv("GOOGLE_API_KEY", "a-stale-key-the-lines-unset")

    def apply(client: str) -> None:
        assert main(["connect", client, "--url", st.url, "--key", KEY]) == 0
        for var, value in shell_env(capsys.readouterr().out.splitlines()).items():
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)

    apply("openai")
    with openai.OpenAI(max_retries=0, timeout=10) as client:
        answer = client.chat.completions.create(
            model="claude-e2e-1", messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.choices[0].message.content == TEXT

    apply("anthropic")
    with anthropic.Anthropic(max_retries=0, timeout=10) as aclient:
        message = aclient.messages.create(
            model="claude-e2e-1", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert message.content[0].type == "text" and message.content[0].text == TEXT

    apply("genai")
    assert "GOOGLE_API_KEY" not in os.environ
    gclient = genai.Client()
    reply = gclient.models.generate_content(model="claude-e2e-1", contents="hi")
    assert reply.text == TEXT

    # The curl lines, as printed, one streamed request per format.
    assert main(["connect", "curl", "--url", st.url, "--key", KEY, "--model", "claude-e2e-1"]) == 0
    curls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("curl ")]
    assert len(curls) == 4
    for line in curls:
        out = subprocess.run(
            [*shlex.split(line), "-sS", "--fail", "--max-time", "20"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, (line, out.stderr)
        assert "data:" in out.stdout, (line, out.stdout[:300])

    # Every request went through the gateway to the one upstream, with the upstream's key.
    received = st.mock("up").received
    assert len(received) == 7
    assert {r.header("x-api-key") for r in received} == {"upstream-key-up"}
