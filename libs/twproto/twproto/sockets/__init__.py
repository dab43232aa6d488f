"""The two WebSocket APIs the gateway speaks, as values and text (docs/transports.md).

`responses` — the Responses WebSocket: what a client's event asks for, the events the gateway
writes itself on that socket, and the gateway's own socket to an upstream. `realtime` — the
Realtime API, read only as far as usage, the events that start a response, and errors.

Every public name of both modules is exported here
(``from twproto.sockets import read_ws_client_event``).
"""

from twproto.sockets.realtime import (
    REALTIME_CHECKED_AS,
    REALTIME_PATH,
    RealtimeEvent,
    add_usage,
    read_realtime_event,
    realtime_cancel_event,
    realtime_error_event,
    realtime_started_response,
    realtime_upstream_url,
    realtime_usage,
)
from twproto.sockets.responses import (
    WS_MAX_ERROR_BODY,
    WS_RESPONSES_PATHS,
    AnswerError,
    EventRejected,
    FailedResponse,
    SteerRequested,
    TurnRequested,
    UpstreamErrorAnswer,
    UpstreamSocketEvent,
    WsClientEvent,
    read_ws_client_event,
    read_ws_upstream_event,
    ws_answer_error_event,
    ws_answer_failed_event,
    ws_completed_event,
    ws_error_event,
    ws_failed_event,
    ws_gateway_error_event,
    ws_gateway_failed_event,
    ws_steer_failed_event,
    ws_stream_message,
    ws_tag_stream_id,
    ws_upstream_create,
    ws_upstream_error_answer,
    ws_upstream_url,
)

__all__ = (
    "REALTIME_CHECKED_AS",
    "REALTIME_PATH",
    "WS_MAX_ERROR_BODY",
    "WS_RESPONSES_PATHS",
    "AnswerError",
    "EventRejected",
    "FailedResponse",
    "RealtimeEvent",
    "SteerRequested",
    "TurnRequested",
    "UpstreamErrorAnswer",
    "UpstreamSocketEvent",
    "WsClientEvent",
    "add_usage",
    "read_realtime_event",
    "read_ws_client_event",
    "read_ws_upstream_event",
    "realtime_cancel_event",
    "realtime_error_event",
    "realtime_started_response",
    "realtime_upstream_url",
    "realtime_usage",
    "ws_answer_error_event",
    "ws_answer_failed_event",
    "ws_completed_event",
    "ws_error_event",
    "ws_failed_event",
    "ws_gateway_error_event",
    "ws_gateway_failed_event",
    "ws_steer_failed_event",
    "ws_stream_message",
    "ws_tag_stream_id",
    "ws_upstream_create",
    "ws_upstream_error_answer",
    "ws_upstream_url",
)
