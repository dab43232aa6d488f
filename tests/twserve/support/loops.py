"""The event loops a transport test runs on: the standard asyncio loop and uvloop (the gateway's
default), as anyio backend parameters for a module's own ``anyio_backend`` fixture."""

from __future__ import annotations

import pytest

BOTH_LOOPS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
]
