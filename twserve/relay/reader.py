"""One attempt's upstream side: open the request, post what arrives into the request's inbox.

The relay starts one reader task per attempt. The reader opens the upstream request and posts
what arrives — head, error body, whole answer, chunks, end, break, a failure — into the
request's inbox, a small bounded queue (`twserve.relay.wait`), so a slow client slows the
upstream read instead of growing a buffer. Cancelling the attempt's scope closes the upstream
request.

Once the answer is committed and no chunk of it waits in the inbox, the reader writes to the
client itself, and after its first such write it hands the upstream connection a sink, so that
where the connection is an asyncio protocol (`twserve.upstream.h1_connection`) a chunk is
translated and written to the client in the callback that read it, with no task woken. Which
of these paths a chunk takes is the attempt's `AttemptStream`'s to say (twserve.relay.stream);
the reader only reads its mode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import anyio

from twengine.attempt import CandidateRef, ResendReason
from twengine.config import AnswerModel, Config, Provider, ResponsesTransport
from twengine.config.credentials import CredentialFault, resolve_credentials
from twengine.pricing import TableCatalog
from twengine.router import ConfigCatalog
from twengine.rules import Candidate
from twproto import json_loads
from twproto.client_errors import request_failure
from twproto.effort import level_after_refusal, parse_effort, requested_effort
from twproto.failures import Failure, classify_transport
from twproto.ir import Effort, ReasoningLevel
from twproto.resume import ResumableStream
from twproto.translate import (
    DEFAULT_MAX_TOKENS,
    ClientTranslationError,
    TranslatedRequest,
    translate_request,
)
from twproto.upstream_request import ClientCall, UpstreamRequest, UpstreamTarget, upstream_request
from twproto.upstream_stream import UpstreamStream
from twserve.relay.stream import READER_WRITES, AttemptStream
from twserve.server.http1 import ClientGone
from twserve.upstream.client import (
    Headers,
    Transport,
    Upstream,
    UpstreamAnswer,
    UpstreamBroken,
    UpstreamUnreachable,
    read_prefix,
)
from twserve.upstream.responses_socket import UpstreamSockets

__all__ = [
    "Attempt",
    "AttemptFailed",
    "AttemptItem",
    "AttemptRequests",
    "Broken",
    "Chunk",
    "Destination",
    "End",
    "ErrorBody",
    "Head",
    "ReaderState",
    "Whole",
    "destination",
    "destinations",
    "read_attempt",
    "transport_of",
]

ERROR_BODY_LIMIT = 64 * 1024
WHOLE_BODY_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """One upstream to try, as routing decided it: `target` says where, with which key and
    model; a routing rule's `set` adds an output limit and a reasoning level (docs/balancing.md)."""

    name: str
    target: UpstreamTarget
    sticky: bool = False
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None
    # The model's output limit (model_specs, else the price table): a conversion to Anthropic
    # of a request without max_tokens sends it.
    output_limit: int | None = None
    connect_timeout: float | None = None
    # This upstream refused the conversation's sealed reasoning before: leave it out up front.
    drop_sealed: bool = False
    # The model's context window (model_specs, else the price table), where known: a context
    # overflow moves on only to a larger one.
    context_window: int | None = None
    # ``answer_model: served``: the answer's body shows `target.model`, not the client's name.
    show_served: bool = False
    # How attempts reach the upstream (its provider's ``responses_transport``, ``http2``),
    # carried to the upstream layer with each attempt, never looked up again by URL; and how
    # those go that its own Responses socket does not carry (all but a client socket's turns).
    transport: Transport = Transport.HTTP1
    http_transport: Transport = Transport.HTTP1

    def candidate(self) -> CandidateRef:
        """This destination as the attempt machine takes it."""
        return CandidateRef(name=self.name, sticky=self.sticky, context_window=self.context_window)

    def client_model(self, requested: str) -> str:
        """The model name the client's answer shows: `requested`, or the one sent upstream."""
        return self.target.model if self.show_served else requested


def transport_of(provider: Provider, *, http: bool = False) -> Transport:
    """How `provider` is reached: over its own Responses socket with ``responses_transport:
    websocket`` (a client socket's turns; `http` True: what goes over HTTP all the same), else
    HTTP/2 with ``http2: true``, else HTTP/1.1."""
    if not http and provider.responses_transport is ResponsesTransport.WEBSOCKET:
        return Transport.RESPONSES_SOCKET
    return Transport.HTTP2 if provider.http2 else Transport.HTTP1


def destination(
    config: Config,
    cand: Candidate,
    sticky: str | None,
    env: Mapping[str, str],
    catalog: TableCatalog | None = None,
) -> Destination | CredentialFault:
    """Where routing's candidate `cand` goes: its provider's URL, key, headers and transport,
    the key and headers read from `env` at send time. A variable not set or a value no header
    can carry is a `CredentialFault` (which never holds the value): that upstream is
    skipped."""
    provider = config.provider(cand.provider)
    creds = resolve_credentials(provider, env)
    if isinstance(creds, CredentialFault):
        return creds
    return Destination(
        name=provider.name,
        target=UpstreamTarget(
            dialect=provider.protocol,
            base_url=provider.base_url,
            key=creds.key,
            model=cand.model,
            headers=tuple((k.lower().encode(), v.encode()) for k, v in creds.headers),
            forward_mock_headers=provider.forward_mock_headers,
        ),
        sticky=cand.provider == sticky,
        max_tokens=cand.overrides.max_tokens,
        reasoning=cand.overrides.reasoning,
        output_limit=(
            catalog.max_output_tokens(config, cand.provider, cand.model) if catalog else None
        ),
        connect_timeout=provider.connect_timeout_secs,
        context_window=(catalog or ConfigCatalog()).context_window(
            config, cand.provider, cand.model
        ),
        show_served=config.answer_model is AnswerModel.SERVED,
        transport=transport_of(provider),
        http_transport=transport_of(provider, http=True),
    )


def destinations(
    config: Config,
    candidates: Sequence[Candidate],
    sticky: str | None,
    env: Mapping[str, str],
    catalog: TableCatalog | None = None,
) -> tuple[list[Destination], list[CredentialFault]]:
    """`destination` of each candidate, in order: the usable ones, and the faults of those
    skipped for their credentials."""
    usable: list[Destination] = []
    faults: list[CredentialFault] = []
    for cand in candidates:
        built = destination(config, cand, sticky, env, catalog)
        if isinstance(built, CredentialFault):
            faults.append(built)
        else:
            usable.append(built)
    return usable, faults


def reasoning_level(effort: Effort | None) -> ReasoningLevel:
    """The rule level that sends `effort`: none is off, and minimal (OpenAI's lowest, with no
    rule level of its own) is low."""
    if effort is None or effort is Effort.NONE:
        return ReasoningLevel.OFF
    if effort is Effort.MINIMAL:
        return ReasoningLevel.LOW
    return ReasoningLevel(effort.value)


class AttemptRequests:
    """Each attempt's upstream request: the client's body translated once per upstream (again
    after a `rewrite` for a resend), the request built for it, and for a stream its opening.
    `resume`: a stream is read so that another upstream may continue it (twproto.resume)."""

    def __init__(
        self,
        call: ClientCall,
        body: bytes,
        model: str,
        wall: Callable[[], float],
        resume: bool = False,
    ) -> None:
        self.resume = resume
        self.call = call
        self.body = body
        self.model = model
        self.wall = wall
        self.translated: dict[str, TranslatedRequest] = {}
        self.rewrites: dict[str, ResendReason] = {}
        # The level a refused effort is resent with, per upstream (None: without an effort).
        self.effort_after: dict[str, Effort | None] = {}
        self.dropped: tuple[str, ...] = ()  # what the latest translation could not carry

    def rewrite(self, dest: Destination, reason: ResendReason, refusal: str) -> str | None:
        """The next request to `dest` leaves out what it refused: sealed reasoning, or an effort
        level — resent with the level the refusal's message accepts (`refusal`), or without
        one. Returns that level's name for an effort refusal."""
        self.rewrites[dest.name] = reason
        self.translated.pop(dest.name, None)
        if reason is not ResendReason.EFFORT_REFUSED:
            return None
        level = level_after_refusal(self._asked_effort(dest), refusal)
        self.effort_after[dest.name] = level
        return reasoning_level(level).value

    def _asked_effort(self, dest: Destination) -> Effort | None:
        """The effort level sent to `dest`: its rule's, else the client's own."""
        if dest.reasoning is not None:
            return parse_effort(dest.reasoning.value)
        try:
            obj = json_loads(self.body)
        except ValueError:
            return None
        return requested_effort(obj, self.call.dialect) if isinstance(obj, dict) else None

    def _reasoning_for(self, dest: Destination) -> ReasoningLevel | None:
        if self.rewrites.get(dest.name) is not ResendReason.EFFORT_REFUSED:
            return dest.reasoning
        # Resent with the level the refusal accepts (docs/operations.md), or without an effort.
        return reasoning_level(self.effort_after.get(dest.name))

    def build(
        self, dest: Destination, continuing: ResumableStream | None = None
    ) -> tuple[UpstreamRequest, UpstreamStream | None]:
        """The request for `dest`, and for a streamed call the opening that reads its answer;
        `continuing`: the answer that broke off, which `dest` is asked to continue."""
        call = self.call
        translated = self.translated.get(dest.name)
        if translated is None or continuing is not None:
            rewrite = self.rewrites.get(dest.name)
            translated = translate_request(
                self.body,
                call.dialect,
                dest.target.dialect,
                model=dest.target.model,
                stream=call.stream,
                max_tokens=dest.max_tokens,
                default_max_tokens=dest.output_limit or DEFAULT_MAX_TOKENS,
                reasoning=self._reasoning_for(dest),
                drop_sealed_reasoning=rewrite is ResendReason.SEALED_REASONING or dest.drop_sealed,
                continuation=continuing.text if continuing is not None else None,
                prefill=rewrite is not ResendReason.PREFILL_REFUSED,
            )
            self.translated[dest.name] = translated
            self.dropped = translated.dropped
        request = upstream_request(dest.target, call, translated.body)
        if not call.stream:
            return request, None
        client_model = dest.client_model(self.model)
        opening = UpstreamStream(
            dest.target.dialect,
            call.dialect,
            client_model=client_model,
            upstream_sse=request.sse,
            client_sse=call.sse,
            tool_names=translated.tool_names,
            created=int(self.wall()),
            # Same format but another model name upstream (an alias): rename it in the answer.
            relay_unchanged=dest.target.model == client_model,
            resumable=self.resume,
            continuing=continuing,
            # A Chat client that did not ask for usage gets no usage-only chunk.
            hide_usage_chunk=translated.hide_usage_chunk,
        )
        return request, opening


@dataclass(frozen=True, slots=True)
class Head:
    index: int
    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class ErrorBody:
    index: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Whole:
    index: int
    body: bytes


@dataclass(frozen=True, slots=True)
class End:
    index: int


@dataclass(frozen=True, slots=True)
class Broken:
    index: int
    detail: str


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    index: int
    failure: Failure


AttemptItem = Head | ErrorBody | Chunk | Whole | End | Broken | AttemptFailed


@dataclass(slots=True)
class ReaderState:
    """What an attempt's reader set up and how far it got; written by the reader alone."""

    opening: UpstreamStream | None = None  # the stream's opening hold (streams only)
    upstream_sse: bool = True
    # It went over its upstream's own Responses socket (`Transport.RESPONSES_SOCKET`), not HTTP.
    over_socket: bool = False
    done: bool = False  # the reader has returned


@dataclass(slots=True)
class Attempt:
    """The attempt in flight. Its fields are what the relay's loop learned from the reader's
    items (written in twserve.relay.feed alone); `reader` is the reader's own record, and
    `stream` (twserve.relay.stream) the one owner of how its chunks reach the client."""

    index: int
    provider: str
    scope: anyio.CancelScope
    sent_at: float
    stream: AttemptStream
    reader: ReaderState = field(default_factory=ReaderState)
    status: int = 0
    headers: Headers = field(default_factory=list)
    whole: bytes | None = None
    # The opening's bytes as they came (streams), read for usage if the attempt ends before
    # content.
    opening_bytes: list[bytes] = field(default_factory=list)
    # The loop took the reader's last item (end, whole answer, error, break): all the reader
    # still does is close the upstream request, which it is left to finish.
    last_taken: bool = False

    def running(self) -> bool:
        """The reader has work left that cancelling its scope would cut short."""
        return not (self.reader.done or self.last_taken or self.scope.cancel_called)


def _open(
    attempt: Attempt,
    up: Upstream,
    request: UpstreamRequest,
    dest: Destination,
    sockets: UpstreamSockets | None,
) -> AbstractAsyncContextManager[UpstreamAnswer]:
    """The attempt's upstream request over `dest`'s transport: a turn of a client socket
    (`sockets`) to a provider with its own Responses socket goes over that socket when it is a
    streamed create; everything else over HTTP/1.1 or HTTP/2 as the provider says."""
    timeout = dest.connect_timeout
    if dest.transport is Transport.RESPONSES_SOCKET and sockets is not None:
        event = sockets.takes(request)
        if event is not None:
            attempt.reader.over_socket = True
            return sockets.open(request, event, connect_timeout=timeout)
    return up.open(request, connect_timeout=timeout, transport=dest.http_transport)


async def read_attempt(
    attempt: Attempt,
    up: Upstream,
    build: Callable[[], tuple[UpstreamRequest, UpstreamStream | None]],
    post: Callable[[AttemptItem], Awaitable[None]],
    dest: Destination,
    sockets: UpstreamSockets | None = None,
) -> None:
    """Carry attempt `attempt` out: `build` the request (and the stream opening), send it
    through `up` — or over `sockets`, a client socket's own upstream sockets, for a `dest`
    reached by its Responses socket — and `post` what arrives. A committed stream's chunks go
    the way its `AttemptStream` says: posted to the loop, or written here, or handed to the
    upstream connection's sink as they arrive (twserve.relay.stream)."""
    index = attempt.index
    reader = attempt.reader
    try:
        with attempt.scope:
            try:
                request, reader.opening = build()
                reader.upstream_sse = request.sse
                stream = reader.opening is not None
            except ClientTranslationError as exc:
                # The request cannot be written for this upstream: the client's to fix.
                await post(
                    AttemptFailed(index, request_failure(str(exc), status=exc.error_status_hint))
                )
                return
            try:
                opened = _open(attempt, up, request, dest, sockets)
                async with opened as answer:
                    await post(Head(index, answer.status, answer.headers))
                    if answer.status >= 400:
                        await post(ErrorBody(index, await read_prefix(answer, ERROR_BODY_LIMIT)))
                        return
                    if not stream:
                        # Not read_prefix, which stops quietly at a break: a whole answer cut
                        # off half-way must fail the attempt (UpstreamBroken below), never pass
                        # for a complete one.
                        parts: list[bytes] = []
                        size = 0
                        async for chunk in answer.chunks():
                            parts.append(chunk)
                            size += len(chunk)
                            if size > WHOLE_BODY_LIMIT:
                                break
                        if size > WHOLE_BODY_LIMIT:
                            await post(Broken(index, "answer larger than the gateway reads"))
                        else:
                            await post(Whole(index, b"".join(parts)))
                        return
                    client = attempt.stream
                    async for chunk in answer.chunks():
                        if client.mode in READER_WRITES:
                            await client.write(chunk, answer)
                        else:
                            client.queue()
                            await post(Chunk(index, chunk))
                    await post(End(index))
            except UpstreamUnreachable as exc:
                await post(AttemptFailed(index, classify_transport(exc.fault)))
            except UpstreamBroken as exc:
                await post(Broken(index, str(exc)))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ClientGone):
        pass  # the request is over; nobody reads this attempt any more
    finally:
        reader.done = True
