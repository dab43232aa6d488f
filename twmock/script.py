"""The mock upstream's scripting model: what an answer looks like, and how a request fails.

A `Script` is plain, frozen data. It is made once per mock instance (from `MockSettings` or the
command line) and can be overridden per request by the JSON header ``x-mock-script``, whose
fields are merged over the instance's script (`Script.merged`). The same field names are used in
the JSON header, in ``--script`` on the command line and in docs/mock-upstream.md.

A script has three groups of fields:

* the **answer**: ``text`` or ``chunks``/``chunk_size``, ``reasoning``, ``tool_calls`` (+
  ``tool_name``, ``tool_arguments``, ``tool_pieces``), ``finish``, ``usage``, ``echo``, and the
  timing ``head_delay``, ``first_delay``, ``chunk_delay``;
* the **failure**: ``error``, ``stream_error_after``, ``break_after``, ``stall_after``,
  ``silence``, ``reset_before_head``;
* the **selectors** ``fail_first``, ``fail_every``, ``fail_rate``, which say *which* requests
  get the failure. Without a selector every request gets it; with one, only the selected
  requests do, and a selected request with no failure given gets the format's "overloaded" error.

Parsing is strict: an unknown field or a value of the wrong type is a `ScriptError`, so a typo in
a test's script fails loudly instead of silently playing the default answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Literal

from twproto import json_dumps, json_loads
from twproto.sigv4 import AwsCredentials

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_REASONING",
    "ErrorSpec",
    "Finish",
    "MockSettings",
    "Script",
    "ScriptError",
    "SilenceMode",
    "Usage",
    "parse_script",
]

DEFAULT_REASONING = (
    "The user wants a short answer. I will check what was asked, think about the simplest "
    "correct reply, and then write it out plainly."
)


# What GET /v1/models lists; any other model name is answered just the same.
DEFAULT_MODELS = ("claude-sonnet-4-5", "gpt-4.1", "gpt-5", "gemini-2.5-flash")


class ScriptError(ValueError):
    """A script (settings, ``--script`` or the ``x-mock-script`` header) is not valid."""


class SilenceMode(StrEnum):
    BEFORE_HEAD = "before_head"
    AFTER_HEAD = "after_head"


Finish = Literal["stop", "length", "blocked"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts the answer reports.

    ``input`` is the uncached input (Anthropic's sense); ``cache_read``/``cache_write`` are on
    top of it, so OpenAI's prompt_tokens and Gemini's promptTokenCount are their sum. ``output``
    includes ``reasoning``. None means "estimate": input from the request's size (4 bytes a
    token), output and reasoning from the answer's characters (4 a token).
    """

    input: int | None = None
    output: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorSpec:
    """An error to answer with.

    ``status`` None means the format's own "overloaded" status (Anthropic 529, others 503).
    ``shape`` names a provider body from `twmock.shapes` (e.g. ``glm-1308``); then the
    status defaults to that shape's. ``retry_after`` (seconds) becomes a ``Retry-After`` header
    (Gemini: a RetryInfo ``retryDelay`` in the body), ``retry_after_ms`` a ``retry-after-ms``
    header; ``resets_in`` (seconds, default 3600) is when a quota shape says the quota resets
    (Codex ``resets_at``, GLM 1308's reset time, Anthropic's ratelimit reset headers);
    ``headers`` are added as given; ``delay`` holds the error back that many seconds.
    """

    status: int | None = None
    shape: str | None = None
    message: str | None = None
    retry_after: float | None = None
    retry_after_ms: int | None = None
    resets_in: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.status is not None and not 400 <= self.status <= 599:
            raise ScriptError(f"error status must be 4xx or 5xx, not {self.status}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """One mock behaviour; see the module docstring and docs/mock-upstream.md."""

    # the answer
    text: str | None = None
    chunks: int | None = None
    chunk_size: int = 4
    reasoning: str | None = None
    tool_calls: int = 0
    tool_name: str | None = None
    tool_arguments: str | None = None  # JSON object text
    tool_pieces: int = 3
    finish: Finish = "stop"
    usage: Usage = field(default_factory=Usage)
    echo: bool = False
    validate: bool = True
    # A request carrying an earlier answer (a trailing assistant message, or one followed by a
    # request to continue) that `text` starts with gets the rest of `text`, starting this many
    # characters early (a repeat). None: every request gets the whole answer.
    continue_repeat: int | None = None
    # A request ending in an assistant message (a prefill) gets a 400 that names the prefill.
    refuse_prefill: bool = False
    # timing
    head_delay: float = 0.0
    first_delay: float = 0.0
    chunk_delay: float = 0.0
    # the failure
    error: ErrorSpec | None = None
    stream_error_after: int | None = None
    break_after: int | None = None
    stall_after: int | None = None
    silence: SilenceMode | None = None
    reset_before_head: bool = False
    # which requests fail
    fail_first: int = 0
    fail_every: int = 0
    fail_rate: float = 0.0

    @property
    def has_selector(self) -> bool:
        return self.fail_first > 0 or self.fail_every > 0 or self.fail_rate > 0.0

    @property
    def has_failure(self) -> bool:
        return (
            self.error is not None
            or self.stream_error_after is not None
            or self.break_after is not None
            or self.stall_after is not None
            or self.silence is not None
            or self.reset_before_head
        )

    def fails(self, number: int, draw: float) -> bool:
        """Whether request `number` (1-based, per instance) with random `draw` in [0, 1) fails."""
        if not self.has_selector:
            return self.has_failure
        if 0 < number <= self.fail_first:
            return True
        if self.fail_every > 0 and number > 0 and number % self.fail_every == 0:
            return True
        return draw < self.fail_rate

    def merged(self, overrides: Mapping[str, Any]) -> Script:
        """This script with the fields of `overrides` (script JSON) replaced."""
        return parse_script(overrides, base=self)

    def answer_only(self) -> Script:
        """This script without its failure (what a request that is not selected plays)."""
        if not self.has_failure:
            return self
        return replace(
            self,
            error=None,
            stream_error_after=None,
            break_after=None,
            stall_after=None,
            silence=None,
            reset_before_head=False,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MockSettings:
    """One mock instance.

    `script` plays for every request; `profiles` maps a first path segment to another script, so
    one instance can play several upstreams (``http://127.0.0.1:9100/flaky/v1/messages`` uses
    profile ``flaky``); each profile counts its own requests for the fail selectors. `seed`
    fixes the random draws (fail_rate, ids). `keep_received` bounds the request log.
    """

    script: Script = field(default_factory=Script)
    profiles: Mapping[str, Script] = field(default_factory=dict)
    seed: int | None = None
    keep_received: int = 100
    allow_script_header: bool = True
    models: tuple[str, ...] = DEFAULT_MODELS
    silence_limit: float = 3600.0
    # Bedrock's authentication (twmock.serve.bedrock): SigV4 with these credentials in this
    # region, and/or a Bedrock API key as a bearer token. Neither: Bedrock paths take anyone.
    aws_credentials: AwsCredentials | None = None
    aws_region: str = "us-east-1"
    bedrock_api_key: str | None = None
    # Vertex AI's authentication (twmock.serve.cloud): access tokens accepted as they are, and
    # service accounts (client_email → PEM public key) whose signed grants the mock's token
    # endpoint (POST /token) exchanges for tokens lasting `google_token_lifetime` seconds.
    # Neither: Vertex paths take anyone.
    vertex_tokens: frozenset[str] = frozenset()
    google_service_accounts: Mapping[str, str] = field(default_factory=dict)
    google_token_lifetime: int = 3600
    # Azure OpenAI's: the resource key (``api-key``) and/or an Entra ID token (bearer).
    # Neither: Azure paths take anyone.
    azure_api_key: str | None = None
    azure_entra_token: str | None = None

    def __post_init__(self) -> None:
        for name in self.profiles:
            if not name or "/" in name or name in _RESERVED_SEGMENTS:
                raise ScriptError(f"profile name {name!r} is empty, has '/' or is an API segment")


# First path segments the APIs themselves use; a profile may not shadow them.
_RESERVED_SEGMENTS = frozenset(
    {
        "v1",
        "v1beta",
        "v1alpha",
        "chat",
        "responses",
        "messages",
        "models",
        "backend-api",
        "healthz",
        "model",
        "openai",
        "token",
    }
)


# ---------------------------------------------------------------------------------------------
# parsing


def _int(name: str, *, low: int = 0) -> Callable[[Any, Script], int]:
    def conv(value: Any, base: Script) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ScriptError(f"{name}: expected an integer >= {low}, got {value!r}")
        return value

    return conv


def _opt_int(name: str) -> Callable[[Any, Script], int | None]:
    conv = _int(name)

    def opt(value: Any, base: Script) -> int | None:
        return None if value is None else conv(value, base)

    return opt


def _float(name: str, *, high: float = math.inf) -> Callable[[Any, Script], float]:
    def conv(value: Any, base: Script) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScriptError(f"{name}: expected a number, got {value!r}")
        number = float(value)
        if not 0.0 <= number <= high or math.isnan(number):
            raise ScriptError(f"{name}: expected a number in [0, {high}], got {value!r}")
        return number

    return conv


def _bool(name: str) -> Callable[[Any, Script], bool]:
    def conv(value: Any, base: Script) -> bool:
        if not isinstance(value, bool):
            raise ScriptError(f"{name}: expected true or false, got {value!r}")
        return value

    return conv


def _text(name: str, value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        # A lone surrogate cannot be written as JSON; refuse it here rather than mid-answer.
        raise ScriptError(f"{name}: not valid Unicode text") from None
    return value


def _opt_str(name: str) -> Callable[[Any, Script], str | None]:
    def conv(value: Any, base: Script) -> str | None:
        if value is not None and not isinstance(value, str):
            raise ScriptError(f"{name}: expected a string, got {value!r}")
        return None if value is None else _text(name, value)

    return conv


def _reasoning(value: Any, base: Script) -> str | None:
    if value is True:
        return DEFAULT_REASONING
    if value is None or value is False:
        return None
    if isinstance(value, str):
        return _text("reasoning", value)
    raise ScriptError(f"reasoning: expected a string or true/false, got {value!r}")


def _tool_arguments(value: Any, base: Script) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return json_dumps(value).decode()
    if isinstance(value, str):
        try:
            parsed = json_loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return value
    raise ScriptError(f"tool_arguments: expected a JSON object, got {value!r}")


def _finish(value: Any, base: Script) -> Finish:
    if value == "stop":
        return "stop"
    if value == "length":
        return "length"
    if value == "blocked":
        return "blocked"
    raise ScriptError(f"finish: expected 'stop', 'length' or 'blocked', got {value!r}")


def _silence(value: Any, base: Script) -> SilenceMode | None:
    if value is None or value is False:
        return None
    if value is True:
        return SilenceMode.AFTER_HEAD
    try:
        return SilenceMode(value)
    except ValueError:
        raise ScriptError(
            f"silence: expected 'before_head', 'after_head', true or false, got {value!r}"
        ) from None


_USAGE_FIELDS = {f.name for f in fields(Usage)}


def _usage(value: Any, base: Script) -> Usage:
    if not isinstance(value, dict):
        raise ScriptError(f"usage: expected an object, got {value!r}")
    changes: dict[str, int | None] = {}
    for key, item in value.items():
        if key not in _USAGE_FIELDS:
            raise ScriptError(f"usage: unknown field {key!r} (known: {sorted(_USAGE_FIELDS)})")
        if key in ("cache_read", "cache_write"):
            changes[key] = _int(f"usage.{key}")(item, base)
        else:
            changes[key] = _opt_int(f"usage.{key}")(item, base)
    return replace(base.usage, **changes)  # type: ignore[arg-type]


_ERROR_FIELDS = {f.name for f in fields(ErrorSpec)}


def parse_error(value: Any) -> ErrorSpec | None:
    """``error``: a status (429), a shape name ("glm-1308"), or an object of ErrorSpec fields."""
    if value is None or value is False:
        return None
    if value is True:
        return ErrorSpec()
    if isinstance(value, int) and not isinstance(value, bool):
        return ErrorSpec(status=value)
    if isinstance(value, str):
        return ErrorSpec(shape=value)
    if not isinstance(value, dict):
        raise ScriptError(f"error: expected a status, a shape name or an object, got {value!r}")
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        if key not in _ERROR_FIELDS:
            raise ScriptError(f"error: unknown field {key!r} (known: {sorted(_ERROR_FIELDS)})")
        if key == "status":
            if item is not None and (isinstance(item, bool) or not isinstance(item, int)):
                raise ScriptError(f"error.status: expected an integer, got {item!r}")
        elif key in ("shape", "message"):
            if item is not None and not isinstance(item, str):
                raise ScriptError(f"error.{key}: expected a string, got {item!r}")
        elif key in ("retry_after", "resets_in"):
            item = None if item is None else _float(f"error.{key}")(item, Script())
        elif key == "retry_after_ms":
            item = None if item is None else _int("error.retry_after_ms")(item, Script())
        elif key == "delay":
            item = _float("error.delay")(item, Script())
        elif key == "headers":
            if not isinstance(item, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in item.items()
            ):
                raise ScriptError(f"error.headers: expected an object of strings, got {item!r}")
            item = tuple((k.lower(), v) for k, v in item.items())
        kwargs[key] = item
    return ErrorSpec(**kwargs)


def _error(value: Any, base: Script) -> ErrorSpec | None:
    return parse_error(value)


_FIELDS: dict[str, Callable[[Any, Script], Any]] = {
    "text": _opt_str("text"),
    "chunks": _opt_int("chunks"),
    "chunk_size": _int("chunk_size", low=1),
    "reasoning": _reasoning,
    "tool_calls": _int("tool_calls"),
    "tool_name": _opt_str("tool_name"),
    "tool_arguments": _tool_arguments,
    "tool_pieces": _int("tool_pieces", low=1),
    "finish": _finish,
    "usage": _usage,
    "echo": _bool("echo"),
    "validate": _bool("validate"),
    "continue_repeat": _opt_int("continue_repeat"),
    "refuse_prefill": _bool("refuse_prefill"),
    "head_delay": _float("head_delay"),
    "first_delay": _float("first_delay"),
    "chunk_delay": _float("chunk_delay"),
    "error": _error,
    "stream_error_after": _opt_int("stream_error_after"),
    "break_after": _opt_int("break_after"),
    "stall_after": _opt_int("stall_after"),
    "silence": _silence,
    "reset_before_head": _bool("reset_before_head"),
    "fail_first": _int("fail_first"),
    "fail_every": _int("fail_every"),
    "fail_rate": _float("fail_rate", high=1.0),
}

# Spellings accepted for readability; each maps to a canonical field and a value converter.
_ALIASES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # an in-stream error right after the opening events
    "stream_error_before_content": (
        "stream_error_after",
        lambda v: 0 if v is True else None if v is False else v,
    ),
}

SCRIPT_FIELDS: tuple[str, ...] = (*_FIELDS, *_ALIASES)


def parse_script(obj: Any, *, base: Script | None = None) -> Script:
    """Parse script JSON (a dict) over `base` (default: the default script)."""
    if isinstance(obj, str | bytes):
        try:
            obj = json_loads(obj)
        except ValueError as exc:
            raise ScriptError(f"script is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ScriptError(f"script must be a JSON object, got {type(obj).__name__}")
    script = base if base is not None else Script()
    changes: dict[str, Any] = {}
    for key, value in obj.items():
        if key in _ALIASES:
            if not isinstance(value, bool):
                raise ScriptError(f"{key}: expected true or false, got {value!r}")
            key, adapt = _ALIASES[key]
            value = adapt(value)
        conv = _FIELDS.get(key)
        if conv is None:
            raise ScriptError(f"unknown script field {key!r} (known: {', '.join(SCRIPT_FIELDS)})")
        changes[key] = conv(value, script)
    if not changes:
        return script
    return replace(script, **changes)
