"""``twserve serve --workers N``: the checks before the workers start, then the supervisor
(twserve/app/workers.py; docs/deployment.md, "Several workers")."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from twengine.config import ConfigError
from twserve.app.wiring import open_store
from twserve.app.workers import Supervisor, command_for, reserve_port
from twserve.config.files import load_config
from twserve.observe.logs import configure_logging

__all__ = ("serve_workers",)


def serve_workers(args: argparse.Namespace, path: Path, home: Path, count: int) -> int:
    """Run `count` workers for ``serve`` with `args`; the exit status."""
    try:
        config = load_config(path)
    except ConfigError as err:
        # A single gateway would start in safe mode; workers need a config that loads.
        print(f"{path}: {len(err.problems)} problem(s); --workers needs a config that loads:")
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    configure_logging(
        args.log_format or config.observability.log_format, level=logging.getLogger().level
    )
    if config.state is None or not config.state.redis_url:
        print(
            "gw.workers.no_shared_state: --workers needs state.redis_url, so that the workers "
            "share key limits, slots, pauses and affinity (docs/deployment.md)",
            file=sys.stderr,
        )
        return 2
    # The store's schema is brought up to date once, before several processes open it.
    store = open_store(config, home, os.environ)
    store.close_db()
    host = config.listen.gateway.bind
    try:
        port = args.port if args.port is not None else config.listen.gateway.port
        held = reserve_port(host, port)
    except OSError as exc:
        print(f"gw.listen.cannot_bind: cannot listen on {host}: {exc.strerror}", file=sys.stderr)
        return 2
    with held:
        port = held.getsockname()[1]
        options = ["--config", str(path), "--data-dir", str(home), "--port", str(port)]
        if args.log_format:
            options += ["--log-format", args.log_format]
        print(f"twserve: {count} workers on http://{host}:{port}", flush=True)
        command = command_for(options, verbose=args.verbose)
        return Supervisor(command=command, count=count).run()
