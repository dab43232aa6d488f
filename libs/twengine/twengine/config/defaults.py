"""Defaults and allowed ranges of every numeric config field, kept as data.

The model's dataclass defaults and the validator's range checks both take their figures from
this module, so a figure changes in one place (docs/configuration.md repeats them, and a test
compares). A `Bound` is inclusive at both ends; `integer` says whether a fractional value is
refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = (
    "CLIENT_MAX_CONCURRENT",
    "CONTROL_BIND",
    "CONTROL_MAX_BODY_BYTES",
    "CONTROL_MAX_CONFIG_BYTES",
    "CONTROL_MAX_CONNECTIONS",
    "CONTROL_PORT",
    "FAILOVER",
    "GATEWAY_BIND",
    "GATEWAY_MAX_CONNECTIONS",
    "GATEWAY_MAX_CONNECTIONS_PER_ADDRESS",
    "GATEWAY_MAX_MODEL_NAME_CHARS",
    "GATEWAY_MAX_REQUESTS",
    "GATEWAY_PORT",
    "GATEWAY_SHED_LOOP_LAG_MS",
    "GROUP_WEIGHT",
    "LIMIT_COST_USD",
    "LIMIT_REQUESTS",
    "LIMIT_TOKENS",
    "LISTEN_HTTP",
    "LISTEN_HTTP2",
    "LISTEN_WEBSOCKET",
    "MIN_STREAM_START_WAIT_SECS",
    "MODEL_SPEC_TOKENS",
    "NOTIFICATIONS",
    "OBSERVABILITY",
    "OFFICIAL_HOSTS",
    "POOL",
    "PORT",
    "PRICE_MULTIPLIER",
    "PRICE_PER_MILLION",
    "PROVIDER",
    "RETENTION",
    "SET_MAX_TOKENS",
    "STATE",
    "STORE",
    "TRACES",
    "Bound",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    """An inclusive range for a number, with its default (None: the field has no default)."""

    low: float
    high: float
    default: float | None = None
    integer: bool = True

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high

    def describe(self) -> str:
        """The range as the docs and problem messages write it: ``1–1000``, ``≥ 0.01``."""
        if math.isinf(self.high):
            return f"≥ {_num(self.low)}"
        return f"{_num(self.low)}–{_num(self.high)}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


GATEWAY_BIND = "127.0.0.1"
GATEWAY_PORT = 8788
CONTROL_BIND = "127.0.0.1"
CONTROL_PORT = 8789
# listen.control.max_config_bytes: the largest config a PUT /config takes. Reading YAML costs
# about ten seconds a megabyte; real configs are a few kilobytes.
CONTROL_MAX_CONFIG_BYTES = Bound(low=4096, high=64 * 1024 * 1024, default=1024 * 1024)
PORT = Bound(low=1, high=65535)
# listen.gateway.max_connections: client connections open at once.
GATEWAY_MAX_CONNECTIONS = Bound(low=1, high=1_000_000, default=1000)
# listen.gateway.max_connections_per_address: of those, from one client address. No default of
# its own: half of max_connections (GatewayListen.per_address_cap).
GATEWAY_MAX_CONNECTIONS_PER_ADDRESS = Bound(low=1, high=1_000_000)
# listen.control.max_connections and max_body_bytes: the control listener's own caps (its
# bodies draw on a budget of their own, ControlListen.body_budget_bytes).
CONTROL_MAX_CONNECTIONS = Bound(low=1, high=10_000, default=32)
CONTROL_MAX_BODY_BYTES = Bound(low=1024, high=64 * 1024 * 1024, default=1024 * 1024)
# listen.gateway.max_model_name_chars: the longest model name a request may ask for. Real names
# (dated snapshots, vendor/ prefixes, Bedrock ARNs) stay well under 256.
GATEWAY_MAX_MODEL_NAME_CHARS = Bound(low=16, high=65_536, default=256)
# listen.gateway.max_requests: requests in progress at once over every connection, beyond which
# a new one is refused at once (503 gw.overloaded); 0: no such bound.
GATEWAY_MAX_REQUESTS = Bound(low=0, high=10_000_000, default=0)
# listen.gateway.shed_loop_lag_ms: the event loop's lag (the median of its last second) at which
# new requests are refused at once (503 gw.overloaded) until it is back under half of it; 0: never.
GATEWAY_SHED_LOOP_LAG_MS = Bound(low=0, high=60_000, default=250)

_KIB = 1024
_MIB = 1024 * 1024
# listen.http, listen.http2, listen.websocket: what the transports allow one client connection
# (docs/configuration.md, "Transport limits"). Each default is the figure the transports had
# before they were settings (twserve.server's ServerLimits, Http2Limits, WebSocketLimits).
LISTEN_HTTP: Mapping[str, Bound] = MappingProxyType(
    {
        "max_header_bytes": Bound(low=_KIB, high=_MIB, default=64 * _KIB),
        "max_headers": Bound(low=8, high=10_000, default=200),
        "max_body_bytes": Bound(low=_KIB, high=1024 * _MIB, default=32 * _MIB),
        "head_timeout_secs": Bound(low=1, high=3600, default=30, integer=False),
        "body_timeout_secs": Bound(low=1, high=3600, default=60, integer=False),
        "keepalive_timeout_secs": Bound(low=1, high=3600, default=75, integer=False),
        "write_timeout_secs": Bound(low=1, high=3600, default=60, integer=False),
        "body_budget_bytes": Bound(low=_MIB, high=64 * 1024 * _MIB, default=512 * _MIB),
    }
)
LISTEN_HTTP2: Mapping[str, Bound] = MappingProxyType(
    {
        "max_concurrent_streams": Bound(low=1, high=10_000, default=100),
        # The protocol's own range for SETTINGS_MAX_FRAME_SIZE.
        "max_frame_size": Bound(low=16_384, high=16_777_215, default=16_384),
        "max_header_list_size": Bound(low=_KIB, high=16 * _MIB, default=64 * _KIB),
        "hard_header_list_size": Bound(low=_KIB, high=64 * _MIB, default=256 * _KIB),
        # At least the protocol's initial window, at most its largest.
        "initial_window_size": Bound(low=65_535, high=2_147_483_647, default=_MIB),
        "max_resets": Bound(low=1, high=100_000, default=200),
        "reset_window_secs": Bound(low=1, high=3600, default=10, integer=False),
        "output_buffer_bytes": Bound(low=4 * _KIB, high=64 * _MIB, default=64 * _KIB),
        "max_owed_control_frames": Bound(low=10, high=1_000_000, default=1000),
        "max_blocked_secs": Bound(low=1, high=3600, default=60, integer=False),
    }
)
LISTEN_WEBSOCKET: Mapping[str, Bound] = MappingProxyType(
    {
        "max_message_bytes": Bound(low=_KIB, high=1024 * _MIB, default=16 * _MIB),
        "idle_timeout_secs": Bound(low=1, high=86_400, default=300, integer=False),
        "max_queued_turns": Bound(low=1, high=1000, default=8),
        "max_sockets_per_key": Bound(low=1, high=100_000, default=32),
        "output_buffer_bytes": Bound(low=4 * _KIB, high=64 * _MIB, default=64 * _KIB),
        "max_owed_pongs": Bound(low=10, high=1_000_000, default=1000),
    }
)

CLIENT_MAX_CONCURRENT = Bound(low=1, high=1000)
# Per-upstream numbers; `max_concurrent` has no default (no cap).
PROVIDER: Mapping[str, Bound] = MappingProxyType(
    {
        "max_concurrent": Bound(low=1, high=1000),
        "connect_timeout_secs": Bound(low=1, high=300, default=10, integer=False),
        # The largest single stream event read from the upstream: the closing events of a
        # Responses stream repeat the whole answer, so this is the largest answer it can send.
        "max_answer_bytes": Bound(low=64 * _KIB, high=1024 * _MIB, default=64 * _MIB),
    }
)
GROUP_WEIGHT = Bound(low=1, high=100, default=1)
MODEL_SPEC_TOKENS = Bound(low=1, high=100_000_000)
SET_MAX_TOKENS = Bound(low=1, high=100_000_000)

LIMIT_REQUESTS = Bound(low=1, high=math.inf)
LIMIT_TOKENS = Bound(low=1, high=math.inf)
# Cost is counted in micro-dollars; a cent is the smallest limit worth enforcing.
LIMIT_COST_USD = Bound(low=0.01, high=math.inf, integer=False)

PRICE_MULTIPLIER = Bound(low=0, high=100, default=1, integer=False)
PRICE_PER_MILLION = Bound(low=0, high=1_000_000, integer=False)

# `failover:` fields in the order the docs list them. Seconds may be fractional.
# pool: the upstream connection pools (HTTP/1.1, and the HTTP/2 pools with the same bounds).
POOL: Mapping[str, Bound] = MappingProxyType(
    {
        # Connections open at once over every upstream; each running HTTP/1.1 attempt holds one.
        "max_connections": Bound(low=1, high=1_000_000, default=10_000),
        # Idle connections kept for reuse, over every upstream.
        "max_idle": Bound(low=0, high=1_000_000, default=200),
        # An idle connection unused this long is closed.
        "idle_secs": Bound(low=1, high=3600, default=60, integer=False),
        # How long an attempt waits for a connection while max_connections are all in use; past
        # it the attempt ends as `pool_full` (fails over, not counted against the upstream).
        "wait_secs": Bound(low=0.1, high=600, default=10, integer=False),
    }
)
FAILOVER: Mapping[str, Bound] = MappingProxyType(
    {
        "failures_to_pause": Bound(low=1, high=100, default=3),
        "pause_secs": Bound(low=1, high=86_400, default=60, integer=False),
        "max_pause_secs": Bound(low=1, high=86_400, default=600, integer=False),
        "no_balance_pause_secs": Bound(low=1, high=604_800, default=1800, integer=False),
        "quota_pause_secs": Bound(low=1, high=604_800, default=3600, integer=False),
        "rate_limit_max_pause_secs": Bound(low=1, high=86_400, default=3600, integer=False),
        "idle_timeout_secs": Bound(low=30, high=3600, default=300, integer=False),
        "wait_secs": Bound(low=0, high=600, default=120, integer=False),
        "stream_start_wait_secs": Bound(low=0, high=3600, default=30, integer=False),
    }
)
# With `next_on_slow_start` on, a shorter wait would cancel streams that are merely warming up.
MIN_STREAM_START_WAIT_SECS = 5

RETENTION: Mapping[str, Bound] = MappingProxyType(
    {
        "row_days": Bound(low=1, high=36_500, default=90),
        "body_days": Bound(low=0, high=36_500, default=7),
        # Each stored body (request, answer) is cut at this many bytes.
        "body_max_bytes": Bound(low=1024, high=64 * 1024 * 1024, default=262_144),
        # Responses conversation state (previous_response_id): how long a response is kept,
        # and each key's caps (records, bytes); 0 seconds keeps none.
        "responses_secs": Bound(low=0, high=90 * 86_400, default=30 * 86_400),
        "responses_per_key": Bound(low=1, high=1_000_000, default=1_000),
        "responses_key_bytes": Bound(low=65_536, high=16 * 1024**3, default=256 * 1024**2),
    }
)

STATE: Mapping[str, Bound] = MappingProxyType(
    {
        # How long one Redis call may take before Redis counts as lost (each instance then
        # keeps its own state), and how often a lost Redis is tried again.
        "timeout_secs": Bound(low=0.05, high=30, default=1, integer=False),
        "retry_secs": Bound(low=0.1, high=300, default=1, integer=False),
    }
)

STORE: Mapping[str, Bound] = MappingProxyType(
    {
        # With commit_before_end: how long an answer's end waits for its row's commit.
        "commit_wait_secs": Bound(low=0.1, high=600, default=5, integer=False),
    }
)

OBSERVABILITY: Mapping[str, Bound] = MappingProxyType(
    {
        # Log lines waiting for the log's writer thread; past it a line is dropped and counted.
        "log_queue_lines": Bound(low=16, high=1_000_000, default=10_000),
    }
)

NOTIFICATIONS: Mapping[str, Bound] = MappingProxyType(
    {
        # One POST's whole time: connecting, sending, the receiver's answer.
        "timeout_secs": Bound(low=0.1, high=60, default=5, integer=False),
        # Tries of one notification, the first included; then it is dropped and counted.
        "max_attempts": Bound(low=1, high=20, default=5),
        # The wait before the first retry; it doubles at each retry, at most 300 s.
        "backoff_secs": Bound(low=0.01, high=300, default=1, integer=False),
        # Notifications waiting for this receiver; past it a new one is dropped and counted.
        "max_queued": Bound(low=1, high=100_000, default=1000),
    }
)

TRACES: Mapping[str, Bound] = MappingProxyType(
    {
        # observability.traces.sample_ratio: the share of new traces kept (a client's sampled
        # traceparent is followed whatever it is).
        "sample_ratio": Bound(low=0, high=1, default=1, integer=False),
    }
)

# Official API hosts whose protocol is known without `protocol:`; any other host is taken to
# speak OpenAI Chat Completions, the format most relays copy.
OFFICIAL_HOSTS: Mapping[str, str] = MappingProxyType(
    {
        "api.anthropic.com": "anthropic",
        "generativelanguage.googleapis.com": "gemini",
    }
)
