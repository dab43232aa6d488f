"""Containerfile and .dockerignore: two stages, an unprivileged runtime, a health check on
/healthz at the gateway's default port, a graceful stop, and a build context without the
checkout's .venv and .git."""

from __future__ import annotations

import fnmatch
import json
import shlex

from tests.deploy.support import CONTAINERFILE, default_config
from tests.support.layout import ROOT

UID = "10001"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation runs off the end"
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word, rest))
    return stages


def test_two_stages_and_only_the_environment_carried_over() -> None:
    build, runtime = _stages()
    assert build[0][1].endswith(" AS build")
    copies = [rest for word, rest in runtime if word == "COPY"]
    assert copies == ["--from=build /opt/twserve /opt/twserve"]
    installs = " ".join(rest for word, rest in build if word == "RUN")
    assert "./libs/twproto ./libs/twengine '.[postgres,redis]'" in installs


def test_runs_as_an_unprivileged_user() -> None:
    runtime = _stages()[-1]
    users = [rest for word, rest in runtime if word == "USER"]
    assert users == [f"{UID}:{UID}"]
    created = " ".join(rest for word, rest in runtime if word == "RUN")
    assert f"--uid {UID}" in created and "--system" in created
    # The data directory is the volume and belongs to that user.
    assert ("VOLUME", '["/data"]') in runtime
    assert "chown twserve:twserve /data" in created


def test_health_check_asks_healthz_on_the_gateway_port() -> None:
    (check,) = [rest for word, rest in instructions() if word == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    argv = json.loads(command)
    port = default_config().listen.gateway.port
    assert f"http://127.0.0.1:{port}/healthz" in argv[-1]
    assert "--timeout=" in options and "--interval=" in options
    exposed = [rest for word, rest in instructions() if word == "EXPOSE"]
    assert str(port) in exposed[0].split()


def test_entry_point_serves_the_mounted_config_and_the_volume() -> None:
    (entry,) = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    argv = json.loads(entry)
    assert argv[:2] == ["twserve", "serve"]
    assert argv[argv.index("--data-dir") + 1] == "/data"
    assert argv[argv.index("--config") + 1] == "/etc/twserve/config.yaml"
    assert ("STOPSIGNAL", "SIGTERM") in instructions()


def _ignored(pattern_lines: list[str], path: str) -> bool:
    ignored = False
    for pattern in pattern_lines:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        hit = any(
            fnmatch.fnmatch("/".join(parts[: i + 1]), pattern)
            or fnmatch.fnmatch("/".join(parts[: i + 1]), pattern.removeprefix("**/"))
            or fnmatch.fnmatch(parts[i], pattern.removeprefix("**/"))
            for i in range(len(parts))
        )
        if hit:
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_venv_and_git_out_and_the_sources_in() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (".venv/bin/python", ".git/HEAD", "twserve/__pycache__/x.pyc", "dist/a.whl"):
        assert _ignored(lines, path), path
    # What the build stage copies must stay in the context.
    copied = [
        shlex.split(rest)[:-1]
        for word, rest in _stages()[0]
        if word == "COPY" and not rest.startswith("--from")
    ]
    for sources in copied:
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not _ignored(lines, source), source
    assert not _ignored(lines, "libs/twproto/twproto/__init__.py")
