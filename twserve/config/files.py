"""The config file and the data directory on disk.

`parse_config_text` is what the one-shot commands (``check``, ``dryrun``, ``usage``) load a config
with: the same stages as a serving gateway (`twserve.config.check.check_config_text`: the same YAML
reader, anchors and aliases refused, ``${VAR}`` keys read from the environment), the problems
handed back as one `ConfigError`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path

from twengine.config import Config, ConfigError, Problem
from twserve.config.check import ConfigRejection, check_config_text

__all__ = [
    "data_dir",
    "load_config",
    "parse_config_text",
    "starting_config_text",
    "write_private",
]


def data_dir(env: dict[str, str] | None = None) -> Path:
    """``$TWSERVE_HOME`` or ``~/.twserve``, created with mode 0700."""
    env = dict(os.environ) if env is None else env
    path = Path(env.get("TWSERVE_HOME") or Path.home() / ".twserve").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def parse_config_text(text: str, env: Mapping[str, str] | None = None) -> Config:
    """YAML text → validated Config; raises `ConfigError` naming every problem.

    ``${VAR}`` templates are read from `env` (default: the process environment): gateway keys
    are resolved here, upstream credentials checked (see `build_config`)."""
    try:
        return check_config_text(text, dict(os.environ) if env is None else env)
    except ConfigRejection as rejection:
        raise ConfigError(
            tuple(
                Problem(
                    code=f.code,
                    path=f.path,
                    message=(
                        f.message if f.path or f.line is None else f"line {f.line}: {f.message}"
                    ),
                )
                for f in rejection.findings
            )
        ) from None


def load_config(path: Path, env: Mapping[str, str] | None = None) -> Config:
    return parse_config_text(path.read_text(encoding="utf-8"), env)


def write_private(path: Path, data: str | bytes, *, through_link: bool = False) -> None:
    """Write `data` to `path` readable by the owner only (0600), atomically: a reader sees the
    old file or the new one, never a part.

    The temporary file is made by `tempfile.mkstemp` (O_CREAT|O_EXCL, mode 0600, a random
    name) in the same directory: a fixed name such as ``config.yaml.tmp`` could be a symlink
    planted by someone else, and opening it would write the config, keys and all, wherever it
    points. `os.replace` then swaps the new file in; it replaces a symlink at `path` itself
    rather than following it, unless `through_link` asks to write the link's target (a config
    file the operator linked into place stays a link when the gateway rewrites it).
    """
    target = path.resolve() if through_link and path.is_symlink() else path
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def new_key(prefix: str = "tw-") -> str:
    return prefix + secrets.token_urlsafe(24)


def starting_config_text(*, gateway_key: str, control_key: str) -> str:
    """The config `twserve serve` writes when there is none: one key, no upstream yet."""
    return f"""\
# twserve configuration — see docs/configuration.md for every field.
version: 1

listen:
  gateway:
    bind: 127.0.0.1
    port: 8788
  control:
    bind: 127.0.0.1
    port: 8789
    key: {control_key}

clients:
  - name: me
    key: {gateway_key}

# Add your upstreams here; keys may refer to environment variables.
providers: []
#  - name: anthropic
#    base_url: https://api.anthropic.com
#    key: ${{ANTHROPIC_API_KEY}}
#  - name: openai
#    base_url: https://api.openai.com/v1
#    key: ${{OPENAI_API_KEY}}
"""
