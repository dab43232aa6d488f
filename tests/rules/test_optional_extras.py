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


def test_serving_without_traces_does_not_import_opentelemetry() -> None:
    # Traces (the ``otel`` extra) are imported only when configured: a gateway without them,
    # its app built and its handler ready, never loads the SDK.
    probe = (
        "import sys, pathlib, tempfile\n"
        "from twengine.config import build_config\n"
        "from twserve.app.wiring import GatewayApp\n"
        "cfg = build_config({'version': 1, 'clients': [{'name': 'c', 'key': 'k'}]})\n"
        "app = GatewayApp(cfg, pathlib.Path(tempfile.mkdtemp()), env={}, port=0)\n"
        "assert app.gateway.hooks.tracing is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"
