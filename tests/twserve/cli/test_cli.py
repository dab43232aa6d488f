"""The command line: init, check, serve (starting config, data directory, graceful stop)."""

from __future__ import annotations

import os
import pty
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpcore
import pytest

from twserve.cli.main import main
from twserve.config.files import data_dir


def test_init_writes_a_private_config_that_checks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.yaml"
    assert main(["init", "--config", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    out = capsys.readouterr().out
    key = path.read_text().split("key: tw-")[1].split()[0]
    assert str(path) in out and key not in out  # not a terminal: the path, never the key
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
        [sys.executable, "-m", "twserve.cli.main", "serve", "--port", str(port)],
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
    key = config.read_text().split("key: tw-")[1].split()[0]
    assert key not in out  # stdout is a pipe here: the key stays in the file
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert (tmp_path / "requests.sqlite3").exists()


def test_init_shows_the_key_only_on_a_terminal(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "twserve.cli.main", "init", "--config", str(path)],
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=30,
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    key = path.read_text().split("key: tw-")[1].split()[0]
    assert f"gateway key: tw-{key}".encode() in shown


def test_the_config_writer_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    path = tmp_path / "config.yaml"
    (tmp_path / "config.yaml.tmp").symlink_to(victim)
    assert main(["init", "--config", str(path)]) == 0
    assert victim.read_text() == "untouched\n"
    assert "clients:" in path.read_text() and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == ["config.yaml.tmp"]


def _config_listening_on(tmp_path: Path, bind: str, port: int) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"version: 1\nlisten:\n  gateway:\n    bind: {bind}\n    port: {port}\n"
        "clients:\n  - {name: me, key: some-long-key-for-tests}\n"
    )
    return path


def test_a_bind_that_does_not_resolve_fails_check_and_serve_in_one_line(tmp_path: Path) -> None:
    path = _config_listening_on(tmp_path, "loopback", _free_port())
    env = {**os.environ, "TWSERVE_HOME": str(tmp_path)}
    check = subprocess.run(
        [sys.executable, "-m", "twserve.cli.main", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    serve = subprocess.run(
        [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert check.returncode == 1
    assert "gw.listen.bind_unresolved at listen.gateway.bind" in check.stderr
    assert serve.returncode == 2, serve.stderr
    assert "Traceback" not in serve.stderr and "ExceptionGroup" not in serve.stderr
    assert serve.stderr.strip().splitlines()[-1].startswith("gw.listen.bind_unresolved: ")


def test_a_port_in_use_fails_serve_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        path = _config_listening_on(tmp_path, "127.0.0.1", port)
        serve = subprocess.run(
            [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "TWSERVE_HOME": str(tmp_path)},
            timeout=30,
        )
    assert serve.returncode == 2, serve.stderr
    assert "Traceback" not in serve.stderr
    last = serve.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gw.listen.cannot_bind: cannot listen on 127.0.0.1:{port}")
