"""Real Redis and PostgreSQL servers for the tests, started from the Debian packages on free
loopback ports and stopped afterwards.

`.ci/run` installs `redis-server` and PostgreSQL when the machine lacks them. A test that needs a
server takes the `redis_server` or `postgres_server` fixture from `tests/conftest.py`; both are
session-scoped, so the suite starts each server once. Tests that need a server of their own (to
stop and restart it mid-load) call `start_redis` / `start_postgres` directly. `redis_cluster`
(`start_cluster`: three masters made a Cluster with ``redis-cli --cluster create``) and
`start_sentinels` (a master, its replica and three sentinels) stand for the other two ways to run
Redis; a test that kills the master takes a `start_sentinels` of its own.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PostgresServer",
    "RedisClusterSet",
    "RedisServer",
    "SentinelSet",
    "free_port",
    "start_cluster",
    "start_postgres",
    "start_redis",
    "start_sentinels",
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
    # More redis-server options (a replica's ``--replicaof``, a Cluster node's).
    extra: tuple[str, ...] = ()

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
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_port(self.port, self.proc, "redis-server", 20)

    def start_config(self) -> None:
        """Start as ``redis-server <config file> <options>`` (`extra` holds the file first, as
        a sentinel needs)."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [exe, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_port(self.port, self.proc, "redis-sentinel", 20)

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

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


def _redis_cli(port: int, *args: str) -> str:
    exe = shutil.which("redis-cli")
    if exe is None:
        raise RuntimeError("redis-cli is not installed (apt-get install redis-tools)")
    done = subprocess.run(
        [exe, "-h", "127.0.0.1", "-p", str(port), *args],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def _until(check: Callable[[], bool], what: str, secs: float) -> None:
    deadline = time.monotonic() + secs
    while True:
        try:
            if check():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {secs:.0f} s")
        time.sleep(0.1)


def _started(make: Callable[[int], RedisServer], config_file: bool = False) -> RedisServer:
    """A server made by `make` on a free port and started; on another port when the one found
    free was taken meanwhile (other tests pick ports too)."""
    for attempt in range(3):
        server = make(free_port())
        try:
            server.start_config() if config_file else server.start()
            return server
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@dataclass
class SentinelSet:
    """A master, one replica of it and three sentinels watching them (quorum 2)."""

    master: RedisServer
    replica: RedisServer
    sentinels: list[RedisServer]
    name: str = "twmaster"

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.name}/{db}"

    def master_port(self) -> int:
        """The port of the master the sentinels name now."""
        out = _redis_cli(
            self.sentinels[0].port, "SENTINEL", "get-master-addr-by-name", self.name
        ).split()
        return int(out[1])


@contextmanager
def start_sentinels(down_after_ms: int = 1000) -> Iterator[SentinelSet]:
    """A `SentinelSet` on free loopback ports, ready when every sentinel knows the replica and
    the two other sentinels (so a failover can be agreed at once). The sentinels take the
    master as down `down_after_ms` after it stops answering."""
    with tempfile.TemporaryDirectory(prefix="twserve-sentinel-") as d:
        root = Path(d)
        servers: list[RedisServer] = []
        try:
            master = _started(lambda port: RedisServer(port=port, dir=root))
            servers.append(master)
            (root / "replica").mkdir()
            replica = _started(
                lambda port: RedisServer(
                    port=port,
                    dir=root / "replica",
                    extra=("--replicaof", "127.0.0.1", str(master.port)),
                )
            )
            servers.append(replica)
            sentinels = []
            for n in range(3):

                def sentinel_on(port: int, n: int = n) -> RedisServer:
                    conf = root / f"sentinel-{n}.conf"
                    conf.write_text(
                        f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {root}\n"
                        f"sentinel monitor twmaster 127.0.0.1 {master.port} 2\n"
                        f"sentinel down-after-milliseconds twmaster {down_after_ms}\n"
                        "sentinel failover-timeout twmaster 10000\n"
                        "sentinel parallel-syncs twmaster 1\n"
                    )
                    return RedisServer(port=port, dir=root, extra=(str(conf), "--sentinel"))

                sentinel = _started(sentinel_on, config_file=True)
                servers.append(sentinel)
                sentinels.append(sentinel)
            found = SentinelSet(master=master, replica=replica, sentinels=sentinels)

            def ready() -> bool:
                for s in sentinels:
                    replicas = _redis_cli(s.port, "SENTINEL", "replicas", found.name)
                    others = _redis_cli(s.port, "SENTINEL", "sentinels", found.name)
                    if str(replica.port) not in replicas.split():
                        return False
                    if sum(str(o.port) in others.split() for o in sentinels) < 2:
                        return False
                return True

            _until(ready, "the sentinels know the replica and each other", 30)
            yield found
        finally:
            for server in reversed(servers):
                server.stop()


@dataclass
class RedisClusterSet:
    """A Redis Cluster of three masters (no replicas), the slots split evenly."""

    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)


@contextmanager
def start_cluster() -> Iterator[RedisClusterSet]:
    """A `RedisClusterSet` on free loopback ports, ready when every node says the cluster is
    ``ok``."""
    with tempfile.TemporaryDirectory(prefix="twserve-cluster-") as d:
        nodes: list[RedisServer] = []
        try:
            for n in range(3):
                node_dir = Path(d) / str(n)
                node_dir.mkdir()
                node = _started(
                    lambda port, d=node_dir: RedisServer(
                        port=port,
                        dir=d,
                        # The bus port is its own free port: port + 10000 (the default)
                        # may be taken, or past 65535.
                        extra=(
                            "--cluster-enabled",
                            "yes",
                            "--cluster-node-timeout",
                            # No replica takes over a master here: a long timeout only keeps
                            # a master that a loaded machine starved from being marked failed.
                            "15000",
                            "--cluster-port",
                            str(free_port()),
                            "--cluster-config-file",
                            str(d / "nodes.conf"),
                        ),
                    )
                )
                nodes.append(node)
            _redis_cli(
                nodes[0].port, "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes",
            )  # fmt: skip

            def ok() -> bool:
                return all(
                    "cluster_state:ok" in _redis_cli(n.port, "CLUSTER", "INFO") for n in nodes
                )

            _until(ok, "the cluster is ok", 30)
            yield RedisClusterSet(nodes=nodes)
        finally:
            for node in nodes:
                node.stop()


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
