"""The key management API on the control listener (docs/console.md, "Keys").

=================================  ===========================================================
``POST /keys``                     create a key; the answer holds its secret, once
``PATCH /keys/{name}``             change ``route``, ``max_concurrent``, ``limits``,
                                   ``disabled``, ``expires_at``, ``allowed_models`` (a field
                                   sent as null is removed)
``POST /keys/{name}/rotate``       a new secret; the old one is refused from the answer on, or
                                   (``overlap_secs``) kept as ``previous_key`` until then
``DELETE /keys/{name}``            revoke: the entry leaves the file
=================================  ===========================================================

Every write is a splice of the config file's text (`twserve.console.key_edit`) applied through
`LiveConfig.apply`, as the other control-plane writes are: the four validation stages (a
refused result is 422 with each problem's code and line, and the file is untouched), the
``base_version`` check (409 when stale), the atomic write, the history entry, and the
``ConfigReloaded`` event. The key is in force before the answer leaves.

Secrets: a new secret is drawn here (`secrets.token_urlsafe`, 256 bits), written to the file,
and shown in the answer to the create or rotate that made it — never again (`GET /keys` masks
it). A key the file writes as a ``${VAR}`` reference stays one: create may name a reference
instead of asking for a secret, and rotate refuses such a key (the variable is rotated where it
is set). The API never takes a literal secret from the caller: every key it writes is one the
gateway drew.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import anyio
from ruamel.yaml.error import YAMLError

from twproto import json_loads
from twserve.config.edit import EditError
from twserve.config.live import LiveConfig, StaleVersion
from twserve.console.key_edit import (
    add_client,
    client_key_text,
    remove_client,
    set_client_field,
)
from twserve.control.plane import ControlPlane, ControlRequestError
from twserve.server.base import Request

__all__ = ["KEY_PREFIX", "MAX_OVERLAP_SECS", "KeysAPI", "new_secret", "utc_text"]

KEY_PREFIX = "tw-"
# A name a new key may have: it is written into URLs (`/keys/{name}`) and the file unquoted.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")
_PATCHABLE = ("route", "max_concurrent", "limits", "disabled", "expires_at", "allowed_models")
#: The longest a rotated key's old secret may stay valid (``overlap_secs``): 30 days.
MAX_OVERLAP_SECS = 30 * 86400
# At most this many model patterns per key, each at most this long.
_MAX_PATTERNS, _MAX_PATTERN_CHARS = 64, 200
_LIMIT_FIELDS = frozenset({"per", "requests", "tokens", "cost", "cache_reads"})

Answer = tuple[int, Any]


def new_secret() -> str:
    """A fresh gateway key: the prefix and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _invalid(message: str) -> ControlRequestError:
    return ControlRequestError(400, "control.key_invalid", message)


def _check_fields(body: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    """The fields of a create or patch body, shallowly checked (the config's own validation
    checks the rest: a route that exists, a limit's range)."""
    allowed = set(_PATCHABLE) | {"base_version"} | ({"name", "key"} if creating else set())
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _invalid(f"unknown fields {unknown} (known: {sorted(allowed)})")
    out: dict[str, Any] = {}
    for name in _PATCHABLE:
        if name not in body:
            continue
        value = body[name]
        if value is None:
            out[name] = None
        elif name == "route" and not (isinstance(value, str) and value.strip()):
            raise _invalid("route must name a route")
        elif name == "max_concurrent" and (isinstance(value, bool) or not isinstance(value, int)):
            raise _invalid("max_concurrent must be a whole number")
        elif name == "disabled" and not isinstance(value, bool):
            raise _invalid("disabled must be true or false")
        elif name == "expires_at" and (
            isinstance(value, bool) or not isinstance(value, (int, float, str))
        ):
            raise _invalid("expires_at must be unix seconds or an ISO 8601 time")
        elif name == "allowed_models":
            out[name] = _check_patterns(value)
            continue
        elif name == "limits":
            out[name] = _check_limits(value)
            continue
        out[name] = value
    return out


def _check_patterns(value: object) -> list[str]:
    patterns = [value] if isinstance(value, str) else value
    if (
        not isinstance(patterns, list)
        or not 1 <= len(patterns) <= _MAX_PATTERNS
        or not all(isinstance(p, str) and 0 < len(p) <= _MAX_PATTERN_CHARS for p in patterns)
    ):
        raise _invalid(
            f"allowed_models must be a model pattern or a list of 1-{_MAX_PATTERNS} of them "
            f"(each at most {_MAX_PATTERN_CHARS} characters)"
        )
    return list(patterns)


def utc_text(at: float) -> str:
    """Unix seconds as the ISO 8601 time the file is written with (``…Z``)."""
    when = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")
    return when.replace("+00:00", "Z")


def _overlap(body: dict[str, Any]) -> float | None:
    unknown = sorted(set(body) - {"overlap_secs", "base_version"})
    if unknown:
        raise _invalid(f"unknown fields {unknown} (known: ['base_version', 'overlap_secs'])")
    secs = body.get("overlap_secs")
    if secs is None:
        return None
    if isinstance(secs, bool) or not isinstance(secs, (int, float)):
        raise _invalid("overlap_secs must be a number of seconds")
    if not 0 < secs <= MAX_OVERLAP_SECS:
        raise _invalid(f"overlap_secs must be above 0 and at most {MAX_OVERLAP_SECS}")
    return float(secs)


def _check_limits(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > 16:
        raise _invalid("limits must be a list of at most 16 limits")
    limits = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not item:
            raise _invalid(f"limits[{i}] must be an object such as {{per: day, requests: 100}}")
        unknown = sorted(set(item) - _LIMIT_FIELDS)
        if unknown:
            raise _invalid(f"limits[{i}] has unknown fields {unknown}")
        for field, v in item.items():
            ok = (
                isinstance(v, str)
                if field == "per"
                else isinstance(v, bool)
                if field == "cache_reads"
                else isinstance(v, (int, float)) and not isinstance(v, bool)
            )
            if not ok:
                raise _invalid(f"limits[{i}].{field} has the wrong type")
        limits.append(dict(item))
    return limits


class KeysAPI:
    """Key writes over one `LiveConfig` (see the module docs)."""

    def __init__(self, live: LiveConfig, plane: ControlPlane) -> None:
        self.live = live
        self.plane = plane

    def route(self, request: Request) -> Callable[[], Awaitable[Answer]] | None:
        """The handler for `request`, or None when its path is not a key write."""
        path = request.path
        method = request.method
        if path == "/keys":
            if method == "POST":
                return lambda: self._create(request)
            return None  # GET /keys is the plane's view
        if not path.startswith("/keys/"):
            return None
        rest = path[len("/keys/") :]
        action = None
        if rest.endswith("/rotate"):
            rest, action = rest[: -len("/rotate")], "rotate"
        name = unquote(rest)
        if not name or "/" in rest:
            raise ControlRequestError(
                404, "control.request.not_found", f"no control view at {path}"
            )
        expected = {None: ("PATCH", "DELETE"), "rotate": ("POST",)}[action]
        if method not in expected:
            raise ControlRequestError(
                405,
                "control.request.method_not_allowed",
                f"{path} answers {' or '.join(expected)}, not {method}",
            )
        if action == "rotate":
            return lambda: self._rotate(request, name)
        if method == "PATCH":
            return lambda: self._patch(request, name)
        return lambda: self._revoke(request, name)

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _body(request: Request, *, optional: bool = False) -> dict[str, Any]:
        if optional and not request.body.strip():
            return {}
        try:
            body = json_loads(request.body) if request.body else None
        except ValueError:
            raise ControlRequestError(
                400, "control.request.bad_json", "the body is not valid JSON"
            ) from None
        if not isinstance(body, dict):
            raise ControlRequestError(
                400, "control.request.bad_json", "the body must be a JSON object"
            )
        return body

    @staticmethod
    def _base(body: dict[str, Any]) -> str | None:
        base = body.get("base_version")
        if base is not None and not isinstance(base, str):
            raise ControlRequestError(
                400, "control.request.invalid", "base_version must be a string"
            )
        return base

    def _known(self, name: str) -> None:
        if not self.plane.config.has_client(name) and self.live.safe is None:
            raise ControlRequestError(404, "control.key_unknown", f"no gateway key named {name!r}")

    async def _edit(self, edit: Callable[[str], str], base: str | None) -> dict[str, Any]:
        """Splice `edit` into the current text (in a worker thread: it parses YAML) and apply
        it; the answer's version fields."""
        current = self.live.version
        if base is not None and base != current:
            raise StaleVersion(base, current)
        try:
            text = await anyio.to_thread.run_sync(edit, self.live.text())
        except EditError as err:
            if err.what == "key":
                raise ControlRequestError(404, "control.key_unknown", err.message) from None
            raise ControlRequestError(409, "control.config.layout", err.message) from None
        except YAMLError:
            raise ControlRequestError(
                422,
                "control.config.rejected",
                "the config file is not valid YAML; write the whole file with PUT /config",
            ) from None
        applied = await self.live.apply(
            text.encode("utf-8"), origin="control", write=True, base_version=base or current
        )
        return {"version": applied.version, "generation": applied.generation}

    # -- the writes ------------------------------------------------------------------------

    async def _create(self, request: Request) -> Answer:
        body = self._body(request)
        name = body.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _invalid(
                "name must be 1-64 letters, digits, '_', '.', '@' or '-', starting with a "
                "letter or digit"
            )
        if self.plane.config.has_client(name):
            raise ControlRequestError(409, "control.key_exists", f"a key named {name!r} exists")
        fields = _check_fields(body, creating=True)
        reference = body.get("key")
        if reference is not None and not (
            isinstance(reference, str) and _REFERENCE.fullmatch(reference)
        ):
            raise _invalid("key may only be a ${VAR} reference; leave it out to get a new key")
        secret = reference if reference is not None else new_secret()
        entry = {"name": name, "key": secret} | {k: v for k, v in fields.items() if v is not None}
        versions = await self._edit(lambda text: add_client(text, entry), self._base(body))
        return 201, {"name": name, "key": secret, "shown_once": reference is None} | versions

    async def _patch(self, request: Request, name: str) -> Answer:
        self._known(name)
        body = self._body(request)
        fields = _check_fields(body, creating=False)
        if not fields:
            raise _invalid(f"nothing to change: send any of {list(_PATCHABLE)}")

        def edit(text: str) -> str:
            for field, value in fields.items():
                text = set_client_field(text, name, field, value)
            return text

        versions = await self._edit(edit, self._base(body))
        return 200, {"name": name, "changed": sorted(fields)} | versions

    async def _rotate(self, request: Request, name: str) -> Answer:
        self._known(name)
        body = self._body(request, optional=True)
        written = await anyio.to_thread.run_sync(client_key_text, self.live.text(), name)
        if written is not None and _REFERENCE.search(written):
            raise ControlRequestError(
                409,
                "control.key_from_env",
                f"key {name!r} is read from {written}; rotate it where that variable is set",
            )
        overlap = _overlap(body)
        old = written if overlap is not None else None
        until = None if overlap is None else utc_text(self.plane.gateway.wall() + overlap)
        secret = new_secret()

        def edit(text: str) -> str:
            # The old secret stays valid until `until` as `previous_key`, or goes at once
            # (a previous key left by an earlier rotation goes too).
            text = set_client_field(text, name, "key", secret)
            text = set_client_field(text, name, "previous_key_until", until)
            return set_client_field(text, name, "previous_key", old)

        versions = await self._edit(edit, self._base(body))
        answer = {"name": name, "key": secret, "shown_once": True, "previous_key_until": until}
        return 200, answer | versions

    async def _revoke(self, request: Request, name: str) -> Answer:
        self._known(name)
        body = self._body(request, optional=True)
        versions = await self._edit(lambda text: remove_client(text, name), self._base(body))
        return 200, {"name": name, "revoked": True} | versions
