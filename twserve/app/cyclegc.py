"""Python's cycle collector in `twserve serve`: the startup heap frozen, young collections rarer.

A request allocates a few hundred container objects and frees nearly all of them by reference
counting as it ends (the relay keeps no reference cycle; see twserve.relay.holds). Python's
default collector still runs a young-generation pass every 700 net allocations, which many
requests in flight reach together many times a second; each pass promotes what is in flight at
that moment, and every tenth of the next generation's passes ends in a full collection that walks
the whole heap: configuration, router state, imported modules, tens of thousands of objects
that live as long as the process. Under load that was about a tenth of the gateway's CPU.

`settle` is called once the gateway listens: it collects what startup left, moves every object
alive then to the permanent generation (``gc.freeze``: never walked again; freed as usual when
its last reference goes), and raises the young generation's threshold to `YOUNG_THRESHOLD`
allocations. Reference cycles are still collected, only less often: at most that many objects
wait for it, a few MB. One thing changes: a reference cycle made only of frozen objects is not
collected (such as the startup config, if it refers to itself, once a reload has replaced it);
only what was alive at startup is frozen, so that is bounded by the startup heap, however many
reloads follow.

``TWSERVE_GC=default`` in the environment leaves Python's collector as it is, e.g. to rule this
out when chasing memory (docs/operations.md).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

__all__ = ["YOUNG_THRESHOLD", "settle"]

#: Net allocations of container objects between young-generation collections (Python: 700).
YOUNG_THRESHOLD = 10_000


def settle(environ: Mapping[str, str] | None = None) -> bool:
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
