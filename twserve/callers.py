"""Who is calling, and whether they may: the gateway's caller checks (docs/operations.md).

`Callers` holds what the current config says of callers — its gateway keys and the
``listen.gateway.allow_from`` filter. `check` recognises a request's route and the client its key
names and returns `twengine.admission.check_caller`'s verdict; `head_refusal` is the part of it
a request's head is enough for, which the transport asks before it reads the body.
"""

from __future__ import annotations

from twengine.admission import LocalAnswer, Refusal, check_caller
from twengine.config import Config
from twproto.errors import error_body, error_headers
from twproto.keys import find_key
from twproto.paths import Route, guess_client_dialect, match_path
from twserve import http1
from twserve.auth import AddressFilter, KeyRing
from twserve.httptypes import Request

__all__ = ["Callers"]


class Callers:
    """The caller checks of one config."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.keys = KeyRing.of([(c.key, c.name) for c in config.clients])
        self.addresses = AddressFilter(list(config.listen.gateway.allow_from))

    def check(
        self, request: Request
    ) -> tuple[Route | None, str | None, Refusal | LocalAnswer | None]:
        """The request's route, its key's client name, and `check_caller`'s verdict."""
        route = match_path(request.method, request.path, request.query)
        presented = find_key(request.headers, request.query)
        client = self.config.client_for(self.keys.lookup(presented), presented=bool(presented))
        verdict = check_caller(
            method=request.method,
            path=request.path,
            route=route,
            address_allowed=self.addresses.allows(request.client[0]),
            client=client,
            key_presented=bool(presented),
        )
        return route, client, verdict

    def head_refusal(self, request: Request) -> http1.Refusal | None:
        """The checks a request's head is enough for — address and key — so that no body is
        buffered for a request that would be refused anyway. The handler makes the same checks
        again (`check`)."""
        _, _, verdict = self.check(request)
        if not isinstance(verdict, Refusal) or verdict.error.status not in (401, 403):
            return None  # the handler answers the rest (404, the warm-up probe, health)
        err = verdict.error
        dialect = guess_client_dialect(request.path, request.headers)
        return http1.Refusal(
            status=err.status, headers=error_headers(err), body=error_body(dialect, err)
        )
