"""The Redis and PostgreSQL clients are optional extras (``twserve[redis]``, ``twserve[postgres]``):
a gateway whose config names neither must start without them, so serving, the demo and the CLI
import neither package."""

from __future__ import annotations

import subprocess
import sys


def test_serving_imports_neither_redis_nor_psycopg() -> None:
    probe = (
        "import sys, twserve.cli.main, twserve.app.wiring, twserve.cli.demo\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'psycopg')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
