"""The process `twserve serve` runs in: its event loop, its cycle collector, its open-file
limit.

**The event loop.** uvloop (libuv, written in Cython) when it is installed, else the standard
library's asyncio loop. Its transports write and its scheduling runs without the standard loop's
Python-level bookkeeping. Today most of the gateway's cost is elsewhere (anyio, h11, httpcore,
the relay, and the system calls themselves), and the load benchmark shows no difference beyond
its noise (docs/benchmarks.md); the loop's share grows as that work shrinks. Past one core's
worth of streams uvloop starves tasks behind the sockets (libuv polls up to 48 times before it
runs any): the chunks go on, but a new request waits a second a turn, which is why the gateway
has a door that refuses new clients without the loop (twserve/app/door.py). uvloop is a default
dependency except on Windows (see pyproject.toml); where it is missing, or with
``TWSERVE_EVENT_LOOP=asyncio`` in the environment, the standard loop runs and everything behaves
the same. anyio hides the difference from the rest of the code.

**The cycle collector**: the startup heap frozen, young collections rarer. A request allocates a
few hundred container objects and frees nearly all of them by reference counting as it ends (the
relay keeps no reference cycle; see twserve.relay.holds). Python's default collector still runs
a young-generation pass every 700 net allocations, which many requests in flight reach together
many times a second; each pass promotes what is in flight at that moment, and every tenth of the
next generation's passes ends in a full collection that walks the whole heap: configuration,
router state, imported modules, tens of thousands of objects that live as long as the process.
Under load that was about a tenth of the gateway's CPU.

`settle_heap` is called once the gateway listens: it collects what startup left, moves every
object alive then to the permanent generation (``gc.freeze``: never walked again; freed as usual
when its last reference goes), and raises the young generation's threshold to `YOUNG_THRESHOLD`
allocations. Reference cycles are still collected, only less often: at most that many objects
wait for it, a few MB. One thing changes: a reference cycle made only of frozen objects is not
collected (such as the startup config, if it refers to itself, once a reload has replaced it);
only what was alive at startup is frozen, so that is bounded by the startup heap, however many
reloads follow.

``TWSERVE_GC=default`` in the environment leaves Python's collector as it is, e.g. to rule this
out when chasing memory (docs/operations.md).

**The open-file limit.** A gateway's connections are file descriptors, and the default soft
limit (often 1024) is far below what the hard limit permits: `raise_fd_limit` raises it at
startup, and `FD_RESERVE` descriptors are kept back from ``listen.gateway.max_connections``.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

__all__ = [
    "FD_RESERVE",
    "YOUNG_THRESHOLD",
    "backend_options",
    "raise_fd_limit",
    "run",
    "settle_heap",
]

log = logging.getLogger("twserve")


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


#: Net allocations of container objects between young-generation collections (Python: 700).
YOUNG_THRESHOLD = 10_000


def settle_heap(environ: Mapping[str, str] | None = None) -> bool:
    """Freeze the heap built so far and make young collections rarer; False (nothing done)
    with ``TWSERVE_GC=default``."""
    env = os.environ if environ is None else environ
    if env.get("TWSERVE_GC", "").lower() == "default":
        return False
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True


# Descriptors kept back from listen.gateway.max_connections: upstream connections, the store,
# the control plane, the event loop's own.
FD_RESERVE = 64


def raise_fd_limit(wanted: int = 1 << 20) -> int:
    """Raise the soft limit on open files as far as the hard limit allows (up to `wanted`);
    the soft limit in force afterwards. A gateway's connections are file descriptors, and the
    default soft limit (often 1024) is far below what the hard limit permits."""
    try:
        import resource
    except ImportError:  # not on this platform
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    return target
