"""deploy/systemd/twserve.service: a user of its own, a read-only system but the state
directory, nothing to gain, a stop window longer than the drain, and `systemd-analyze security`
at 3.0 or better (systemd is installed by .ci/run when the machine lacks it)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from tests.deploy.support import UNIT, drain_secs, parse_unit

EXPOSURE_LIMIT = 3.0


def _service() -> dict[str, list[str]]:
    return parse_unit(UNIT)["Service"]


def _one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values, f"{UNIT.name} has no {key}="
    return values[-1]


def test_runs_as_its_own_user_with_nothing_to_gain() -> None:
    service = _service()
    assert _one(service, "User") == _one(service, "Group") == "twserve"
    assert _one(service, "NoNewPrivileges") == "true"
    assert _one(service, "CapabilityBoundingSet") == ""
    assert _one(service, "AmbientCapabilities") == ""
    assert _one(service, "PrivateUsers") == "true"


def test_only_the_state_directory_is_writable() -> None:
    service = _service()
    assert _one(service, "ProtectSystem") == "strict"
    assert _one(service, "ProtectHome") == "true"
    assert _one(service, "PrivateTmp") == "true"
    assert _one(service, "StateDirectory") == "twserve"
    assert _one(service, "StateDirectoryMode") == "0700"
    assert "ReadWritePaths" not in service, "only the state directory may be writable"
    # The gateway's data directory is that state directory.
    argv = shlex.split(_one(service, "ExecStart"))
    assert argv[argv.index("--data-dir") + 1] == "/var/lib/twserve"
    assert argv[1] == "serve" and argv[argv.index("--config") + 1] == "/etc/twserve/config.yaml"


def test_the_gateway_may_raise_its_open_file_limit() -> None:
    # twserve.app.wiring.raise_fd_limit calls setrlimit, which @resources holds: denying that
    # group would make every start fail.
    denied = [v[1:].split() for v in _service()["SystemCallFilter"] if v.startswith("~")]
    assert not any("@resources" in group or "setrlimit" in group for group in denied)


def test_the_stop_window_covers_the_drain() -> None:
    service = _service()
    assert _one(service, "KillSignal") == "SIGTERM"
    stop = float(_one(service, "TimeoutStopSec"))
    # The drain, then the request store's last batch: twice the drain is the margin kept
    # everywhere (the Containerfile's note, the Kubernetes grace period).
    assert stop >= 2 * drain_secs(), (stop, drain_secs())


def _exposure(output: str) -> float:
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", output)
    assert match, output[-500:]
    return float(match[1])


def test_systemd_analyze_security_rates_it_ok() -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: apt-get install systemd (.ci/run does)"
    out = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = _exposure(out.stdout + out.stderr)
    assert exposure <= EXPOSURE_LIMIT, out.stdout[-3000:]


def test_the_exposure_is_read_from_the_last_line() -> None:
    line = "→ Overall exposure level for twserve.service: 1.4 OK 🙂"
    assert _exposure("…\n" + line + "\n") == 1.4
