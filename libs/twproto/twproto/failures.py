"""Failure classification: what an upstream's error means for routing.

Theory of operation
-------------------

An upstream refuses a request in one of three ways: an HTTP error response (status, headers,
body), an error event inside a stream that had already answered 200, or a transport fault before
any response. Each becomes a `Failure`, which says

* what happened (`FailureKind`),
* whether the request moves to the next upstream (`failover`),
* whether it is worth trying the same upstream again after a backoff (`temporary`),
* how the upstream is paused (`PauseRule`, resolved to durations by the engine's config), and
* the times the upstream itself named: an explicit pause (``Retry-After`` and friends, or the
  time left until a quota resets), the reset time, and a retry hint.

Classification is a pure function of its inputs (``now`` is an argument) and never raises on any
input: bodies are read defensively — at most 64 KiB, which may be non-JSON, HTML, truncated or
nested in an array (Gemini's streaming endpoint wraps errors in ``[...]``).

The recognising is data, not code. `RULES` is an ordered table of small rows; the first row that
matches decides the kind. A row matches on

* *codes*: the error's identifiers — ``type``, ``code``, ``status``, ``reason``, an AWS
  exception name — lowercased and compared exactly;
* *texts*: regular expressions searched in the lowercased message (plus a relay's
  ``metadata.raw`` and the offending ``param``), or in the whole body when it is not JSON;
* *statuses*: the HTTP statuses the row applies to (``None`` in the set stands for an in-stream
  error that carries no status);
* *needs*: `Evidence` computed from headers and body that must be present (a retry delay, a
  daily-quota violation, usage headers showing a full window).

Rows that read the body come before rows that read only the status, because the body outranks
the status: a 429 saying "insufficient balance" is no_balance, and a 500 naming an invalid request
is the client's error. docs/failures.md lists every row; a test keeps the two in step.

What each kind does next (`KIND_POLICY`) is a second table, so policy and recognition change
independently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from enum import StrEnum
from itertools import islice
from zoneinfo import ZoneInfo

from twproto import _json
from twproto.dialect import Dialect

__all__ = [
    "KIND_POLICY",
    "MAX_BODY_BYTES",
    "RULES",
    "TEMPORARY_STATUSES",
    "Evidence",
    "Failure",
    "FailureKind",
    "KindPolicy",
    "PauseRule",
    "Rule",
    "TransportFault",
    "classify_response",
    "classify_stream_error",
    "classify_transport",
    "idle_timeout",
    "next_pacific_midnight",
    "stream_ended_early",
]

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


class Evidence(StrEnum):
    """Facts read from headers and body that a `Rule` may require."""

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
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One row of the recognition table. Empty `codes` and `texts` match on status alone."""

    name: str
    kind: FailureKind
    codes: frozenset[str] = frozenset()
    texts: tuple[str, ...] = ()
    statuses: frozenset[int | None] | None = None  # None: any status
    needs: frozenset[Evidence] = frozenset()
    pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.texts and self.pattern is None:
            compiled = re.compile("|".join(f"(?:{t})" for t in self.texts))
            object.__setattr__(self, "pattern", compiled)


def _statuses(*ranges: range | int | None) -> frozenset[int | None]:
    out: set[int | None] = set()
    for r in ranges:
        if isinstance(r, range):
            out.update(r)
        else:
            out.add(r)
    return frozenset(out)


_4XX = range(400, 500)
_5XX = range(500, 600)
# "Unless the body names a request error": rows that overrule a 5xx (or a status-less stream
# error, or a 2xx carrying an error body) but leave 4xx to the status rows.
_NOT_4XX = _statuses(None, range(100, 400), _5XX)
_BAD_REQUEST = _statuses(400, 422, None)
# The server statuses worth retrying (docs/failures.md). Any other 5xx — 501 Not Implemented,
# 505 HTTP Version Not Supported, 507, 508, 511, a relay's own 520–527 — still fails over but is not
# retried on the same upstream: nothing says waiting will change the answer.
TEMPORARY_STATUSES = frozenset({500, 502, 503, 504, 529})
_MODEL_STATUSES = _statuses(400, 403, 404, 422, None)

K = FailureKind

RULES: tuple[Rule, ...] = (
    # --- resend-once kinds: specific enough to go first --------------------------------------
    Rule(
        name="sealed_encrypted_content",
        kind=K.SEALED_REASONING,
        codes=frozenset({"invalid_encrypted_content"}),
        texts=(r"encrypted content .{0,200}could not be (?:verified|decrypted)",),
        statuses=_BAD_REQUEST,
    ),
    Rule(
        name="sealed_thinking_signature",
        kind=K.SEALED_REASONING,
        texts=(
            r"invalid `?signature`? in `?thinking`? block",
            r"invalid `?data`? in `?redacted_thinking`? block",
        ),
        statuses=_BAD_REQUEST,
    ),
    Rule(
        name="effort_refused",
        kind=K.EFFORT_REFUSED,
        texts=(
            r"effort level",
            r"reasoning[_. ]effort",
            r"output_config\.effort",
            r"'effort'",
            r"thinking[_ ]?level",
            r"thinking[_ ]?budget",
            r"budget_tokens",
            r"only works in thinking mode",
        ),
        statuses=_statuses(400, 422),
    ),
    # --- the request does not fit the model's context window ---------------------------------
    Rule(
        name="context_overflow",
        kind=K.CONTEXT_OVERFLOW,
        codes=frozenset({"context_length_exceeded"}),
        texts=(
            r"prompt is too long",  # Anthropic
            r"input length and `?max_tokens`? exceed context limit",  # Anthropic
            r"input token count.{0,40}exceeds the maximum",  # Gemini
            r"maximum context length",  # OpenAI, DeepSeek, vLLM, OpenRouter
            r"context[_ ]length[_ ]exceeded",
            r"exceeds? the context window",  # OpenAI Responses
            r"input tokens exceed the configured limit",  # OpenAI
            r"(?:input|prompt) is too long for (?:the )?requested model",  # Bedrock
            r"too many total text bytes",  # Bedrock
            r"too large for model with \d+ maximum context length",  # Mistral
            r"maximum prompt length is \d+",  # xAI
        ),
        statuses=_statuses(400, 413, 422, None, range(100, 400), _5XX),
    ),
    # --- money and quotas ---------------------------------------------------------------------
    Rule(
        name="no_balance",
        kind=K.NO_BALANCE,
        codes=frozenset(
            {
                "insufficient_quota",
                "insufficient_balance",
                "billing_error",
                "billing_hard_limit_reached",
                "payment_required",
                "arrearage",  # Alibaba DashScope
                "1113",  # GLM: 余额不足或无可用资源包
                "1309",  # GLM: coding-plan subscription expired
            }
        ),
        texts=(
            r"insufficient[ _-]?(?:account[ _-]?)?(?:balance|credits?|funds|quota)",
            r"credit balance is too low",
            r"requires more credits",
            r"out of credits",
            r"billing[ _]hard[ _]limit",
            r"payment required",
            r"arrearage",
            r"余额不足",
            r"欠费",
        ),
    ),
    Rule(
        name="gemini_daily_quota",
        kind=K.QUOTA_USED_UP,
        codes=frozenset({"resource_exhausted"}),
        needs=frozenset({Evidence.DAILY_QUOTA}),
    ),
    Rule(
        name="gemini_retry_delay",
        kind=K.RATE_LIMITED,
        codes=frozenset({"resource_exhausted"}),
        needs=frozenset({Evidence.RETRY_HINT}),
    ),
    Rule(
        name="quota_used_up",
        kind=K.QUOTA_USED_UP,
        codes=frozenset({"usage_limit_reached", "quota_exceeded", "1304", "1308"}),
        texts=(
            r"usage limit (?:has been )?reached",
            r"quota (?:has been )?(?:exceeded|exhausted|used up)",
            r"exceeded (?:your|the) (?:current |daily |weekly |monthly )?quota",
            r"out of quota",
            r"\bper day\b",
            r"\bdaily (?:quota|limit)",
            r"今日调用次数限额",
            r"使用上限",
            r"额度已用",
        ),
    ),
    Rule(
        name="quota_headers_full",
        kind=K.QUOTA_USED_UP,
        statuses=_statuses(429, None),
        needs=frozenset({Evidence.QUOTA_HEADERS_FULL}),
    ),
    # --- capacity -------------------------------------------------------------------------------
    Rule(
        name="overloaded",
        kind=K.OVERLOADED,
        codes=frozenset(
            {
                "overloaded_error",
                "server_is_overloaded",
                "slow_down",
                "unavailable",
                "service_unavailable",
                "serviceunavailableexception",
                "modelnotreadyexception",
                "1305",  # GLM: model overloaded, sent as 429
            }
        ),
        texts=(
            r"overload",
            r"over capacity",
            r"at capacity",
            r"server is busy",
            r"访问量过大",
            r"繁忙",
        ),
    ),
    Rule(
        name="rate_limited",
        kind=K.RATE_LIMITED,
        codes=frozenset(
            {
                "rate_limit_exceeded",
                "rate_limit_error",
                "rate_limit",
                "ratelimitexceeded",
                "rate_limit_exceeded_error",
                "too_many_requests",
                "throttlingexception",
                "throttling",
                "resource_exhausted",
                "1302",  # GLM: concurrency / rate
                "1303",  # GLM: frequency
            }
        ),
        texts=(
            r"rate[ _-]?limit",
            r"too many (?:requests|tokens)",
            r"throttl",
            r"please wait before trying again",
            r"速率限制",
            r"频率过高",
            r"并发数过高",
        ),
    ),
    # --- the upstream cannot serve this model / this account ----------------------------------
    Rule(
        name="model_unavailable",
        kind=K.MODEL_UNAVAILABLE,
        codes=frozenset(
            {"model_not_found", "model_not_available", "resourcenotfoundexception", "1211"}
        ),
        texts=(
            r"model\s*[`'\"]?[\w./:@-]*[`'\"]?\s*(?:is |was |has been )?(?:does not exist|doesn't"
            r" exist|not exist|not found|not available|unavailable|not supported|deprecated"
            r"|decommissioned|no longer available)",
            r"models/\S+ is not (?:found|supported)",
            r"(?:unknown|invalid|unsupported|no such) model",
            r"not a valid model",
            r"model (?:identifier|id|name) is invalid",
            r"(?:do|does|don't|doesn't) (?:not )?have access to (?:the )?model",
            r"no endpoints found",
            r"模型不存在",
        ),
        statuses=_MODEL_STATUSES,
    ),
    Rule(
        name="auth_rejected",
        kind=K.AUTH_REJECTED,
        codes=frozenset(
            {
                "authentication_error",
                "invalid_api_key",
                "api_key_invalid",
                "invalid_authentication",
                "permission_error",
                "permission_denied",
                "unauthenticated",
                "account_deactivated",
                "unrecognizedclientexception",
                "accessdeniedexception",
                "expiredtokenexception",
                "1000",  # GLM: authentication failed
                "1001",
                "1002",
                "1003",
                "1004",
            }
        ),
        texts=(
            r"invalid (?:x-)?api[-_ ]?key",
            r"incorrect api key",
            r"api key not valid",
            r"api key (?:is )?(?:expired|revoked|disabled)",
            r"user location is not supported",
            r"身份验证失败",
        ),
    ),
    # --- a request error named in a 5xx (or status-less) body ---------------------------------
    Rule(
        name="request_error_in_body",
        kind=K.CLIENT_ERROR,
        codes=frozenset(
            {
                "invalid_request_error",
                "invalid_request",
                "invalid_argument",
                "invalid_value",
                "bad_request",
                "validationexception",
                "validation_error",
                "unsupported_parameter",
                "unsupported_value",
                "request_too_large",
            }
        ),
        statuses=_NOT_4XX,
    ),
    Rule(
        name="server_error_in_body",
        kind=K.SERVER,
        codes=frozenset(
            {
                "server_error",
                "api_error",
                "internal",
                "internal_error",
                "internal_server_error",
                "internalserverexception",
                "internalfailure",
                "modelstreamerrorexception",
                "modelerrorexception",
                "bad_gateway",
                "deadline_exceeded",
                "timeout_error",
                "1234",  # GLM: network error
            }
        ),
        texts=(
            r"internal server error",
            r"server had an error",
            r"bad gateway",
            r"gateway time-?out",
            r"upstream (?:connect )?error",
        ),
        statuses=_NOT_4XX,
    ),
    # --- status alone -------------------------------------------------------------------------
    Rule(name="status_402", kind=K.NO_BALANCE, statuses=_statuses(402)),
    Rule(name="status_401_403", kind=K.AUTH_REJECTED, statuses=_statuses(401, 403)),
    Rule(name="status_404", kind=K.MODEL_UNAVAILABLE, statuses=_statuses(404)),
    Rule(name="status_429", kind=K.RATE_LIMITED, statuses=_statuses(429)),
    Rule(name="status_503_529", kind=K.OVERLOADED, statuses=_statuses(503, 529)),
    Rule(name="status_5xx", kind=K.SERVER, statuses=_statuses(_5XX)),
    Rule(name="status_4xx", kind=K.CLIENT_ERROR, statuses=_statuses(_4XX)),
    # Anything else — an in-stream error nothing above recognised, or an error body under a
    # 2xx/3xx status — is taken for an upstream fault.
    Rule(name="unrecognised", kind=K.SERVER),
)

del K


# --- reading the evidence -------------------------------------------------------------------

# Identifier values that say nothing about the error itself.
_GENERIC_IDS = frozenset({"error", "response.failed", "response.error", "none", "null", ""})
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_GO_DURATION_FULL = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|us|µs|ns|h|m|s))+")
_RETRY_IN = re.compile(
    r"(?:try again|retry) in ((?:\d+(?:\.\d+)?(?:ms|h|m|s))+|\d+(?:\.\d+)?\s*"
    r"(?:milliseconds?|seconds?|secs?|minutes?|mins?|hours?))\b"
)
_WORDS = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*s?\s*$")
_MESSAGE_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.\d+)?\s?([zZ]|[+-]\d{2}:?\d{2})?"
)
_CHINA_TIME = timezone(timedelta(hours=8))
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_WORD_UNITS = (
    ("milli", 1e-3),
    ("sec", 1.0),
    ("min", 60.0),
    ("hour", 3600.0),
)


@dataclass(slots=True)
class _Info:
    """What the body says, gathered from whichever shape it came in."""

    ids: list[str] = field(default_factory=list)
    error_type: str | None = None  # the first identifier as written, for reports
    message: str = ""
    extra_text: list[str] = field(default_factory=list)
    status: int | None = None
    retry_delay: float | None = None
    daily_quota: bool = False
    resets_at: float | None = None
    resets_in: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return _finite(float(value))
        except OverflowError:  # an int beyond float range
            return None
    if isinstance(value, str):
        m = _SECONDS.match(value)
        if m:
            return _finite(float(m.group(1)))
    return None


def _go_duration(text: str) -> float | None:
    """Seconds in a Go-style duration: ``"6m0s"``, ``"1s"``, ``"20ms"``, ``"1h2m3.5s"``."""
    text = text.strip()
    if not _GO_DURATION_FULL.fullmatch(text):
        m = _SECONDS.match(text)
        return _finite(float(m.group(1))) if m else None
    total = sum(float(n) * _DURATION_UNITS[u] for n, u in _GO_DURATION.findall(text))
    return _finite(total)


def _words_duration(text: str) -> float | None:
    m = _WORDS.match(text)
    if m is None:
        return None
    for prefix, unit in _WORD_UNITS:
        if m.group(2).startswith(prefix):
            return _finite(float(m.group(1)) * unit)
    return None


def _id(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        # No identifier is that long; str() of a huge int is slow (and refused past 4300 digits).
        return str(value) if -(10**18) < value < 10**18 else None
    if isinstance(value, str):
        v = value.strip().lower()
        # AWS writes "com.amazon.coral.service#ThrottlingException" or
        # "ThrottlingException:http://internal.amazon.com/...".
        if "#" in v:
            v = v.rsplit("#", 1)[1]
        if ":http" in v:
            v = v.split(":http", 1)[0]
        return v if v not in _GENERIC_IDS and len(v) <= 200 else None
    return None


def _status_hint(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 400 <= value <= 599:
        return value
    if isinstance(value, str) and len(value) == 3 and value.isdigit() and value[0] in "45":
        return int(value)
    return None


def _read_object(obj: Mapping[str, object], info: _Info) -> None:
    """Gather identifiers, message and hints from one error-shaped object."""
    # The most specific identifier first: OpenAI's code says more than its type.
    for key in ("code", "type", "status", "reason", "__type", "error_code", "errorCode"):
        value = obj.get(key)
        if _status_hint(value) is not None:
            continue  # an HTTP status written as the code (Gemini, relays): read below
        ident = _id(value)
        if ident is not None and ident not in info.ids:
            info.ids.append(ident)
            if info.error_type is None:
                info.error_type = str(value).strip()
    if info.status is None:
        info.status = _status_hint(obj.get("status_code")) or _status_hint(obj.get("code"))
    message = obj.get("message")
    if not isinstance(message, str):
        message = obj.get("msg") or obj.get("detail")
    if isinstance(message, str) and message and not info.message:
        info.message = message
    param = obj.get("param")
    if isinstance(param, str):
        info.extra_text.append(param)
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        raw = metadata.get("raw")
        if isinstance(raw, str):
            info.extra_text.append(raw[:4000])
    if info.resets_at is None:
        info.resets_at = _number(obj.get("resets_at"))
    if info.resets_in is None:
        info.resets_in = _number(obj.get("resets_in_seconds"))
    for listed in (obj.get("errors"), obj.get("details")):
        if isinstance(listed, list):
            for item in listed[:16]:
                if isinstance(item, Mapping):
                    _read_detail(item, info)


def _read_detail(item: Mapping[str, object], info: _Info) -> None:
    """A Google ``details[]`` / ``errors[]`` entry: RetryInfo, QuotaFailure, ErrorInfo."""
    ident = _id(item.get("reason"))
    if ident is not None and ident not in info.ids:
        info.ids.append(ident)
    kind = item.get("@type")
    if not isinstance(kind, str):
        return
    if kind.endswith("RetryInfo"):
        delay = item.get("retryDelay")
        if isinstance(delay, str) and info.retry_delay is None:
            info.retry_delay = _go_duration(delay)
    elif kind.endswith("QuotaFailure"):
        violations = item.get("violations")
        if isinstance(violations, list):
            for v in violations[:16]:
                if isinstance(v, Mapping):
                    names = f"{v.get('quotaId', '')} {v.get('quotaMetric', '')}".lower()
                    if "perday" in names or "per_day" in names or "daily" in names:
                        info.daily_quota = True


def _read_payload(payload: object, info: _Info) -> None:
    if isinstance(payload, list):
        # Gemini's streaming endpoint wraps the error object in an array.
        for item in payload[:4]:
            if isinstance(item, Mapping):
                _read_payload(item, info)
                return
        return
    if isinstance(payload, str):
        info.message = info.message or payload
        return
    if not isinstance(payload, Mapping):
        return
    candidates: list[Mapping[str, object]] = []
    response = payload.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("error"), Mapping):
        candidates.append(response["error"])  # Responses: response.failed
    error = payload.get("error")
    if isinstance(error, Mapping):
        candidates.append(error)
    elif isinstance(error, str) and error:
        info.message = error
    for key, value in islice(payload.items(), 32):
        # A Bedrock event-stream exception: {"throttlingException": {"message": ...}}.
        if isinstance(key, str) and key.lower().endswith("exception"):
            ident = _id(key)
            if ident is not None:
                info.ids.append(ident)
                info.error_type = info.error_type or key
            if isinstance(value, Mapping):
                candidates.append(value)
    candidates.append(payload)
    for obj in candidates:
        _read_object(obj, info)
    embedded = payload.get("headers")
    if isinstance(embedded, Mapping):
        # The Codex in-band error event repeats its response headers.
        for k, v in islice(embedded.items(), 64):
            if isinstance(k, str) and isinstance(v, str | int | float):
                info.headers.setdefault(k.lower(), str(v))


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    return value if isinstance(value, str) else None


def _header_map(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lowercased names; the first of repeated headers wins. ``str`` pairs are accepted too."""
    out: dict[str, str] = {}
    for pair in headers:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            continue
        name, value = _text(pair[0]), _text(pair[1])
        if name is not None and value is not None:
            out.setdefault(name.strip().lower(), value.strip())
    return out


def _http_date(value: str) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def _rfc3339(value: str) -> float | None:
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def _retry_after(headers: Mapping[str, str], info: _Info, text: str, now: float) -> float | None:
    """The first explicit retry delay: retry-after-ms, Retry-After, RetryInfo, the message."""
    value = headers.get("retry-after-ms")
    if value is not None:
        ms = _number(value)
        if ms is not None:
            return ms / 1000.0
    value = headers.get("retry-after")
    if value:
        secs = _number(value)
        if secs is not None:
            return secs
        when = _http_date(value)
        if when is not None:
            return max(0.0, when - now)
    if info.retry_delay is not None:
        return info.retry_delay
    m = _RETRY_IN.search(text)
    if m is None:
        return None
    found = m.group(1)
    if _GO_DURATION_FULL.fullmatch(found):
        return _go_duration(found)
    return _words_duration(found)


def _window_reset(headers: Mapping[str, str], now: float) -> float | None:
    """When the exhausted rate-limit window resets (Anthropic or OpenAI headers), if any."""
    resets: list[float] = []
    for name, value in headers.items():
        if name.startswith("anthropic-ratelimit-") and name.endswith("-remaining"):
            if value.strip() == "0":
                when = _rfc3339(headers.get(name[: -len("remaining")] + "reset", ""))
                if when is not None:
                    resets.append(when)
        elif name.startswith("x-ratelimit-remaining-") and value.strip() == "0":
            dur = _go_duration(headers.get("x-ratelimit-reset-" + name[22:], ""))
            if dur is not None:
                resets.append(now + dur)
    resets = [r for r in resets if r > now]  # a reset already past says nothing
    return max(resets) if resets else None


def _codex_windows(headers: Mapping[str, str], now: float) -> tuple[bool, float | None]:
    """Whether a Codex usage window is full, and when the latest full one resets."""
    full = False
    resets: list[float] = []
    for window in ("primary", "secondary"):
        used = _number(headers.get(f"x-codex-{window}-used-percent", ""))
        if used is None or used < 100:
            continue
        full = True
        at = _number(headers.get(f"x-codex-{window}-reset-at", ""))
        if at is not None and at > now:
            resets.append(at)
            continue
        after = _number(headers.get(f"x-codex-{window}-reset-after-seconds", ""))
        if after is not None:
            resets.append(now + after)
    return full, (max(resets) if resets else None)


def _named_reset(message: str) -> float | None:
    """A reset time written in the message.

    GLM (code 1308) writes China time without a zone: "您的限额将在 2026-08-25 07:41:44 重置";
    a zone written after the time (``Z``, ``+08:00``) is honoured.
    """
    m = _MESSAGE_DATETIME.search(message)
    if m is None:
        return None
    written = m.group(7)
    try:
        zone = _CHINA_TIME
        if written in ("z", "Z"):
            zone = UTC
        elif written:
            digits = written[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            zone = timezone(-offset if written[0] == "-" else offset)
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        return datetime(y, mo, d, h, mi, s, tzinfo=zone).timestamp()
    except (ValueError, OverflowError):
        return None


# Gemini's per-day quotas reset at midnight Pacific time (Google's documented quota day).
_PACIFIC = ZoneInfo("America/Los_Angeles")


def next_pacific_midnight(now: float) -> float:
    """The first midnight in America/Los_Angeles after `now` (epoch seconds), DST included."""
    day = datetime.fromtimestamp(now, _PACIFIC).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=_PACIFIC).timestamp()


def _quota_reset(
    info: _Info, headers: Mapping[str, str], codex_reset: float | None, now: float
) -> float | None:
    if info.resets_at is not None and info.resets_at > now:
        return info.resets_at
    if info.resets_in is not None:
        return now + info.resets_in
    if codex_reset is not None:
        return codex_reset
    named = _named_reset(info.message)
    if named is not None and named > now:
        return named
    window = _window_reset(headers, now)
    if window is None and info.daily_quota:
        # A per-day quota with no reset named comes back with Google's quota day.
        return next_pacific_midnight(now)
    return window


def _matches(
    rule: Rule, status: int | None, ids: Sequence[str], text: str, facts: set[Evidence]
) -> bool:
    if rule.statuses is not None and status not in rule.statuses:
        return False
    if not rule.needs <= facts:
        return False
    if not rule.codes and rule.pattern is None:
        return True
    if rule.codes and any(i in rule.codes for i in ids):
        return True
    return rule.pattern is not None and rule.pattern.search(text) is not None


def _classify(
    status: int | None,
    headers: dict[str, str],
    payload: object,
    body_text: str,
    now: float,
) -> Failure:
    info = _Info()
    _read_payload(payload, info)
    for k, v in info.headers.items():
        headers.setdefault(k, v)
    # Header-declared AWS exception names (x-amzn-ErrorType, or an event-stream frame header).
    for name in ("x-amzn-errortype", ":exception-type", ":error-code"):
        ident = _id(headers.get(name))
        if ident is not None:
            info.ids.append(ident)
    if status is None:
        status = info.status
    if info.message:
        message = info.message[:_MAX_MESSAGE]
        text = " ".join([info.message, *info.extra_text]).lower()
    else:
        # Not JSON, or JSON without a message field: search the whole (bounded) body.
        message = " ".join(body_text[: _MAX_MESSAGE * 4].split())[:_MAX_MESSAGE]
        text = " ".join([body_text, *info.extra_text]).lower()

    retry_after = _retry_after(headers, info, text, now)
    codex_full, codex_reset = _codex_windows(headers, now)
    facts: set[Evidence] = set()
    if retry_after is not None:
        facts.add(Evidence.RETRY_HINT)
    if info.daily_quota:
        facts.add(Evidence.DAILY_QUOTA)
    if codex_full:
        facts.add(Evidence.QUOTA_HEADERS_FULL)

    rule = next(r for r in RULES if _matches(r, status, info.ids, text, facts))
    policy = KIND_POLICY[rule.kind]
    pause = policy.pause
    pause_secs: float | None = None
    reset_at: float | None = None
    if rule.kind is FailureKind.QUOTA_USED_UP:
        reset_at = _quota_reset(info, headers, codex_reset, now)
        pause_secs = max(0.0, reset_at - now) if reset_at is not None else retry_after
    elif rule.kind is FailureKind.RATE_LIMITED:
        reset_at = _window_reset(headers, now)
        if retry_after is not None:
            pause_secs = retry_after
        elif reset_at is not None:
            pause_secs = max(0.0, reset_at - now)
        else:
            pause = PauseRule.UNEXPLAINED  # a rate limit without a named pause
    temporary = policy.temporary
    if status is not None and status >= 500 and status not in TEMPORARY_STATUSES:
        temporary = False
    return Failure(
        kind=rule.kind,
        failover=policy.failover,
        temporary=temporary,
        pause=pause,
        pause_secs=pause_secs,
        reset_at=reset_at,
        retry_after_secs=retry_after,
        status=status,
        message=message,
        error_type=info.error_type or (info.ids[0] if info.ids else None),
        rule=rule.name,
    )


def classify_response(
    status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes, *, now: float
) -> Failure:
    """Classify an HTTP error response. Reads at most `MAX_BODY_BYTES` of `body`; never raises."""
    raw = bytes(body[:MAX_BODY_BYTES])
    payload: object = None
    try:
        payload = _json.loads(raw)
    except ValueError:  # JSONDecodeError: HTML, plain text, truncated JSON
        payload = None
    return _classify(status, _header_map(headers), payload, raw.decode("utf-8", "replace"), now)


def classify_stream_error(dialect: Dialect, payload: object, *, now: float) -> Failure:
    """Classify an error event received inside a stream (before or after content).

    `payload` is the event's parsed JSON (or its raw text when it did not parse): an Anthropic
    ``error`` event, a Responses ``response.failed`` / ``error`` event (a Codex one may carry its
    ``status_code`` and ``headers``), a Chat chunk with ``error``, or a Gemini error object. An
    error code that is an HTTP status (Gemini, relays) is read as the status. Never raises.
    """
    del dialect  # every dialect's error shape is recognised by its own fields
    if isinstance(payload, bytes | bytearray):
        payload = bytes(payload[:MAX_BODY_BYTES]).decode("utf-8", "replace")
    if isinstance(payload, str):
        text = payload[:MAX_BODY_BYTES]
        try:
            parsed: object = _json.loads(text)
        except ValueError:
            parsed = None
        return _classify(None, {}, parsed, text, now)
    return _classify(None, {}, payload, "", now)


def _fixed(kind: FailureKind, *, message: str, rule: str) -> Failure:
    policy = KIND_POLICY[kind]
    return Failure(
        kind=kind,
        failover=policy.failover,
        temporary=policy.temporary,
        pause=policy.pause,
        message=message,
        rule=rule,
    )


def classify_transport(fault: TransportFault) -> Failure:
    """Classify a fault below HTTP: a connect failure, or a body that broke before content."""
    if fault is TransportFault.BODY_BROKEN:
        return _fixed(
            FailureKind.STREAM_ENDED_EARLY,
            message="the upstream connection broke before any content",
            rule=f"transport_{fault.value}",
        )
    return _fixed(
        FailureKind.CONNECT,
        message=f"could not reach the upstream ({fault.value})",
        rule=f"transport_{fault.value}",
    )


def stream_ended_early() -> Failure:
    """The stream broke or ended before its first content (temporary, fails over)."""
    return _fixed(
        FailureKind.STREAM_ENDED_EARLY,
        message="the upstream stream ended before any content",
        rule="stream_ended_early",
    )


def idle_timeout() -> Failure:
    """No content within the idle timeout (fails over, not retried on the same upstream)."""
    return _fixed(
        FailureKind.IDLE_TIMEOUT,
        message="the upstream sent nothing within the idle timeout",
        rule="idle_timeout",
    )
