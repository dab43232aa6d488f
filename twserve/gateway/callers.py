"""Who is calling, and whether they may: the gateway's caller checks (docs/operations.md).

`Callers` holds what the current config says of callers — its gateway keys, the
``listen.gateway.allow_from`` filter and what it allows of web pages (``allow_origins``,
``allow_hosts``: `twengine.browser`). `check` recognises a request's route and the client its key
names and returns `twengine.admission.check_caller`'s verdict; `head_refusal` is the part of it
a request's head is enough for, which the transport asks before it reads the body: everything
but the generation itself, so no body is buffered for a request that is refused anyway.
"""

from __future__ import annotations

from twengine.admission import LocalAnswer, Refusal, check_caller
from twengine.browser import browser_refusal
from twengine.config import Config
from twproto.errors import GatewayError, error_body, error_headers
from twproto.keys import find_key
from twproto.paths import Route, guess_client_dialect, match_path
from twserve.gateway.auth import AddressFilter, KeyRing
from twserve.server.base import HeadRefusal, Request

__all__ = ["Callers"]


# The headers `twengine.browser` reads, found in one pass over the request's headers.
_BROWSER_HEADERS = frozenset((b"origin", b"sec-fetch-site", b"content-type", b"host"))
# Refusals the head is enough for (address, web page, content type, key); a 404 too when a body
# follows (`head_refusal`).
_HEAD_REFUSED = frozenset((401, 403, 415))


class Callers:
    """The caller checks of one config."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.keys = KeyRing.of([(c.key, c.name) for c in config.clients])
        self.addresses = AddressFilter(list(config.listen.gateway.allow_from))
        self.listen = config.listen.gateway

    def check(
        self, request: Request, *, browser: GatewayError | None = None
    ) -> tuple[Route | None, str | None, Refusal | LocalAnswer | None]:
        """The request's route, its key's client name, and `check_caller`'s verdict; `browser`
        is `web_page`'s (the head check asks it, once per request)."""
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
            browser=browser,
        )
        return route, client, verdict

    def web_page(self, request: Request) -> GatewayError | None:
        """`twengine.browser`'s verdict on the request's head: one pass over its headers, and
        no call at all for what SDKs and tools send (no Origin, no Sec-Fetch-Site, JSON)."""
        origin = fetch_site = content_type = host = None
        for name, value in request.headers:
            if name in _BROWSER_HEADERS:
                if name == b"content-type":
                    content_type = value
                elif name == b"host":
                    host = value
                elif name == b"origin":
                    origin = value
                else:
                    fetch_site = value
        if (
            origin is None
            and fetch_site is None
            and not self.listen.allow_hosts
            and (content_type is None or content_type == b"application/json")
        ):
            return None
        return browser_refusal(
            self.listen,
            method=request.method,
            origin=origin,
            fetch_site=fetch_site,
            content_type=content_type,
            host=host,
        )

    def head_refusal(self, request: Request) -> HeadRefusal | None:
        """The checks a request's head is enough for — address, web page, content type, key,
        and the path when a body follows — so that no body is buffered for a request that would
        be refused anyway. Every transport asks it before the handler, which makes the same
        checks again (`check`) but for the web page's, made once here."""
        _, _, verdict = self.check(request, browser=self.web_page(request))
        if not isinstance(verdict, Refusal):
            return None  # the handler answers (generation, listing, warm-up probe, health)
        err = verdict.error
        if err.status not in _HEAD_REFUSED and not (err.status == 404 and _has_body(request)):
            return None  # a bodiless 404 keeps its connection: the handler answers it
        dialect = guess_client_dialect(request.path, request.headers)
        return HeadRefusal(
            status=err.status, headers=error_headers(err), body=error_body(dialect, err)
        )


def _has_body(request: Request) -> bool:
    """Whether a request's head announces a body (a length above 0, or chunks)."""
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            return True
    return False
