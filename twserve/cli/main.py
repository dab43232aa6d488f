"""``twserve`` command line: serve, init, check, config, demo, mock-upstream, dryrun, usage,
prices, connect.

Every subcommand is a thin layer over functions that tests call directly.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc

from twengine.config import Config, ConfigError
from twserve.app import process
from twserve.app.process import FD_RESERVE, raise_fd_limit
from twserve.app.wiring import GatewayApp
from twserve.app.workers import worker_count
from twserve.config.files import (
    data_dir,
    load_config,
    new_key,
    starting_config_text,
    write_private,
)
from twserve.observe.logs import configure_logging
from twserve.server.listener import ListenError

log = logging.getLogger("twserve")


def _config_path(args: argparse.Namespace) -> Path:
    if args.config:
        return Path(args.config).expanduser()
    return data_dir() / "config.yaml"


def _home(args: argparse.Namespace) -> Path:
    """The data directory: ``--data-dir`` (created 0700 when it does not exist yet, as the
    default one is: safe mode keeps its key there, the store its rows), else the default."""
    if not args.data_dir:
        return data_dir()
    home = Path(args.data_dir).expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def _print_problems(err: ConfigError) -> None:
    for p in err.problems:
        where = f" at {p.path}" if p.path else ""
        print(f"  {p.code}{where}: {p.message}", file=sys.stderr)


def _tell_key(path: Path, key: str) -> None:
    """Say where the generated gateway key is. The key itself only goes to a terminal: stdout
    that is a file or a pipe ends up in logs (systemd's journal, CI output, a shared terminal
    log), and the key is in the 0600 config file anyway."""
    if sys.stdout.isatty():
        print(f"gateway key: {key}")
    else:
        print(f"the gateway key is clients[0].key in {path}")


def cmd_init(args: argparse.Namespace) -> int:
    path = _config_path(args)
    if path.exists() and not args.force:
        print(f"{path} exists already (use --force to overwrite)", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    key = new_key()
    write_private(path, starting_config_text(gateway_key=key, control_key=new_key("twc-")))
    print(f"wrote {path}")
    _tell_key(path, key)
    return 0


def _unresolved_binds(config: Config) -> list[str]:
    """A problem line for each listen.*.bind that is not an address or a resolving name."""
    binds = [("listen.gateway.bind", config.listen.gateway.bind, config.listen.gateway.port)]
    if config.listen.control.enabled:
        control = config.listen.control
        binds.append(("listen.control.bind", control.bind, control.port))
    problems = []
    for where, host, port in binds:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            problems.append(
                f"  gw.listen.bind_unresolved at {where}: {host!r} does not resolve "
                f"({exc.strerror})"
            )
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    path = _config_path(args)
    try:
        config = load_config(path)
    except FileNotFoundError:
        print(f"no config at {path}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"{path}: {len(err.problems)} problem(s)", file=sys.stderr)
        _print_problems(err)
        return 1
    unresolved = _unresolved_binds(config)
    if unresolved:
        print(f"{path}: {len(unresolved)} problem(s)", file=sys.stderr)
        for line in unresolved:
            print(line, file=sys.stderr)
        return 1
    print(f"{path}: ok ({len(config.providers)} upstreams, {len(config.clients)} keys)")
    for warning in config.warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    path = _config_path(args)
    if not path.exists():
        key = new_key()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, starting_config_text(gateway_key=key, control_key=new_key("twc-")))
        print(f"wrote a starting config to {path}")
        _tell_key(path, key)
    open_files = raise_fd_limit()
    try:
        home = _home(args)
    except OSError as exc:
        print(f"cannot use the data directory {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    try:
        workers = worker_count(args.workers) if args.worker is None else 1
    except ValueError:
        print(
            f"--workers takes a count of at least 1 or auto, not {args.workers!r}", file=sys.stderr
        )
        return 2
    if workers > 1:
        from twserve.cli.workers import serve_workers

        return serve_workers(args, path, home, workers)
    app = _serving_app(path, home, port=args.port, safe=args.safe, worker=args.worker)
    if app is None:
        return 1
    # The log's format: --log-format, else the config's (followed across reloads).
    handler = configure_logging(
        args.log_format or app.config.observability.log_format,
        level=logging.getLogger().level,
        queue_lines=app.config.observability.log_queue_lines,
    )
    app.observation.follow(handler, pinned=args.log_format)
    if app.control is not None:
        app.control.status_parts["log"] = handler.status
    cap = app.config.listen.gateway.max_connections
    if 0 < open_files < cap + FD_RESERVE:
        log.warning(
            "listen.gateway.max_connections is %d but only %d files may be open: accepting "
            "will pause when descriptors run out (raise the hard limit, ulimit -Hn)",
            cap,
            open_files,
        )

    async def main() -> None:
        # The signal handlers go in before the app starts listening, so a SIGTERM sent as soon
        # as the port answers already drains rather than kills. SIGHUP reads the config again.
        # The first SIGTERM / Ctrl-C drains requests in flight; a second one stops at once.
        sigs_wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        with anyio.open_signal_receiver(*sigs_wanted) as sigs:
            async with anyio.create_task_group() as tg:
                bound = await tg.start(app.run)
                process.settle_heap()  # what startup built is not walked again
                if args.worker is not None:
                    supervisor = int(os.environ.get("TWSERVE_SUPERVISOR", os.getppid()))
                    tg.start_soon(_stop_with_supervisor, app, supervisor, tg)
                if bound.gateway_port is not None:
                    print(
                        f"twserve listening on http://{app.host}:{bound.gateway_port}", flush=True
                    )
                if bound.control_port is not None:
                    where = f"http://{app.control_host}:{bound.control_port}"
                    print(f"control plane on {where}", flush=True)
                async for signum in sigs:
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: reading the config again")
                        app.reload_config()
                        continue
                    if app.stopping:
                        tg.cancel_scope.cancel()
                        break
                    print("stopping: finishing requests in flight", flush=True)
                    app.request_stop()
                    tg.start_soon(_stop_when_done, app, tg)

    failed: list[ListenError] = []
    try:
        try:
            process.run(main)
        except* ListenError as group:
            failed.extend(_leaves(group, ListenError))
    except KeyboardInterrupt:
        pass
    handler.close()  # the queued lines are written before the process ends
    if failed:
        # One line, not a traceback: the port is taken, or bind names no address.
        print(str(failed[0]), file=sys.stderr)
        return 2
    return 0


def _serving_app(
    path: Path, home: Path, *, port: int | None, safe: bool, worker: int | None = None
) -> GatewayApp | None:
    """The app `serve` runs: from the config on disk, or in safe mode when it cannot load (or
    `safe` asks for it) — only the control plane, naming the problem."""
    from twserve.config.check import ConfigRejection, Finding
    from twserve.config.live import check_bytes
    from twserve.config.safemode import control_only_config

    try:
        data = path.read_bytes()
    except OSError as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return None
    rejection: ConfigRejection | None = None
    try:
        config = check_bytes(data, os.environ)
    except ConfigRejection as err:
        rejection = err
    if rejection is None and safe:
        rejection = ConfigRejection(
            [
                Finding(
                    stage="runtime",
                    code="control.safe_mode",
                    path="",
                    line=None,
                    message="started with --safe; write a config to start the gateway",
                    excerpt="",
                )
            ]
        )
    if rejection is None:
        return GatewayApp(
            config, home, port=port, config_path=path, config_data=data, worker=worker
        )
    print(f"{path}: starting in safe mode (control plane only):", file=sys.stderr)
    for f in rejection.findings:
        line = f" line {f.line}" if f.line is not None else ""
        print(f"  [{f.stage}] {f.code}{line}: {f.message}", file=sys.stderr)
    control = control_only_config(data.decode("utf-8", errors="replace"), home, os.environ)
    if control.source == "defaults":
        where = f"$TWSERVE_CONTROL_KEY or {control.key_file}"
        why = f" ({control.reason})" if control.reason else ""
        print(
            f"  the config gives no usable listen.control{why}; the control plane uses the "
            f"defaults (127.0.0.1:8789, key from {where})",
            file=sys.stderr,
        )
    return GatewayApp(
        control.config,
        home,
        port=port,
        config_path=path,
        config_data=data,
        safe_mode=rejection,
    )


def cmd_config(args: argparse.Namespace) -> int:
    """``twserve config history`` and ``twserve config rollback N``; the gateway may be stopped
    or running (then its watcher applies the rolled-back file)."""
    from twserve.config.check import ConfigRejection
    from twserve.config.history import ConfigHistory
    from twserve.config.live import check_bytes

    path = _config_path(args)
    try:
        home = _home(args)
    except OSError as exc:
        print(f"cannot use the data directory {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    history = ConfigHistory(home)
    if args.action == "history":
        import time

        entries = history.entries()
        if not entries:
            print("no config history yet", file=sys.stderr)
            return 0
        try:
            from twserve.config.check import config_version

            current = config_version(path.read_bytes())
        except OSError:
            current = None
        for e in entries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.applied_at))
            mark = "  (current file)" if e.version == current else ""
            print(f"{e.number:>4}  {when}  {e.version}  {e.origin:<7}{mark}")
        return 0
    if args.number is None:
        print("rollback needs the history number to go back to", file=sys.stderr)
        return 2
    try:
        entry, data = history.read(args.number)
    except KeyError:
        print(f"no history entry {args.number} (see `twserve config history`)", file=sys.stderr)
        return 1
    try:
        check_bytes(data, os.environ)
    except ConfigRejection as err:
        print(f"entry {entry.number} no longer passes validation:", file=sys.stderr)
        for f in err.findings:
            print(f"  [{f.stage}] {f.code} line {f.line}: {f.message}", file=sys.stderr)
        return 1
    write_private(path, data, through_link=True)
    history.record(data, "cli")
    print(f"{path}: rolled back to entry {entry.number} ({entry.version})")
    return 0


def _leaves(group: BaseExceptionGroup[BaseException], kind: type[ListenError]) -> list[ListenError]:
    """The exceptions of `kind` in `group`, however deeply task groups nested them."""
    found: list[ListenError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc, kind))
        elif isinstance(exc, kind):
            found.append(exc)
    return found


async def _stop_with_supervisor(app: GatewayApp, supervisor: int, tg: anyio.abc.TaskGroup) -> None:
    """A worker whose supervisor is gone (killed: it could not pass a stop on) drains and
    stops, rather than serve on unwatched."""
    while os.getppid() == supervisor:
        await anyio.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone: stopping", supervisor)
    app.request_stop()
    await _stop_when_done(app, tg)


async def _stop_when_done(app: GatewayApp, tg: anyio.abc.TaskGroup) -> None:
    await app.wait_stopped()
    tg.cancel_scope.cancel()


def cmd_mock(args: argparse.Namespace) -> int:
    from twmock import serve_mock, settings_from_args

    settings = settings_from_args(args)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            port = await tg.start(
                lambda task_status: serve_mock(
                    settings, host=args.host, port=args.port, task_status=task_status
                )
            )
            print(f"mock upstream listening on http://{args.host}:{port}", flush=True)

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from twserve.cli.demo import run_demo

    # The demo's log lines as `serve` writes them, fields and all (docs/observability.md).
    configure_logging("text", level=logging.getLogger().level)

    failed: list[ListenError] = []
    try:
        try:
            anyio.run(lambda: run_demo(port=args.port, mock_port=args.mock_port, once=args.once))
        except* ListenError as group:
            failed.extend(_leaves(group, ListenError))
    except KeyboardInterrupt:
        pass
    if failed:
        # Like `serve`: the port (the gateway's or the mock's) is taken, one line and exit 2.
        print(str(failed[0]), file=sys.stderr)
        return 2
    return 0


def cmd_dryrun(args: argparse.Namespace) -> int:
    import json
    import time

    from twengine.dryrun import format_text, report_from_dict
    from twengine.router import Router
    from twserve.control.client import fetch_dryrun
    from twserve.control.plane import ControlRequestError, control_key_of, dryrun_facts

    path = _config_path(args)
    try:
        if args.control:
            key = args.control_key or os.environ.get("TWSERVE_CONTROL_KEY")
            if not key and path.exists():
                key = control_key_of(load_config(path))
            if not key:
                print("no control key: use --control-key or $TWSERVE_CONTROL_KEY", file=sys.stderr)
                return 2
            source = f"live state of the gateway at {args.control}"
            data = fetch_dryrun(
                args.control,
                key,
                model=args.model,
                key_name=args.key,
                dialect=args.dialect,
                stream=args.stream,
            )
            report = report_from_dict(data)
        else:
            config = load_config(path)
            facts = dryrun_facts(
                config, model=args.model, key=args.key, dialect=args.dialect, stream=args.stream
            )
            source = (
                f"fresh routing state from {path}: no health, pauses, slots or conversations of "
                "a running gateway (ask one with --control URL)"
            )
            report = Router(config).dryrun(facts, now=time.monotonic())
            data = report.to_dict()
    except FileNotFoundError:
        print(f"no config at {path}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"{path}: {len(err.problems)} problem(s)", file=sys.stderr)
        _print_problems(err)
        return 1
    except ControlRequestError as err:
        print(f"{err.code}: {err.message}", file=sys.stderr)
        return 1
    except ConnectionError as err:
        print(f"cannot reach the control plane: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**data, "source": source}, indent=2))
    else:
        print(f"({source})")
        print(format_text(report), end="")
    return 0


class _Version(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kw: object) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version("twserve")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        print(f"twserve {version}")
        parser.exit()


def build_parser(*, mock_options: bool = True) -> argparse.ArgumentParser:
    """The command line; `mock_options`: with ``mock-upstream``'s own options, which load the
    mock server (about 0.7 MiB the gateway has no use for)."""
    parser = argparse.ArgumentParser(prog="twserve", description="LLM API gateway")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", help="config file (default: $TWSERVE_HOME/config.yaml)")
    p.add_argument("--data-dir", help="data directory (default: $TWSERVE_HOME or ~/.twserve)")
    p.add_argument("--port", type=int, help="gateway port (default: listen.gateway.port)")
    p.add_argument(
        "--safe",
        action="store_true",
        help="start in safe mode: only the control plane, until a config is written through it",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="the log's lines: text or one JSON object each (default: observability.log_format)",
    )
    p.add_argument(
        "--workers",
        default="1",
        help="gateway processes on one port (auto: one per core); more than one needs "
        "state.redis_url (default: 1)",
    )
    # One of --workers' processes, started by the supervisor (twserve/app/workers.py).
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("config", help="the config history: list it, roll back to an entry")
    p.add_argument("action", choices=("history", "rollback"))
    p.add_argument("number", nargs="?", type=int, help="history entry to roll back to")
    p.add_argument("--config", help="config file (default: $TWSERVE_HOME/config.yaml)")
    p.add_argument("--data-dir", help="data directory (default: $TWSERVE_HOME or ~/.twserve)")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("init", help="write a starting config with a generated key")
    p.add_argument("--config")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("check", help="validate a config file")
    p.add_argument("--config")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("demo", help="gateway plus a built-in mock upstream; no API key needed")
    p.add_argument("--port", type=int, default=8788)
    p.add_argument("--mock-port", type=int, default=0)
    p.add_argument(
        "--once", action="store_true", help="run the banner's requests, print the answers, exit"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("mock-upstream", help="a scriptable fake upstream speaking all four APIs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9100)
    if mock_options:
        from twmock import add_mock_arguments

        add_mock_arguments(p)
    p.set_defaults(func=cmd_mock)

    p = sub.add_parser("dryrun", help="where a request would go, and why")
    p.add_argument("--model", required=True, help="the model the request asks for")
    p.add_argument("--key", help="the gateway key's name (default: default_key, else none)")
    p.add_argument("--dialect", help="the client's API format (default: openai-chat)")
    p.add_argument("--stream", action="store_true", help="a streamed request")
    p.add_argument("--config", help="config file (default: $TWSERVE_HOME/config.yaml)")
    p.add_argument(
        "--control", metavar="URL", help="ask a running gateway's control plane (live state)"
    )
    p.add_argument(
        "--control-key",
        help="control key for --control (default: $TWSERVE_CONTROL_KEY, else the config's)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_dryrun)

    from twserve.cli import connect as cli_connect
    from twserve.cli import top as cli_top
    from twserve.cli import usage as cli_usage

    cli_usage.add_commands(sub)
    cli_connect.add_commands(sub)
    cli_top.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(mock_options="mock-upstream" in argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.umask(0o077)
    try:
        code = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # Whoever read stdout stopped (`twserve usage --json | head`): end as a program killed
        # by SIGPIPE would (128 + 13), without a traceback, and without Python's own complaint
        # when it flushes stdout again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
