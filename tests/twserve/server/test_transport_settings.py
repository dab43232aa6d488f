"""The transports' limits are config settings: ``listen.http``, ``listen.http2``,
``listen.websocket`` (docs/configuration.md, "Transport limits").

Their defaults are the figures the servers had in code, they are checked when the config loads,
and a reload applies them to the connections accepted after it (those already open keep the
bounds they started with) — on a real gateway over loopback.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.twserve.support.h2_client import RawH2
from tests.twserve.support.live import KEY, config_yaml, live_gateway, wait_for
from twengine.config import ConfigError, Listen, build_config, defaults
from twmock.script import MockSettings
from twserve.app.transport_limits import TransportLimits, transport_limits
from twserve.server.base import ServerLimits
from twserve.server.http2 import Http2Limits
from twserve.server.websocket import WebSocketLimits

# --- the settings themselves (no event loop) -------------------------------------------------


def test_the_defaults_are_the_figures_the_transports_had() -> None:
    assert transport_limits(Listen()) == TransportLimits(
        ServerLimits(), Http2Limits(), WebSocketLimits()
    )


def test_each_setting_reaches_its_transport() -> None:
    config = build_config(
        {
            "version": 1,
            "listen": {
                "http": {"max_headers": 50, "head_timeout_secs": 2.5, "write_timeout_secs": 9},
                "http2": {"max_concurrent_streams": 7, "max_blocked_secs": 3},
                "websocket": {"max_sockets_per_key": 2, "idle_timeout_secs": 40},
            },
        }
    )
    got = transport_limits(config.listen)
    assert (got.http.max_headers, got.http.head_timeout, got.http.write_timeout) == (50, 2.5, 9)
    assert got.http.max_body_bytes == ServerLimits().max_body_bytes  # the rest at defaults
    assert (got.http2.max_concurrent_streams, got.http2.max_blocked_secs) == (7, 3)
    assert (got.websocket.max_sockets_per_key, got.websocket.idle_timeout) == (2, 40)


def test_the_connection_caps_are_kept_from_the_program() -> None:
    got = transport_limits(Listen(), ServerLimits(max_connections=5))
    assert got.http.max_connections == 5


def _problems(listen: dict[str, object]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        build_config({"version": 1, "listen": listen})
    return [(p.code, p.path) for p in info.value.problems]


def test_out_of_range_and_unknown_settings_are_refused() -> None:
    assert _problems({"http": {"max_headers": 0}}) == [
        ("config.out_of_range", "listen.http.max_headers")
    ]
    assert _problems({"http2": {"max_frame_size": 1000}}) == [
        ("config.out_of_range", "listen.http2.max_frame_size")
    ]
    assert _problems({"websocket": {"max_owed_pongs": "many"}}) == [
        ("config.wrong_type", "listen.websocket.max_owed_pongs")
    ]
    assert [c for c, _ in _problems({"http": {"max_header": 10}})] == ["config.unknown_field"]


def test_settings_that_disagree_are_refused() -> None:
    assert _problems(
        {"http": {"max_body_bytes": 4 * 1024 * 1024, "body_budget_bytes": 1048576}}
    ) == [("config.listen_limits_conflict", "listen.http.body_budget_bytes")]
    assert _problems({"http2": {"max_header_list_size": 300_000}}) == [
        ("config.listen_limits_conflict", "listen.http2.hard_header_list_size")
    ]


DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def _figure(value: float | None) -> str:
    assert value is not None
    return str(int(value)) if float(value).is_integer() else str(value)


def test_every_setting_is_documented_with_its_default_and_range() -> None:
    text = DOC.read_text(encoding="utf-8")
    for section, table in (
        ("http", defaults.LISTEN_HTTP),
        ("http2", defaults.LISTEN_HTTP2),
        ("websocket", defaults.LISTEN_WEBSOCKET),
    ):
        for name, bound in table.items():
            row = f"| `listen.{section}.{name}` | `{_figure(bound.default)}`"
            assert row in text, row
            assert f"| {bound.describe()}" in text.split(row, 1)[1].split("\n", 1)[0], name


# --- on a running gateway --------------------------------------------------------------------


def _with_listen(text: str, extra: str) -> str:
    return text.replace("listen:\n", "listen:\n" + extra, 1)


def _get(sock: socket.socket, headers: int) -> bytes:
    """One keep-alive GET /healthz with `headers` extra headers; the answer's status line."""
    lines = [b"GET /healthz HTTP/1.1", b"host: 127.0.0.1"]
    lines += [b"x-h%d: v" % i for i in range(headers)]
    sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n", 1)[0]


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_listen_http_bounds_a_running_gateway_and_a_reload_applies_to_new_connections(
    tmp_path: Path,
) -> None:
    def text(ports: dict[str, int], control: int) -> str:
        return _with_listen(config_yaml(ports, control), "  http:\n    max_headers: 20\n")

    with live_gateway(tmp_path, {"a": MockSettings()}, text) as live:  # type: ignore[arg-type]
        port = live.app.gateway_port
        assert port is not None
        with _connect(port) as sock:
            assert _get(sock, 10).startswith(b"HTTP/1.1 200")
        with _connect(port) as sock:
            assert _get(sock, 30).startswith(b"HTTP/1.1 431")
        # A connection opened before the reload keeps the bounds it started with.
        before = _connect(port)
        try:
            assert _get(before, 5).startswith(b"HTTP/1.1 200")
            live.write(live.path.read_text().replace("max_headers: 20", "max_headers: 60"))
            wait_for(lambda: live.app.gateway_server.limits.max_headers == 60)
            with _connect(port) as sock:
                assert _get(sock, 30).startswith(b"HTTP/1.1 200")
            assert _get(before, 30).startswith(b"HTTP/1.1 431")
        finally:
            before.close()


def test_listen_http2_is_what_a_new_connection_is_offered(tmp_path: Path) -> None:
    def text(ports: dict[str, int], control: int) -> str:
        return _with_listen(
            config_yaml(ports, control), "  http2:\n    max_concurrent_streams: 7\n"
        )

    with live_gateway(tmp_path, {"a": MockSettings()}, text) as live:  # type: ignore[arg-type]
        port = live.app.gateway_port
        assert port is not None
        client = RawH2(port)
        try:
            client.wait(lambda: client.h2.remote_settings.max_concurrent_streams == 7)
            sid = client.request(
                "/healthz", method="GET", headers=[("authorization", f"Bearer {KEY}")]
            )
            assert client.finish(sid).status == 200
        finally:
            client.close()
        live.write(
            live.path.read_text().replace("max_concurrent_streams: 7", "max_concurrent_streams: 9")
        )
        wait_for(lambda: live.app.h2_limits.max_concurrent_streams == 9)
        client = RawH2(port)
        try:
            client.wait(lambda: client.h2.remote_settings.max_concurrent_streams == 9)
        finally:
            client.close()
