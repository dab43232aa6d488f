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

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from twengine.attempt import TurnAsSent
from twengine.destinations import Destination, Transport
from twproto.errors import request_failure
from twproto.failures import Failure, classify_transport
from twproto.stream import UpstreamStream
from twproto.translate import ClientTranslationError
from twproto.upstream_request import UpstreamRequest
from twserve.relay.stream import READER_WRITES, AttemptStream
from twserve.server.base import ClientGone
from twserve.upstream.client import (
    Headers,
    Upstream,
    UpstreamAnswer,
    UpstreamBroken,
    UpstreamUnreachable,
    read_prefix,
)
from twserve.upstream.responses_socket import SocketTurn

if TYPE_CHECKING:  # opentelemetry is imported only when traces are on
    from twserve.observe.traces import RequestTrace

__all__ = [
    "Attempt",
    "AttemptFailed",
    "AttemptItem",
    "Broken",
    "Built",
    "Chunk",
    "End",
    "ErrorBody",
    "Head",
    "ReaderState",
    "Whole",
    "read_attempt",
]

ERROR_BODY_LIMIT = 64 * 1024
WHOLE_BODY_LIMIT = 64 * 1024 * 1024


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
    upstream_eventstream: bool = False  # Bedrock's event stream (twproto.bedrock)
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


Built = tuple[UpstreamRequest, UpstreamStream | None]


Anew = Callable[[], str | None]


def _build(
    build: Callable[[TurnAsSent | None], Built], dest: Destination, turn: SocketTurn | None
) -> tuple[Built, Anew | None]:
    """The attempt's request: a client socket's turn (`turn`) that the gateway expanded goes as
    the client sent it (its new input and ``previous_response_id``) only over `dest`'s own
    socket, when the socket it would be sent on answered that response last, so the upstream
    holds the conversation; to any other upstream, or to a socket that does not hold it (opened
    anew since, or the earlier turn went elsewhere), the expanded turn goes
    (docs/conversion.md, "Responses state"). With the turn as sent comes the expanded turn's
    event, made only if that socket turns out closed and the turn goes on a new one."""
    as_sent = turn.as_sent if turn is not None else None
    if as_sent is None or dest.transport is not Transport.RESPONSES_SOCKET:
        return build(None), None
    assert turn is not None
    built = build(as_sent)
    if not turn.sockets.holds(built[0], as_sent.previous):
        return build(None), None
    sockets = turn.sockets
    return built, lambda: sockets.takes(build(None)[0])


def _open(
    attempt: Attempt,
    up: Upstream,
    request: UpstreamRequest,
    dest: Destination,
    turn: SocketTurn | None,
    anew: Anew | None,
) -> AbstractAsyncContextManager[UpstreamAnswer]:
    """The attempt's upstream request over `dest`'s transport: a turn of a client socket
    (`turn`) to a provider with its own Responses socket goes over that socket when it is a
    streamed create (`anew`: the event a new socket gets instead); everything else over
    HTTP/1.1 or HTTP/2 as the provider says."""
    timeout = dest.connect_timeout
    if dest.transport is Transport.RESPONSES_SOCKET and turn is not None:
        event = turn.sockets.takes(request)
        if event is not None:
            attempt.reader.over_socket = True
            return turn.sockets.open(request, event, connect_timeout=timeout, anew=anew)
    return up.open(request, connect_timeout=timeout, transport=dest.http_transport)


async def read_attempt(
    attempt: Attempt,
    up: Upstream,
    build: Callable[[TurnAsSent | None], Built],
    post: Callable[[AttemptItem], Awaitable[None]],
    dest: Destination,
    turn: SocketTurn | None = None,
    trace: RequestTrace | None = None,
) -> None:
    """Carry attempt `attempt` out: `build` the request (and the stream opening), send it
    through `up` — or, for a client socket's `turn`, over that socket's own upstream socket for
    a `dest` reached by its Responses socket — and `post` what arrives. A committed stream's
    chunks go the way its `AttemptStream` says: posted to the loop, or written here, or handed
    to the upstream connection's sink as they arrive (twserve.relay.stream). With `trace`, the
    attempt's span starts as its request is built, its context upstream in ``traceparent``."""
    index = attempt.index
    reader = attempt.reader
    try:
        with attempt.scope:
            try:
                (request, reader.opening), anew = _build(build, dest, turn)
                if trace is not None:
                    request.headers.append(trace.attempt(index, dest))
                reader.upstream_sse = request.sse
                reader.upstream_eventstream = request.eventstream
                stream = reader.opening is not None
            except ClientTranslationError as exc:
                # The request cannot be written for this upstream: the client's to fix.
                await post(
                    AttemptFailed(index, request_failure(str(exc), status=exc.error_status_hint))
                )
                return
            try:
                opened = _open(attempt, up, request, dest, turn, anew)
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
                        del chunk  # not kept while the next one is awaited (seconds, paced)
                    await post(End(index))
            except UpstreamUnreachable as exc:
                await post(AttemptFailed(index, classify_transport(exc.fault)))
            except UpstreamBroken as exc:
                await post(Broken(index, str(exc)))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ClientGone):
        pass  # the request is over; nobody reads this attempt any more
    finally:
        reader.done = True
