"""The console's endpoints on the control listener, in front of the config endpoints.

`ConsoleAPI` is what the control plane asks first for a path it has no view of its own for
(`ControlPlane.config_api`): the key writes (`twserve.console.keys_api`), the config check,
history entry and rollback (`twserve.console.config_tools`), then everything else
goes on to `twserve.control.config_api.ConfigAPI`. A refused or stale write answers as the
config writes do (422 with the problems, 409 with the current version).
"""

from __future__ import annotations

from typing import Any

from twserve.config.check import ConfigRejection
from twserve.config.live import LiveConfig, StaleVersion
from twserve.console.config_tools import ConfigTools
from twserve.console.keys_api import KeysAPI
from twserve.control.config_api import ConfigAPI, _rejected, _stale
from twserve.control.plane import ControlPlane
from twserve.server.base import Request

__all__ = ["ConsoleAPI"]


class ConsoleAPI:
    """The console's writes, then the config endpoints (`ConfigEndpoints`)."""

    def __init__(self, live: LiveConfig, plane: ControlPlane) -> None:
        self.config_api = ConfigAPI(live, plane)
        self.keys = KeysAPI(live, plane)
        self.tools = ConfigTools(live, plane)

    def status(self) -> dict[str, Any]:
        return self.config_api.status()

    async def handle(self, request: Request) -> tuple[int, Any] | None:
        route = self.keys.route(request) or self.tools.route(request)
        if route is None:
            return await self.config_api.handle(request)
        try:
            return await route()
        except StaleVersion as err:
            return _stale(err)
        except ConfigRejection as rejection:
            return _rejected(rejection)
