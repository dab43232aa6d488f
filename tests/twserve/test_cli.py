"""The command line: init, check, serve (starting config, data directory, graceful stop)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpcore
import pytest

from twserve.cli import main
from twserve.configfile import data_dir


def test_init_writes_a_private_config_that_checks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.yaml"
    assert main(["init", "--config", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = capsys.readouterr().out.split("gateway key: ")[1].strip()
    assert key.startswith("tw-") and key in path.read_text()
    assert main(["init", "--config", str(path)]) == 1  # never overwritten by accident
    assert main(["check", "--config", str(path)]) == 0
    assert ": ok" in capsys.readouterr().out


def test_check_names_each_problem_with_its_code(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\nproviders:\n  - {name: a, base_url: 'http://x', max_concurrent: 0}\nbogus: 1\n"
    )
    assert main(["check", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "config.provider_concurrency_range" in err and "config.unknown_field" in err
    path.write_text("version: [1\n")
    assert main(["check", "--config", str(path)]) == 1
    assert "config.yaml_invalid" in capsys.readouterr().err


def test_data_dir_is_private(tmp_path: Path) -> None:
    home = data_dir({"TWSERVE_HOME": str(tmp_path / "home")})
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_writes_a_starting_config_and_stops_gracefully(tmp_path: Path, sig: int) -> None:
    port = _free_port()
    env = {**os.environ, "TWSERVE_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "twserve.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpcore.request("GET", f"http://127.0.0.1:{port}/healthz").status == 200:
                    break
            except httpcore.ConnectError:
                time.sleep(0.1)
        else:
            pytest.fail("the gateway did not come up")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "wrote a starting config" in out and "stopping" in out
    config = tmp_path / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert (tmp_path / "requests.sqlite3").exists()
