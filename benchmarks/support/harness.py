"""What the end-to-end benchmarks share: loopback ports, a process's CPU and memory read from
/proc, the head of a generated gateway config, a mock upstream with `twserve serve` in front of
it (each its own process, so the gateway's CPU is its own), and how figures are printed.

Every benchmark runs its targets as separate processes and reads their CPU from /proc, never
its own: the client's work must not count as the gateway's.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The stand-alone processes a benchmark starts by path (fakeupstream.py, rawproxy.py).
SUPPORT = Path(__file__).resolve().parent
KEY = "bench-key"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int, *, fine: bool = False) -> float:
    """User + system CPU of process `pid`, all its threads, from /proc.

    ``stat`` counts clock ticks (10 ms) but keeps the time of threads that have exited (the
    gateway's idle worker threads do); ``fine`` sums each live thread's ``schedstat``
    (nanoseconds) instead, for a process whose threads live as long as it does and which spends
    too little for clock ticks to resolve (the byte-copy proxy).
    """
    if fine:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_kib(pid: int) -> dict[str, int]:
    """``VmHWM`` (peak resident set) and ``VmRSS`` (now) of process `pid`, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            name, value = line.split()[:2]
            out[name.rstrip(":")] = int(value)
    return out


def wait_port(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 90.0
) -> None:
    """Until something listens on `port`; fails early when `proc`, which should, has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def gateway_yaml(port: int, providers: str) -> str:
    """A gateway config on `port` with one client (key `KEY`) and the `providers` given as YAML
    list items, indented by two spaces."""
    return f"""version: 1
listen:
  gateway: {{bind: 127.0.0.1, port: {port}}}
clients:
  - {{name: bench, key: {KEY}}}
providers:
{providers.rstrip()}
"""


def python_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "twserve.cli.main", *args]


def benchmark_command(module: str, *args: str) -> list[str]:
    """The command that runs ``benchmarks.<module>`` (run it with ``cwd=ROOT``)."""
    return [sys.executable, "-m", f"benchmarks.{module}", *args]


@dataclass(frozen=True)
class Served:
    """A running mock upstream and gateway."""

    mock_port: int
    gateway_port: int
    gateway_pid: int
    home: Path


@contextmanager
def mock_and_gateway(
    config: Callable[[int, int], str], mock_args: Sequence[str] = (), *, prefix: str = "twserve-"
) -> Iterator[Served]:
    """`twserve mock-upstream` (with `mock_args`) and `twserve serve` with the config
    `config(mock_port, gateway_port)`, each its own process, both listening when this yields and
    stopped when it is left."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    mock_port, gw_port = free_port(), free_port()
    cfg = home / "config.yaml"
    cfg.write_text(config(mock_port, gw_port))
    env = {**os.environ, "TWSERVE_HOME": str(home)}
    mock = subprocess.Popen(
        python_command("mock-upstream", "--port", str(mock_port), *mock_args),
        env=env,
        stdout=subprocess.DEVNULL,
    )
    gateway = subprocess.Popen(
        python_command("serve", "--config", str(cfg), "--data-dir", str(home)),
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_port(mock_port, mock)
        wait_port(gw_port, gateway)
        yield Served(mock_port, gw_port, gateway.pid, home)
    finally:
        for proc in (gateway, mock):
            proc.terminate()
        for proc in (gateway, mock):
            proc.wait(10)


def medians(values: dict[str, list[float]], digits: int = 3) -> dict[str, float]:
    return {k: round(statistics.median(v), digits) for k, v in values.items()}


def ratio(values: dict[str, list[float]], top: str, bottom: str) -> float | None:
    """The ratio of two medians, rounded; None when the bottom one is zero (a short run whose
    CPU stayed under one clock tick)."""
    below = statistics.median(values[bottom])
    return round(statistics.median(values[top]) / below, 3) if below else None


def report(figures: dict[str, object], json_path: str | None) -> None:
    """Print the figures as JSON, and write them to `json_path` when given."""
    text = json.dumps(figures, indent=2)
    print(text)
    if json_path:
        Path(json_path).write_text(text)
