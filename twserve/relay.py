"""Carrying one request to its upstreams and the answer back: the attempt machine's IO.

`twengine.attempt.AttemptMachine` decides everything — which upstream next, when to wait, when
the client's 200 goes out, how the request ends. This module only carries its actions out and
feeds it what happened:

* Each `Send` starts a *reader* task for that attempt. The reader opens the upstream request
  (httpcore) and posts what arrives — head, error body, chunks, end, break — into the request's
  inbox, a small memory stream, so a slow client slows the upstream read instead of growing a
  buffer. `CancelAttempt` cancels the reader's scope, which closes the upstream connection.
* The main loop takes one inbox item at a time, or wakes at the machine's `next_deadline()` and
  calls `on_timer`. Before first content, chunks go through `twproto.first_content.OpeningHold`;
  its verdict becomes `first_content` or `failed`. After the commit, chunks go through the
  `twproto.translate.StreamTranslator` (which relays a same-format stream unchanged while
  watching it) straight to the client.
* Slots: `Send` takes a slot through the hooks; `WaitForSlot` queues a ticket whose grant comes
  back through the inbox as `slot_granted`. Every slot is given back when its attempt ends or
  the client leaves.

A client that leaves cancels the handler's scope (see twserve.http1); the `finally` here gives
back slots, cancels tickets and closes the machine's records with `client_gone`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from twengine.attempt import (
    Action,
    AttemptMachine,
    AttemptRecord,
    AttemptSettings,
    Backoff,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    Finish,
    PassThroughUpstreamError,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
    WaitForSlot,
)
from twengine.slots import Permit, Ticket
from twproto import json_loads
from twproto.dialect import Dialect
from twproto.errors import ERROR_HEADER, ErrorCategory, GatewayError, error_body, error_headers
from twproto.failures import (
    Failure,
    FailureKind,
    PauseRule,
    classify_response,
    classify_transport,
    stream_ended_early,
)
from twproto.first_content import FailedBeforeContent, Holding, OpeningHold, Released
from twproto.formats._effort import level_after_refusal, parse_effort, requested_effort
from twproto.headers import client_response_headers
from twproto.ir import Effort, ReasoningLevel
from twproto.paths import Operation, upstream_path
from twproto.sse import encode_comment
from twproto.translate import (
    DEFAULT_MAX_TOKENS,
    ClientTranslationError,
    StreamTranslator,
    TranslatedRequest,
    UpstreamTranslationError,
    translate_request,
    translate_response,
)
from twserve.http1 import ClientGone
from twserve.httptypes import Headers, Responder
from twserve.upstream import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamUnreachable,
    auth_headers,
    forwardable_headers,
)

__all__ = ["Candidate", "RelayHooks", "RelayOutcome", "RelayRequest", "relay"]

log = logging.getLogger("twserve.relay")

ERROR_BODY_LIMIT = 64 * 1024
WHOLE_BODY_LIMIT = 64 * 1024 * 1024
INBOX_SIZE = 8
REPORT_EVERY = 0.5
KEEPALIVE = encode_comment("keep-alive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One upstream to try, as routing decided it: where, with which key, for which model."""

    name: str
    dialect: Dialect
    base_url: str
    key: str
    model: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    sticky: bool = False
    # A routing rule's `set` for this hop (SPEC §6): output limit and reasoning level.
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None
    mock_headers: bool = False  # the provider's forward_mock_headers
    # The model's output limit (model_specs, else the price table): a conversion to Anthropic
    # of a request without max_tokens sends it.
    output_limit: int | None = None
    connect_timeout: float | None = None
    # This upstream refused the conversation's sealed reasoning before: leave it out up front.
    drop_sealed: bool = False


@dataclass(slots=True, kw_only=True)
class RelayRequest:
    client_dialect: Dialect
    operation: Operation
    body: bytes
    headers: Headers
    model: str
    stream: bool
    sse: bool  # Gemini clients: SSE (alt=sse) or a JSON-array stream
    query: str = ""
    owner: str = ""  # request id, for slot bookkeeping
    # When the request arrived (the caller's clock): wait_secs and the keep-alive clock run
    # from there, not from the end of a wait in the key's queue
    # (docs/operations.md). None: now.
    arrival: float | None = None


@dataclass(slots=True, kw_only=True)
class RelayOutcome:
    status: int | None = None
    provider: str | None = None
    ttfb_ms: int | None = None
    usage: Any = None
    error_code: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    translated: list[str] = field(default_factory=list)
    cancelled: bool = False
    # Usage reported by attempts that did not give the answer (by attempt index): tokens an
    # upstream may bill although its attempt failed or was cancelled.
    attempt_usage: dict[int, Any] = field(default_factory=dict)
    # The client left after the whole answer had gone out (not a cancelled request).
    delivered: bool = False
    # Per upstream: the level a refused effort was resent with ("off": without one).
    effort_resent: dict[str, str] = field(default_factory=dict)


class RelayHooks(Protocol):
    """What the relay needs from the gateway's shared state (slots, health)."""

    def free(self, names: Collection[str]) -> set[str]: ...

    def paused(self, names: Collection[str], now: float) -> set[str]: ...

    def acquire(self, name: str, owner: str) -> Permit | None: ...

    def wait(
        self, names: tuple[str, ...], owner: str, deadline: float, deliver: Callable[[Permit], bool]
    ) -> Ticket: ...

    def cancel_wait(self, ticket: Ticket) -> None: ...

    def release(self, permit: Permit) -> None: ...

    def failed(self, provider: str, failure: Failure, now: float) -> None: ...

    def succeeded(self, provider: str, now: float, first_content_secs: float | None) -> None: ...


# --- inbox items: what a reader task saw --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Head:
    index: int
    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class _ErrorBody:
    index: int
    body: bytes


@dataclass(frozen=True, slots=True)
class _Chunk:
    index: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _Whole:
    index: int
    body: bytes


@dataclass(frozen=True, slots=True)
class _End:
    index: int


@dataclass(frozen=True, slots=True)
class _Broken:
    index: int
    detail: str


@dataclass(frozen=True, slots=True)
class _AttemptFailed:
    index: int
    failure: Failure


@dataclass(frozen=True, slots=True)
class _Granted:
    permit: Permit


_Item = _Head | _ErrorBody | _Chunk | _Whole | _End | _Broken | _AttemptFailed | _Granted


def _client_headers(upstream: Headers) -> Headers:
    # An allow-list, compared without regard to case: an upstream's `Content-Length` beside
    # the gateway's own made h11 refuse the answer, and its account headers are not the
    # client's business.
    return client_response_headers(upstream)


@dataclass(slots=True)
class _Live:
    """The attempt in flight."""

    index: int
    cand: Candidate
    scope: anyio.CancelScope
    sent_at: float
    upstream_sse: bool
    status: int = 0
    headers: Headers = field(default_factory=list)
    hold: OpeningHold | None = None
    translator: StreamTranslator | None = None
    pending: bytes = b""
    whole: bytes | None = None
    # Chunks of this attempt still in the inbox; once the answer is committed and none are
    # left, the reader writes to the client itself (`direct`), sparing each chunk the hop.
    queued: int = 0
    committed: bool = False
    direct: bool = False
    reported: float = 0.0
    # The opening's bytes as they came, read for usage if the attempt ends before content.
    opening: list[bytes] = field(default_factory=list)


class _Relay:
    def __init__(
        self,
        up: UpstreamClient,
        hooks: RelayHooks,
        candidates: list[Candidate],
        req: RelayRequest,
        responder: Responder,
        settings: AttemptSettings,
        clock: Callable[[], float],
        wall: Callable[[], float],
        rng: Callable[[], float],
        out: RelayOutcome,
        observer: Callable[[Action], None] | None,
    ) -> None:
        self.up = up
        self.hooks = hooks
        self.cands = {c.name: c for c in candidates}
        self.names = [c.name for c in candidates]
        self.req = req
        self.responder = responder
        self.clock = clock
        self.wall = wall
        self.out = out
        self.machine = AttemptMachine(
            candidates=[CandidateRef(name=c.name, sticky=c.sticky) for c in candidates],
            client_stream=req.stream,
            client_is_gemini=req.client_dialect is Dialect.GEMINI,
            arrival=clock() if req.arrival is None else req.arrival,
            settings=settings,
            rng=rng,
        )
        send, receive = anyio.create_memory_object_stream[_Item](INBOX_SIZE)
        self.inbox_send: MemoryObjectSendStream[_Item] = send
        self.inbox: MemoryObjectReceiveStream[_Item] = receive
        self.live: _Live | None = None
        self.permits: dict[str, Permit] = {}
        self.ticket: Ticket | None = None
        self.passthrough: dict[int, tuple[int, Headers, bytes, Dialect]] = {}
        self.translated: dict[str, TranslatedRequest] = {}
        self._rewrites: dict[str, ResendReason] = {}
        # The level a refused effort is resent with, per upstream (None: without an effort).
        self._effort_after: dict[str, Effort | None] = {}
        self.started = False
        self.tg: anyio.abc.TaskGroup | None = None
        self.observer = observer
        self._waited_since: float | None = None

    # -- snapshots for the machine ---------------------------------------------------------

    def _free(self) -> set[str]:
        if self.req.operation is Operation.COUNT_TOKENS:
            return set(self.names)  # token counts take no slot (SPEC §8)
        free = self.hooks.free(self.names)
        # A slot this request already holds counts as free for it.
        return free | set(self.permits)

    def _paused(self, now: float) -> set[str]:
        return self.hooks.paused(self.names, now)

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> RelayOutcome:
        try:
            async with anyio.create_task_group() as tg:
                self.tg = tg
                now = self.clock()
                await self._carry_out(
                    self.machine.start(now, free=self._free(), paused=self._paused(now))
                )
                while not self.machine.done:
                    deadline = self.machine.next_deadline()
                    item: _Item | None = None
                    if deadline is None:
                        item = await self.inbox.receive()
                    else:
                        with anyio.move_on_after(max(0.0, deadline - self.clock())):
                            item = await self.inbox.receive()
                    now = self.clock()
                    if item is None:
                        actions = self.machine.on_timer(
                            now, free=self._free(), paused=self._paused(now)
                        )
                    else:
                        actions = await self._on_item(item, now)
                    await self._carry_out(actions)
                # The answer (or its error) is written and ended: a client that leaves from
                # here on had all of it.
                self.out.delivered = not self.out.cancelled
                tg.cancel_scope.cancel()
        except* ClientGone:
            pass  # the client left mid-answer; _cleanup records it
        finally:
            with anyio.CancelScope(shield=True):
                self._cleanup()
        return self.out

    def _cleanup(self) -> None:
        if not self.machine.done:
            self.machine.client_gone(self.clock())
            live = self.live
            # A client that leaves right after the answer's final event (its SDK is done) has
            # the whole answer: that is not a cancelled request, even if the upstream's own end
            # had not arrived yet.
            delivered = (
                live is not None
                and live.committed
                and live.translator is not None
                and live.translator.finished
                and live.pending == b""
            )
            self.out.cancelled = not delivered
            self.out.delivered = delivered
            if live is not None:
                # What the client had already received came from this upstream.
                if live.committed:
                    self.out.provider = live.cand.name
                    self.out.status = 200 if self.started else None
                if live.translator is not None:
                    self.out.usage = live.translator.usage
        self.out.attempts = self.machine.attempts
        if self.ticket is not None:
            self.hooks.cancel_wait(self.ticket)
            self.ticket = None
        for permit in self.permits.values():
            self.hooks.release(permit)
        self.permits.clear()
        self.inbox_send.close()
        self.inbox.close()

    async def _on_item(self, item: _Item, now: float) -> list[Action]:
        if isinstance(item, _Granted):
            self.ticket = None
            self.permits[item.permit.name] = item.permit
            return self.machine.slot_granted(item.permit.name, now)
        live = self.live
        if live is None or item.index != live.index:
            return []  # from an attempt already given up
        if isinstance(item, _Head):
            live.status, live.headers = item.status, item.headers
            return self.machine.response_head(now, status=item.status)
        if isinstance(item, _ErrorBody):
            failure = classify_response(live.status, live.headers, item.body, now=self.wall())
            self.passthrough[live.index] = (
                live.status,
                _client_headers(live.headers),
                item.body,
                live.cand.dialect,
            )
            return self._failed(live, failure, now)
        if isinstance(item, _AttemptFailed):
            return self._failed(live, item.failure, now)
        if isinstance(item, _Whole):
            live.whole = item.body
            self.out.ttfb_ms = int((now - live.sent_at) * 1000)
            await self._carry_out(self.machine.first_content(now))
            return self.machine.ended(now, clean=True)
        if isinstance(item, _Chunk):
            live.queued -= 1
            if live.translator is None:
                live.opening.append(item.data)
                return self._hold(live, live.hold.feed(item.data, now=self.wall()), now)  # type: ignore[union-attr]
            data = live.translator.feed(item.data)
            follow: list[Action] = []
            if data:
                await self.responder.send(data)
                live.reported = now
                follow = self.machine.content(now)
            # Only after our own write is done may the reader write (one writer at a time).
            if live.committed and live.queued == 0:
                live.direct = True
            return follow
        if isinstance(item, _End):
            if live.translator is None:
                released = self._hold(live, live.hold.end(now=self.wall()), now)  # type: ignore[union-attr]
                if live.translator is None:
                    return released
                await self._carry_out(released)
            return await self._ended(live, now, broke=False)
        assert isinstance(item, _Broken)
        if live.translator is None:
            return self._failed(live, stream_ended_early(), now)
        return await self._ended(live, now, broke=True)

    def _failed(self, live: _Live, failure: Failure, now: float) -> list[Action]:
        self._end_attempt(live, failure=failure, now=now)
        return self.machine.failed(failure, now, free=self._free(), paused=self._paused(now))

    def _hold(self, live: _Live, outcome: object, now: float) -> list[Action]:
        if isinstance(outcome, Holding):
            return []
        if isinstance(outcome, FailedBeforeContent):
            return self._failed(live, outcome.failure, now)
        assert isinstance(outcome, Released)
        translated = self.translated.get(live.cand.name)
        live.translator = StreamTranslator(
            live.cand.dialect,
            self.req.client_dialect,
            client_model=self.req.model,
            upstream_sse=live.upstream_sse,
            client_stream=self.req.stream,
            client_sse=self.req.sse,
            tool_names=translated.tool_names if translated is not None else None,
            created=int(self.wall()),
            # Same format but another model name upstream (an alias): rename it in the answer.
            relay_unchanged=live.cand.model == self.req.model,
        )
        live.pending = live.translator.feed(outcome.data)
        self.out.ttfb_ms = int((now - live.sent_at) * 1000)
        return self.machine.first_content(now)

    async def _ended(self, live: _Live, now: float, *, broke: bool) -> list[Action]:
        translator = live.translator
        assert translator is not None
        if broke:
            return self.machine.ended(now, clean=False)
        # end() flushes a last event that came without its blank line, so `finished` is only
        # known after it.
        tail = translator.end()
        clean = translator.finished
        if tail and clean:
            await self.responder.send(tail)
        return self.machine.ended(now, clean=clean)

    def _end_attempt(self, live: _Live, *, failure: Failure | None, now: float) -> None:
        """The attempt in flight is over: stop its reader, count the failure, free its slot."""
        live.scope.cancel()
        usage = _billed_usage(live, self.req.model)
        if usage is not None:
            self.out.attempt_usage[live.index] = usage
        if failure is not None:
            self.hooks.failed(live.cand.name, failure, now)
        permit = self.permits.pop(live.cand.name, None)
        if permit is not None:
            self.hooks.release(permit)
        self.live = None

    # -- actions ---------------------------------------------------------------------------

    async def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                if self._waited_since is not None or action.queued_ms:
                    # The end of a retry backoff or of a slot wait (event RequestDequeued).
                    self._note(action)
                self._waited_since = None
                self._send(action.provider, action.index)
            elif isinstance(action, Resend):
                # Once to the same upstream, rewritten: without the reasoning effort it refused
                # (SPEC §13), or without the reasoning sealed for another account (SPEC §14).
                self._rewrites[action.provider] = action.reason
                if action.reason is ResendReason.EFFORT_REFUSED:
                    level = level_after_refusal(
                        self._asked_effort(self.cands[action.provider]),
                        action.failure.message if action.failure else "",
                    )
                    self._effort_after[action.provider] = level
                    self.out.effort_resent[action.provider] = reasoning_level(level).value
                self.translated.pop(action.provider, None)
                self._send(action.provider, action.index)
            elif isinstance(action, WaitForSlot):
                self.ticket = self.hooks.wait(
                    action.providers, self.req.owner, action.until, self._deliver
                )
            elif isinstance(action, Backoff):
                # The machine's deadline wakes the loop; the wait is announced.
                self._waited_since = self.clock()
                self._note(action)
            elif isinstance(action, Commit):
                await self._commit(action)
            elif isinstance(action, SendKeepAlive):
                await self.responder.send(KEEPALIVE)
            elif isinstance(action, CancelAttempt):
                live = self.live
                if live is not None and live.index == action.index:
                    if live.committed:
                        # It answered before it went quiet (idle timeout after content): the
                        # row names it, with the usage seen so far.
                        self.out.provider = live.cand.name
                        if live.translator is not None:
                            self.out.usage = live.translator.usage
                    self._end_attempt(live, failure=action.failure, now=self.clock())
            elif isinstance(action, RespondError):
                await self._respond_error(action.error)
            elif isinstance(action, EndStreamWithError):
                await self._end_stream_with_error(action.error)
            elif isinstance(action, PassThroughUpstreamError):
                await self._pass_through(action)
            elif isinstance(action, Finish):
                await self._finish(action)

    def _note(self, action: Action) -> None:
        if self.observer is not None:
            try:
                self.observer(action)
            except Exception:  # an observer's bug must not fail the request
                log.exception("relay observer failed")

    def _deliver(self, permit: Permit) -> bool:
        try:
            self.inbox_send.send_nowait(_Granted(permit))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def _send(self, provider: str, index: int) -> None:
        cand = self.cands[provider]
        if provider not in self.permits and self.req.operation is not Operation.COUNT_TOKENS:
            permit = self.hooks.acquire(provider, self.req.owner)
            if permit is not None:
                self.permits[provider] = permit
        same = cand.dialect is self.req.client_dialect
        upstream_sse = True if cand.dialect is not Dialect.GEMINI or not same else self.req.sse
        live = _Live(
            index=index,
            cand=cand,
            scope=anyio.CancelScope(),
            sent_at=self.clock(),
            upstream_sse=upstream_sse,
        )
        if self.req.stream:
            live.hold = OpeningHold(cand.dialect, sse=upstream_sse)
        self.live = live
        self.machine.attempt_sent(live.sent_at)
        assert self.tg is not None
        self.tg.start_soon(self._reader, live)

    def _asked_effort(self, cand: Candidate) -> Effort | None:
        """The effort level sent to `cand`: its rule's, else the client's own."""
        if cand.reasoning is not None:
            return parse_effort(cand.reasoning.value)
        try:
            obj = json_loads(self.req.body)
        except ValueError:
            return None
        return requested_effort(obj, self.req.client_dialect) if isinstance(obj, dict) else None

    def _reasoning_for(
        self, cand: Candidate, rewrite: ResendReason | None
    ) -> ReasoningLevel | None:
        if rewrite is not ResendReason.EFFORT_REFUSED:
            return cand.reasoning
        # Resent with the level the refusal accepts (docs/operations.md), or without an effort.
        return reasoning_level(self._effort_after.get(cand.name))

    def _request_for(self, cand: Candidate) -> tuple[str, Headers, bytes]:
        req = self.req
        same = cand.dialect is req.client_dialect
        translated = self.translated.get(cand.name)
        rewrite = self._rewrites.get(cand.name)
        if translated is None:
            translated = translate_request(
                req.body,
                req.client_dialect,
                cand.dialect,
                model=cand.model,
                stream=req.stream,
                max_tokens=cand.max_tokens,
                default_max_tokens=cand.output_limit or DEFAULT_MAX_TOKENS,
                reasoning=self._reasoning_for(cand, rewrite),
                drop_sealed_reasoning=rewrite is ResendReason.SEALED_REASONING or cand.drop_sealed,
            )
            self.translated[cand.name] = translated
            self.out.translated = list(translated.dropped)
        sse = req.sse if same else True
        path = upstream_path(
            cand.dialect, req.operation, model=cand.model, stream=req.stream, sse=sse
        )
        if same and req.query:
            # The client's own query (Claude Code's ?beta=true, Gemini's alt) goes along to a
            # same-format upstream; the gateway key was stripped from it already.
            extra = "&".join(p for p in req.query.split("&") if p and p != "alt=sse")
            if extra:
                path += ("&" if "?" in path else "?") + extra
        headers: Headers = [
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"identity"),
            *auth_headers(cand.dialect, cand.key),
            *cand.headers,
            *forwardable_headers(
                req.headers, req.client_dialect, same_format=same, mock_headers=cand.mock_headers
            ),
        ]
        if cand.dialect is Dialect.ANTHROPIC and not any(
            k == b"anthropic-version" for k, _ in headers
        ):
            headers.append((b"anthropic-version", b"2023-06-01"))
        return cand.base_url.rstrip("/") + path, headers, translated.body

    async def _reader(self, live: _Live) -> None:
        post = self.inbox_send.send
        index = live.index
        try:
            with live.scope:
                try:
                    url, headers, body = self._request_for(live.cand)
                except ClientTranslationError as exc:
                    # The request cannot be written for this upstream: the client's to fix.
                    await post(_AttemptFailed(index, _request_failure(exc)))
                    return
                try:
                    async with self.up.open(
                        "POST",
                        url,
                        headers=headers,
                        body=body,
                        connect_timeout=live.cand.connect_timeout,
                    ) as resp:
                        await post(_Head(index, resp.status, resp.headers))
                        if resp.status >= 400:
                            await post(_ErrorBody(index, await resp.read_prefix(ERROR_BODY_LIMIT)))
                            return
                        if not self.req.stream:
                            # Not read_prefix, which stops quietly at a break: a whole answer
                            # cut off half-way must fail the attempt (UpstreamBroken below),
                            # never pass for a complete one.
                            parts: list[bytes] = []
                            size = 0
                            async for chunk in resp.chunks():
                                parts.append(chunk)
                                size += len(chunk)
                                if size > WHOLE_BODY_LIMIT:
                                    break
                            whole = b"".join(parts)
                            if len(whole) > WHOLE_BODY_LIMIT:
                                await post(_Broken(index, "answer larger than the gateway reads"))
                            else:
                                await post(_Whole(index, whole))
                            return
                        async for chunk in resp.chunks():
                            if live.direct:
                                await self._write_direct(live, chunk)
                            else:
                                live.queued += 1
                                await post(_Chunk(index, chunk))
                        await post(_End(index))
                except UpstreamUnreachable as exc:
                    await post(_AttemptFailed(index, classify_transport(exc.fault)))
                except UpstreamBroken as exc:
                    await post(_Broken(index, str(exc)))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ClientGone):
            pass  # the request is over; nobody reads this attempt any more

    async def _write_direct(self, live: _Live, chunk: bytes) -> None:
        """A committed answer's chunk, from the reader straight to the client."""
        translator = live.translator
        assert translator is not None
        data = translator.feed(chunk)
        if data:
            await self.responder.send(data)
            # The idle clock only needs to know that content keeps coming; telling it at most
            # every REPORT_EVERY seconds keeps the machine off the per-chunk path.
            now = self.clock()
            if now - live.reported >= REPORT_EVERY:
                live.reported = now
                self.machine.content(now)

    # -- writing to the client -------------------------------------------------------------

    async def _start_stream(self) -> None:
        if not self.started:
            self.started = True
            kind = b"text/event-stream" if self.req.sse else b"application/json"
            await self.responder.start(
                200,
                [
                    (b"content-type", kind),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            )

    async def _commit(self, action: Commit) -> None:
        if action.send_headers:
            await self._start_stream()
        live = self.live
        if action.provider is not None and live is not None:
            live.committed = True
            if live.pending:
                data, live.pending = live.pending, b""
                await self.responder.send(data)
            live.direct = live.queued == 0 and live.translator is not None

    async def _finish(self, action: Finish) -> None:
        live = self.live
        if action.cancelled or live is None:
            return
        self.out.provider = live.cand.name
        self.out.status = 200
        first = None
        if self.req.stream and self.out.ttfb_ms is not None:
            first = self.out.ttfb_ms / 1000
        self.hooks.succeeded(live.cand.name, self.clock(), first)
        if live.whole is not None:
            await self._write_whole(live, live.whole)
        else:
            translator = live.translator
            assert translator is not None
            self.out.usage = translator.usage
            self.out.translated.extend(translator.dropped)
            await self.responder.end()
        self._end_attempt(live, failure=None, now=self.clock())

    async def _write_whole(self, live: _Live, body: bytes) -> None:
        same = live.cand.dialect is self.req.client_dialect
        translated = self.translated.get(live.cand.name)
        try:
            answer = translate_response(
                body,
                live.cand.dialect,
                self.req.client_dialect,
                client_model=self.req.model,
                tool_names=translated.tool_names if translated is not None else None,
                created=int(self.wall()),
            )
        except UpstreamTranslationError as exc:
            if not same:
                await self._respond_error(
                    GatewayError(
                        status=502,
                        category=ErrorCategory.UPSTREAM,
                        code="gw.upstream.error",
                        message=f"the answer from {live.cand.name} could not be read: {exc}",
                    )
                )
                return
            answer = None  # a same-format answer goes through as it came
        if answer is not None:
            self.out.usage = answer.usage
            self.out.translated.extend(answer.dropped)
        # Same format: the upstream's bytes, with only the model renamed (translate_response).
        payload = body if answer is None else answer.body
        headers = (
            _client_headers(live.headers) if same else [(b"content-type", b"application/json")]
        )
        await self.responder.start(200, [*headers, (b"content-length", str(len(payload)).encode())])
        await self.responder.send(payload)
        await self.responder.end()

    async def _respond_error(self, err: GatewayError) -> None:
        self.out.status = err.status
        self.out.error_code = err.code
        body = error_body(self.req.client_dialect, err)
        await self.responder.start(
            err.status, [*error_headers(err), (b"content-length", str(len(body)).encode())]
        )
        await self.responder.send(body)
        await self.responder.end()

    async def _end_stream_with_error(self, err: GatewayError) -> None:
        self.out.error_code = err.code
        self.out.status = 200 if self.started else err.status
        live = self.live
        if live is not None and live.committed:
            self.out.provider = live.cand.name  # it answered, then broke off
        translator = live.translator if live is not None else None
        if translator is None:
            translator = StreamTranslator(
                self.req.client_dialect,
                self.req.client_dialect,
                client_model=self.req.model,
                client_sse=self.req.sse,
            )
        else:
            self.out.usage = translator.usage
        await self._start_stream()
        await self.responder.send(translator.fail(err))
        await self.responder.end()
        if live is not None:
            self._end_attempt(live, failure=None, now=self.clock())

    async def _pass_through(self, action: PassThroughUpstreamError) -> None:
        saved = self.passthrough.get(action.index)
        if saved is None:
            await self._respond_error(_as_gateway_error(action.failure))
            return
        status, headers, body, dialect = saved
        if dialect is not self.req.client_dialect:
            await self._respond_error(_as_gateway_error(action.failure))
            return
        self.out.status = status
        self.out.error_code = "gw.upstream.error"
        # The upstream's own body, marked as the upstream's like every error the gateway relays.
        tag = (ERROR_HEADER, ErrorCategory.UPSTREAM.value.encode())
        length = (b"content-length", str(len(body)).encode())
        await self.responder.start(status, [*headers, tag, length])
        await self.responder.send(body)
        await self.responder.end()


def _billed_usage(live: _Live, model: str) -> Any:
    """The usage an ended attempt's upstream reported, if any (its answer so far, or the
    opening events of one that ended before content, e.g. Anthropic's message_start)."""
    if live.translator is not None:
        return live.translator.usage
    if not live.opening:
        return None
    watcher = StreamTranslator(
        live.cand.dialect,
        live.cand.dialect,
        client_model=model,
        upstream_sse=live.upstream_sse,
        client_sse=live.upstream_sse,
    )
    try:
        watcher.feed(b"".join(live.opening))
    except Exception:  # a broken opening bills nothing we can read
        return None
    return watcher.usage


def _request_failure(exc: ClientTranslationError) -> Failure:
    return Failure(
        kind=FailureKind.CLIENT_ERROR,
        failover=False,
        temporary=False,
        pause=PauseRule.NONE,
        status=exc.error_status_hint,
        message=str(exc),
    )


def _as_gateway_error(failure: Failure) -> GatewayError:
    status = failure.status if failure.status and 400 <= failure.status < 600 else 502
    return GatewayError(
        status=status,
        category=ErrorCategory.UPSTREAM,
        code="gw.upstream.error",
        message=failure.message or failure.kind.value,
    )


def reasoning_level(effort: Effort | None) -> ReasoningLevel:
    """The rule level that sends `effort`: none is off, and minimal (OpenAI's lowest, with no
    rule level of its own) is low."""
    if effort is None or effort is Effort.NONE:
        return ReasoningLevel.OFF
    if effort is Effort.MINIMAL:
        return ReasoningLevel.LOW
    return ReasoningLevel(effort.value)


async def relay(
    up: UpstreamClient,
    hooks: RelayHooks,
    candidates: list[Candidate],
    req: RelayRequest,
    responder: Responder,
    *,
    settings: AttemptSettings,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    rng: Callable[[], float],
    out: RelayOutcome | None = None,
    observer: Callable[[Action], None] | None = None,
) -> RelayOutcome:
    """Carry `req` to `candidates` under the attempt machine; write the answer or an error.

    `out` is filled in as the request goes, so a caller whose scope is cancelled (the client
    left) still has the attempts made so far. `observer` sees the `Backoff` actions and the
    `Send` that ends a wait (for the retry events).
    """
    out = out if out is not None else RelayOutcome()
    r = _Relay(up, hooks, candidates, req, responder, settings, clock, wall, rng, out, observer)
    return await r.run()
