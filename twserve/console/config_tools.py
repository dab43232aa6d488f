"""The console's config tools on the control listener: check a file without applying it, read
one history entry, roll back to one (docs/console.md, "Config").

=============================  ================================================================
``POST /config/check``         ``{"yaml"}``: the four validation stages, nothing applied; the
                               answer says ``ok`` or lists each problem's code, line and message
``GET /config/history/{n}``    entry ``n``'s file, secrets masked (for the page's diff)
``POST /config/rollback``      ``{"number", "base_version"}``: entry ``n``'s exact bytes applied
                               as any control write is (stages, version check, history, event)
=============================  ================================================================

A check reads the text as ``PUT /config`` does — masked secrets put back from the current file
— so what it says is what the save would do. YAML is read in a worker thread, never on the
event loop; a text over ``listen.control.max_config_bytes`` is refused before it is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from twserve.config.check import ConfigRejection
from twserve.config.live import LiveConfig, check_bytes
from twserve.config.mask import masked_config
from twserve.control.config_api import ConfigAPI
from twserve.control.plane import ControlPlane, ControlRequestError, mask_secret
from twserve.server.base import Request

__all__ = ["ConfigTools"]

Answer = tuple[int, Any]
_HISTORY = "/config/history/"


def _invalid(message: str) -> ControlRequestError:
    return ControlRequestError(400, "control.request.invalid", message)


class ConfigTools:
    """``/config/check``, ``/config/history/{n}`` and ``/config/rollback`` over one
    `LiveConfig` (see the module docs)."""

    def __init__(self, live: LiveConfig, plane: ControlPlane) -> None:
        self.live = live
        self.plane = plane

    def route(self, request: Request) -> Callable[[], Awaitable[Answer]] | None:
        """The handler for `request`, or None when its path is not one of these."""
        path, method = request.path, request.method
        wanted = {"/config/check": "POST", "/config/rollback": "POST"}.get(path)
        if wanted is None and path.startswith(_HISTORY):
            wanted = "GET"
        if wanted is None:
            return None
        if method != wanted:
            raise ControlRequestError(
                405,
                "control.request.method_not_allowed",
                f"{path} answers {wanted}, not {method}",
            )
        if path == "/config/check":
            return lambda: self._check(request)
        if path == "/config/rollback":
            return lambda: self._rollback(request)
        return lambda: self._entry(path[len(_HISTORY) :])

    def _number(self, value: Any) -> int:
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _invalid("number must be a history entry's number (1 and up)")
        return value

    def _read(self, number: int) -> bytes:
        try:
            _, data = self.live.history.read(number)
        except KeyError:
            raise ControlRequestError(
                404,
                "control.request.not_found",
                f"no config history entry {number} (see GET /config/history)",
            ) from None
        return data

    async def _entry(self, raw: str) -> Answer:
        number = self._number(raw)
        data = await anyio.to_thread.run_sync(self._read, number)
        text = data.decode("utf-8", errors="replace")
        masked = await anyio.to_thread.run_sync(masked_config, text, mask_secret, self.plane.env)
        return 200, {"number": number, "yaml": masked, "current": text == self.live.text()}

    async def _check(self, request: Request) -> Answer:
        body = ConfigAPI._body(request)
        text = body.get("yaml")
        if not isinstance(text, str):
            raise _invalid("yaml must be the config's text")
        limit = self.plane.config.listen.control.max_config_bytes
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise ControlRequestError(
                413,
                "control.config.too_large",
                f"the config is {size} bytes; listen.control.max_config_bytes is {limit}",
            )
        restored = await anyio.to_thread.run_sync(ConfigAPI._unmask, text, self.live.text())
        try:
            await anyio.to_thread.run_sync(
                check_bytes, restored.encode("utf-8", "surrogatepass"), self.plane.env
            )
        except ConfigRejection as rejection:
            return 200, {
                "ok": False,
                "stage": rejection.stage_name,
                "problems": [f.to_dict() for f in rejection.findings],
            }
        return 200, {"ok": True, "stage": None, "problems": []}

    async def _rollback(self, request: Request) -> Answer:
        body = ConfigAPI._body(request)
        number = self._number(body.get("number"))
        base = body.get("base_version")
        if base is not None and not isinstance(base, str):
            raise _invalid("base_version must be GET /config's version")
        data = await anyio.to_thread.run_sync(self._read, number)
        applied = await self.live.apply(data, origin="control", write=True, base_version=base)
        return 200, {
            "number": number,
            "version": applied.version,
            "generation": applied.generation,
        }
