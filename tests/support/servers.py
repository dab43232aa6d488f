"""Real Redis and PostgreSQL servers for the tests, started from the Debian packages on free
loopback ports and stopped afterwards.

`.ci/run` installs `redis-server` and PostgreSQL when the machine lacks them. A test that needs a
server takes the `redis_server` or `postgres_server` fixture from `tests/conftest.py`; both are
session-scoped, so the suite starts each server once. Tests that need a server of their own (to
stop and restart it mid-load) call `start_redis` / `start_postgres` directly.

PostgreSQL refuses to run as root; when the tests run as root the cluster is created and run as
the `postgres` user the package made, in a directory that user owns.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PostgresServer",
    "RedisServer",
    "free_port",
    "start_postgres",
    "start_redis",
]

_PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str, secs: float) -> None:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {secs:.0f} s")


@dataclass
class RedisServer:
    """One redis-server process; `stop` and `start` again keep the port (for restart tests)."""

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.dir),
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_port(self.port, self.proc, "redis-server", 20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextmanager
def start_redis() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="twserve-redis-") as d:
        server = RedisServer(port=free_port(), dir=Path(d))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def _pg_tool(name: str) -> str:
    for d in _PG_BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return found


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, trust auth on loopback TCP only."""

    port: int
    data: Path
    log: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k '' -c fsync=off"
        subprocess.run(
            _as_postgres([_pg_tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-o", opts, "-w", "-t", "60", "start"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_port(self.port, None, "postgres", 30)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres([_pg_tool("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@contextmanager
def start_postgres() -> Iterator[PostgresServer]:
    root = Path(tempfile.mkdtemp(prefix="twserve-pg-"))
    try:
        data = root / "data"
        data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            shutil.chown(data, "postgres", "postgres")
        subprocess.run(
            _as_postgres([_pg_tool("initdb"), "-D", str(data), "-U", "postgres",
                          "--auth=trust", "-E", "UTF8", "--no-sync"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        server = PostgresServer(port=free_port(), data=data, log=root / "postgres.log")
        server.start()
        try:
            yield server
        finally:
            server.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)
