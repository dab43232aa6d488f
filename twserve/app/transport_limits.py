"""The transports' bounds from the config: ``listen.http``, ``listen.http2``,
``listen.websocket`` (docs/configuration.md, "Transport limits").

The config's figures become the servers' own limits here. A server reads its limits when it
sets a connection up, so a reload applies them to the connections accepted after it; the
connections already open keep the bounds they started with. The connection caps
(``listen.gateway.max_connections`` and ``max_connections_per_address``) are not among them:
they belong to the listener (twserve/app/wiring.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from twengine.config import Listen
from twserve.server.base import ServerLimits
from twserve.server.http2 import Http2Limits
from twserve.server.websocket import WebSocketLimits

__all__ = ["TransportLimits", "transport_limits"]


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """The three transports' limits, as one config sets them."""

    http: ServerLimits
    http2: Http2Limits
    websocket: WebSocketLimits


def transport_limits(listen: Listen, base: ServerLimits | None = None) -> TransportLimits:
    """The limits `listen` sets; the connection caps are kept from `base` (a program's own)."""
    http = listen.http
    server = replace(
        base or ServerLimits(),
        max_header_bytes=http.max_header_bytes,
        max_headers=http.max_headers,
        max_body_bytes=http.max_body_bytes,
        head_timeout=http.head_timeout_secs,
        body_timeout=http.body_timeout_secs,
        keepalive_timeout=http.keepalive_timeout_secs,
        write_timeout=http.write_timeout_secs,
        body_budget_bytes=http.body_budget_bytes,
    )
    h2 = listen.http2
    http2 = Http2Limits(
        max_concurrent_streams=h2.max_concurrent_streams,
        max_frame_size=h2.max_frame_size,
        max_header_list_size=h2.max_header_list_size,
        hard_header_list_size=h2.hard_header_list_size,
        initial_window_size=h2.initial_window_size,
        max_resets=h2.max_resets,
        reset_window_secs=h2.reset_window_secs,
        output_buffer_bytes=h2.output_buffer_bytes,
        max_owed_control_frames=h2.max_owed_control_frames,
        max_blocked_secs=h2.max_blocked_secs,
    )
    ws = listen.websocket
    websocket = WebSocketLimits(
        max_message_bytes=ws.max_message_bytes,
        idle_timeout=ws.idle_timeout_secs,
        max_queued_turns=ws.max_queued_turns,
        max_sockets_per_key=ws.max_sockets_per_key,
        output_buffer_bytes=ws.output_buffer_bytes,
        max_owed_pongs=ws.max_owed_pongs,
    )
    return TransportLimits(server, http2, websocket)
