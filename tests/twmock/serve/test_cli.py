"""The mock's command line (twmock/serve/cli.py): every flag into `MockSettings`, and the two
commands that serve it, ``python -m twmock`` and ``twserve mock-upstream``, as processes."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpcore
import pytest

from twmock import (
    ErrorSpec,
    MockSettings,
    ScriptError,
    SilenceMode,
    add_mock_arguments,
    settings_from_args,
)
from twmock.script import DEFAULT_REASONING


def _parse(argv: list[str]) -> MockSettings:
    parser = argparse.ArgumentParser()
    add_mock_arguments(parser)
    return settings_from_args(parser.parse_args(argv))


def test_cli_example_from_the_brief() -> None:
    settings = _parse(
        [
            "--port",
            "9100",
            "--chunks",
            "20",
            "--chunk-delay",
            "0.01",
            "--first-delay",
            "0.2",
            "--fail-rate",
            "0.3",
            "--error-status",
            "529",
            "--seed",
            "7",
        ]
    )
    script = settings.script
    assert script.chunks == 20 and script.chunk_delay == 0.01 and script.first_delay == 0.2
    assert script.fail_rate == 0.3
    assert script.error == ErrorSpec(status=529)
    assert settings.seed == 7


def test_cli_all_flags(tmp_path: Path) -> None:
    script_file = tmp_path / "s.json"
    script_file.write_text(json.dumps({"text": "from file", "echo": False}))
    settings = _parse(
        [
            "--script",
            f"@{script_file}",
            "--reasoning",
            "--tool-calls",
            "2",
            "--finish",
            "length",
            "--silence",
            "before_head",
            "--reset-before-head",
            "--echo",
            "--no-validate",
            "--input-tokens",
            "60",
            "--cache-read",
            "40",
            "--error-shape",
            "glm-1308",
            "--resets-in",
            "600",
            "--retry-after-ms",
            "250",
            "--break-after",
            "0",
            "--profile",
            'flaky={"fail_first": 2}',
            "--models",
            "a, b",
            "--no-script-header",
            "--keep-received",
            "5",
        ]
    )
    s = settings.script
    assert s.text == "from file"
    assert s.reasoning == DEFAULT_REASONING
    assert s.tool_calls == 2 and s.finish == "length"
    assert s.silence is SilenceMode.BEFORE_HEAD and s.reset_before_head and s.echo
    assert not s.validate
    assert s.usage.input == 60 and s.usage.cache_read == 40
    assert s.error == ErrorSpec(shape="glm-1308", resets_in=600.0, retry_after_ms=250)
    assert s.break_after == 0
    assert settings.profiles["flaky"].fail_first == 2
    assert settings.models == ("a", "b")
    assert not settings.allow_script_header
    assert settings.keep_received == 5


def test_cli_without_listen_options_and_bad_profile() -> None:
    parser = argparse.ArgumentParser()
    add_mock_arguments(parser, listen=False)
    ns = parser.parse_args(["--profile", "nojson"])
    assert not hasattr(ns, "port")
    with pytest.raises(ScriptError, match="NAME=JSON"):
        settings_from_args(ns)


def test_cli_keeps_a_parser_s_own_listen_options() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=1)
    add_mock_arguments(parser)
    ns = parser.parse_args(["--chunks", "2"])
    assert (ns.host, ns.port) == ("0.0.0.0", 1)
    assert settings_from_args(ns).script.chunks == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serving(command: list[str]) -> Iterator[int]:
    """`command` (with ``--port``) running until something listens there; yields the port."""
    port = _free_port()
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--text", "served by the command line"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the mock never listened"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "twmock"],
        [sys.executable, "-m", "twserve.cli.main", "mock-upstream"],
    ],
    ids=["python -m twmock", "twserve mock-upstream"],
)
def test_both_commands_serve_the_mock(command: list[str]) -> None:
    with _serving(command) as port, httpcore.ConnectionPool() as pool:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        answer = pool.request(
            "POST",
            f"http://127.0.0.1:{port}/v1/messages",
            headers=[(b"content-type", b"application/json")],
            content=json.dumps(body).encode(),
        )
    assert answer.status == 200
    assert json.loads(answer.content)["content"][0]["text"] == "served by the command line"


def test_python_m_twmock_refuses_a_bad_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twmock", "--script", "{not json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not JSON" in done.stderr
