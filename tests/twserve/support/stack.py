"""A running gateway with mock upstreams on loopback, for tests that drive it with real clients.

The gateway and the mocks run on an anyio event loop in a background thread (a blocking portal),
so synchronous SDK clients in the test thread talk to them over real sockets.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from twengine.config import build_config
from twmock.script import MockSettings
from twmock.serve.handler import MockHandler, make_handler
from twmock.serve.server import mock_switches
from twserve.app import process
from twserve.app.wiring import GatewayApp
from twserve.server import base, http2, listener
from twserve.server.base import Handler
from twserve.server.websocket import WebSocketLimits

KEY = "test-key"
CONTROL_KEY = "control-key-for-tests-0123456789"

_BASE_PATH = {
    "anthropic": "",
    "openai-chat": "/v1",
    "openai-responses": "/v1",
    "gemini": "",
    "bedrock-anthropic": "",
    "bedrock-converse": "",
    "vertex-gemini": "",
    "vertex-anthropic": "",
    "azure-openai": "",
}


@dataclass
class Upstream:
    protocol: str
    settings: MockSettings = field(default_factory=MockSettings)
    models: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Stands in front of the mock (to record or change what it sends); the mock is still
    # `Stack.mock(name)`.
    wrap: Callable[[Handler], Handler] | None = None
    # Further providers at this mock's base URL: name → their own fields (``http2`` …).
    twins: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Stack:
    portal: BlockingPortal
    app: GatewayApp
    port: int
    mocks: dict[str, tuple[MockHandler, int]]
    data_dir: Path
    control_port: int | None = None

    @property
    def control_url(self) -> str:
        assert self.control_port is not None, "start the stack with control=True"
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mock(self, name: str) -> MockHandler:
        return self.mocks[name][0]

    def wait_rows(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The stored rows, oldest first, once at least `count` are written."""
        deadline = time.monotonic() + timeout
        while self.app.store.written < count and time.monotonic() < deadline:
            time.sleep(0.02)
        with closing(sqlite3.connect(self.data_dir / "requests.sqlite3")) as db:
            db.row_factory = sqlite3.Row
            rows = [dict(r) for r in db.execute("SELECT * FROM requests ORDER BY ts")]
        return rows


@contextmanager
def running_stack(
    data_dir: Path,
    upstreams: Mapping[str, Upstream],
    *,
    config: Mapping[str, Any] | None = None,
    limits: base.ServerLimits | None = None,
    ws_limits: WebSocketLimits | None = None,
    h2_limits: http2.Http2Limits | None = None,
    control: bool = False,
    wall: Callable[[], float] | None = None,
    tz: dt.tzinfo | None = None,
    env: Mapping[str, str] | None = None,
    uvloop: bool = False,
) -> Iterator[Stack]:
    """A gateway over mocks. `wall` stands in for the wall clock (limits, rows), `tz` for the
    local time zone of calendar limits; `uvloop` runs it on uvloop, as ``twserve serve`` does
    (asyncio's own loop otherwise)."""
    with start_blocking_portal(
        backend_options=process.backend_options() if uvloop else None
    ) as portal:
        futures = []
        mocks: dict[str, tuple[MockHandler, int]] = {}
        providers = []
        for name, up in upstreams.items():
            mock = make_handler(up.settings)
            handler: Handler = mock if up.wrap is None else up.wrap(mock)
            # The mocks speak h2c too, for upstreams configured with ``http2: true``, and take
            # Realtime and Responses sockets (twmock.serve.realtime, .responses_socket).
            server = listener.Server(handler, switches=mock_switches(mock))
            fut, port = portal.start_task(
                partial(listener.serve, handler, host="127.0.0.1", port=0, server=server)
            )
            futures.append(fut)
            mocks[name] = (mock, port)
            twins: list[dict[str, Any]] = []
            entry: dict[str, Any] = {
                "name": name,
                "protocol": up.protocol,
                "base_url": f"http://127.0.0.1:{port}{_BASE_PATH[up.protocol]}",
                "key": f"upstream-key-{name}",
            }
            for twin, fields in up.twins.items():
                twins.append({**entry, "name": twin, "key": f"upstream-key-{twin}", **fields})
            if up.models is not None:
                entry["models"] = up.models
            entry.update(up.extra)
            providers.append(entry)
            providers += twins
        data: dict[str, Any] = {
            "version": 1,
            "listen": {"gateway": {"bind": "127.0.0.1"}}
            | ({"control": {"bind": "127.0.0.1", "key": CONTROL_KEY}} if control else {}),
            "clients": [{"name": "tester", "key": KEY}],
            "providers": providers,
        }
        data.update(config or {})
        app = GatewayApp(
            build_config(data, env or {}),
            data_dir,
            env=dict(env or {}),
            port=0,
            limits=limits,
            ws_limits=ws_limits,
            h2_limits=h2_limits,
            control_port=0 if control else None,
            **({"wall": wall} if wall is not None else {}),
            tz=tz,
        )
        app_future, bound = portal.start_task(app.run)
        try:
            yield Stack(
                portal=portal,
                app=app,
                port=bound.gateway_port,
                mocks=mocks,
                data_dir=data_dir,
                control_port=bound.control_port,
            )
        finally:
            app_future.cancel()
            for fut in futures:
                fut.cancel()
