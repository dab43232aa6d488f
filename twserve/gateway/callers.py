"""The caller checks' refusal from a request's head, as a transport writes it.

The checks themselves are twengine's (`twengine.callers.Callers`: the client address against
``listen.gateway.allow_from``, web pages, the gateway key, the path; docs/operations.md). A
transport asks `head_refusal` before it reads a request's body; the refusal is written in the
shape the client's path and headers suggest, and the connection then closes.
"""

from __future__ import annotations

from twengine.callers import Callers
from twproto.errors import error_body, error_headers
from twproto.paths import guess_client_dialect
from twserve.server.base import HeadRefusal, Request

__all__ = ["head_refusal"]


def head_refusal(callers: Callers, request: Request, *, now: float) -> HeadRefusal | None:
    """The answer to send instead of reading `request`'s body, or None to read it and go on
    (`twengine.callers.Callers.head_refusal`; `now`: the wall clock, for keys that expire)."""
    err = callers.head_refusal(request, now=now)
    if err is None:
        return None
    dialect = guess_client_dialect(request.path, request.headers)
    return HeadRefusal(status=err.status, headers=error_headers(err), body=error_body(dialect, err))
