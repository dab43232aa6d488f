"""``listen`` (docs/configuration.md): the gateway's and the control plane's listeners and the
transports' bounds, as the config builds them (re-exported by `twengine.config.model`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from twengine.config import defaults

__all__ = (
    "ControlListen",
    "GatewayListen",
    "Http2Listen",
    "HttpListen",
    "IPNetwork",
    "Listen",
    "WebSocketListen",
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _d(section: Mapping[str, defaults.Bound], name: str) -> float:
    default = section[name].default
    assert default is not None
    return float(default)


# --- listeners ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayListen:
    """``listen.gateway``. An empty `allow_from` lets every address in; loopback always may."""

    bind: str = defaults.GATEWAY_BIND
    port: int = defaults.GATEWAY_PORT
    allow_from: tuple[IPNetwork, ...] = ()
    # Client connections open at once; beyond it new ones wait in the listen backlog.
    max_connections: int = 1000
    # Of those, from one address (None: half of max_connections, `per_address_cap`).
    max_connections_per_address: int | None = None
    # Web page origins (``scheme://host[:port]``, lower-case; ``*`` any) whose requests are
    # served; a request from any other page is refused (twengine.browser).
    allow_origins: tuple[str, ...] = ()
    # Host names (lower-case, no port) a request's Host may name; empty: any.
    allow_hosts: tuple[str, ...] = ()

    @property
    def per_address_cap(self) -> int:
        """Connections one client address may hold open at once."""
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        return max(1, self.max_connections // 2)

    # The longest model name a request may ask for (400 `gw.request.model_name_too_long`):
    # the name is echoed in headers, rows, events and answers.
    max_model_name_chars: int = 256
    # Requests in progress at once beyond which a new one is refused (503 `gw.overloaded`); 0:
    # no bound. `shed_loop_lag_ms`: the loop lag at which new requests are refused; 0: never.
    max_requests: int = 0
    shed_loop_lag_ms: int = 250

    def allows(self, address: str) -> bool:
        """Whether a client at `address` may connect (checked before the key)."""
        if not self.allow_from:
            return True
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        # An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback:
            return True
        return any(ip.version == net.version and ip in net for net in self.allow_from)


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlListen:
    """``listen.control``: on when the section is present (unless ``enabled: false``)."""

    enabled: bool = False
    bind: str = defaults.CONTROL_BIND
    port: int = defaults.CONTROL_PORT
    key: str | None = None
    # The control listener's own caps: connections open at once, one request body's bytes.
    max_connections: int = int(defaults.CONTROL_MAX_CONNECTIONS.default or 32)
    max_body_bytes: int = int(defaults.CONTROL_MAX_BODY_BYTES.default or 1024 * 1024)

    @property
    def body_budget_bytes(self) -> int:
        """Request bodies the control listener holds in memory at once, apart from the
        gateway's budget: four of the largest."""
        return 4 * self.max_body_bytes

    max_config_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpListen:
    """``listen.http``: the bounds of every client connection's requests, whichever protocol
    it speaks (heads, bodies, the time each may take, one write to a client that does not
    read, the bodies held in memory at once). The control listener keeps its own connection
    and body caps (`ControlListen`)."""

    max_header_bytes: int = int(_d(defaults.LISTEN_HTTP, "max_header_bytes"))
    max_headers: int = int(_d(defaults.LISTEN_HTTP, "max_headers"))
    max_body_bytes: int = int(_d(defaults.LISTEN_HTTP, "max_body_bytes"))
    head_timeout_secs: float = _d(defaults.LISTEN_HTTP, "head_timeout_secs")
    body_timeout_secs: float = _d(defaults.LISTEN_HTTP, "body_timeout_secs")
    keepalive_timeout_secs: float = _d(defaults.LISTEN_HTTP, "keepalive_timeout_secs")
    write_timeout_secs: float = _d(defaults.LISTEN_HTTP, "write_timeout_secs")
    body_budget_bytes: int = int(_d(defaults.LISTEN_HTTP, "body_budget_bytes"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Http2Listen:
    """``listen.http2``: what one client HTTP/2 connection is allowed."""

    max_concurrent_streams: int = int(_d(defaults.LISTEN_HTTP2, "max_concurrent_streams"))
    max_frame_size: int = int(_d(defaults.LISTEN_HTTP2, "max_frame_size"))
    max_header_list_size: int = int(_d(defaults.LISTEN_HTTP2, "max_header_list_size"))
    hard_header_list_size: int = int(_d(defaults.LISTEN_HTTP2, "hard_header_list_size"))
    initial_window_size: int = int(_d(defaults.LISTEN_HTTP2, "initial_window_size"))
    max_resets: int = int(_d(defaults.LISTEN_HTTP2, "max_resets"))
    reset_window_secs: float = _d(defaults.LISTEN_HTTP2, "reset_window_secs")
    output_buffer_bytes: int = int(_d(defaults.LISTEN_HTTP2, "output_buffer_bytes"))
    max_owed_control_frames: int = int(_d(defaults.LISTEN_HTTP2, "max_owed_control_frames"))
    max_blocked_secs: float = _d(defaults.LISTEN_HTTP2, "max_blocked_secs")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSocketListen:
    """``listen.websocket``: what one Responses WebSocket is allowed (the idle timeout and the
    output bounds hold for Realtime connections too)."""

    max_message_bytes: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_message_bytes"))
    idle_timeout_secs: float = _d(defaults.LISTEN_WEBSOCKET, "idle_timeout_secs")
    max_queued_turns: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_queued_turns"))
    max_sockets_per_key: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_sockets_per_key"))
    output_buffer_bytes: int = int(_d(defaults.LISTEN_WEBSOCKET, "output_buffer_bytes"))
    max_owed_pongs: int = int(_d(defaults.LISTEN_WEBSOCKET, "max_owed_pongs"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    gateway: GatewayListen = field(default_factory=GatewayListen)
    control: ControlListen = field(default_factory=ControlListen)
    http: HttpListen = field(default_factory=HttpListen)
    http2: Http2Listen = field(default_factory=Http2Listen)
    websocket: WebSocketListen = field(default_factory=WebSocketListen)
