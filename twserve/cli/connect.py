"""``twserve connect CLIENT``: the exact lines that point a client at this gateway.

Each client finds its endpoint and key in its own variables and files (docs/clients.md has
them, client by client, and what works across formats). This command prints them filled in:
the gateway's address from the config (``listen.gateway``; a wildcard bind is reached on
loopback) or ``--url``, and a key the operator names — ``--key`` itself, or ``--key-name`` for a
``clients[]`` entry of the config, its ``${VAR}`` read from the environment. Shell lines are
quoted for sh; TOML and JSON lines are written as their formats quote.

`connect_lines` is pure (tests call it directly); `cmd_connect` loads the config and prints.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CLIENTS", "Target", "add_commands", "cmd_connect", "connect_lines", "gateway_url"]

MODEL_PLACEHOLDER = "<model>"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a client is sent: the gateway's base URL (no trailing slash), the key, and the
    model to ask for (None: the client's own default, or a placeholder where one is needed)."""

    url: str
    key: str
    model: str | None = None


def _export(name: str, value: str) -> str:
    return f"export {name}={shlex.quote(value)}"


def _model_line(name: str, model: str | None) -> str:
    # Without --model the line is shown commented out: the variable is optional.
    line = _export(name, model or MODEL_PLACEHOLDER)
    return line if model else f"# {line}"


def _claude_code(t: Target) -> list[str]:
    lines = [
        '# Claude Code: in the shell that starts `claude` (or under "env" in',
        "# ~/.claude/settings.json). The key goes as Authorization: Bearer.",
        _export("ANTHROPIC_BASE_URL", t.url),
        _export("ANTHROPIC_AUTH_TOKEN", t.key),
        "# ANTHROPIC_API_KEY (sent in the API-key header) works too; set only one of the two.",
        "unset ANTHROPIC_API_KEY",
        "# The model, and the models behind the opus / sonnet / haiku slots (background tasks",
        "# use haiku's): names the gateway routes.",
    ]
    for name in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    ):
        lines.append(_model_line(name, t.model))
    return lines


def _toml(value: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's for everything a URL or name holds.
    return json.dumps(value, ensure_ascii=False)


def _codex(t: Target) -> list[str]:
    model = f"model = {_toml(t.model or MODEL_PLACEHOLDER)}"
    return [
        "# Codex CLI: the key in the shell that starts `codex`",
        _export("TWSERVE_API_KEY", t.key),
        "# and in ~/.codex/config.toml (top-level keys before any [table]):",
        'model_provider = "twserve"',
        model if t.model else f"# {model}",
        "",
        "[model_providers.twserve]",
        'name = "twserve"',
        f"base_url = {_toml(t.url + '/v1')}",
        'env_key = "TWSERVE_API_KEY"',
        'wire_api = "responses"',
        "# The Responses WebSocket, on the gateway's own port; Codex falls back to HTTP",
        "# streams when a socket cannot be opened.",
        "supports_websockets = true",
    ]


def _gemini_cli(t: Target) -> list[str]:
    return [
        "# Gemini CLI: in the shell that starts `gemini` (or in ~/.gemini/.env)",
        _export("GOOGLE_GEMINI_BASE_URL", t.url),
        _export("GEMINI_API_KEY", t.key),
        _model_line("GEMINI_MODEL", t.model),
        "# and in ~/.gemini/settings.json, so it signs in with the key, not a Google account:",
        '#   {"security": {"auth": {"selectedType": "gemini-api-key"}}}',
    ]


def _openai(t: Target) -> list[str]:
    return [
        "# OpenAI SDKs: openai.OpenAI() in Python and new OpenAI() in TypeScript read both.",
        _export("OPENAI_BASE_URL", t.url + "/v1"),
        _export("OPENAI_API_KEY", t.key),
    ]


def _anthropic(t: Target) -> list[str]:
    return [
        "# Anthropic SDKs: anthropic.Anthropic() in Python and new Anthropic() in TypeScript",
        "# read both (ANTHROPIC_AUTH_TOKEN instead of the key sends it as a Bearer token).",
        _export("ANTHROPIC_BASE_URL", t.url),
        _export("ANTHROPIC_API_KEY", t.key),
    ]


def _genai(t: Target) -> list[str]:
    return [
        "# Google GenAI SDK: genai.Client() in Python reads both; GOOGLE_API_KEY, when set, wins",
        "# over GEMINI_API_KEY there, so it is unset.",
        _export("GOOGLE_GEMINI_BASE_URL", t.url),
        _export("GEMINI_API_KEY", t.key),
        "unset GOOGLE_API_KEY",
        "# TypeScript (@google/genai) takes the address as an option:",
        "#   new GoogleGenAI({apiKey: process.env.GEMINI_API_KEY,",
        "#                    httpOptions: {baseUrl: process.env.GOOGLE_GEMINI_BASE_URL}})",
    ]


def _curl(t: Target) -> list[str]:
    from twproto import ClientCall, Dialect, Operation, UpstreamTarget, upstream_request

    model = t.model or MODEL_PLACEHOLDER
    user = [{"role": "user", "content": "Hello"}]
    # Each request as its own SDK writes it: to a client, the gateway is one more upstream of
    # the client's format (twproto.upstream_request knows the paths and key headers).
    calls = [
        (
            "Anthropic Messages",
            Dialect.ANTHROPIC,
            {"model": model, "max_tokens": 256, "stream": True, "messages": user},
        ),
        (
            "OpenAI Chat Completions",
            Dialect.OPENAI_CHAT,
            {"model": model, "stream": True, "messages": user},
        ),
        (
            "OpenAI Responses",
            Dialect.OPENAI_RESPONSES,
            {"model": model, "stream": True, "input": "Hello"},
        ),
        ("Gemini", Dialect.GEMINI, {"contents": [{"role": "user", "parts": [{"text": "Hello"}]}]}),
    ]
    lines = ["# curl: one streamed request in each API format; any model the gateway routes."]
    for title, dialect, body in calls:
        openai_sdk = dialect in (Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES)
        base_url = t.url + "/v1" if openai_sdk else t.url
        target = UpstreamTarget(dialect=dialect, base_url=base_url, key=t.key, model=model)
        call = ClientCall(dialect=dialect, operation=Operation.GENERATE, stream=True)
        raw = json.dumps(body, separators=(",", ":"))
        built = upstream_request(target, call, raw.encode())
        words = ["curl", "-N", shlex.quote(built.url)]
        for name, value in built.headers:
            if name in (b"content-type", b"accept-encoding"):
                continue  # curl's own content-type line follows; identity is its default
            words += ["-H", shlex.quote(f"{name.decode()}: {value.decode()}")]
        words += ["-H", "'content-type: application/json'", "-d", shlex.quote(raw)]
        lines += [f"# {title}", " ".join(words)]
    return lines


#: CLIENT → the lines it gets.
CLIENTS: Mapping[str, Callable[[Target], list[str]]] = {
    "claude-code": _claude_code,
    "codex": _codex,
    "gemini-cli": _gemini_cli,
    "openai": _openai,
    "anthropic": _anthropic,
    "genai": _genai,
    "curl": _curl,
}


def connect_lines(client: str, target: Target) -> list[str]:
    """What ``twserve connect CLIENT`` prints; KeyError for an unknown client."""
    return CLIENTS[client](target)


def gateway_url(bind: str, port: int) -> str:
    """The base URL a client on this machine reaches a listener bound to `bind` at: a wildcard
    bind (``0.0.0.0``, ``::``) is reached on loopback; an IPv6 address is bracketed."""
    try:
        ip = ipaddress.ip_address(bind)
    except ValueError:
        return f"http://{bind}:{port}"  # a host name
    if ip.is_unspecified:
        ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}"


class ConnectError(Exception):
    """Why the lines cannot be printed; one line for stderr."""


def _config_path(args: argparse.Namespace) -> Path:
    from twserve.config.files import data_dir

    return Path(args.config).expanduser() if args.config else data_dir() / "config.yaml"


def _load(args: argparse.Namespace) -> Any:
    from twengine.config import ConfigError
    from twserve.config.files import load_config

    path = _config_path(args)
    try:
        return load_config(path)
    except OSError as exc:
        raise ConnectError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ConfigError as err:
        raise ConnectError(f"{path} does not load: {err}") from None


def _key_of(config: Any, name: str | None, env: Mapping[str, str]) -> str:
    from twengine.config import TemplateError, resolve_template

    names = [c.name for c in config.clients]
    if name is None:
        if len(names) != 1:
            raise ConnectError(
                "name the key: --key-name NAME (one of: "
                + (", ".join(names) or "none in the config")
                + ") or --key KEY"
            )
        name = names[0]
    try:
        client = config.client(name)
    except KeyError:
        raise ConnectError(
            f"no key named {name!r} in the config (names: {', '.join(names) or 'none'})"
        ) from None
    try:
        return str(resolve_template(client.key, env))
    except TemplateError as exc:
        raise ConnectError(f"the key {name!r} cannot be read: {exc}") from None


def target_for(args: argparse.Namespace, env: Mapping[str, str]) -> Target:
    """The address and key `args` name, reading the config only for what they leave out."""
    config: Any = None
    if args.url is None or args.key is None:
        config = _load(args)
    if args.url is not None:
        url = args.url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConnectError(f"--url must start with http:// or https://, not {args.url!r}")
    else:
        gw = config.listen.gateway
        url = gateway_url(gw.bind, gw.port)
    key = args.key if args.key is not None else _key_of(config, args.key_name, env)
    return Target(url=url, key=key, model=args.model)


def cmd_connect(args: argparse.Namespace) -> int:
    try:
        target = target_for(args, os.environ)
    except ConnectError as exc:
        print(f"twserve connect: {exc}", file=sys.stderr)
        return 2
    print("\n".join(connect_lines(args.client, target)))
    return 0


def add_commands(sub: Any) -> None:
    """Add ``connect`` to the CLI's subcommands."""
    p = sub.add_parser(
        "connect",
        help="print the lines that point a client at this gateway",
        description="Print the variables and config lines that send CLIENT to this gateway "
        "(docs/clients.md).",
    )
    p.add_argument("client", choices=sorted(CLIENTS), metavar="CLIENT", help=", ".join(CLIENTS))
    p.add_argument("--url", help="the gateway's base URL (default: from listen.gateway)")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--key", help="the gateway key to print")
    keys.add_argument(
        "--key-name", help="the clients[] entry whose key to print (default: the only one)"
    )
    p.add_argument("--model", help="the model the client asks for (default: its own)")
    p.add_argument("--config", help="config file (default: $TWSERVE_HOME/config.yaml)")
    p.set_defaults(func=cmd_connect)
