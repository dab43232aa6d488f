"""Which event loop `twserve serve` runs on.

uvloop (libuv, written in Cython) when it is installed, else the standard library's asyncio
loop. The gateway's hot path is one socket write per streamed chunk; on uvloop the write goes
from the transport to ``send()`` without Python-level bookkeeping in between, and the loop's own
scheduling is cheaper, which measurably cuts the CPU per streamed chunk (docs/benchmarks.md).
uvloop is a default dependency on Linux and macOS (see pyproject.toml); anywhere it is missing,
or with ``TWSERVE_EVENT_LOOP=asyncio`` in the environment, the standard loop runs and
everything behaves the same, only slower. anyio hides the difference from the rest of the code.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

__all__ = ["backend_options", "run"]


def backend_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """anyio's asyncio backend options: ``use_uvloop`` when uvloop can be imported and the
    environment does not ask for the standard loop."""
    env = os.environ if environ is None else environ
    if env.get("TWSERVE_EVENT_LOOP", "").lower() == "asyncio":
        return {}
    if importlib.util.find_spec("uvloop") is None:
        return {}
    return {"use_uvloop": True}


def run(main: Callable[[], Awaitable[Any]]) -> None:
    """`anyio.run(main)` on the loop `backend_options` picks."""
    anyio.run(main, backend="asyncio", backend_options=backend_options())
