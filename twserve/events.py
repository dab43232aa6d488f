"""The gateway's events, and the in-process bus that carries them to whoever listens.

Theory of operation
-------------------
Events say what happened, after it happened: a request started, was routed, finished or failed;
an upstream was paused or came back; a config was applied or refused. Each is a frozen dataclass
named for what happened, turned into JSON by `event_json` (the control plane's ``GET /events``
streams them as SSE, one event per SSE event, the class name as the SSE event name).

`EventBus.publish` is synchronous and never waits: the gateway calls it from its request path,
which must not slow down because somebody is watching. It numbers the event (`Published.seq`,
one sequence for the whole bus), calls the synchronous `EventBus.listeners` (in-process
consumers such as the metrics' in-flight count), and offers the event to every `Subscription`.
A subscription is a bounded anyio memory stream; when its buffer is full the event is dropped
for that subscriber alone. Because every subscriber is offered every event, a gap in the
sequence numbers it receives is exactly what it missed: `Subscription.receive` reports it as a
`Dropped` marker in the place the events went missing, then carries on with the next event.

The bus is used from the event loop's thread only; publishing from a worker thread would need
``anyio.from_thread``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from twengine.config import Problem
from twengine.health import PauseChanged
from twengine.limits import LimitAlert as EngineLimitAlert
from twengine.router import RoutePlan
from twproto import json_dumps
from twserve.store.sqlite import RequestRow

__all__ = [
    "EVENT_TYPES",
    "ConfigProblem",
    "ConfigRejected",
    "ConfigReloaded",
    "Dropped",
    "Event",
    "EventBus",
    "HealthChanged",
    "KeyLimitAlert",
    "Published",
    "RequestAborted",
    "RequestFailed",
    "RequestFinished",
    "RequestRouted",
    "RequestStarted",
    "SharedStateChanged",
    "StoreRecovered",
    "StoreUnavailable",
    "Subscription",
    "event_json",
    "event_name",
]

log = logging.getLogger("twserve.events")

# Events a subscriber may fall behind by before it starts losing them.
DEFAULT_BUFFER = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestStarted:
    """A request passed the key check and is about to be read and routed.

    `key` is the gateway key's *name*; `format` the client's API format.
    """

    id: str
    ts: float
    path: str
    key: str | None
    format: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRouted:
    """Routing chose the upstreams to ask, in order (`candidates`; `sticky` comes first)."""

    id: str
    ts: float
    model: str | None
    stream: bool
    route: str | None
    rule: str | None
    group: str | None
    candidates: tuple[str, ...]
    sticky: str | None
    held: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFinished:
    """A request was answered (status below 400) and its answer was delivered whole."""

    id: str
    ts: float
    model: str | None
    provider: str | None
    status: int | None
    ttfb_ms: int | None
    duration_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFailed:
    """A request ended with an error status, or the client left before it ended (`cancelled`)."""

    id: str
    ts: float
    model: str | None
    provider: str | None
    status: int | None
    error_code: str | None
    duration_ms: int | None
    attempts: int
    cancelled: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAborted:
    """The control plane aborted running request `id` (``POST /requests/{id}/abort``);
    `stage` is where it was: ``key_wait`` (waiting for its key's turn) or ``relay``. Its
    `RequestFailed` (``gw.request.aborted``, `cancelled`) follows when its row is written."""

    id: str
    ts: float
    stage: str
    reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRetrying:
    """Every candidate failed temporarily before content: the request waits `backoff_ms`, then
    retry round `retry` begins (docs/failover.md, "Retry rounds"). Paired with the `RequestDequeued`
    that ends the wait."""

    id: str
    ts: float
    retry: int
    backoff_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDequeued:
    """A request that waited — a retry backoff, or for a slot — is sent on, to `provider`."""

    id: str
    ts: float
    provider: str
    retry: int
    queued_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthChanged:
    """An upstream was paused (`paused`, for `pause_secs`) or its pause ended (`reason`)."""

    ts: float
    upstream: str
    paused: bool
    reason: str
    pause_secs: float | None
    failures_in_row: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimitAlert:
    """A gateway key's limit reached `percent` (80 or 100) of `amount` in its current window.

    `measure` is requests, tokens or cost (cost amounts in micro-dollars); `reset` is when the
    window frees (unix seconds; None when nothing in a rolling window is counted yet)."""

    ts: float
    key: str
    per: str
    measure: str
    amount: int
    used: int
    percent: int
    reset: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedStateChanged:
    """The state shared across instances (``state.redis_url``) was lost — `shared` false: this
    instance counts limits, slots, pauses and affinity alone — or is in use again. `code` is
    ``gw.shared_state.lost`` or ``gw.shared_state.back``; `detail` says what failed."""

    ts: float
    shared: bool
    code: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigReloaded:
    """A new config is serving; `generation` counts the configs applied since start (1 first),
    `version` is the config schema's version, `config_version` names the file's bytes
    (``blake3:…``) and `origin` says where the change came from (file, control, cli)."""

    ts: float
    generation: int
    version: int
    config_version: str = ""
    origin: str = "file"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigProblem:
    """One problem of a refused config: its validation `stage` (yaml, schema, consistency,
    runtime), code, field path, 1-based `line` in the file and that line with secrets hidden."""

    code: str
    path: str
    message: str
    stage: str = "schema"
    line: int | None = None
    excerpt: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRejected:
    """A config failed validation; the previous one keeps serving. `stage` is the earliest
    stage that failed; `config_version` names the refused bytes."""

    ts: float
    problems: tuple[ConfigProblem, ...]
    stage: str = "schema"
    config_version: str = ""
    origin: str = "file"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreUnavailable:
    """The request store's database (PostgreSQL) stopped answering. Rows are kept: `held` in
    memory, `journal` in the local journal file; they are written when it returns."""

    ts: float
    code: str
    reason: str
    held: int
    journal: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreRecovered:
    """The request store's database answers again and took the `rows` kept meanwhile;
    it was away `down_secs`."""

    ts: float
    code: str
    rows: int
    down_secs: float


Event = (
    RequestStarted
    | RequestRouted
    | RequestRetrying
    | RequestDequeued
    | RequestFinished
    | RequestFailed
    | RequestAborted
    | HealthChanged
    | KeyLimitAlert
    | SharedStateChanged
    | ConfigReloaded
    | ConfigRejected
    | StoreUnavailable
    | StoreRecovered
)

EVENT_TYPES: tuple[type[Any], ...] = (
    RequestStarted,
    RequestRouted,
    RequestRetrying,
    RequestDequeued,
    RequestFinished,
    RequestFailed,
    RequestAborted,
    HealthChanged,
    KeyLimitAlert,
    SharedStateChanged,
    ConfigReloaded,
    ConfigRejected,
    StoreUnavailable,
    StoreRecovered,
)


def event_name(event: Event) -> str:
    """The event's name on the wire: its class name."""
    return type(event).__name__


def event_json(event: Event) -> bytes:
    """The event as a JSON object, its name under ``type``."""
    body: dict[str, Any] = {"type": event_name(event)}
    for f in fields(event):
        body[f.name] = getattr(event, f.name)
    return json_dumps(body)


@dataclass(frozen=True, slots=True)
class Published:
    """An event as the bus delivers it, with its place in the bus's sequence."""

    seq: int
    event: Event


@dataclass(frozen=True, slots=True)
class Dropped:
    """This subscriber missed `count` events here (its buffer was full); `total` so far."""

    count: int
    total: int


class Subscription:
    """One subscriber's bounded queue. Use as an async iterator or call `receive`."""

    def __init__(self, bus: EventBus, buffer: int) -> None:
        send, receive = anyio.create_memory_object_stream[Published](buffer)
        self._send: MemoryObjectSendStream[Published] = send
        self._receive: MemoryObjectReceiveStream[Published] = receive
        self._bus = bus
        self._expected: int | None = None
        self._held: Published | None = None
        self.dropped = 0

    def offer(self, item: Published) -> bool:
        """Queue `item` without waiting; False once the subscriber has gone."""
        try:
            self._send.send_nowait(item)
        except anyio.WouldBlock:
            self.dropped += 1
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    async def receive(self) -> Published | Dropped:
        """The next event, or a `Dropped` marker where events went missing."""
        item = self._held
        self._held = None
        if item is None:
            item = await self._receive.receive()
        if self._expected is not None and item.seq > self._expected:
            missed = item.seq - self._expected
            self._expected = None  # the held item passes the check on the next call
            self._held = item
            return Dropped(count=missed, total=self.dropped)
        self._expected = item.seq + 1
        return item

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Published | Dropped:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._bus.unsubscribe(self)
        self._send.close()
        self._receive.close()


class EventBus:
    """Publishes events to listeners and subscribers (see the module docstring).

    The `request_*`, `health_changed` and `config_*` methods build an event from what the
    gateway has at hand and publish it; `wall` stamps it.
    """

    def __init__(
        self,
        *,
        buffer: int = DEFAULT_BUFFER,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buffer = buffer
        self.wall = wall
        self.clock = clock
        self.listeners: list[Callable[[Event], None]] = []
        self._subscribers: list[Subscription] = []
        self._seq = 0

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, event: Event) -> None:
        """Deliver `event` now; never waits and never raises into the caller."""
        self._seq += 1
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not fail the request that published
                log.exception("event listener failed on %s", event_name(event))
        if not self._subscribers:
            return  # nobody watches /events (the usual case): no numbered item to build
        item = Published(seq=self._seq, event=event)
        gone = [sub for sub in self._subscribers if not sub.offer(item)]
        for sub in gone:
            self.unsubscribe(sub)

    @contextmanager
    def subscribe(self, buffer: int | None = None) -> Iterator[Subscription]:
        """A subscription for the `with` block; events published before it are not seen."""
        sub = Subscription(self, self.buffer if buffer is None else buffer)
        self._subscribers.append(sub)
        try:
            yield sub
        finally:
            sub.close()

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)

    # -- producers -------------------------------------------------------------------------

    def request_started(self, row: RequestRow) -> None:
        self.publish(
            RequestStarted(
                id=row.id, ts=self.wall(), path=row.path, key=row.key_name, format=row.format
            )
        )

    def request_routed(self, row: RequestRow, plan: RoutePlan) -> None:
        decision = plan.decision
        self.publish(
            RequestRouted(
                id=row.id,
                ts=self.wall(),
                model=row.model,
                stream=row.stream,
                route=decision.route,
                rule=decision.rule,
                group=decision.group,
                candidates=tuple(c.provider for c in plan.candidates),
                sticky=plan.sticky,
                held=plan.held,
            )
        )

    def request_retrying(self, request_id: str, *, retry: int, backoff_ms: int) -> None:
        self.publish(
            RequestRetrying(id=request_id, ts=self.wall(), retry=retry, backoff_ms=backoff_ms)
        )

    def request_dequeued(
        self, request_id: str, *, provider: str, retry: int, queued_ms: int
    ) -> None:
        self.publish(
            RequestDequeued(
                id=request_id,
                ts=self.wall(),
                provider=provider,
                retry=retry,
                queued_ms=queued_ms,
            )
        )

    def request_ended(self, row: RequestRow) -> None:
        """`RequestFinished` or `RequestFailed`, from the row as it is stored."""
        attempts = len((row.routing or {}).get("attempts") or ())
        ok = row.status is not None and row.status < 400 and not row.cancelled
        if ok:
            self.publish(
                RequestFinished(
                    id=row.id,
                    ts=self.wall(),
                    model=row.model,
                    provider=row.provider,
                    status=row.status,
                    ttfb_ms=row.ttfb_ms,
                    duration_ms=row.duration_ms,
                    input_tokens=row.input_tokens,
                    output_tokens=row.output_tokens,
                    attempts=attempts,
                )
            )
        else:
            self.publish(
                RequestFailed(
                    id=row.id,
                    ts=self.wall(),
                    model=row.model,
                    provider=row.provider,
                    status=row.status,
                    error_code=row.error_code,
                    duration_ms=row.duration_ms,
                    attempts=attempts,
                    cancelled=row.cancelled,
                )
            )

    def health_changed(self, change: PauseChanged) -> None:
        """A `RouterHooks` listener: the engine's change, with monotonic times made relative."""
        pause = None
        if change.paused and change.until is not None:
            pause = round(max(0.0, change.until - change.at), 3)
        self.publish(
            HealthChanged(
                ts=self.wall(),
                upstream=change.upstream,
                paused=change.paused,
                reason=change.reason.value,
                pause_secs=pause,
                failures_in_row=change.failures_in_row,
            )
        )

    def key_limit_alert(self, alert: EngineLimitAlert) -> None:
        """A `UsageKeeper` alert listener."""
        lim = alert.limit
        self.publish(
            KeyLimitAlert(
                ts=self.wall(),
                key=alert.key,
                per=lim.per.value,
                measure=lim.measure.value,
                amount=lim.amount,
                used=alert.used,
                percent=alert.percent,
                reset=round(alert.reset, 3) if alert.reset is not None else None,
            )
        )

    def shared_state_changed(self, shared: bool, detail: str) -> None:
        """A `RedisState` listener."""
        code = "gw.shared_state.back" if shared else "gw.shared_state.lost"
        self.publish(SharedStateChanged(ts=self.wall(), shared=shared, code=code, detail=detail))

    def store_unavailable(self, *, reason: str, held: int, journal: int) -> None:
        self.publish(
            StoreUnavailable(
                ts=self.wall(),
                code="gw.store.unavailable",
                reason=reason,
                held=held,
                journal=journal,
            )
        )

    def store_recovered(self, *, rows: int, down_secs: float) -> None:
        self.publish(
            StoreRecovered(
                ts=self.wall(), code="gw.store.recovered", rows=rows, down_secs=down_secs
            )
        )

    def config_reloaded(
        self, *, generation: int, version: int, config_version: str = "", origin: str = "file"
    ) -> None:
        self.publish(
            ConfigReloaded(
                ts=self.wall(),
                generation=generation,
                version=version,
                config_version=config_version,
                origin=origin,
            )
        )

    def config_rejected(
        self,
        problems: Sequence[Problem | ConfigProblem],
        *,
        stage: str | None = None,
        config_version: str = "",
        origin: str = "file",
    ) -> None:
        items = tuple(
            p
            if isinstance(p, ConfigProblem)
            else ConfigProblem(code=p.code, path=p.path, message=p.message)
            for p in problems
        )
        self.publish(
            ConfigRejected(
                ts=self.wall(),
                problems=items,
                stage=stage or (items[0].stage if items else "schema"),
                config_version=config_version,
                origin=origin,
            )
        )
