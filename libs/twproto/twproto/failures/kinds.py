"""What a classified failure is (`Failure`, its `FailureKind`, the pause it asks for) and what
each kind does next (`KIND_POLICY`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = (
    "KIND_POLICY",
    "MAX_BODY_BYTES",
    "Evidence",
    "Failure",
    "FailureKind",
    "KindPolicy",
    "PauseRule",
    "TransportFault",
)


#: Only this much of an error body is read.
MAX_BODY_BYTES = 64 * 1024
# A message kept on a Failure is cut to this many characters.
_MAX_MESSAGE = 1000


class FailureKind(StrEnum):
    NO_BALANCE = "no_balance"
    QUOTA_USED_UP = "quota_used_up"
    RATE_LIMITED = "rate_limited"
    AUTH_REJECTED = "auth_rejected"
    MODEL_UNAVAILABLE = "model_unavailable"
    OVERLOADED = "overloaded"
    SERVER = "server"
    CONNECT = "connect"
    STREAM_ENDED_EARLY = "stream_ended_early"
    IDLE_TIMEOUT = "idle_timeout"
    EFFORT_REFUSED = "effort_refused"
    SEALED_REASONING = "sealed_reasoning"
    CONTEXT_OVERFLOW = "context_overflow"
    CLIENT_ERROR = "client_error"
    # The gateway's own resources ran short before the request reached the upstream (its pool of
    # upstream connections, its file descriptors or local ports): nothing the upstream did.
    GATEWAY_BUSY = "gateway_busy"


class PauseRule(StrEnum):
    """How the engine pauses the upstream; each maps to a config duration."""

    NONE = "none"  # no pause, and the failure does not count against the upstream
    UNEXPLAINED = "unexplained"  # counts towards failures_to_pause (pause_secs, doubling)
    NO_BALANCE = "no_balance"  # no_balance_pause_secs
    QUOTA = "quota"  # until Failure.reset_at, else quota_pause_secs
    RATE_LIMIT = "rate_limit"  # Failure.pause_secs, capped at rate_limit_max_pause_secs


class TransportFault(StrEnum):
    """A fault below HTTP, named by the transport that saw it."""

    CONNECT_REFUSED = "connect_refused"
    CONNECT_TIMEOUT = "connect_timeout"
    DNS = "dns"
    TLS = "tls"
    RESET_BEFORE_HEAD = "reset_before_head"  # connection closed or reset before the status line
    PROTOCOL_ERROR = "protocol_error"  # the response head could not be parsed
    BODY_BROKEN = "body_broken"  # the connection broke after the head, before any content
    # The gateway's own upstream connections were all in use for its pool wait: not the
    # upstream's doing, so it fails over without counting against the upstream.
    POOL_FULL = "pool_full"
    # The gateway's host refused to make the connection (out of file descriptors, socket
    # buffers or local ports): the gateway's load, not the upstream's, and counted the same way.
    LOCAL_RESOURCES = "local_resources"


class Evidence(StrEnum):
    """Facts read from headers and body that a `FailureRule` may require."""

    RETRY_HINT = "retry_hint"  # retry-after(-ms), Gemini RetryInfo, "retry in 5s" in the message
    DAILY_QUOTA = "daily_quota"  # a Gemini QuotaFailure naming a per-day quota
    QUOTA_HEADERS_FULL = "quota_headers_full"  # x-codex-*-used-percent at 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One classified failure of one attempt.

    `pause_secs` is an explicit pause the upstream named (Retry-After, time until a quota
    resets); the caller caps it. `reset_at` (epoch seconds) is when an exhausted quota or limit
    resets, if known. `retry_after_secs` is a retry hint that may lengthen a backoff. `rule` names
    the `RULES` row (or the source) that decided.
    """

    kind: FailureKind
    failover: bool
    temporary: bool
    pause: PauseRule
    pause_secs: float | None = None
    reset_at: float | None = None
    retry_after_secs: float | None = None
    status: int | None = None
    message: str = ""
    error_type: str | None = None
    rule: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class KindPolicy:
    """What a kind does: fail over, retry as temporary, and how it pauses the upstream."""

    failover: bool
    temporary: bool
    pause: PauseRule


# docs/failures.md, "Kinds and what they do". effort_refused and sealed_reasoning do not fail over:
# the engine resends once to the same upstream (with another effort level / without the sealed
# items); a second refusal is classified afresh.
KIND_POLICY: Mapping[FailureKind, KindPolicy] = {
    FailureKind.NO_BALANCE: KindPolicy(failover=True, temporary=False, pause=PauseRule.NO_BALANCE),
    FailureKind.QUOTA_USED_UP: KindPolicy(failover=True, temporary=False, pause=PauseRule.QUOTA),
    # RATE_LIMIT only with an explicit pause; without one a rate limit counts as unexplained.
    FailureKind.RATE_LIMITED: KindPolicy(
        failover=True, temporary=False, pause=PauseRule.RATE_LIMIT
    ),
    FailureKind.AUTH_REJECTED: KindPolicy(
        failover=True, temporary=False, pause=PauseRule.UNEXPLAINED
    ),
    FailureKind.MODEL_UNAVAILABLE: KindPolicy(failover=True, temporary=False, pause=PauseRule.NONE),
    FailureKind.OVERLOADED: KindPolicy(failover=True, temporary=True, pause=PauseRule.UNEXPLAINED),
    FailureKind.SERVER: KindPolicy(failover=True, temporary=True, pause=PauseRule.UNEXPLAINED),
    FailureKind.CONNECT: KindPolicy(failover=True, temporary=True, pause=PauseRule.UNEXPLAINED),
    FailureKind.STREAM_ENDED_EARLY: KindPolicy(
        failover=True, temporary=True, pause=PauseRule.UNEXPLAINED
    ),
    FailureKind.IDLE_TIMEOUT: KindPolicy(
        failover=True, temporary=False, pause=PauseRule.UNEXPLAINED
    ),
    FailureKind.EFFORT_REFUSED: KindPolicy(failover=False, temporary=False, pause=PauseRule.NONE),
    FailureKind.SEALED_REASONING: KindPolicy(failover=False, temporary=False, pause=PauseRule.NONE),
    # The request is too long for this model, not the upstream's fault: the engine moves on only
    # to a candidate with a larger context window (docs/failover.md), and blames nobody.
    FailureKind.CONTEXT_OVERFLOW: KindPolicy(failover=True, temporary=False, pause=PauseRule.NONE),
    FailureKind.CLIENT_ERROR: KindPolicy(failover=False, temporary=False, pause=PauseRule.NONE),
    # The gateway's own shortage: another candidate may still be reached (an idle connection of
    # its pool, another origin), but the same upstream is not retried and not blamed.
    FailureKind.GATEWAY_BUSY: KindPolicy(failover=True, temporary=False, pause=PauseRule.NONE),
}
