"""The config in force, changed while the gateway serves (docs/operations.md, "Live reload").

Theory of operation
-------------------
`LiveConfig` owns the bytes of the config in force and their version. Every change — the
watcher seeing the file change, ``SIGHUP``, a control-plane write, a rollback — goes through
`LiveConfig.apply`, one at a time under a lock:

1. stages 1–3 (`twserve.config.check.check_config_text`, with the gateway's environment for
   ``${VAR}`` keys) and stage 4's object build (`build_runtime`), in a worker thread: a large
   or hostile text never holds up the event loop that serves requests;
2. ``stage(config)``, supplied by the app, does what can still fail outside the config itself
   — binding a changed listener — and returns a `Staged` change that has touched nothing the
   requests see;
3. for a write, the new bytes go to the file atomically (a failed write discards the staged
   change);
4. ``Staged.commit()`` swaps the config in. Requests already admitted keep the candidates and
   settings they were planned with; the router keeps health, pauses, balancer positions and
   slots for every upstream that stays.

Any failure before the commit leaves the config in force untouched and publishes
`ConfigRejected`; success publishes `ConfigReloaded` and records the bytes in the history.

The watcher polls: every `POLL_SECS` it compares the file's inode, size and modification time
with the last seen, and only then reads and hashes it. Polling one ``stat`` four times a second
costs nothing, needs no platform notification API (inotify misses changes on some network and
container bind mounts, and editors and Kubernetes replace files by rename or symlink swap, which
the inode catches), and keeps the one-second promise with room to spare. A file whose bytes
were already refused is not tried again until it changes, so a broken file is reported once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio

from twengine.config import Config
from twserve.config.check import (
    ConfigRejection,
    Finding,
    build_runtime,
    check_config_text,
    config_version,
)
from twserve.config.files import write_private
from twserve.config.history import ConfigHistory
from twserve.events import ConfigProblem, EventBus

__all__ = ["POLL_SECS", "Applied", "LiveConfig", "Staged", "StaleVersion", "check_bytes"]

log = logging.getLogger("twserve")

POLL_SECS = 0.25


class Staged(Protocol):
    """A change ready to swap in; nothing a request sees has changed yet."""

    def commit(self) -> None: ...

    def discard(self) -> None: ...


class StaleVersion(Exception):
    """A write based on a version that is no longer the current one."""

    def __init__(self, base: str, current: str) -> None:
        super().__init__(f"the config is at {current}, not {base}")
        self.base = base
        self.current = current


@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    config: Config
    version: str
    origin: str
    generation: int


def check_bytes(data: bytes, env: Mapping[str, str]) -> Config:
    """Stages 1–4 (without binding) of a file's bytes, ``${VAR}`` read from `env`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigRejection(
            [
                Finding(
                    stage="yaml",
                    code="config.yaml_invalid",
                    path="",
                    line=data[: exc.start].count(b"\n") + 1,
                    message="the config is not UTF-8 text",
                    excerpt="",
                )
            ]
        ) from None
    config = check_config_text(text, env)
    build_runtime(config)
    return config


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


class LiveConfig:
    """The config file, the bytes in force, and the way every change is applied."""

    def __init__(
        self,
        path: Path,
        *,
        history: ConfigHistory,
        events: EventBus,
        stage: Callable[[Config, str], Awaitable[Staged]],
        data: bytes,
        env: Mapping[str, str],
        safe: ConfigRejection | None = None,
    ) -> None:
        self.path = path
        self.env = env
        self.history = history
        self.events = events
        self._stage = stage
        # The bytes the control plane shows: those in force, or in safe mode the file on disk.
        self.data = data
        self.version = config_version(data)
        self.safe = safe
        self.generation = 0 if safe is not None else 1
        self.last_rejection: ConfigRejection | None = safe
        self.on_applied: list[Callable[[Applied], None]] = []
        self._rejected_version: str | None = self.version if safe is not None else None
        self._seen = _stat_key(path)
        self._lock: anyio.Lock | None = None
        self._poke: anyio.Event | None = None
        self._forced = False

    @property
    def lock(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    async def apply(
        self, data: bytes, *, origin: str, write: bool, base_version: str | None = None
    ) -> Applied:
        """Validate `data`, stage it, write it to the file when `write`, and swap it in.

        Raises `StaleVersion` when `base_version` is given and is not the current version,
        `ConfigRejection` when a stage fails (after publishing `ConfigRejected`).
        """
        async with self.lock:
            if base_version is not None and base_version != self.version:
                raise StaleVersion(base_version, self.version)
            version = config_version(data)
            try:
                config = await anyio.to_thread.run_sync(check_bytes, data, self.env)
                staged = await self._stage(config, data.decode("utf-8"))
            except ConfigRejection as rejection:
                self._publish_rejection(rejection, version, origin)
                raise
            if write:
                try:
                    write_private(self.path, data, through_link=True)
                except BaseException:
                    staged.discard()
                    raise
            staged.commit()
            self.data, self.version = data, version
            self.safe = None
            self._rejected_version = None
            self.last_rejection = None
            if write or origin == "file":
                self._seen = _stat_key(self.path)
            self.generation += 1
            try:
                self.history.record(data, origin)
            except OSError as exc:
                log.warning("could not record the config history: %s", exc)
            applied = Applied(
                config=config, version=version, origin=origin, generation=self.generation
            )
            log.info("config %s applied (from %s)", version, origin)
            self.events.config_reloaded(
                generation=self.generation,
                version=config.version,
                config_version=version,
                origin=origin,
            )
            for listener in self.on_applied:
                listener(applied)
            return applied

    def _publish_rejection(self, rejection: ConfigRejection, version: str, origin: str) -> None:
        self.last_rejection = rejection
        self._rejected_version = version
        first = rejection.first
        log.warning(
            "config %s refused at its %s stage: %s (line %s, %s); the previous config keeps "
            "serving",
            version,
            rejection.stage_name,
            first.code,
            first.line,
            first.message,
        )
        self.events.config_rejected(
            [
                ConfigProblem(
                    code=f.code,
                    path=f.path,
                    message=f.message,
                    stage=f.stage,
                    line=f.line,
                    excerpt=f.excerpt,
                )
                for f in rejection.findings
            ],
            stage=rejection.stage_name,
            config_version=version,
            origin=origin,
        )

    def reload_now(self) -> None:
        """Read the file again at once, even if it looks unchanged (``SIGHUP``)."""
        self._forced = True
        if self._poke is not None:
            self._poke.set()

    async def check_file(self) -> Applied | ConfigRejection | None:
        """One look at the file: apply it when it changed. None when there was nothing to do."""
        forced, self._forced = self._forced, False
        seen = _stat_key(self.path)
        if seen == self._seen and not forced:
            return None
        self._seen = seen
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return None
        version = config_version(data)
        if version == self.version and self.safe is None:
            # Back to the bytes in force (a refused edit undone): nothing is pending any more.
            self._rejected_version = None
            self.last_rejection = None
            return None
        if version == self._rejected_version and not forced:
            return None
        try:
            return await self.apply(data, origin="file", write=False)
        except ConfigRejection as rejection:
            return rejection

    async def watch(self, interval: float = POLL_SECS) -> None:
        """Poll the file until cancelled."""
        while True:
            self._poke = anyio.Event()
            if not self._forced:
                with anyio.move_on_after(interval):
                    await self._poke.wait()
            await self.check_file()
