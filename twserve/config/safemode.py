"""Safe mode: only the control plane serves, saying why, until a config passes.

See docs/operations.md, "Safe mode".

The gateway enters safe mode when the config on disk cannot load at start (or on
``twserve serve --safe``). The control plane still needs an address and a key. They come from
the broken file's own ``listen.control`` when that much of it is sound — its key's ``${VAR}``
set in the environment included, or nobody could get in —; otherwise from the
documented defaults — ``127.0.0.1:8789`` and the key in ``$TWSERVE_CONTROL_KEY``, else a key
generated once and kept in ``<data dir>/safe-mode-control-key`` (0600), whose path is logged
(never the key). The file's ``notifications`` come along when they load on their own, so that
the receivers hear that the gateway is in safe mode.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml.error import YAMLError

from twengine.config import Config, ConfigError, build_config
from twengine.config import defaults as config_defaults
from twserve.config.check import load_document, plain
from twserve.config.files import write_private

__all__ = ["SAFE_KEY_FILE", "SafeControl", "control_only_config"]

log = logging.getLogger("twserve")

SAFE_KEY_FILE = "safe-mode-control-key"


@dataclass(frozen=True, slots=True, kw_only=True)
class SafeControl:
    """The control-only config safe mode serves with, and where its control settings came
    from: ``config`` (the file's own ``listen.control``) or ``defaults``; with the defaults,
    `reason` says why the file's could not be used when it has a ``listen.control``."""

    config: Config
    source: str
    key_file: Path | None = None
    reason: str | None = None


def _document(text: str) -> dict[str, Any] | None:
    try:
        doc = load_document(text)
    except YAMLError:  # not YAML: fall back to the defaults
        return None
    return plain(doc) if isinstance(doc, dict) else None


def _with_notifications(
    data: dict[str, Any], doc: dict[str, Any] | None, env: Mapping[str, str]
) -> Config:
    """`data` built with the file's ``notifications`` when they load with it, else without."""
    hooks = doc.get("notifications") if doc is not None else None
    if hooks is not None:
        try:
            return build_config({**data, "notifications": hooks}, env)
        except ConfigError:
            pass
    return build_config(data, env)


def _from_file(doc: dict[str, Any] | None, env: Mapping[str, str]) -> Config | str | None:
    """The file's own control-only config; else why not (None: it has no ``listen.control``)."""
    if doc is None:
        return None
    listen = doc.get("listen")
    control: Any = listen.get("control") if isinstance(listen, dict) else None
    if not isinstance(control, dict):
        return None
    try:
        config = _with_notifications({"version": 1, "listen": {"control": control}}, doc, env)
    except ConfigError as err:
        first = err.problems[0]
        return f"{first.code} at {first.path}: {first.message}"
    if not config.listen.control.enabled or not config.listen.control.key:
        return "listen.control is switched off"
    return config


def control_only_config(text: str, data_dir: Path, env: Mapping[str, str]) -> SafeControl:
    """The config safe mode runs the control plane with (see the module docs)."""
    doc = _document(text)
    found = _from_file(doc, env)
    if isinstance(found, Config):
        return SafeControl(config=found, source="config")
    key = env.get("TWSERVE_CONTROL_KEY")
    key_file = None
    if not key:
        key_file = data_dir / SAFE_KEY_FILE
        try:
            key = key_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            key = ""
        if not key:
            key = "twc-" + secrets.token_urlsafe(24)
            write_private(key_file, key.encode())
        os.chmod(key_file, 0o600)
    config = _with_notifications(
        {
            "version": 1,
            "listen": {
                "control": {
                    "bind": config_defaults.CONTROL_BIND,
                    "port": config_defaults.CONTROL_PORT,
                    "key": key,
                }
            },
        },
        doc,
        env,
    )
    return SafeControl(config=config, source="defaults", key_file=key_file, reason=found)
