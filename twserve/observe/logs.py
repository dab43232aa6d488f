"""The gateway's log: text or JSON lines, an access line per request, and the operator's events.

Theory of operation
-------------------
Every record goes through one handler on the root logger, formatted by `TextFormatter` (one
line: time, level, logger, message, then ``name=value`` pairs) or `JsonFormatter` (one JSON
object a line, for a log shipper), chosen by ``--log-format`` or ``observability.log_format``
(`configure_logging`). A record carries its structured fields in ``extra={"fields": {...}}``:
the JSON form puts them at the top level of the object, the text form after the message.

`ObservationLog` writes the structured records. It is wired as a row listener (each stored row
is one request that ended: its access line, `access_fields`) and as an event bus listener
(upstream paused and resumed, configs applied and refused, key limit alerts, shared state and
store changes), so nothing is added to the request path. Its fields come from the row and the
events, which hold the key's *name* and masked config excerpts: no secret reaches the log.

Lines are written by `twserve.observe.writer.LineWriter` (`configure_logging`), a bounded
queue and a thread of its own, so a log stream that does not take lines never stops the loop.
With that writer (`ObservationLog.follow`), an access line costs the loop one tuple put on the
queue: the row is not changed once recorded, so its fields are read and the line formatted on
the writer's thread (`render_text`, `render_json`: plain string operations, no LogRecord).
Without it (the gateway embedded in a program with handlers of its own) the access line goes
through the logging module like every other record. With ``access_log: false`` (or the logger
above INFO) it is one attribute test.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

from twengine.config import Config, LogFormat, defaults
from twproto import json_dumps
from twserve.events import (
    ConfigRejected,
    ConfigReloaded,
    Event,
    HealthChanged,
    KeyLimitAlert,
    SharedStateChanged,
    StoreRecovered,
    StoreUnavailable,
)
from twserve.observe.writer import Access, LineWriter
from twserve.store.sqlite import RequestRow

__all__ = (
    "ACCESS_LOGGER",
    "JsonFormatter",
    "ObservationLog",
    "TextFormatter",
    "access_fields",
    "configure_logging",
    "outcome",
    "render_json",
    "render_text",
)

ACCESS_LOGGER = "twserve.access"
_QUEUE_LINES = defaults.OBSERVABILITY["log_queue_lines"]
EVENTS_LOGGER = "twserve.events"

# The attribute a record's structured fields travel in (``extra={"fields": ...}``).
_FIELDS = "fields"


# The last second formatted, per form: lines come many to a second, strftime is the dear part.
_SECOND: dict[str, tuple[int, str]] = {"utc": (-1, ""), "local": (-1, "")}


def _utc(created: float) -> str:
    """An RFC 3339 UTC time with milliseconds, the form log shippers parse without help."""
    whole = int(created)
    second, stamp = _SECOND["utc"]
    if second != whole:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _SECOND["utc"] = (whole, stamp)
    return f"{stamp}.{int((created - whole) * 1000):03d}Z"


def _local(created: float) -> str:
    """The text form's time, as `logging.Formatter` writes ``asctime``: local, milliseconds."""
    whole = int(created)
    second, stamp = _SECOND["local"]
    if second != whole:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole))
        _SECOND["local"] = (whole, stamp)
    return f"{stamp},{int((created - whole) * 1000):03d}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``msg`` and the record's
    fields at the top level (a field never replaces those four)."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, _FIELDS, None)
        if isinstance(extra, Mapping):
            for name, value in extra.items():
                body.setdefault(name, value)
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json_dumps(body).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message name=value …``; a value with a space, a quote or an ``=``
    is written as a JSON string so that the line splits back into its pairs."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = getattr(record, _FIELDS, None)
        if not isinstance(extra, Mapping) or not extra:
            return line
        pairs = " ".join(f"{name}={_text_value(value)}" for name, value in extra.items())
        head, sep, rest = line.partition("\n")  # a traceback stays below the pairs
        return f"{head} {pairs}{sep}{rest}"


# A text value written bare: no space, quote, equals sign, backslash or control character.
_BARE = re.compile(r'[^\s"=\\\x00-\x1f\x7f]+')


_BARE_MATCH = _BARE.fullmatch


def _text_values(values: Iterable[object]) -> tuple[str, ...]:
    """`_text_value` of each, inlined for the kinds an access line holds."""
    out: list[str] = []
    add = out.append
    for value in values:
        if value is None:
            add("-")
        elif value is True:
            add("true")
        elif value is False:
            add("false")
        elif type(value) is int:
            add(str(value))
        elif type(value) is str:
            add(value if _BARE_MATCH(value) else json_dumps(value).decode())
        else:
            add(_text_value(value))
    return tuple(out)


def _text_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if _BARE_MATCH(value) else json_dumps(value).decode()
    if isinstance(value, (int, float)):
        return str(value)
    return json_dumps(value).decode()


def configure_logging(
    log_format: LogFormat | str,
    *,
    level: int = logging.INFO,
    stream: TextIO | None = None,
    queue_lines: int | None = None,
) -> LineWriter:
    """One `LineWriter` on the root logger writing `log_format` lines to `stream` (stderr) from
    its thread, queueing at most `queue_lines` (``observability.log_queue_lines``); the
    handlers there before are removed (a previous writer is closed: its lines are written).
    Returns the writer."""
    fmt = LogFormat(log_format)
    bound = queue_lines if queue_lines is not None else int(_QUEUE_LINES.default or 0)
    handler = LineWriter(stream if stream is not None else sys.stderr, bound)
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, LineWriter):
            old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def outcome(row: RequestRow) -> str:
    """How the request ended: ``ok``, ``local`` (answered by the gateway), ``cancelled`` (the
    client left), ``refused`` (stopped before any upstream was asked) or ``error``."""
    if row.cancelled:
        return "cancelled"
    if row.status is not None and row.status < 400:
        return "local" if row.local else "ok"
    if row.provider is None and not _sent(row):
        return "refused"
    return "error"


def _failed(row: RequestRow) -> bool:
    """`outcome` is ``error`` (without building the attempts' count when it is not)."""
    if row.cancelled or (row.status is not None and row.status < 400):
        return False
    return not (row.provider is None and not _sent(row))


def _attempts(row: RequestRow) -> list[dict[str, Any]]:
    routing = row.routing
    if not routing:
        return []
    found = routing.get("attempts")
    return found if isinstance(found, list) else []


def _sent(row: RequestRow) -> int:
    return sum(1 for a in _attempts(row) if a.get("outcome") != "skipped")


def _served_model(row: RequestRow) -> str | None:
    """The model name sent to the upstream that answered (its last attempt there)."""
    if row.provider is None:
        return None
    for attempt in reversed(_attempts(row)):
        if attempt.get("provider") == row.provider:
            model = attempt.get("model")
            return model if isinstance(model, str) else None
    return None


def access_fields(row: RequestRow) -> dict[str, Any]:
    """The access line's fields (docs/observability.md, "The access line")."""
    return {
        "request_id": row.id,
        "correlation_id": row.correlation_id,
        "key": row.key_name,
        "format": row.format,
        "path": row.path,
        "stream": row.stream,
        "model": row.model,
        "model_served": _served_model(row),
        "upstream": row.provider,
        "status": row.status,
        "outcome": outcome(row),
        "code": row.error_code,
        "attempts": _sent(row),
        "ttfc_ms": row.ttfb_ms,
        "duration_ms": row.duration_ms,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "cache_read_tokens": row.cache_read_tokens,
        "cache_write_tokens": row.cache_write_tokens,
        "reasoning_tokens": row.reasoning_tokens,
        "cost_usd": row.cost_micros / 1e6 if row.cost_micros is not None else None,
        "cost_state": row.cost_state,
        "bytes_in": row.request_bytes,
        "bytes_out": row.answer_bytes,
    }


_LEVEL_NAMES = {logging.INFO: "INFO", logging.WARNING: "WARNING"}
_ACCESS_NAMES = tuple(access_fields(RequestRow(id="", ts=0.0, path="")))
_ACCESS_HEAD = f"{ACCESS_LOGGER}: request "
_ACCESS_TEMPLATE = _ACCESS_HEAD + " ".join(f"{name}=%s" for name in _ACCESS_NAMES)
_JSON_LEVELS = {logging.INFO: "info", logging.WARNING: "warning"}


def render_text(created: float, level: int, row: RequestRow) -> str:
    """The text access line, as `TextFormatter` writes the record (plain string work: one
    ``%`` over a template made once)."""
    fields = access_fields(row)
    head = f"{_local(created)} {_LEVEL_NAMES.get(level) or logging.getLevelName(level)} "
    if len(fields) != len(_ACCESS_NAMES):  # access_fields changed shape: say it all the same
        return head + _ACCESS_HEAD + " ".join(f"{n}={_text_value(v)}" for n, v in fields.items())
    return head + _ACCESS_TEMPLATE % _text_values(fields.values())


def render_json(created: float, level: int, row: RequestRow) -> str:
    """The JSON access line, as `JsonFormatter` writes the record."""
    body: dict[str, Any] = {
        "ts": _utc(created),
        "level": _JSON_LEVELS.get(level) or logging.getLevelName(level).lower(),
        "logger": ACCESS_LOGGER,
        "msg": "request",
    }
    body.update(access_fields(row))
    return json_dumps(body).decode()


# The events that have lines of their own.
_WRITTEN = frozenset(
    {
        HealthChanged,
        ConfigReloaded,
        ConfigRejected,
        KeyLimitAlert,
        SharedStateChanged,
        StoreUnavailable,
        StoreRecovered,
    }
)


class ObservationLog:
    """Writes the access lines and the operator's events; `config` is read at each line, so
    a reload that turns ``observability.access_log`` off applies at once."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self._config = config
        self.access = logging.getLogger(ACCESS_LOGGER)
        self.events = logging.getLogger(EVENTS_LOGGER)
        self._handler: logging.Handler | None = None
        self._pinned: LogFormat | None = None
        # With a LineWriter followed: access lines go to it as tuples, rendered by `_render`.
        self._writer: LineWriter | None = None
        self._render: Callable[[float, int, Any], str] = render_text
        self._wall: Callable[[], float] = time.time

    def follow(self, handler: logging.Handler, pinned: LogFormat | str | None = None) -> None:
        """Keep `handler`'s format the config's ``observability.log_format`` across reloads,
        unless the command line `pinned` one (``--log-format``). A `LineWriter` also takes the
        access lines straight from `on_row`, and its bound follows
        ``observability.log_queue_lines``."""
        self._handler = handler
        self._writer = handler if isinstance(handler, LineWriter) else None
        self._pinned = LogFormat(pinned) if pinned is not None else None
        self._take_format()

    def _take_format(self) -> None:
        if self._handler is None:
            return
        observability = self._config().observability
        fmt = self._pinned or observability.log_format
        wanted = JsonFormatter if fmt is LogFormat.JSON else TextFormatter
        self._render = render_json if fmt is LogFormat.JSON else render_text
        if type(self._handler.formatter) is not wanted:
            self._handler.setFormatter(wanted())
        if self._writer is not None:
            self._writer.bound = observability.log_queue_lines

    def on_row(self, row: RequestRow) -> None:
        if not self._config().observability.access_log or not self.access.isEnabledFor(
            logging.INFO
        ):
            return
        writer = self._writer
        if writer is not None:
            # The line is made on the writer's thread: the loop pays for one tuple.
            level = logging.WARNING if _failed(row) else logging.INFO
            if self.access.isEnabledFor(level):
                writer.put(Access(self._wall(), level, row, self._render))
            return
        fields = access_fields(row)
        level = logging.WARNING if fields["outcome"] == "error" else logging.INFO
        self.access.log(level, "request", extra={_FIELDS: fields})

    def on_event(self, event: Event) -> None:
        if type(event) not in _WRITTEN:
            return  # the request events (most of them): the access line is written from the row
        match event:
            case HealthChanged():
                self._health(event)
            case ConfigReloaded():
                self._take_format()
                self._write(
                    logging.INFO,
                    "config applied",
                    event="config_applied",
                    generation=event.generation,
                    config_version=event.config_version,
                    origin=event.origin,
                )
            case ConfigRejected():
                first = event.problems[0] if event.problems else None
                self._write(
                    logging.WARNING,
                    "config refused; the previous config keeps serving",
                    event="config_refused",
                    stage=event.stage,
                    config_version=event.config_version,
                    origin=event.origin,
                    problems=len(event.problems),
                    code=first.code if first else None,
                    path=first.path if first else None,
                    line=first.line if first else None,
                    message=first.message if first else None,
                )
            case KeyLimitAlert():
                self._write(
                    logging.WARNING,
                    "key limit alert",
                    event="key_limit",
                    key=event.key,
                    per=event.per,
                    measure=event.measure,
                    amount=event.amount,
                    used=event.used,
                    percent=event.percent,
                    reset=event.reset,
                )
            case SharedStateChanged():
                self._write(
                    logging.INFO if event.shared else logging.WARNING,
                    "shared state back" if event.shared else "shared state lost",
                    event="shared_state",
                    code=event.code,
                    detail=event.detail,
                )
            case StoreUnavailable():
                self._write(
                    logging.WARNING,
                    "request store unavailable",
                    event="store_unavailable",
                    code=event.code,
                    reason=event.reason,
                    held=event.held,
                    journal=event.journal,
                )
            case StoreRecovered():
                self._write(
                    logging.INFO,
                    "request store recovered",
                    event="store_recovered",
                    code=event.code,
                    rows=event.rows,
                    down_secs=event.down_secs,
                )
            case _:
                pass  # the request events are the access line's, written from the row

    def _health(self, event: HealthChanged) -> None:
        until = None
        if event.paused and event.pause_secs is not None:
            until = _utc(event.ts + event.pause_secs)
        self._write(
            logging.WARNING if event.paused else logging.INFO,
            "upstream paused" if event.paused else "upstream resumed",
            event="upstream_paused" if event.paused else "upstream_resumed",
            upstream=event.upstream,
            reason=event.reason,
            pause_secs=event.pause_secs,
            until=until,
            failures_in_row=event.failures_in_row,
        )

    def _write(self, level: int, text: str, **fields: Any) -> None:
        if self.events.isEnabledFor(level):
            self.events.log(level, text, extra={_FIELDS: fields})
