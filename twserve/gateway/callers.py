"""The caller checks' refusal from a request's head, as a transport writes it.

The checks themselves are twengine's (`twengine.callers.Callers`: the client address against
``listen.gateway.allow_from``, web pages, the gateway key, the path; docs/operations.md), and
after them load shedding's (`twengine.shedding.LoadGauge`: a request that passes them is refused
503 ``gw.overloaded`` while the gateway sheds load). A transport asks `head_refusal` before it
reads a request's body; the refusal is written in the shape the client's path and headers
suggest, and the connection then closes.

`door_refusal` is the same answer for a client the door (twserve/app/door.py) turns away while
the loop is behind, from the door's thread: the caller checks first, then the door's 503.
"""

from __future__ import annotations

from twengine.callers import Callers
from twengine.config import Config
from twengine.shedding import LoadGauge
from twproto.errors import GatewayError, error_body, error_headers
from twproto.paths import guess_client_dialect
from twserve.server.base import HeadRefusal, Request

__all__ = ["door_refusal", "head_refusal"]


def head_refusal(
    callers: Callers, request: Request, load: LoadGauge, config: Config, *, now: float
) -> HeadRefusal | None:
    """The answer to send instead of reading `request`'s body, or None to read it and go on
    (`twengine.callers.Callers.head_refusal`, `now` the wall clock for keys that expire; then
    `LoadGauge.verdict` under `config`'s ``listen.gateway`` bounds)."""
    err = callers.head_refusal(request, now=now) or load.verdict(config.listen.gateway)
    return None if err is None else _answer(request, err)


def door_refusal(
    callers: Callers,
    request: Request | None,
    refusal: GatewayError,
    load: LoadGauge,
    *,
    now: float,
) -> HeadRefusal:
    """The door's answer to `request` (None: no head could be read), `refusal` its 503 from
    `LoadGauge.at_door`: the caller checks' refusal when the head earns one (so that a wrong
    key is told 401, as on the loop), else `refusal`, counted in `load.shed_at_door`. `now` is
    the wall clock; this runs on the door's thread and only reads `callers`."""
    err = callers.head_refusal(request, now=now) if request is not None else None
    if err is None:
        err = refusal
        load.shed_at_door += 1
    return _answer(request, err)


def _answer(request: Request | None, err: GatewayError) -> HeadRefusal:
    """`err` written in the shape `request`'s path and headers suggest (OpenAI's without one)."""
    dialect = guess_client_dialect(
        request.path if request is not None else None,
        request.headers if request is not None else None,
    )
    return HeadRefusal(status=err.status, headers=error_headers(err), body=error_body(dialect, err))
