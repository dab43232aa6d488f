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

import datetime as dt
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import anyio.abc

from twengine.config import Config, GroupType, Provider, resolve_template
from twserve.app.door import Door, door
from twserve.app.loop_lag import watch_loop_lag
from twserve.app.maintenance import Maintenance
from twserve.app.transport_limits import transport_limits
from twserve.config.check import ConfigRejection, Finding, locate
from twserve.config.effort_store import load_effort_memory, save_effort_memory
from twserve.config.history import ConfigHistory
from twserve.config.live import LiveConfig
from twserve.control import plane as control
from twserve.control.metrics import Metrics
from twserve.events import EventBus
from twserve.gateway import realtime
from twserve.gateway.answers import transport_error
from twserve.gateway.callers import door_refusal
from twserve.gateway.handler import Gateway
from twserve.observe.logs import ObservationLog
from twserve.observe.notify import Notifier
from twserve.observe.otel_env import traces_wanted
from twserve.server import http2, websocket
from twserve.server.base import BodyBudget, Request, ServerLimits
from twserve.server.listener import Server, listen
from twserve.store.responses import PostgresResponses, ResponseRecords, SqliteResponses
from twserve.store.sqlite import RequestStore, Store
from twserve.upstream.client import UpstreamClient
from twserve.upstream.h1_connection import ReadTurns
from twserve.usage.keeper import UsageKeeper
from twserve.usage.prices import load_price_table

if TYPE_CHECKING:
    from twserve.app.sharing import Sharing
    from twserve.observe.traces import Tracing
    from twserve.store.postgres import StoreBack, StoreLost

__all__ = ["GatewayApp", "open_store"]

log = logging.getLogger("twserve")


@dataclass(slots=True)
class Bound:
    """The ports bound; `gateway_port` is None in safe mode (only the control plane serves)."""

    gateway_port: int | None
    control_port: int | None = None


def _sharing() -> type[Sharing]:
    """The Redis-backed sharing, imported only when a config asks for it: the Redis client is
    the optional ``redis`` extra."""
    try:
        from twserve.app.sharing import Sharing
    except ImportError as exc:  # the extra is not installed
        raise RuntimeError(
            "state.redis_url needs the Redis client: pip install 'twserve[redis]'"
        ) from exc
    return Sharing


def _tracing(config: Config, env: Mapping[str, str], clock: Callable[[], float]) -> Tracing:
    """The OpenTelemetry tracer, imported only when traces are on: the SDK and its OTLP/HTTP
    exporter are the optional ``otel`` extra."""
    try:
        from twserve.observe.traces import Tracing
    except ImportError as exc:  # the extra is not installed
        raise RuntimeError(
            "traces (observability.traces or OTEL_EXPORTER_OTLP_*ENDPOINT) need the "
            "OpenTelemetry SDK: pip install 'twserve[otel]'"
        ) from exc
    return Tracing(config.observability.traces, env, clock=clock)


class GatewayApp:
    # The gateway's bound port (None until it listens: in safe mode, until a config passes).
    gateway_port: int | None
    _serving: anyio.abc.TaskGroup | None

    def __init__(
        self,
        config: Config,
        data_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
        port: int | None = None,
        limits: ServerLimits | None = None,
        ws_limits: websocket.WebSocketLimits | None = None,
        h2_limits: http2.Http2Limits | None = None,
        control_port: int | None = None,
        shutdown_grace: float = 30.0,
        config_path: Path | None = None,
        config_data: bytes | None = None,
        safe_mode: ConfigRejection | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        tz: dt.tzinfo | None = None,
        worker: int | None = None,
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        # One of `serve --workers N`'s processes (twserve/app/workers.py): the gateway's port is
        # shared (SO_REUSEPORT); worker 0 alone serves the control plane and cleans up rows.
        self.worker = worker
        for warning in config.warnings:
            log.warning("config: %s", warning)
        self.env = dict(os.environ) if env is None else env
        self.host = host if host is not None else config.listen.gateway.bind
        self.port = port if port is not None else config.listen.gateway.port
        # The transports' limits: the config's listen.http, listen.http2 and listen.websocket,
        # unless the program gave its own (pinned, as --port pins the port). The Responses
        # WebSocket's idle timeout is the Realtime proxy's too.
        self._pinned_limits = (limits, h2_limits, ws_limits)
        self.limits: ServerLimits
        self.h2_limits: http2.Http2Limits
        self.ws_limits: websocket.WebSocketLimits
        self._take_transport_limits(config)
        self.store = open_store(config, data_dir, self.env)
        self.upstream = UpstreamClient.for_pool(config.pool)
        # Prices from the user's refreshed copy or the shipped table; limits on `tz`'s calendar
        # (the machine's local one when None).
        self.usage = UsageKeeper(config, load_price_table(data_dir), wall=wall, clock=clock, tz=tz)
        self.gateway = Gateway(
            config,
            store=self.store,
            upstream=self.upstream,
            env=self.env,
            clock=clock,
            wall=wall,
            usage=self.usage,
        )
        gw = self.gateway
        # While the loop is behind, upstream reads go one per loop turn (h1_connection.py).
        self.upstream.pool.turns = ReadTurns(lambda: gw.load.due)
        gw.on_efforts_changed = lambda: save_effort_memory(data_dir, gw.reasoning.efforts.memory)
        gw.use_effort_memory(load_effort_memory(data_dir))
        gw.conversations.records = open_responses(config, data_dir, self.env)
        self.events = EventBus(wall=gw.wall, clock=gw.clock)
        store = self.store
        self.metrics = Metrics(
            lambda: gw.router,
            clock=gw.clock,
            wall=gw.wall,
            table=lambda: gw.usage.table,
            set_aside=lambda: store.rejected,
            queued=store.queued,
            keys=lambda: [c.name for c in gw.config.clients if c.limits],
            key_view=self.usage.key_view,
        )
        store.batch_listeners.append(self.metrics.observe_batch)
        self.events.listeners.append(self.metrics.on_event)
        gw.events = self.events
        gw.row_listeners.append(self.metrics.observe_row)
        # Access lines and the operator's events in the log (docs/observability.md).
        self.observation = ObservationLog(lambda: gw.config)
        self.events.listeners.append(self.observation.on_event)
        gw.row_listeners.append(self.observation.on_row)
        # Alerts POSTed to the receivers of notifications[] (docs/observability.md).
        self.notifier = Notifier(lambda: gw.config, self.env, wall=gw.wall)
        self.events.listeners.append(self.notifier.on_event)
        # OpenTelemetry traces: imported and built only when configured (docs/observability.md).
        if traces_wanted(config.observability.traces, self.env):
            gw.hooks.tracing = tracing = _tracing(config, self.env, gw.clock)
            gw.row_listeners.append(tracing.on_row)
        gw.hooks.listeners.append(self.events.health_changed)
        if not isinstance(self.store, RequestStore):
            from twserve.store.postgres import PostgresStore

            assert isinstance(self.store, PostgresStore)
            self.store.listeners.append(self._store_changed)
        self.usage.alert_listeners.append(self.events.key_limit_alert)
        # With state.redis_url: limits, slots, pauses, affinity and the reasoning memories shared
        # with other instances.
        self.sharing: Sharing | None = None
        if config.state is not None and config.state.redis_url is not None:
            self.sharing = _sharing()(
                config.state.redis_url,
                gw.hooks,
                self.usage,
                aborts=gw.aborts,
                reasoning=gw.reasoning,
                on_efforts_changed=lambda: gw.on_efforts_changed(),
                wall=gw.wall,
                clock=gw.clock,
                timeout=config.state.timeout_secs,
                retry_secs=config.state.retry_secs,
            )
            self.sharing.state.listeners.append(self.events.shared_state_changed)
            self.sharing.aborts.on_aborted = self.events.request_aborted
        self.maintenance = Maintenance(self.usage, self.store, lambda: gw.config, pinned_tz=tz)
        self.maintenance.responses = gw.conversations.records
        # One budget for the gateway's request bodies held in memory, whichever protocol they
        # came in on (the control plane has its own).
        self.body_budget = BodyBudget(self.limits.body_budget_bytes)
        self.gateway_server = self._new_gateway_server()
        self.shutdown_grace = shutdown_grace
        # Created on the event loop, in run().
        self._stop: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._stop_requested = False
        self.control_host = config.listen.control.bind
        self.control_port = control_port if control_port is not None else config.listen.control.port
        self.control: control.ControlPlane | None = None
        if config.listen.control.enabled and not worker:
            self.control = control.ControlPlane(
                gw, store=self.store, events=self.events, metrics=self.metrics, env=self.env
            )
            if self.sharing is not None:  # an abort for a request another instance runs
                self.control.aborter.elsewhere = self.sharing.aborts.abort_elsewhere
            self.control.status_parts["notifications"] = self.notifier.status
        self._host_pinned = host is not None
        self._init_live_config(
            config_path,
            config_data,
            safe_mode,
            port_pinned=port is not None,
            control_pinned=control_port is not None,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[Bound] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        if self._stop_requested:
            self._stop.set()
        try:
            # Limits' day/week/month totals come back from the stored rows before serving.
            await self.maintenance.rebuild()
            if self.sharing is not None:
                await self.sharing.connect()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_rows)
                tg.start_soon(self.notifier.run)
                if self.safe_mode is not None:
                    first = self.safe_mode.first
                    self.notifier.safe_mode(True, first.code, first.path)
                if self.sharing is not None:
                    tg.start_soon(self.sharing.run)
                if not self.worker:
                    tg.start_soon(self.maintenance.run)
                tg.start_soon(self._end_pauses)
                tg.start_soon(self._test_connections)
                tg.start_soon(
                    partial(
                        watch_loop_lag,
                        self.gateway.load,
                        lambda: self.config.listen.gateway,
                        turns=self.upstream.pool.turns,
                    )
                )
                try:
                    async with anyio.create_task_group() as serving:
                        self._serving = serving
                        port = None
                        if self.safe_mode is None:
                            port = await serving.start(self._serve)
                        control_port = None
                        if self.control is not None:
                            control_port = await serving.start(self._serve_control)
                        if self.live is not None:
                            serving.start_soon(self.live.watch)
                        task_status.started(Bound(gateway_port=port, control_port=control_port))
                        await self._stop.wait()
                        # Graceful stop: no new requests; streams in flight finish in the grace.
                        log.info("draining requests in flight (up to %.0f s)", self.shutdown_grace)
                        if not await self._drain_gateway(self.shutdown_grace):
                            log.warning("requests still running after the grace period were cut")
                        serving.cancel_scope.cancel()
                finally:
                    # Whatever stopped the server, the writer gets every queued row out first.
                    tg.cancel_scope.cancel()
                    self.store.close()
                    with anyio.CancelScope(shield=True):
                        await self.upstream.aclose()
                        if self.gateway.conversations.records is not None:
                            await self.gateway.conversations.records.close()
                        tracing = self.gateway.hooks.tracing
                        if tracing is not None:  # the spans still queued go out
                            await anyio.to_thread.run_sync(tracing.shutdown)
        finally:
            self.store.close_db()
            self._stopped.set()

    def _store_changed(self, change: StoreLost | StoreBack) -> None:
        from twserve.store.postgres import StoreLost

        if isinstance(change, StoreLost):
            self.events.store_unavailable(
                reason=change.reason, held=change.held, journal=change.journal
            )
        else:
            self.events.store_recovered(rows=change.rows, down_secs=change.down_secs)

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

    def _new_gateway_server(self) -> Server:
        """The gateway's HTTP server: the address checked at accept, the key before the body,
        at most listen.gateway.max_connections open, bodies within the shared budget."""
        limits = self.limits
        listen = self.config.listen.gateway
        if limits.max_connections is None:
            limits = replace(limits, max_connections=listen.max_connections)
        if limits.max_connections_per_address is None:
            limits = replace(limits, max_connections_per_address=listen.per_address_cap)
        # HTTP/2 (h2c) by prior knowledge or Upgrade, and Responses WebSocket upgrades, on the
        # same port as HTTP/1.1.
        return Server(
            self.gateway.handle,
            limits=limits,
            errors=transport_error,
            switches=(
                # Each reads the limits at the switch, so a reload applies to the next.
                lambda request: http2.switch(request, limits=self.h2_limits),
                websocket.switch_for(
                    self.gateway.check_head, lambda: self.ws_limits, key_of=self._key_name
                ),
                realtime.switch_for(self.gateway, lambda: self.ws_limits),
            ),
            check_head=self.gateway.check_head,
            admit=lambda address: self.gateway.callers.addresses.allows(address),
            budget=self.body_budget,
            door=self._door,
        )

    def _door(
        self, sockets: Sequence[socket.socket], accepted: Callable[[], int]
    ) -> AbstractContextManager[Door]:
        """The gateway listener's door (twserve/app/door.py): new clients turned away from a
        thread while the loop is `shed_loop_lag_ms` behind, or they wait that long to be
        accepted."""
        gateway = self.gateway
        return door(
            sockets,
            behind=lambda now, waited: gateway.load.at_door(
                now, self.config.listen.gateway, waited
            ),
            answer=lambda request, refusal: door_refusal(
                gateway.callers, request, refusal, gateway.load, now=gateway.wall()
            ),
            admit=gateway.callers.addresses.allows,
            wakes=lambda now, waited: gateway.load.door_wakes(
                now, self.config.listen.gateway, waited
            ),
            accepted=accepted,
        )

    def _take_transport_limits(self, config: Config) -> None:
        """The transports' limits from `config`, but those the program pinned."""
        found = transport_limits(config.listen)
        http, h2, ws = self._pinned_limits
        self.limits = http or found.http
        self.h2_limits = h2 or found.http2
        self.ws_limits = ws or found.websocket

    def _renew_transport_limits(self, config: Config) -> None:
        """A reload's transport limits, for the connections accepted from now on (those open
        keep theirs). The connection caps stay those the listeners were set up with."""
        self._take_transport_limits(config)
        self.body_budget.limit = self.limits.body_budget_bytes
        server = self.gateway_server
        server.limits = replace(
            self.limits,
            max_connections=server.limits.max_connections,
            max_connections_per_address=server.limits.max_connections_per_address,
        )
        control = self._control_server
        if control is not None:
            control.limits = replace(
                self.limits,
                max_connections=control.limits.max_connections,
                max_connections_per_address=None,
                max_body_bytes=control.limits.max_body_bytes,
                body_budget_bytes=control.limits.body_budget_bytes,
            )

    def _key_name(self, request: Request) -> str | None:
        """The name of the gateway key `request` presents (None: none the config lists)."""
        return self.gateway.callers.check(request, now=self.gateway.wall())[1]

    def _new_control_server(self) -> Server:
        """The control plane's HTTP server: the control key checked before the body, its own
        connection cap, body cap and body budget (listen.control.max_connections,
        max_body_bytes), so that it can neither hold up the gateway's clients nor be held up
        by them."""
        assert self.control is not None
        listen = self.config.listen.control
        limits = replace(
            self.limits,
            max_connections=listen.max_connections,
            max_connections_per_address=None,
            max_body_bytes=listen.max_body_bytes,
            body_budget_bytes=listen.body_budget_bytes,
        )
        return Server(
            self.control.handle,
            limits=limits,
            errors=control.transport_error,
            check_head=self.control.check_head,
        )

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        # listen: a bind that fails is one ListenError line (gw.listen.*), no traceback.
        listener = await listen(self.host, self.port, reuse_port=self.worker is not None)
        bound = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        self.gateway_port = bound
        task_status.started(bound)
        await self._serve_on(self.gateway_server, listener)

    async def _serve_control(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        assert self.control is not None and self._control_server is not None
        listener = await listen(self.control_host, self.control_port)
        task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
        await self._serve_on(self._control_server, listener)

    # -- live config: reload, listener rebind, safe mode (docs/operations.md) ----------------

    def _init_live_config(
        self,
        path: Path | None,
        data: bytes | None,
        safe: ConfigRejection | None,
        *,
        port_pinned: bool,
        control_pinned: bool,
    ) -> None:
        """Set up the config watcher when the app was given its file. In safe mode the gateway
        listener waits for a config that passes; the control plane serves meanwhile."""
        self.safe_mode = safe
        self.gateway_port = None
        self._port_pinned = port_pinned
        self._control_pinned = control_pinned
        self._serving = None
        self._retiring: set[Server] = set()
        self._control_server = self._new_control_server() if self.control is not None else None
        self.live: LiveConfig | None = None
        if path is None:
            return
        if data is None:
            data = path.read_bytes()
        self.live = LiveConfig(
            path,
            history=ConfigHistory(self.data_dir),
            events=self.events,
            stage=self._stage_config,
            data=data,
            env=self.env,
            safe=safe,
        )
        if safe is None:
            try:
                self.live.history.record(data, "file")
            except OSError as exc:
                log.warning("could not record the config history: %s", exc)
        if self.control is not None:
            from twserve.console.api import ConsoleAPI

            self.control.config_api = ConsoleAPI(self.live, self.control)

    def reload_config(self) -> None:
        """Read the config file again now (what ``SIGHUP`` does)."""
        if self.live is not None:
            self.live.reload_now()

    async def _stage_config(self, config: Config, text: str) -> _StagedConfig:
        """Stage 4's last part: bind the new addresses when `listen` moved a listener (or the
        gateway's when safe mode ends). A port that cannot be bound refuses the config; the
        old listeners stay."""
        staged = _StagedConfig(self, config)
        gw = config.listen.gateway
        host = self.host if self._host_pinned else gw.bind
        port = self.port if self._port_pinned else gw.port
        if self.safe_mode is not None or (host, port) != (self.host, self.port):
            staged.gateway = (await self._bind(host, port, text, "gateway"), host, port)
        ctl = config.listen.control
        if (
            self.control is not None
            and ctl.enabled
            and not self._control_pinned
            and (ctl.bind, ctl.port) != (self.control_host, self.control_port)
        ):
            try:
                staged.control = (
                    await self._bind(ctl.bind, ctl.port, text, "control"),
                    ctl.bind,
                    ctl.port,
                )
            except ConfigRejection:
                staged.discard()
                raise
        return staged

    async def _bind(
        self, host: str, port: int, text: str, which: str
    ) -> anyio.abc.Listener[anyio.abc.SocketStream]:
        try:
            return await anyio.create_tcp_listener(
                local_host=host, local_port=port, reuse_port=False
            )
        except OSError as exc:
            path = f"listen.{which}.port"
            # Locating the field reads the YAML again: off the event loop, like every parse.
            line, excerpt = await anyio.to_thread.run_sync(locate, text, path)
            raise ConfigRejection(
                [
                    Finding(
                        stage="runtime",
                        code="config.listen_unavailable",
                        path=path,
                        line=line,
                        message=f"cannot listen on {host}:{port} ({which}): {exc.strerror or exc}",
                        excerpt=excerpt,
                    )
                ]
            ) from None

    def _commit_config(self, staged: _StagedConfig) -> None:
        config = staged.config
        redis_url = config.state.redis_url if config.state is not None else None
        running = self.sharing.state.redis_url if self.sharing is not None else None
        if redis_url != running:
            log.warning("state.redis_url changed: it takes effect when twserve restarts")
        if self.sharing is not None and config.state is not None:
            # A call's time bound and the retry interval apply from the next call on.
            self.sharing.state.timeout = config.state.timeout_secs
            self.sharing.state.retry_secs = config.state.retry_secs
        if _dsn(config) != _dsn(self.config) and self.safe_mode is None:
            log.warning("store.postgres_dsn changed: the request store changes at the next start")
        tested = _url_test_members(self.config) if self.safe_mode is None else set()
        self.config = config
        self.gateway.apply_config(config)
        self.upstream.apply_pool(config.pool)
        self._renew_transport_limits(config)
        if self._serving is not None:
            # Members a reload adds to url-test groups get their startup connection timing too.
            for name in sorted(_url_test_members(config) - tested):
                self._serving.start_soon(self._test_connection, config.provider(name))
        if self.control is not None:
            self.control.safe_mode = ()
        if self.safe_mode is not None:
            self.notifier.safe_mode(False)
        if staged.gateway is not None:
            self._switch_gateway_listener(*staged.gateway)
        if staged.control is not None:
            self._switch_control_listener(*staged.control)
        self.safe_mode = None

    def _switch_gateway_listener(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], host: str, port: int
    ) -> None:
        """Serve the gateway on `listener` from now on; the previous listener stops accepting
        and its connections finish what they are doing (streams are not cut)."""
        assert self._serving is not None
        old = self.gateway_server if self.gateway_port is not None else None
        self.gateway_server = self._new_gateway_server()
        self.host, self.port = host, port
        self.gateway_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        self._serving.start_soon(self._serve_on, self.gateway_server, listener)
        if old is not None:
            self._retire(old)
        log.info("gateway listening on %s:%s", host, self.gateway_port)

    def _switch_control_listener(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], host: str, port: int
    ) -> None:
        assert self._serving is not None and self.control is not None
        old = self._control_server
        self._control_server = self._new_control_server()
        self.control_host, self.control_port = host, port
        self._serving.start_soon(self._serve_on, self._control_server, listener)
        if old is not None:
            self._retire(old)
        log.info("control plane listening on %s:%s", host, port)

    async def _serve_on(
        self, server: Server, listener: anyio.abc.Listener[anyio.abc.SocketStream]
    ) -> None:
        async with listener:
            await server.serve_listener(listener)

    def _retire(self, server: Server) -> None:
        """Stop `server` accepting; its connections get the shutdown grace to finish."""
        assert self._serving is not None
        self._retiring.add(server)

        async def drain() -> None:
            try:
                await server.drain(self.shutdown_grace)
            finally:
                self._retiring.discard(server)

        self._serving.start_soon(drain)

    async def _drain_gateway(self, grace: float) -> bool:
        """Drain the current gateway listener and any listener still retiring after a rebind."""
        results: list[bool] = []

        async def one(server: Server) -> None:
            results.append(await server.drain(grace))

        async with anyio.create_task_group() as tg:
            for server in {self.gateway_server, *self._retiring}:
                tg.start_soon(one, server)
        return all(results)


def open_store(config: Config, data_dir: Path, env: Mapping[str, str]) -> Store:
    """The request store `config` asks for: PostgreSQL with ``store.postgres_dsn``, else the
    SQLite file in the data directory."""
    dsn = config.store.postgres_dsn if config.store is not None else None
    if not dsn:
        return RequestStore(data_dir / "requests.sqlite3")
    try:
        from twserve.store.postgres import JOURNAL_FILE, PostgresStore
    except ImportError as exc:  # the optional dependency is missing
        raise RuntimeError(
            f"store.postgres_dsn needs psycopg ({exc}): pip install 'twserve[postgres]'"
        ) from None
    # Checked when the config was loaded; a variable unset since then fails here, loudly.
    return PostgresStore(resolve_template(dsn, env), journal=data_dir / JOURNAL_FILE)


def open_responses(config: Config, data_dir: Path, env: Mapping[str, str]) -> ResponseRecords:
    """Where stored Responses conversations are kept: next to the request store's rows."""
    dsn = _dsn(config)
    if not dsn:
        return SqliteResponses(data_dir / "requests.sqlite3")
    return PostgresResponses(resolve_template(dsn, env))


def _dsn(config: Config) -> str | None:
    return config.store.postgres_dsn if config.store is not None else None


def _url_test_members(config: Config) -> set[str]:
    return {
        member.provider
        for group in config.groups
        if group.type is GroupType.URL_TEST
        for member in group.members
    }


# A listener bound for a staged config, with the host and port it was asked for.
_BoundListener = tuple[anyio.abc.Listener[anyio.abc.SocketStream], str, int]


class _StagedConfig:
    """A config that passed every stage, with the listeners it needs already bound."""

    def __init__(self, app: GatewayApp, config: Config) -> None:
        self.app = app
        self.config = config
        self.gateway: _BoundListener | None = None
        self.control: _BoundListener | None = None

    def commit(self) -> None:
        self.app._commit_config(self)

    def discard(self) -> None:
        for bound in (self.gateway, self.control):
            if bound is not None and self.app._serving is not None:
                self.app._serving.start_soon(bound[0].aclose)
        self.gateway = self.control = None
