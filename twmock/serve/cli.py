"""Command-line arguments of ``twserve mock-upstream`` and ``python -m twmock``, and the
latter's `main`.

Each flag sets one script field (docs/mock-upstream.md lists them); ``--script`` takes a whole
script as JSON (or ``@file``) and the flags are applied over it; ``--profile NAME=JSON`` adds a
profile. Every destination is prefixed ``mock_`` so the arguments can share a parser with others;
``--host``/``--port`` (``host``, ``port``) are added when `listen` is true and the parser does
not have them yet.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from twmock.script import DEFAULT_MODELS, MockSettings, Script, ScriptError, parse_script
from twmock.serve.server import serve_mock
from twproto import json_loads

__all__ = ["add_mock_arguments", "main", "settings_from_args"]

_MAIN_HELP = """``python -m twmock [options]``: run the mock upstream alone (same options as
``twserve mock-upstream``)."""

# flag -> (script field, type, help)
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--text", "text", str, "exact answer text (cut into --chunk-size pieces)"),
    ("--chunks", "chunks", int, "number of generated text chunks (default 10)"),
    ("--chunk-size", "chunk_size", int, "characters per text chunk (default 4)"),
    ("--tool-calls", "tool_calls", int, "number of parallel tool calls"),
    ("--tool-name", "tool_name", str, "tool name (default: the request's tools, in turn)"),
    ("--tool-pieces", "tool_pieces", int, "pieces each tool call's arguments stream in"),
    ("--head-delay", "head_delay", float, "seconds before the response head"),
    ("--first-delay", "first_delay", float, "seconds before the first content"),
    ("--chunk-delay", "chunk_delay", float, "seconds between content chunks"),
    ("--stream-error-after", "stream_error_after", int, "in-stream error after N content chunks"),
    ("--break-after", "break_after", int, "drop the connection after N content chunks"),
    ("--stall-after", "stall_after", int, "go silent after N content chunks"),
    ("--fail-first", "fail_first", int, "the first N requests fail"),
    ("--fail-every", "fail_every", int, "every Nth request fails"),
    ("--fail-rate", "fail_rate", float, "this fraction of requests fails (seeded)"),
)
_USAGE_FLAGS: tuple[tuple[str, str], ...] = (
    ("--input-tokens", "input"),
    ("--output-tokens", "output"),
    ("--cache-read", "cache_read"),
    ("--cache-write", "cache_write"),
    ("--reasoning-tokens", "reasoning"),
)
_ERROR_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--error-status", "status", int, "answer with this HTTP error status"),
    ("--error-shape", "shape", str, "answer with a named provider error (e.g. glm-1308)"),
    ("--error-message", "message", str, "error message instead of the default"),
    ("--retry-after", "retry_after", float, "Retry-After seconds on the error"),
    ("--retry-after-ms", "retry_after_ms", int, "retry-after-ms on the error"),
    ("--resets-in", "resets_in", float, "seconds until a quota shape's reset"),
)


def _dest(name: str) -> str:
    return "mock_" + name


def _metavar(kind: type) -> str:
    return {int: "N", float: "X"}.get(kind, "TEXT")


def add_mock_arguments(parser: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """Add the mock's options to `parser` (``--host``/``--port`` too when `listen`, unless the
    parser already has them)."""
    if listen:
        for flag, kwargs in (
            ("--host", {"default": "127.0.0.1", "help": "address to listen on"}),
            ("--port", {"type": int, "default": 9100, "help": "port to listen on"}),
        ):
            # A parser that defines its own listen options keeps them.
            with contextlib.suppress(argparse.ArgumentError):
                parser.add_argument(flag, **kwargs)
    group = parser.add_argument_group("mock answer and failures")
    for flag, name, kind, text in _FLAGS:
        group.add_argument(
            flag, dest=_dest(name), type=kind, default=None, help=text, metavar=_metavar(kind)
        )
    group.add_argument(
        "--reasoning",
        dest=_dest("reasoning"),
        metavar="TEXT",
        nargs="?",
        const=True,
        default=None,
        help="reasoning text first (without a value: a default text)",
    )
    group.add_argument(
        "--finish", dest=_dest("finish"), choices=("stop", "length", "blocked"), default=None
    )
    group.add_argument(
        "--silence",
        dest=_dest("silence"),
        choices=("before_head", "after_head"),
        default=None,
        help="send nothing (before the head), or the head and nothing more",
    )
    group.add_argument(
        "--reset-before-head",
        dest=_dest("reset_before_head"),
        action="store_true",
        default=None,
        help="close the connection without any response",
    )
    group.add_argument(
        "--echo",
        dest=_dest("echo"),
        action="store_true",
        default=None,
        help="answer with facts of the request (model, message and tool counts, last text)",
    )
    group.add_argument(
        "--no-validate",
        dest=_dest("validate"),
        action="store_false",
        default=None,
        help="accept bodies missing fields the real API requires",
    )
    for flag, name in _USAGE_FLAGS:
        group.add_argument(flag, dest=_dest("usage_" + name), type=int, default=None, metavar="N")
    for flag, name, kind, text in _ERROR_FLAGS:
        group.add_argument(
            flag,
            dest=_dest("error_" + name),
            type=kind,
            default=None,
            help=text,
            metavar=_metavar(kind),
        )
    instance = parser.add_argument_group("mock instance")
    instance.add_argument(
        "--script",
        dest=_dest("script"),
        default=None,
        metavar="JSON",
        help="a script as JSON, or @file",
    )
    instance.add_argument(
        "--profile",
        dest=_dest("profiles"),
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a profile: requests under /NAME/… play this script (JSON or @file); repeatable",
    )
    instance.add_argument("--seed", dest=_dest("seed"), type=int, default=None, metavar="N")
    instance.add_argument(
        "--models",
        dest=_dest("models"),
        default=None,
        metavar="A,B",
        help="comma-separated models for GET /v1/models",
    )
    instance.add_argument(
        "--keep-received",
        dest=_dest("keep_received"),
        type=int,
        default=100,
        metavar="N",
        help="how many received requests to keep for inspection",
    )
    instance.add_argument(
        "--no-script-header",
        dest=_dest("allow_script_header"),
        action="store_false",
        default=True,
        help="ignore the x-mock-script request header",
    )


def _load(text: str) -> Any:
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        return json_loads(text)
    except ValueError as exc:
        raise ScriptError(f"not JSON: {exc}") from None


def settings_from_args(ns: argparse.Namespace) -> MockSettings:
    """The `MockSettings` the parsed arguments describe; raises `ScriptError` when invalid."""
    args = vars(ns)
    base = parse_script(_load(args[_dest("script")])) if args.get(_dest("script")) else Script()
    fields: dict[str, Any] = {}
    for _, name, _, _ in _FLAGS:
        if args.get(_dest(name)) is not None:
            fields[name] = args[_dest(name)]
    for name in ("reasoning", "finish", "silence", "reset_before_head", "echo", "validate"):
        if args.get(_dest(name)) is not None:
            fields[name] = args[_dest(name)]
    usage = {
        name: args[_dest("usage_" + name)]
        for _, name in _USAGE_FLAGS
        if args.get(_dest("usage_" + name)) is not None
    }
    if usage:
        fields["usage"] = usage
    error = {
        name: args[_dest("error_" + name)]
        for _, name, _, _ in _ERROR_FLAGS
        if args.get(_dest("error_" + name)) is not None
    }
    if error:
        fields["error"] = error
    script = parse_script(fields, base=base)
    profiles: dict[str, Script] = {}
    for item in args.get(_dest("profiles")) or ():
        name, sep, text = item.partition("=")
        if not sep:
            raise ScriptError(f"--profile expects NAME=JSON, got {item!r}")
        profiles[name] = parse_script(_load(text))
    models = args.get(_dest("models"))
    return MockSettings(
        script=script,
        profiles=profiles,
        seed=args.get(_dest("seed")),
        keep_received=args.get(_dest("keep_received")) or 100,
        allow_script_header=args.get(_dest("allow_script_header"), True),
        models=tuple(m.strip() for m in models.split(",") if m.strip())
        if models
        else DEFAULT_MODELS,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m twmock``: serve the mock upstream on ``--host:--port`` until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m twmock", description=_MAIN_HELP)
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
