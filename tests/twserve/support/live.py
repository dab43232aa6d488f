"""A gateway started the way ``twserve serve`` starts it — from a real config file, watching it —
with mock upstreams on loopback, for the live-config tests.

The app, the mocks and the watcher run on an anyio loop in a background thread (a blocking
portal); the test thread edits the file, talks to the control plane over real sockets and reads
what the app published.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpcore
from anyio.from_thread import BlockingPortal, start_blocking_portal

from twmock.script import MockSettings
from twmock.serve.handler import MockHandler, make_handler
from twserve.app.wiring import GatewayApp
from twserve.cli.main import _serving_app
from twserve.events import Event
from twserve.server import listener

KEY = "live-test-gateway-key-0123456789"
CONTROL_KEY = "live-test-control-key-0123456789"
UPSTREAM_KEY = "live-test-upstream-key-abcdefgh"
TIMEOUT = {"timeout": {"connect": 5.0, "read": 20.0, "write": 5.0, "pool": 20.0}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Live:
    portal: BlockingPortal
    app: GatewayApp
    path: Path
    data_dir: Path
    control_port: int
    mock_ports: dict[str, int]
    mocks: dict[str, MockHandler]
    events: list[Event] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.app.gateway_port is not None, "the gateway is not listening (safe mode)"
        return f"http://127.0.0.1:{self.app.gateway_port}"

    def control(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        content = b"" if body is None else json.dumps(body).encode()
        resp = httpcore.request(
            method,
            f"http://127.0.0.1:{self.control_port}{path}",
            headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
            content=content,
            extensions=TIMEOUT,
        )
        return resp.status, json.loads(resp.content)

    def write(self, text: str) -> None:
        """Replace the file as an editor does: a new file renamed over the old one."""
        tmp = self.path.with_name(self.path.name + ".edit")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.path)

    def events_of(self, name: str) -> list[Any]:
        return [e for e in list(self.events) if type(e).__name__ == name]


def wait_for(check: Callable[[], Any], timeout: float = 20.0, step: float = 0.02) -> float:
    """Poll `check` until it is truthy; the seconds it took. Fails the test on timeout."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true within {timeout} s: {check}")
        time.sleep(step)


def provider_yaml(name: str, port: int, *, models: str = "[m]", comment: str = "") -> str:
    tail = f"  # {comment}" if comment else ""
    return (
        f"  - name: {name}{tail}\n"
        f"    protocol: openai-chat\n"
        f"    base_url: http://127.0.0.1:{port}/v1\n"
        f"    key: {UPSTREAM_KEY}-{name}\n"
        f"    models: {models}\n"
    )


def config_yaml(
    ports: Mapping[str, int],
    control_port: int,
    *,
    providers: tuple[str, ...] = ("a",),
    weights: Mapping[str, int] | None = None,
    gateway_port: int = 8788,
    extra: str = "",
) -> str:
    """A config as a person writes it: comments, blank lines, flow lists."""
    text = (
        "# live config test — comments must survive every write\n"
        "version: 1\n\n"
        "listen:\n"
        "  gateway:\n"
        "    bind: 127.0.0.1\n"
        f"    port: {gateway_port}   # the gateway's port\n"
        "  control:\n"
        "    bind: 127.0.0.1\n"
        f"    port: {control_port}\n"
        f"    key: {CONTROL_KEY}\n\n"
        "clients:\n"
        f"  - name: tester\n    key: {KEY}\n\n"
        "# upstreams, in order\n"
        "providers:\n"
    )
    for name in providers:
        text += provider_yaml(name, ports[name], comment=f"upstream {name}")
    if weights:
        text += "\ngroups:\n  - name: pool\n    type: load-balance\n    providers:\n"
        for name, weight in weights.items():
            text += f"      - {{name: {name}, weight: {weight}}}\n"
        text += "\nroutes:\n  - name: main\n    rules:\n      - {name: all, to: pool}\n"
        text += "default_route: main\n"
    return text + extra


@contextmanager
def live_gateway(
    tmp_path: Path,
    upstreams: Mapping[str, MockSettings],
    text: Callable[[Mapping[str, int], int], str],
    *,
    safe: bool = False,
) -> Iterator[Live]:
    """Mocks for `upstreams`, then the config file `text(mock_ports, control_port)`, then the
    app as ``twserve serve --port 0`` builds it (safe mode included)."""
    data_dir = tmp_path / "home"
    data_dir.mkdir(mode=0o700, exist_ok=True)
    path = tmp_path / "config.yaml"
    control_port = free_port()
    with start_blocking_portal() as portal:
        futures = []
        mocks: dict[str, MockHandler] = {}
        ports: dict[str, int] = {}
        for name, settings in upstreams.items():
            handler = make_handler(settings)
            fut, port = portal.start_task(
                partial(listener.serve, handler, host="127.0.0.1", port=0)
            )
            futures.append(fut)
            mocks[name], ports[name] = handler, port
        path.write_text(text(ports, control_port), encoding="utf-8")
        app = _serving_app(path, data_dir, port=0, safe=safe)
        assert app is not None
        live = Live(
            portal=portal,
            app=app,
            path=path,
            data_dir=data_dir,
            control_port=control_port,
            mock_ports=ports,
            mocks=mocks,
        )
        app.events.listeners.append(live.events.append)
        app_future, _ = portal.start_task(app.run)
        try:
            yield live
        finally:
            app_future.cancel()
            for fut in futures:
                fut.cancel()
