"""Notifications to a receiver on loopback: signed POSTs for the operator's events, once per
crossing; a receiver that refuses connections (retried, then dropped and counted) or that is
slow (past the timeout) leaves the requests' latency alone; a full queue drops and counts."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.twserve.conftest import KEY, http
from tests.twserve.support.live import config_yaml, live_gateway
from tests.twserve.support.ports import refusing_port
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twengine.config import Config, build_config
from twmock.script import MockSettings, parse_script
from twserve.events import ConfigProblem, ConfigRejected, HealthChanged, KeyLimitAlert
from twserve.observe.notify import Notifier, routes_down, sign

SECRET = "receiver-secret-0123456789"
ENV = {"HOOK_SECRET": SECRET}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP receiver in a thread: records each POST; `delay` sleeps before answering,
    `status` is the answer's status."""

    server: ThreadingHTTPServer
    got: list[Received] = field(default_factory=list)
    delay: float = 0.0
    status: int = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.got)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            me = holder[0]
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            me.got.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
            if me.delay:
                time.sleep(me.delay)
            self.send_response(me.status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


def verified(got: Received, secret: str = SECRET, now: float | None = None) -> Any:
    """The body, once its signature checks out as docs/observability.md describes."""
    stamp = got.headers["x-twserve-timestamp"]
    want = "v1=" + _hmac_hex(secret, stamp, got.body)
    assert hmac.compare_digest(got.headers["x-twserve-signature"], want)
    assert abs((now or time.time()) - int(stamp)) < 300
    return got.json()


def _hmac_hex(secret: str, stamp: str, body: bytes) -> str:
    return hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def notification(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "ops",
        "url": url,
        "secret": "${HOOK_SECRET}",
        "events": [
            "key_limit_80",
            "key_limit_100",
            "upstream_paused",
            "route_down",
            "config_refused",
            "safe_mode",
        ],
        "backoff_secs": 0.05,
        **fields,
    }


def chat(stack: Stack, model: str = "m") -> Any:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return http(
        stack.url + "/v1/chat/completions",
        body=body.encode(),
        headers=(("authorization", f"Bearer {KEY}"), ("content-type", "application/json")),
    )


def failing_stack(tmp_path: Path, hooks: list[dict[str, Any]], **config: Any) -> Any:
    """A gateway whose one upstream fails every answer: its first failure pauses it, so its
    route (the default one) has no upstream left."""
    upstreams = {
        "bad": Upstream(
            "openai-chat", MockSettings(script=parse_script({"error": 500})), models=["m"]
        )
    }
    data = {
        "failover": {"failures_to_pause": 1, "pause_secs": 60, "wait_secs": 0},
        "notifications": hooks,
        **config,
    }
    return running_stack(tmp_path, upstreams, config=data, control=True, env=ENV)


def test_a_paused_upstream_and_its_route_reach_the_receiver_signed(
    tmp_path: Path, receiver: Receiver
) -> None:
    with failing_stack(tmp_path, [notification(receiver.url)]) as stack:
        assert chat(stack).status >= 500
        got = receiver.wait(2)
        assert chat(stack).status >= 500  # already paused: no second alert
        time.sleep(0.3)
        status = stack.app.notifier.status()
    bodies = [verified(g) for g in got]
    assert [(b["event"], b["state"]) for b in bodies] == [
        ("upstream_paused", "firing"),
        ("route_down", "firing"),
    ]
    assert len(receiver.got) == 2
    assert bodies[0]["details"]["upstream"] == "bad"
    assert bodies[1]["details"] == {"route": "*", "upstreams": ["bad"]}
    assert got[0].headers["x-twserve-event"] == "upstream_paused"
    assert got[0].headers["x-twserve-delivery"] == bodies[0]["id"]
    assert SECRET not in got[0].body.decode()
    assert status["receivers"]["ops"]["sent"] == 2 and status["dropped"] == 0


def test_the_slack_form_is_text(tmp_path: Path, receiver: Receiver) -> None:
    hook = notification(receiver.url, format="slack", events=["upstream_paused"])
    with failing_stack(tmp_path, [hook]) as stack:
        chat(stack)
        got = receiver.wait(1)
    body = verified(got[0])
    assert body == {"text": "[twserve alert] upstream 'bad' paused (unexplained)"}


def test_key_limit_fires_once_per_level_and_window(tmp_path: Path, receiver: Receiver) -> None:
    upstreams = {"a": Upstream("openai-chat", models=["m"])}
    hook = notification(receiver.url, events=["key_limit_80", "key_limit_100"])
    config = {
        "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "hour", "requests": 5}]}],
        "notifications": [hook],
    }
    with running_stack(tmp_path, upstreams, config=config, env=ENV) as stack:
        statuses = [chat(stack).status for _ in range(7)]
        got = receiver.wait(2)
        time.sleep(0.3)
    assert statuses == [200] * 5 + [429] * 2
    kinds = [(b["event"], b["details"]["percent"]) for b in map(verified, receiver.got)]
    assert kinds == [("key_limit_80", 80), ("key_limit_100", 100)], got


def test_a_receiver_that_is_down_is_retried_then_dropped_and_counted(tmp_path: Path) -> None:
    with refusing_port() as port:
        hook = notification(f"http://127.0.0.1:{port}/hook", max_attempts=3, backoff_secs=0.05)
        with failing_stack(tmp_path, [hook]) as stack:
            started = time.monotonic()
            assert chat(stack).status >= 500
            assert time.monotonic() - started < 2
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                status = stack.app.notifier.status()["receivers"]["ops"]
                if status["failed"] == 2:
                    break
                time.sleep(0.05)
            control = http(
                stack.control_url + "/status",
                method="GET",
                headers=(("authorization", f"Bearer {CONTROL_KEY}"),),
            )
    # Two alerts (upstream paused, route down), three tries each, then dropped.
    assert status == {
        "url": hook["url"],
        "queued": 0,
        "sent": 0,
        "retries": 4,
        "failed": 2,
        "dropped": 0,
    }
    assert control.status == 200, control.body
    assert control.json()["notifications"]["dropped"] == 2


def test_a_slow_receiver_leaves_requests_alone(tmp_path: Path, receiver: Receiver) -> None:
    receiver.delay = 3.0
    upstreams = {
        "bad": Upstream(
            "openai-chat", MockSettings(script=parse_script({"error": 500})), models=["bad"]
        ),
        "good": Upstream("openai-chat", models=["m"]),
    }
    hook = notification(receiver.url, timeout_secs=0.5, max_attempts=2, events=["upstream_paused"])
    config = {
        "failover": {"failures_to_pause": 1, "pause_secs": 60, "wait_secs": 0},
        "notifications": [hook],
    }
    with running_stack(tmp_path, upstreams, config=config, env=ENV) as stack:
        chat(stack, "bad")  # pauses `bad`: its alert waits on the slow receiver
        receiver.wait(1)
        times = []
        for _ in range(10):
            started = time.monotonic()
            assert chat(stack).status == 200
            times.append(time.monotonic() - started)
        deadline = time.monotonic() + 10
        while stack.app.notifier.status()["receivers"]["ops"]["failed"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert max(times) < 0.4, times  # the receiver's 3 s never reach a request
    assert len(receiver.got) == 2  # tried twice, each cut at 0.5 s


def _config(url: str, **fields: Any) -> Config:
    return build_config(
        {
            "version": 1,
            "providers": [{"name": "a", "base_url": "https://a.example", "models": ["m"]}],
            "notifications": [notification(url, **fields)],
        },
        ENV,
    )


def test_config_refusals_and_safe_mode_and_a_full_queue(receiver: Receiver) -> None:
    receiver.delay = 0.3
    config = _config(receiver.url, max_queued=2)
    notifier = Notifier(lambda: config, ENV)

    async def main() -> dict[str, Any]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(notifier.run)
            notifier.safe_mode(True, "config.yaml_invalid", "")
            problem = ConfigProblem(code="config.unknown_field", path="kye", message="unknown")
            notifier.on_event(ConfigRejected(ts=1.0, problems=(problem,)))
            # The queue holds 2, and nothing was sent yet (no await since): these are dropped.
            for _ in range(3):
                notifier.on_event(KeyLimitAlert(**_limit()))
            notifier.safe_mode(False)
            with anyio.fail_after(10):
                while notifier.status()["queued"]:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        return notifier.status()

    status = anyio.run(main)
    bodies = [verified(g) for g in receiver.got]
    assert [(b["event"], b["state"]) for b in bodies] == [
        ("safe_mode", "firing"),
        ("config_refused", "firing"),
    ]
    assert bodies[1]["details"]["code"] == "config.unknown_field"
    assert status["receivers"]["ops"]["dropped"] == 4 and status["dropped"] == 4


def _limit() -> dict[str, Any]:
    return {
        "ts": 1.0,
        "key": "me",
        "per": "day",
        "measure": "requests",
        "amount": 10,
        "used": 8,
        "percent": 80,
        "reset": None,
    }


def test_routes_down_needs_every_upstream_of_the_route() -> None:
    config = build_config(
        {
            "version": 1,
            "providers": [
                {"name": n, "base_url": f"https://{n}.example", "models": ["m"]}
                for n in ("a", "b", "c")
            ],
            "groups": [{"name": "g", "providers": ["a", "b"]}],
            "routes": [
                {"name": "main", "rules": [{"name": "all", "to": "g"}]},
                {"name": "solo", "rules": [{"name": "one", "to": "c"}]},
            ],
            "default_route": "main",
        }
    )
    assert routes_down(config, frozenset({"a"})) == {}
    assert routes_down(config, frozenset({"a", "b"})) == {"main": frozenset({"a", "b"})}
    assert set(routes_down(config, frozenset({"a", "b", "c"}))) == {"main", "solo"}


def test_the_signature_is_the_documented_hmac() -> None:
    body = b'{"event":"safe_mode"}'
    assert sign(b"k" * 16, "1700000000", body) == "v1=" + _hmac_hex("k" * 16, "1700000000", body)


def test_a_resumed_upstream_resolves_its_route(receiver: Receiver) -> None:
    config = _config(receiver.url)
    notifier = Notifier(lambda: config, ENV)

    def health(paused: bool) -> HealthChanged:
        return HealthChanged(
            ts=1.0,
            upstream="a",
            paused=paused,
            reason="server_error" if paused else "expired",
            pause_secs=30.0 if paused else None,
            failures_in_row=1,
        )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(notifier.run)
            notifier.on_event(health(True))
            notifier.on_event(health(False))
            with anyio.fail_after(10):
                while notifier.status()["receivers"]["ops"]["sent"] < 4:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    anyio.run(main)
    states = [(b["event"], b["state"]) for b in map(verified, receiver.got)]
    assert states == [
        ("upstream_paused", "firing"),
        ("route_down", "firing"),
        ("upstream_paused", "resolved"),
        ("route_down", "resolved"),
    ]


def test_safe_mode_at_start_and_its_end_reach_the_receiver(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A file that cannot load starts the gateway in safe mode; its sound ``notifications``
    still load, so the receiver hears of it, and of its end once a config passes."""
    hook = (
        "\nnotifications:\n"
        f"  - url: {receiver.url}\n"
        f"    secret: {SECRET}\n"
        "    events: [safe_mode]\n"
    )

    def broken(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c, extra=hook).replace(
            "providers:\n", "providers:\n  - name: a\n    base_url: 5\n", 1
        )

    with live_gateway(tmp_path, {"a": MockSettings()}, broken) as live:
        assert live.app.gateway_port is None
        got = receiver.wait(1)
        live.write(config_yaml(live.mock_ports, live.control_port, extra=hook))
        got = receiver.wait(2)
    entered, ended = (verified(g) for g in got)
    assert (entered["event"], entered["state"]) == ("safe_mode", "firing")
    assert entered["details"]["code"].startswith("config.")
    assert (ended["event"], ended["state"]) == ("safe_mode", "resolved")
