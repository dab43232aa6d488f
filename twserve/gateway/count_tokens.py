"""Token counts answered here when the upstream of the client's format cannot count
(docs/operations.md).

A token count goes to one upstream of the client's own format, never retried and never failed
over to another format. When that upstream answers 404 or 405 — a relay without the counting
endpoint — the count is estimated locally instead of handing the client an error for a call
that the gateway can answer. `LocalFallbackResponder` sits between the relay and the client:
it passes every other answer on untouched and holds back a 404/405, which `answer_held` then
replaces with the local estimate (`answer_locally`).
"""

from __future__ import annotations

from twproto.dialect import Dialect
from twproto.summary import count_tokens_body
from twserve.server.base import Headers, Responder

__all__ = ["UNSUPPORTED_STATUSES", "LocalFallbackResponder", "answer_locally"]

#: Statuses by which an upstream says it has no token-count endpoint.
UNSUPPORTED_STATUSES = frozenset({404, 405})


class LocalFallbackResponder:
    """A `Responder` that holds back an answer whose status is in `UNSUPPORTED_STATUSES`."""

    def __init__(self, inner: Responder, dialect: Dialect, input_tokens: int) -> None:
        self.inner = inner
        self.dialect = dialect
        self.input_tokens = input_tokens  # the local estimate, answered in place of a 404/405
        self.held_status: int | None = None

    @property
    def held(self) -> bool:
        return self.held_status is not None

    @property
    def started(self) -> bool:
        return self.inner.started

    async def start(self, status: int, headers: Headers) -> None:
        if status in UNSUPPORTED_STATUSES:
            self.held_status = status
            return
        await self.inner.start(status, headers)

    async def send(self, data: bytes) -> None:
        if not self.held:
            await self.inner.send(data)

    def ready(self) -> bool:
        return not self.held and self.inner.ready()

    def send_now(self, data: bytes) -> None:
        self.inner.send_now(data)

    async def end(self) -> None:
        if not self.held:
            await self.inner.end()

    async def abort(self) -> None:
        await self.inner.abort()

    async def answer_held(self) -> None:
        """After the relay: the local estimate in place of an answer held back."""
        if self.held:
            await answer_locally(self.inner, self.dialect, self.input_tokens)


async def answer_locally(responder: Responder, dialect: Dialect, input_tokens: int) -> None:
    """The estimated count in `dialect`'s shape, marked ``x-thinkwatch-local: 1``."""
    body = count_tokens_body(dialect, input_tokens)
    await responder.start(
        200,
        [
            (b"content-type", b"application/json"),
            (b"x-thinkwatch-local", b"1"),
            (b"content-length", str(len(body)).encode()),
        ],
    )
    await responder.send(body)
    await responder.end()
