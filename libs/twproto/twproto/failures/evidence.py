"""Reading the evidence of a failure: the error's identifiers and message from a body of any
shape, and the times named in headers and messages (``Retry-After``, reset headers, quota
windows, durations written as words).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from itertools import islice
from zoneinfo import ZoneInfo

__all__ = ("next_pacific_midnight",)


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
