"""The control plane's config reads and writes (docs/control-plane.md, "Config reads and writes").

=========================  ===================================================================
``GET /config``            the file in force, secrets masked, and its ``version``
``PUT /config``            a whole new file, with the ``base_version`` it was edited from (at
                           most ``listen.control.max_config_bytes``)
``GET /config/history``    the last applied versions, newest last
``PUT /provider-model-spec``  set or clear one ``providers[].model_specs`` entry
``PUT /provider-pause``    pause an upstream for a while, or resume it (``paused: false``)
``PUT /group-selected``    choose a ``select`` group's member
=========================  ===================================================================

Every write goes through `LiveConfig.apply`: the four validation stages, an atomic write of the
file, then the swap. A write that names a ``base_version`` other than the current one is
refused with 409 (``control.config.stale_version``) and changes nothing — the caller reads the
config again and redoes its edit. The small writes change only the lines they must
(`twserve.config.edit`); a pause is not written to the file at all, because it is operational
state that ends by itself, like the pauses the gateway takes on its own, and it carries over
reloads the same way.

``GET /config`` masks secrets as the other views do (`mask_secret`), on each value's own text
however it is written, and leaves out comments that hold a secret (`twserve.config.mask`). A
``PUT /config`` may send a masked value back unchanged: the secret of the same field in the
current file, when it masks to that value, or else the one secret of the file that does, is put
back, written as it was — so reading, editing one line and writing keeps every key. A masked
value that matches no current secret is refused (the file would otherwise hold the mask as a
key).

Reading, masking and editing a config parses YAML, which takes time in proportion to the text
(and the text is the caller's): all of it runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import anyio
from ruamel.yaml.error import YAMLError

from twengine.config import Config
from twproto import json_loads
from twserve.config.check import ConfigRejection
from twserve.config.edit import (
    EditError,
    Verbatim,
    replace_secrets,
    secret_spans,
    set_group_selected,
    set_model_spec,
)
from twserve.config.live import Applied, LiveConfig, StaleVersion
from twserve.config.mask import masked_config
from twserve.control.plane import ControlPlane, ControlRequestError, mask_secret
from twserve.server.base import Request

__all__ = ["MAX_PAUSE_SECS", "ConfigAPI"]

# An operator's pause lasts at most a week; a longer one is a config change (remove the
# upstream from its groups).
MAX_PAUSE_SECS = 7 * 24 * 3600.0
DEFAULT_PAUSE_SECS = 3600.0
_SPEC_FIELDS = ("context_window", "max_output_tokens")
_WILDCARD = frozenset("*?[]")


def _unprintable(text: str) -> str | None:
    """The first control, format or separator character of `text` (``U+2028``), or None: a
    model name is written into the file, where such a character has no business."""
    for char in text:
        if char != " " and unicodedata.category(char)[0] in "CZ":
            return f"U+{ord(char):04X}"
    return None


def _rejected(rejection: ConfigRejection) -> tuple[int, Any]:
    first = rejection.first
    return 422, {
        "error": {
            "code": "control.config.rejected",
            "message": f"the config failed its {rejection.stage_name} stage: {first.message}"
            f" [{first.code}]",
            "stage": rejection.stage_name,
            "problems": [f.to_dict() for f in rejection.findings],
        }
    }


def _stale(err: StaleVersion) -> tuple[int, Any]:
    return 409, {
        "error": {
            "code": "control.config.stale_version",
            "message": f"the config changed since {err.base}; read it again and redo the edit",
            "current_version": err.current,
        }
    }


def _invalid(message: str, code: str = "control.request.invalid") -> ControlRequestError:
    return ControlRequestError(400, code, message)


class ConfigAPI:
    """Config endpoints over one `LiveConfig`; see the module docs."""

    def __init__(self, live: LiveConfig, plane: ControlPlane) -> None:
        self.live = live
        self.plane = plane
        self.live.on_applied.append(self._applied)
        self._routes = {
            ("GET", "/config"): self._get_config,
            ("PUT", "/config"): self._put_config,
            ("GET", "/config/history"): self._history,
            ("PUT", "/provider-model-spec"): self._put_model_spec,
            ("PUT", "/provider-pause"): self._put_pause,
            ("PUT", "/group-selected"): self._put_selected,
        }
        self._paths = {path for _, path in self._routes}

    def _applied(self, applied: Applied) -> None:
        self.plane.generation = applied.generation
        self.plane.safe_mode = ()

    @property
    def config(self) -> Config:
        return self.plane.config

    def status(self) -> dict[str, Any]:
        """What ``GET /status`` adds: the file's version, and in safe mode why."""
        live = self.live
        safe = live.safe
        out: dict[str, Any] = {
            "config": {
                "version": self.config.version,
                "generation": live.generation,
                "config_version": live.version,
                "path": str(live.path),
            },
            "safe_mode": None,
        }
        if safe is not None:
            first = safe.first
            out["safe_mode"] = {
                "code": "control.safe_mode",
                "stage": safe.stage_name,
                "problem_code": first.code,
                "line": first.line,
                "message": first.message,
                "problems": [f.to_dict() for f in safe.findings],
            }
        rejection = live.last_rejection
        out["config"]["last_rejected"] = (
            None
            if rejection is None or safe is not None
            else {
                "stage": rejection.stage_name,
                "code": rejection.first.code,
                "line": rejection.first.line,
            }
        )
        return out

    async def handle(self, request: Request) -> tuple[int, Any] | None:
        if request.path not in self._paths:
            return None
        route = self._routes.get((request.method, request.path))
        if route is None:
            methods = sorted(m for m, p in self._routes if p == request.path)
            raise ControlRequestError(
                405,
                "control.request.method_not_allowed",
                f"{request.path} answers {' or '.join(methods)}, not {request.method}",
            )
        try:
            return await route(request)
        except StaleVersion as err:
            return _stale(err)
        except ConfigRejection as rejection:
            return _rejected(rejection)

    # -- reads ---------------------------------------------------------------------------

    async def _get_config(self, request: Request) -> tuple[int, Any]:
        live = self.live
        masked = await anyio.to_thread.run_sync(
            masked_config, live.text(), mask_secret, self.plane.env
        )
        return 200, {
            "version": live.version,
            "path": str(live.path),
            "yaml": masked,
            "generation": live.generation,
            "safe_mode": live.safe is not None,
        }

    async def _history(self, request: Request) -> tuple[int, Any]:
        entries = self.live.history.entries()
        return 200, {
            "history": [
                {
                    "number": e.number,
                    "version": e.version,
                    "origin": e.origin,
                    "applied_at": e.applied_at,
                    "size": e.size,
                    "current": e.version == self.live.version,
                }
                for e in entries
            ]
        }

    # -- writes --------------------------------------------------------------------------

    @staticmethod
    def _body(request: Request) -> dict[str, Any]:
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
    def _text(body: dict[str, Any], name: str, *, required: bool = True) -> str | None:
        value = body.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value):
            raise _invalid(f"{name} must be a non-empty string")
        return value

    async def _write(self, text: str, base_version: str | None) -> tuple[int, Any]:
        applied = await self.live.apply(
            text.encode("utf-8"), origin="control", write=True, base_version=base_version
        )
        return 200, {"version": applied.version, "generation": applied.generation}

    async def _put_config(self, request: Request) -> tuple[int, Any]:
        body = self._body(request)
        base = self._text(body, "base_version")
        text = self._text(body, "yaml")
        assert base is not None and text is not None
        limit = self.config.listen.control.max_config_bytes
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            # Reading YAML takes time in proportion to its size: a config far larger than any
            # real one is refused before it is read.
            raise ControlRequestError(
                413,
                "control.config.too_large",
                f"the config is {size} bytes; listen.control.max_config_bytes is {limit}",
            )
        if base != self.live.version:
            raise StaleVersion(base, self.live.version)
        restored = await anyio.to_thread.run_sync(self._unmask, text, self.live.text())
        return await self._write(restored, base)

    @staticmethod
    def _unmask(text: str, current: str) -> str:
        """Put back the secrets a ``GET /config`` masked (see the module docs)."""
        by_path: dict[str, str] = {}
        # How the current file writes each secret, to put it back byte for byte.
        written: dict[str, str] = {}
        try:
            for span in secret_spans(current):
                by_path[span.path] = span.value
                source = span.source(current)
                if "\n" not in source and "\r" not in source:
                    written.setdefault(span.value, source)
        except YAMLError:  # the current file does not parse: nothing to put back
            by_path = {}
        by_mask: dict[str, list[str]] = {}
        for secret in dict.fromkeys(by_path.values()):
            masked = mask_secret(secret)
            if masked is not None and masked != secret:
                by_mask.setdefault(masked, []).append(secret)
        unknown: list[str] = []

        def put_back(secret: str) -> str | Verbatim:
            source = written.get(secret)
            return Verbatim(source) if source is not None else secret

        def choose(path: str, value: str) -> str | Verbatim | None:
            if not value.startswith("…"):
                return None
            # The same field masked the same way first; else the one secret with that mask.
            same = by_path.get(path)
            if same is not None and mask_secret(same) == value:
                return put_back(same)
            secrets = by_mask.get(value, [])
            if len(secrets) == 1:
                return put_back(secrets[0])
            unknown.append(path)
            return None

        try:
            restored = replace_secrets(text, choose)
        except YAMLError:  # not YAML: the validation stages say so
            return text
        if unknown:
            raise ControlRequestError(
                422,
                "control.config.rejected",
                "masked secrets that match no current secret at "
                + ", ".join(unknown)
                + "; write the secret itself",
            )
        return restored

    async def _put_model_spec(self, request: Request) -> tuple[int, Any]:
        body = self._body(request)
        provider = body.get("provider")
        model = body.get("model")
        if not isinstance(provider, str) or not provider:
            raise _invalid("provider must name an upstream")
        if not isinstance(model, str) or not model.strip():
            raise _invalid("model must not be blank", "control.model_spec_invalid")
        if model != model.strip():
            raise _invalid("model has surrounding spaces", "control.model_spec_invalid")
        odd = _unprintable(model)
        if odd is not None:
            raise _invalid(
                f"model holds {odd}, a control or separator character",
                "control.model_spec_invalid",
            )
        if _WILDCARD & set(model):
            raise _invalid(
                f"{model!r} is a wildcard; a spec is for one model", "control.model_spec_invalid"
            )
        if not self.config.has_provider(provider) and self.live.safe is None:
            raise ControlRequestError(
                404, "control.provider_unknown", f"no upstream named {provider!r}"
            )
        clear = body.get("clear", False)
        if not isinstance(clear, bool):
            raise _invalid("clear must be true or false")
        spec: dict[str, int] = {}
        for name in _SPEC_FIELDS:
            value = body.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise _invalid(f"{name} must be a whole number", "control.model_spec_invalid")
            if value <= 0:
                raise _invalid(f"{name} must be above zero", "control.model_spec_invalid")
            spec[name] = value
        if clear and spec:
            raise _invalid("clear takes no figures", "control.model_spec_invalid")
        if not clear and not spec:
            raise _invalid(
                "an empty spec: give context_window and/or max_output_tokens, or clear: true",
                "control.model_spec_invalid",
            )
        base = self._text(body, "base_version", required=False)
        current = self.live.version
        try:
            text = await anyio.to_thread.run_sync(
                set_model_spec, self.live.text(), provider, model, None if clear else spec
            )
        except EditError as err:
            raise self._edit_error(err) from None
        except YAMLError:
            raise self._unparsed() from None
        return await self._write(text, base or current)

    async def _put_selected(self, request: Request) -> tuple[int, Any]:
        body = self._body(request)
        group = self._text(body, "group")
        member = self._text(body, "member")
        assert group is not None and member is not None
        if self.live.safe is None:
            if not self.config.has_group(group):
                raise ControlRequestError(404, "control.group_unknown", f"no group named {group!r}")
            if member not in self.config.group(group).provider_names:
                raise _invalid(f"{member!r} is not a member of group {group!r}")
        base = self._text(body, "base_version", required=False)
        current = self.live.version
        try:
            text = await anyio.to_thread.run_sync(
                set_group_selected, self.live.text(), group, member
            )
        except EditError as err:
            raise self._edit_error(err) from None
        except YAMLError:
            raise self._unparsed() from None
        return await self._write(text, base or current)

    @staticmethod
    def _unparsed() -> ControlRequestError:
        # Only in safe mode: the file on disk is what the edit would start from.
        return ControlRequestError(
            422,
            "control.config.rejected",
            "the config file is not valid YAML; write the whole file with PUT /config",
        )

    @staticmethod
    def _edit_error(err: EditError) -> ControlRequestError:
        if err.what == "provider":
            return ControlRequestError(404, "control.provider_unknown", err.message)
        if err.what == "group":
            return ControlRequestError(404, "control.group_unknown", err.message)
        return ControlRequestError(409, "control.config.layout", err.message)

    async def _put_pause(self, request: Request) -> tuple[int, Any]:
        body = self._body(request)
        provider = self._text(body, "provider")
        assert provider is not None
        if not self.config.has_provider(provider):
            raise ControlRequestError(
                404, "control.provider_unknown", f"no upstream named {provider!r}"
            )
        paused = body.get("paused", True)
        if not isinstance(paused, bool):
            raise _invalid("paused must be true or false")
        gateway = self.plane.gateway
        now = gateway.clock()
        health = gateway.router.health
        if paused:
            secs = body.get("secs", DEFAULT_PAUSE_SECS)
            if isinstance(secs, bool) or not isinstance(secs, (int, float)):
                raise _invalid("secs must be a number")
            if not 0 < secs <= MAX_PAUSE_SECS:
                raise _invalid(f"secs must be above 0 and at most {int(MAX_PAUSE_SECS)}")
            changes = health.pause(provider, now, now + float(secs))
        else:
            changes = health.resume(provider, now)
        for change in changes:
            for listener in gateway.hooks.listeners:
                listener(change)
        until = health.paused_until(provider)
        return 200, {
            "provider": provider,
            "paused": health.is_paused(provider, now),
            "pause_left_secs": None if until is None else round(max(0.0, until - now), 3),
        }
