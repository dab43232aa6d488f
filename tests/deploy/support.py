"""What the deployment files are checked against: the files themselves, parsed, and the
gateway's own defaults."""

from __future__ import annotations

import inspect
from pathlib import Path

from tests.support.layout import ROOT
from twengine.config import Config
from twserve.app.wiring import GatewayApp

__all__ = ["CONTAINERFILE", "DEPLOY", "UNIT", "default_config", "drain_secs", "parse_unit"]

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "twserve.service"
CONTAINERFILE = ROOT / "Containerfile"


def drain_secs() -> float:
    """How long a graceful stop gives the streams in flight (GatewayApp's default)."""
    grace = inspect.signature(GatewayApp.__init__).parameters["shutdown_grace"].default
    assert isinstance(grace, int | float)
    return float(grace)


def default_config() -> Config:
    return Config()


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: section → key → every value given (keys may repeat), with
    backslash-continued lines joined and comments dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections
