"""Which event loop `twserve serve` runs on.

uvloop (libuv, written in Cython) when it is installed, else the standard library's asyncio
loop. Its transports write and its scheduling runs without the standard loop's Python-level
bookkeeping. Today most of the gateway's cost is elsewhere (anyio, h11, httpcore, the relay,
and the system calls themselves), and the load benchmark shows no difference beyond its noise
(docs/benchmarks.md); the loop's share grows as that work shrinks. uvloop is a default
dependency except on Windows (see pyproject.toml); where it is missing, or with
``TWSERVE_EVENT_LOOP=asyncio`` in the environment, the standard loop runs and everything
behaves the same. anyio hides the difference from the rest of the code.
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
