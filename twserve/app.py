"""Wiring: the request store, the upstream pool, the gateway's listener and, when
``listen.control`` is on, the control plane's listener, started together.

`GatewayApp.run` is one anyio task. It reports the bound port through ``task_status`` (so tests
and the demo can bind port 0), serves until cancelled, and on the way out stops the listener,
lets the store writer drain every queued row, and closes the upstream pool.

The event bus and the metrics always exist (they cost a few counter updates per request); the
gateway publishes to the bus and hands each stored row to the metrics, and the engine's health
changes go to the bus. The control listener only serves them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.abc

from twengine.config import Config
from twengine.config.model import GroupType, Provider
from twserve import control, http1
from twserve.events import EventBus
from twserve.gateway import Gateway, transport_error
from twserve.metrics import Metrics
from twserve.store import RequestStore
from twserve.upstream import UpstreamClient

__all__ = ["GatewayApp"]

log = logging.getLogger("twserve")


@dataclass(slots=True)
class Bound:
    gateway_port: int
    control_port: int | None = None


class GatewayApp:
    def __init__(
        self,
        config: Config,
        data_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
        port: int | None = None,
        limits: http1.ServerLimits | None = None,
        control_port: int | None = None,
        shutdown_grace: float = 30.0,
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self.env = dict(os.environ) if env is None else env
        self.host = host if host is not None else config.listen.gateway.bind
        self.port = port if port is not None else config.listen.gateway.port
        self.limits = limits
        self.store = RequestStore(data_dir / "requests.sqlite3")
        self.upstream = UpstreamClient()
        self.gateway = Gateway(config, store=self.store, upstream=self.upstream, env=self.env)
        gw = self.gateway
        self.events = EventBus(wall=gw.wall, clock=gw.clock)
        self.metrics = Metrics(lambda: gw.router, clock=gw.clock)
        self.events.listeners.append(self.metrics.on_event)
        gw.events = self.events
        gw.row_listeners.append(self.metrics.observe_row)
        gw.hooks.listeners.append(self.events.health_changed)
        self.gateway_server = http1.Server(
            self.gateway.handle, limits=limits, errors=transport_error
        )
        self.shutdown_grace = shutdown_grace
        # Created on the event loop, in run().
        self._stop: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._stop_requested = False
        self.control_host = config.listen.control.bind
        self.control_port = control_port if control_port is not None else config.listen.control.port
        self.control: control.ControlPlane | None = None
        if config.listen.control.enabled:
            self.control = control.ControlPlane(
                gw, store=self.store, events=self.events, metrics=self.metrics, env=self.env
            )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[Bound] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        if self._stop_requested:
            self._stop.set()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_rows)
                tg.start_soon(self._end_pauses)
                tg.start_soon(self._test_connections)
                try:
                    async with anyio.create_task_group() as serving:
                        port = await serving.start(self._serve)
                        control_port = None
                        if self.control is not None:
                            control_port = await serving.start(self._serve_control)
                        task_status.started(Bound(gateway_port=port, control_port=control_port))
                        await self._stop.wait()
                        # Graceful stop: no new requests; streams in flight finish in the grace.
                        log.info("draining requests in flight (up to %.0f s)", self.shutdown_grace)
                        if not await self.gateway_server.drain(self.shutdown_grace):
                            log.warning("requests still running after the grace period were cut")
                        serving.cancel_scope.cancel()
                finally:
                    # Whatever stopped the server, the writer gets every queued row out first.
                    tg.cancel_scope.cancel()
                    self.store.close()
                    with anyio.CancelScope(shield=True):
                        await self.upstream.aclose()
        finally:
            self.store.close_db()
            self._stopped.set()

    async def _test_connections(self) -> None:
        """Time a connection to each member of a url-test group once at startup: the group ranks
        by it until an upstream has first-content samples of its own (docs/balancing.md, "Balance
        factors")."""
        names = {
            member.provider
            for group in self.config.groups
            if group.type is GroupType.URL_TEST
            for member in group.members
        }
        async with anyio.create_task_group() as tg:
            for name in sorted(names):
                tg.start_soon(self._test_connection, self.config.provider(name))

    async def _test_connection(self, provider: Provider) -> None:
        url = urlsplit(provider.base_url)
        tls = url.scheme == "https"
        port = url.port or (443 if tls else 80)
        started = self.gateway.clock()
        try:
            with anyio.fail_after(provider.connect_timeout_secs):
                host = url.hostname or ""
                if tls:
                    await (await anyio.connect_tcp(host, port, tls=True)).aclose()
                else:
                    await (await anyio.connect_tcp(host, port)).aclose()
        except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:
            log.info("connection test to %s failed: %s", provider.name, exc)
            return
        self.gateway.router.record_connection_test(provider.name, self.gateway.clock() - started)

    async def _end_pauses(self) -> None:
        """Wake when the earliest upstream pause runs out, so its end is published."""
        while True:
            deadline = self.gateway.hooks.tick()
            delay = 1.0 if deadline is None else deadline - self.gateway.clock()
            await anyio.sleep(min(max(delay, 0.01), 1.0))

    async def _write_rows(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.store.run()

    def request_stop(self) -> None:
        """Begin a graceful stop (what SIGTERM and the first Ctrl-C do)."""
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    async def wait_stopped(self) -> None:
        """Return once `run` has finished (after a stop or a cancel)."""
        while self._stopped is None:
            await anyio.sleep(0.01)
        await self._stopped.wait()

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        await http1.serve(
            self.gateway.handle,
            host=self.host,
            port=self.port,
            server=self.gateway_server,
            task_status=task_status,
        )

    async def _serve_control(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        assert self.control is not None
        await http1.serve(
            self.control.handle,
            host=self.control_host,
            port=self.control_port,
            limits=self.limits,
            errors=control.transport_error,
            task_status=task_status,
        )
