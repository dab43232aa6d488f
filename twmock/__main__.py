"""``python -m twmock [options]``: run the mock upstream alone (same options as
``twserve mock-upstream``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial

import anyio

from twmock.cli import add_mock_arguments, settings_from_args
from twmock.script import ScriptError
from twmock.server import serve_mock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twmock", description=__doc__)
    add_mock_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        settings = settings_from_args(ns)
    except ScriptError as exc:
        parser.error(str(exc))
    print(f"mock upstream on http://{ns.host}:{ns.port}", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(partial(serve_mock, settings, host=ns.host, port=ns.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
