"""The last applied config versions, kept in the data directory (``config-history/``).

Each config the gateway put in force is kept whole — the exact bytes, so a rollback restores
comments and layout too — with its version, when it was applied and where it came from:

* ``file`` — an edit of the config file seen by the watcher (or the file at startup);
* ``control`` — a write through the control plane;
* ``cli`` — ``twserve config rollback``.

Entries are numbered from 1 and the numbers never repeat, so ``rollback N`` means the same
config whichever process reads the list. Only the newest `KEEP` are kept. The CLI works on the
same directory with the gateway stopped or running, so every change of the index happens under
an exclusive ``flock`` and is written with a rename; the copies are written 0600 in a 0700
directory because they hold the config's secrets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from twserve.config.check import config_version
from twserve.config.files import write_private

__all__ = ["KEEP", "ORIGINS", "ConfigHistory", "HistoryEntry"]

KEEP = 50
ORIGINS = ("file", "control", "cli")


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    number: int
    version: str
    origin: str
    applied_at: float
    size: int


class ConfigHistory:
    """The history directory of one data directory."""

    def __init__(self, data_dir: Path, *, keep: int = KEEP) -> None:
        self.dir = data_dir / "config-history"
        self.keep = keep

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_index(self) -> list[HistoryEntry]:
        try:
            raw = json.loads((self.dir / "index.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return []
        entries = []
        for item in raw if isinstance(raw, list) else ():
            try:
                entries.append(HistoryEntry(**item))
            except TypeError:
                continue
        return entries

    def entries(self) -> list[HistoryEntry]:
        """Oldest first."""
        with self._locked():
            return self._read_index()

    def _file(self, number: int) -> Path:
        return self.dir / f"{number:06d}.yaml"

    def record(self, data: bytes, origin: str, *, now: float | None = None) -> HistoryEntry:
        """Keep `data` as the newest applied version (unless it already is)."""
        assert origin in ORIGINS, origin
        version = config_version(data)
        with self._locked():
            entries = self._read_index()
            if entries and entries[-1].version == version:
                return entries[-1]
            number = entries[-1].number + 1 if entries else 1
            entry = HistoryEntry(
                number=number,
                version=version,
                origin=origin,
                applied_at=round(time.time() if now is None else now, 3),
                size=len(data),
            )
            write_private(self._file(number), data)
            entries.append(entry)
            for old in entries[: -self.keep]:
                with contextlib.suppress(FileNotFoundError):
                    self._file(old.number).unlink()
            entries = entries[-self.keep :]
            index = json.dumps([asdict(e) for e in entries], indent=1).encode()
            write_private(self.dir / "index.json", index)
            return entry

    def read(self, number: int) -> tuple[HistoryEntry, bytes]:
        """The entry numbered `number` and its bytes; KeyError when it is not kept."""
        with self._locked():
            for entry in self._read_index():
                if entry.number == number:
                    return entry, self._file(number).read_bytes()
        raise KeyError(number)
