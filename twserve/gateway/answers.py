"""The gateway's own answers, before or instead of a relay: a refusal or an answer made here,
an error response, plain bytes, and the errors the HTTP layer answers itself — each written in
the client's format (`twproto.errors`). What comes from an upstream is written by the relay
(twserve.relay.client).
"""

from __future__ import annotations

from typing import assert_never

from twengine.admission import LocalAnswer, Refusal
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError, error_body, error_headers
from twproto.paths import guess_client_dialect
from twserve.server.base import Headers, Responder

__all__ = ["answer", "respond_bytes", "respond_error", "transport_error"]


async def respond_error(responder: Responder, dialect: Dialect, err: GatewayError) -> None:
    """`err` as a whole error response in `dialect`'s format."""
    body = error_body(dialect, err)
    await responder.start(
        err.status, [*error_headers(err), (b"content-length", str(len(body)).encode())]
    )
    await responder.send(body)
    await responder.end()


async def answer(responder: Responder, dialect: Dialect, verdict: Refusal | LocalAnswer) -> None:
    """A refusal in the client's format, or an answer made here."""
    match verdict:
        case Refusal(error=err):
            await respond_error(responder, dialect, err)
        case LocalAnswer(status=status, headers=headers, body=body):
            await respond_bytes(responder, status, body, headers=headers)
        case _:
            assert_never(verdict)


async def respond_bytes(
    responder: Responder,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    *,
    headers: tuple[tuple[bytes, bytes], ...] | None = None,
) -> None:
    """`body` as a whole answer with `status` (`headers`, or just its content type)."""
    head = list(headers) if headers is not None else [(b"content-type", content_type)]
    await responder.start(status, [*head, (b"content-length", str(len(body)).encode())])
    await responder.send(body)
    await responder.end()


def transport_error(
    path: str | None, status: int, code: str, message: str
) -> tuple[Headers, bytes]:
    """Errors the HTTP layer answers itself (bad HTTP, limits), in the client's format."""
    category = ErrorCategory.TIMEOUT if status == 408 else ErrorCategory.REQUEST
    if status >= 500:
        category = ErrorCategory.UPSTREAM
    if status == 503:  # the transport sheds load (request bodies): the client should back off
        category = ErrorCategory.RATE_LIMITED
    err = GatewayError(status=status, category=category, code=code, message=message)
    return error_headers(err), error_body(guess_client_dialect(path), err)
