"""Notifications: the operator's events POSTed, signed, to the receivers of ``notifications[]``.

Theory of operation
-------------------
`Notifier` listens on the event bus (and is told of safe mode by the app). An event a receiver
asked for (``events:``) becomes one `Alert`: a kind (`NotifyEvent`), a state (``firing`` or
``resolved``), a one-line summary and its details. Each kind fires once per crossing: the key
limit alerts come from `twengine.limits`, once per level and window; an upstream fires when it is
paused and resolves when its pause ends; a route fires when its last upstream that was not
paused is paused (`routes_down`), and resolves when one comes back; safe mode fires when the
gateway starts in it and resolves when a config passes.

Delivery never touches a request: `Notifier.on_event` only appends to the receiver's bounded
queue (``max_queued``; an alert that finds it full is dropped and counted) and returns. One task
per receiver sends its queue in order, each POST bounded by ``timeout_secs`` as a whole; an
answer other than 2xx, a refused connection or a timeout is retried after ``backoff_secs``,
doubling at each retry (at most `MAX_BACKOFF_SECS`), up to ``max_attempts`` tries; then the alert
is dropped and counted as failed. The counts are in ``GET /status`` under ``notifications``.

Signature (docs/observability.md, "Verifying a notification"): each try carries
``x-twserve-timestamp`` (unix seconds, as text) and ``x-twserve-signature: v1=<hex>``, the hex
HMAC-SHA256 with the receiver's ``secret`` over ``timestamp + "." + body``. Retries sign again
with their own time; the body's ``id`` stays, so a receiver can drop a repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import httpcore

from twengine.config import (
    Config,
    Notification,
    NotifyEvent,
    NotifyFormat,
    TargetKind,
    resolve_template,
)
from twproto import json_dumps
from twserve.events import ConfigRejected, Event, HealthChanged, KeyLimitAlert

__all__ = (
    "MAX_BACKOFF_SECS",
    "Alert",
    "Notifier",
    "alert_body",
    "routes_down",
    "sign",
)

log = logging.getLogger("twserve.notify")

# The longest wait between two tries of one alert, however the doubling goes.
MAX_BACKOFF_SECS = 300.0
# The name `routes_down` gives the whole set of upstreams when the config has no routes.
EVERY_UPSTREAM = "*"


# The events that may become alerts (safe mode comes from the app: `Notifier.safe_mode`).
_HEARD = frozenset({KeyLimitAlert, HealthChanged, ConfigRejected})


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One notification, before it is shaped for a receiver's ``format``."""

    id: str
    kind: NotifyEvent
    state: str  # "firing" or "resolved"
    ts: float
    summary: str
    details: Mapping[str, Any]


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``x-twserve-signature`` value: ``v1=`` and the hex HMAC-SHA256 of
    ``timestamp + "." + body`` with `secret`."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def alert_body(alert: Alert, fmt: NotifyFormat) -> bytes:
    """The POST's body: the alert as JSON, or Slack's ``{"text": ...}``."""
    if fmt is NotifyFormat.SLACK:
        mark = "resolved" if alert.state == "resolved" else "alert"
        return json_dumps({"text": f"[twserve {mark}] {alert.summary}"})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(alert.ts))
    return json_dumps(
        {
            "id": alert.id,
            "event": alert.kind.value,
            "state": alert.state,
            "ts": alert.ts,
            "time": stamp,
            "summary": alert.summary,
            "details": dict(alert.details),
        }
    )


def _route_upstreams(config: Config) -> dict[str, frozenset[str]]:
    """Every route's upstreams: those its rules' ``to`` can send to."""
    everyone = frozenset(p.name for p in config.providers)
    if not config.routes:
        return {EVERY_UPSTREAM: everyone} if everyone else {}
    found: dict[str, frozenset[str]] = {}
    for route in config.routes:
        names: set[str] = set()
        for rule in route.rules:
            target = rule.to
            if target is None:
                continue
            if target.kind is TargetKind.ALL:
                names |= everyone
            elif target.kind is TargetKind.GROUP and target.name is not None:
                names.update(config.group(target.name).provider_names)
            elif target.kind is TargetKind.PROVIDER and target.name is not None:
                names.add(target.name)
            else:
                names.update(pin.provider for pin in target.pinned)
        if names:
            found[route.name] = frozenset(names)
    return found


def routes_down(config: Config, paused: frozenset[str]) -> dict[str, frozenset[str]]:
    """The routes all of whose upstreams are in `paused`, with those upstreams."""
    return {name: ups for name, ups in _route_upstreams(config).items() if ups <= paused}


@dataclass(slots=True)
class _Receiver:
    """One ``notifications[]`` entry's queue and counts (its settings follow reloads)."""

    settings: Notification
    queue: deque[Alert] = field(default_factory=deque)
    wake: anyio.Event | None = None  # made by the sending task, on the event loop
    sent: int = 0
    retries: int = 0
    failed: int = 0
    dropped: int = 0
    running: bool = False

    def status(self) -> dict[str, Any]:
        return {
            "url": self.settings.url,
            "queued": len(self.queue),
            "sent": self.sent,
            "retries": self.retries,
            "failed": self.failed,
            "dropped": self.dropped,
        }


class Notifier:
    """Turns events into alerts and sends them (module docs). `config` is read at each event,
    so a reload's ``notifications`` apply at once; `env` resolves the secrets' ``${VAR}``."""

    def __init__(
        self,
        config: Callable[[], Config],
        env: Mapping[str, str],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._env = env
        self._wall = wall
        self._receivers: dict[str, _Receiver] = {}
        self._paused: set[str] = set()
        self._down: set[str] = set()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._pool: httpcore.AsyncConnectionPool | None = None

    # -- what happened -----------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if type(event) not in _HEARD:
            return  # the request events: one set lookup each
        match event:
            case KeyLimitAlert():
                kind = (
                    NotifyEvent.KEY_LIMIT_100 if event.percent >= 100 else NotifyEvent.KEY_LIMIT_80
                )
                self._alert(
                    kind,
                    "firing",
                    f"key {event.key!r} reached {event.percent}% of its {event.per} "
                    f"{event.measure} limit ({event.used} of {event.amount})",
                    key=event.key,
                    per=event.per,
                    measure=event.measure,
                    amount=event.amount,
                    used=event.used,
                    percent=event.percent,
                    reset=event.reset,
                )
            case HealthChanged():
                self._health(event)
            case ConfigRejected():
                first = event.problems[0] if event.problems else None
                where = f" at {first.path}: {first.message}" if first else ""
                self._alert(
                    NotifyEvent.CONFIG_REFUSED,
                    "firing",
                    f"a config was refused ({event.stage}{where}); the previous one keeps serving",
                    stage=event.stage,
                    origin=event.origin,
                    config_version=event.config_version,
                    problems=len(event.problems),
                    code=first.code if first else None,
                    path=first.path if first else None,
                    line=first.line if first else None,
                )
            case _:
                pass

    def safe_mode(self, entered: bool, code: str | None = None, path: str | None = None) -> None:
        """The gateway started in safe mode (`entered`), or left it for a config that passed."""
        if entered:
            where = f": {code} at {path}" if code else ""
            self._alert(
                NotifyEvent.SAFE_MODE,
                "firing",
                f"the gateway is in safe mode, only the control plane serves{where}",
                code=code,
                path=path,
            )
        else:
            self._alert(NotifyEvent.SAFE_MODE, "resolved", "safe mode ended: a config passed")

    def _health(self, event: HealthChanged) -> None:
        if event.paused:
            self._paused.add(event.upstream)
            until = event.ts + event.pause_secs if event.pause_secs is not None else None
            self._alert(
                NotifyEvent.UPSTREAM_PAUSED,
                "firing",
                f"upstream {event.upstream!r} paused ({event.reason})",
                upstream=event.upstream,
                reason=event.reason,
                pause_secs=event.pause_secs,
                until=until,
                failures_in_row=event.failures_in_row,
            )
        else:
            self._paused.discard(event.upstream)
            self._alert(
                NotifyEvent.UPSTREAM_PAUSED,
                "resolved",
                f"upstream {event.upstream!r} resumed ({event.reason})",
                upstream=event.upstream,
                reason=event.reason,
            )
        down = routes_down(self._config(), frozenset(self._paused))
        for route in sorted(set(down) - self._down):
            self._alert(
                NotifyEvent.ROUTE_DOWN,
                "firing",
                f"every upstream of route {route!r} is paused",
                route=route,
                upstreams=sorted(down[route]),
            )
        for route in sorted(self._down - set(down)):
            self._alert(
                NotifyEvent.ROUTE_DOWN,
                "resolved",
                f"route {route!r} has an upstream again",
                route=route,
            )
        self._down = set(down)

    def _alert(self, kind: NotifyEvent, state: str, summary: str, **details: Any) -> None:
        wanted = [n for n in self._config().notifications if kind in n.events]
        if not wanted:
            return
        alert = Alert(
            id=secrets.token_hex(12),
            kind=kind,
            state=state,
            ts=self._wall(),
            summary=summary,
            details=details,
        )
        for settings in wanted:
            receiver = self._receivers.get(settings.name)
            if receiver is None:
                receiver = self._receivers[settings.name] = _Receiver(settings)
            receiver.settings = settings
            if len(receiver.queue) >= settings.max_queued:
                receiver.dropped += 1
                continue
            receiver.queue.append(alert)
            if receiver.wake is not None:
                receiver.wake.set()
            if not receiver.running and self._tasks is not None:
                receiver.running = True
                self._tasks.start_soon(self._send_queue, receiver)

    # -- sending -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``GET /status`` shows under ``notifications``."""
        receivers = {name: r.status() for name, r in self._receivers.items()}
        return {
            "receivers": receivers,
            "queued": sum(r["queued"] for r in receivers.values()),
            "dropped": sum(r.dropped + r.failed for r in self._receivers.values()),
        }

    async def run(self) -> None:
        """Send the receivers' queues until cancelled (the app's task group runs this)."""
        async with httpcore.AsyncConnectionPool(max_connections=16) as pool:
            self._pool = pool
            try:
                async with anyio.create_task_group() as tasks:
                    self._tasks = tasks
                    for receiver in self._receivers.values():
                        if receiver.queue and not receiver.running:
                            receiver.running = True
                            tasks.start_soon(self._send_queue, receiver)
                    await anyio.sleep_forever()
            finally:
                self._tasks = None
                self._pool = None

    async def _send_queue(self, receiver: _Receiver) -> None:
        try:
            while True:
                while receiver.queue:
                    alert = receiver.queue[0]
                    await self._deliver(receiver, alert)
                    receiver.queue.popleft()
                receiver.wake = anyio.Event()
                await receiver.wake.wait()
        finally:
            receiver.running = False

    async def _deliver(self, receiver: _Receiver, alert: Alert) -> None:
        settings = receiver.settings
        body = alert_body(alert, settings.format)
        backoff = settings.backoff_secs
        for attempt in range(settings.max_attempts):
            if attempt:
                receiver.retries += 1
                await anyio.sleep(min(backoff, MAX_BACKOFF_SECS))
                backoff *= 2
            why = await self._post(receiver.settings, alert, body)
            if why is None:
                receiver.sent += 1
                return
            log.info(
                "notification to %s not delivered (try %d of %d): %s",
                settings.name,
                attempt + 1,
                settings.max_attempts,
                why,
                extra={"fields": {"event": "notification_failed", "receiver": settings.name}},
            )
        receiver.failed += 1
        log.warning(
            "notification to %s dropped after %d tries",
            settings.name,
            settings.max_attempts,
            extra={
                "fields": {
                    "event": "notification_dropped",
                    "receiver": settings.name,
                    "kind": alert.kind.value,
                }
            },
        )

    async def _post(self, settings: Notification, alert: Alert, body: bytes) -> str | None:
        """One try: None when the receiver answered 2xx, else why not."""
        pool = self._pool
        if pool is None:
            return "not running"
        try:
            secret = resolve_template(settings.secret, self._env).encode()
        except Exception as exc:  # the variable went away since the config was checked
            return f"secret: {exc}"
        timestamp = str(int(self._wall()))
        headers = [
            (b"content-type", b"application/json"),
            (b"user-agent", b"twserve"),
            (b"x-twserve-event", alert.kind.value.encode()),
            (b"x-twserve-delivery", alert.id.encode()),
            (b"x-twserve-timestamp", timestamp.encode()),
            (b"x-twserve-signature", sign(secret, timestamp, body).encode()),
        ]
        limit = settings.timeout_secs
        timeouts = {"connect": limit, "read": limit, "write": limit, "pool": limit}
        try:
            with anyio.fail_after(limit):
                response = await pool.request(
                    "POST",
                    settings.url,
                    headers=headers,
                    content=body,
                    extensions={"timeout": timeouts},
                )
        except TimeoutError:
            return f"no answer within {limit:g} s"
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            return f"{type(exc).__name__}: {exc}"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= response.status < 300:
            return None
        return f"answered {response.status}"
