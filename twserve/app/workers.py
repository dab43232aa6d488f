"""``twserve serve --workers N``: N gateway processes on one port, run by a supervisor.

One process runs every stream on one event loop, so it uses one core. With ``--workers N``
(``auto``: the machine's cores) the ``serve`` process becomes a supervisor that starts N worker
processes, each a whole gateway (``serve --worker K``), and stays to run them
(docs/deployment.md, "Several workers"):

* **One port.** Every worker listens on the gateway's port with ``SO_REUSEPORT``, and the kernel
  spreads new connections over them. The supervisor binds the port first (same option, no
  listen), so that ``--port 0`` or ``port: 0`` resolves to one port all the workers then share,
  and so that the port is checked before a worker starts.
* **Shared state.** The workers share what several instances share: key limits, concurrency
  slots, pauses and conversation affinity through Redis (``state.redis_url``, required for more
  than one worker: without it each worker would keep its own limits), and the request store
  (SQLite in WAL mode, whose writers take turns, or PostgreSQL). The supervisor opens the store
  once before the workers start, so that its schema is brought up to date by one process.
* **One control plane.** Worker 0 serves the control listener and runs the hourly retention
  clean-up; the others serve only the gateway. Views that read Redis or the store (limits,
  pauses, ``/requests``, ``/usage``) cover every worker; counters a process keeps (metrics,
  requests in flight) are worker 0's.
* **Signals.** SIGTERM or Ctrl-C is passed to every worker, which drains as a single gateway
  does (a second one stops at once); SIGHUP is passed on too. Each worker follows the config
  file itself, so a reload reaches them all. A worker that exits on its own is started again,
  after a pause that doubles from `RESTART_PAUSE` up to `MAX_RESTART_PAUSE`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

__all__ = (
    "MAX_RESTART_PAUSE",
    "RESTART_PAUSE",
    "Supervisor",
    "command_for",
    "reserve_port",
    "worker_count",
)

log = logging.getLogger("twserve.workers")

RESTART_PAUSE = 1.0
MAX_RESTART_PAUSE = 30.0
# How often the supervisor looks at its workers (seconds).
_POLL = 0.2


def worker_count(text: str) -> int:
    """``--workers``'s value: a count of at least 1, or ``auto`` for the cores this process may
    run on."""
    if text == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    count = int(text)
    if count < 1:
        raise ValueError("--workers must be at least 1")
    return count


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` with ``SO_REUSEPORT`` and not listening: it resolves port 0
    and holds the port for the workers, who bind it with the same option (OSError when the
    port is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    pause: float = RESTART_PAUSE
    start_after: float = 0.0


@dataclass
class Supervisor:
    """Runs `count` workers, each ``command + ["--worker", K]``, until told to stop."""

    command: Sequence[str]
    count: int
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    _workers: list[_Worker] = field(default_factory=list)
    _stops: int = 0
    _hups: int = 0

    def run(self) -> int:
        """Start the workers and keep them running; returns 0 once they have all stopped after
        SIGTERM/SIGINT."""
        previous = {
            sig: signal.signal(sig, self._on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            self._workers = [_Worker(index=k) for k in range(self.count)]
            for worker in self._workers:
                self._start(worker)
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._hups += 1
        else:
            self._stops += 1
        self._tell(signal.SIGHUP if signum == signal.SIGHUP else signal.SIGTERM)

    def _tell(self, sig: signal.Signals) -> None:
        for worker in self._workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(sig)

    def _start(self, worker: _Worker) -> None:
        # The supervisor's pid: a worker stops when its parent is no longer this process.
        env = {**self.env, "TWSERVE_SUPERVISOR": str(os.getpid())}
        command = [*self.command, "--worker", str(worker.index)]
        # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which passes
        # one SIGTERM on (a second signal would stop the worker at once, cutting its streams).
        worker.proc = subprocess.Popen(command, env=env, start_new_session=True)
        log.info("worker %d started (pid %d)", worker.index, worker.proc.pid)

    def _watch(self) -> int:
        while True:
            running = 0
            now = time.monotonic()
            for worker in self._workers:
                proc = worker.proc
                if proc is not None and proc.poll() is None:
                    running += 1
                    continue
                if self._stops:
                    continue  # stopping: it is not started again
                if proc is not None:
                    log.warning(
                        "worker %d (pid %d) exited with %s; starting it again in %.0f s",
                        worker.index,
                        proc.pid,
                        proc.returncode,
                        worker.pause,
                    )
                    worker.proc = None
                    worker.start_after = now + worker.pause
                    worker.pause = min(worker.pause * 2, MAX_RESTART_PAUSE)
                    running += 1
                    continue
                running += 1
                if now >= worker.start_after:
                    self._start(worker)
            if self._stops and running == 0:
                return 0
            time.sleep(_POLL)


def command_for(argv: Sequence[str], *, verbose: bool = False) -> list[str]:
    """The worker's command line: this program's ``serve`` with `argv` (its options)."""
    top = ["-v"] if verbose else []
    return [sys.executable, "-m", "twserve.cli.main", *top, "serve", *argv]
