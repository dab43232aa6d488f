"""``effort-memory.json`` in the data directory: the effort memory kept across restarts.

The memory itself is `twengine.reasoning.EffortMemory`; this module only reads and writes
its file. A missing or unreadable file starts an empty memory (the memory is an optimisation,
never a reason not to start); writes replace the file atomically, readable by the owner only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from twengine.reasoning import EffortMemory
from twproto import json_dumps, json_loads
from twserve.config.files import write_private

__all__ = ["FILE_NAME", "load_effort_memory", "save_effort_memory"]

FILE_NAME = "effort-memory.json"

log = logging.getLogger("twserve")


def load_effort_memory(data_dir: Path) -> EffortMemory:
    path = data_dir / FILE_NAME
    try:
        data = json_loads(path.read_bytes())
    except FileNotFoundError:
        return EffortMemory()
    except (OSError, ValueError) as exc:
        log.warning("%s could not be read (%s); starting with an empty effort memory", path, exc)
        return EffortMemory()
    return EffortMemory.from_json(data, now=time.time())


def save_effort_memory(data_dir: Path, memory: EffortMemory) -> None:
    try:
        write_private(data_dir / FILE_NAME, json_dumps(memory.to_json()).decode() + "\n")
    except OSError as exc:
        log.warning("%s could not be written: %s", data_dir / FILE_NAME, exc)
