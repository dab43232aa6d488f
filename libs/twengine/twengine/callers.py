"""Who is calling, and whether they may: the caller checks of one config (docs/operations.md).

`Callers` holds what a config says of callers — its gateway keys (`KeyRing`), the
``listen.gateway.allow_from`` filter (`AddressFilter`) and what it allows of web pages
(``allow_origins``, ``allow_hosts``: `twengine.browser`). `Callers.check` recognises a request's
route and the client its key names and returns `twengine.admission.check_caller`'s verdict;
`Callers.head_refusal` is the part of it a request's head is enough for, which a transport asks
before it reads the body: everything but the generation itself, so no body is buffered for a
request that is refused anyway. The request is read through `CallerHead`, the few fields of a
request's head these checks need.

Where a client puts its key is a protocol fact (`twproto.find_key`). Every configured key is
compared with `hmac.compare_digest` and all of them are compared every time, so neither the
answer's timing nor its early exit tells which key came close. Keys are compared as UTF-8
bytes: a header value's raw bytes, a query value's percent-decoded bytes, a configured key
encoded as UTF-8. Bytes that are not UTF-8 ride along as surrogate escapes, so they compare as
themselves and never collapse into a replacement character that some other key might also
contain.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from twengine.admission import LocalAnswer, Refusal, check_caller
from twengine.browser import browser_refusal
from twengine.config.model import Config
from twproto import GatewayError, match_path
from twproto.keys import find_key
from twproto.paths import PathRoute

__all__ = ("AddressFilter", "CallerHead", "Callers", "KeyRing", "announces_body")

Header = tuple[bytes, bytes]

# The headers `twengine.browser` reads, found in one pass over the request's headers.
_BROWSER_HEADERS = frozenset((b"origin", b"sec-fetch-site", b"content-type", b"host"))
# Refusals the head is enough for (address, web page, content type, key); a 404 too when a body
# follows (`Callers.head_refusal`).
_HEAD_REFUSED = frozenset((401, 403, 415))


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The configured gateway keys, each with the name of the client it belongs to and the
    wall-clock time it stops opening the gateway (None: never; a rotation's previous key)."""

    entries: tuple[tuple[bytes, str, float | None], ...]

    @classmethod
    def of(
        cls, pairs: Sequence[tuple[str, str]], until: Sequence[tuple[str, str, float]] = ()
    ) -> KeyRing:
        """The ring of `(key, client name)` pairs and `(key, client name, until)` triples; an
        empty key is no key."""
        entries: list[tuple[bytes, str, float | None]] = [
            (key.encode(), name, None) for key, name in pairs if key
        ]
        entries += [(key.encode(), name, at) for key, name, at in until if key]
        return cls(tuple(entries))

    def lookup(self, presented: str | None, now: float = 0.0) -> str | None:
        """The client name for `presented` at wall-clock `now`, or None; constant time in the
        key's content (every entry is compared, a lapsed one too)."""
        if not presented:
            return None
        raw = presented.encode("utf-8", "surrogateescape")
        match: str | None = None
        for key, name, until in self.entries:
            if hmac.compare_digest(key, raw) and match is None and (until is None or now < until):
                match = name
        return match


class AddressFilter:
    """``listen.gateway.allow_from``: CIDRs allowed to connect; loopback is always allowed."""

    __slots__ = ("networks",)

    def __init__(self, cidrs: Sequence[object]) -> None:
        self.networks = tuple(ipaddress.ip_network(str(c), strict=False) for c in cidrs)

    def allows(self, address: str) -> bool:
        """Whether a client at `address` (an IP, IPv6 zone allowed) may connect."""
        if not self.networks:
            return True
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if ip.is_loopback:
            return True
        mapped = getattr(ip, "ipv4_mapped", None)
        if mapped is not None and (mapped.is_loopback or any(mapped in n for n in self.networks)):
            return True
        return any(ip in n for n in self.networks if n.version == ip.version)


class CallerHead(Protocol):
    """What the caller checks read of a request's head: its method, path and query, its
    headers (names lower-case, in arrival order) and the client's address and port."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def query(self) -> str: ...

    @property
    def headers(self) -> Sequence[Header]: ...

    @property
    def client(self) -> tuple[str, int]: ...


def announces_body(headers: Sequence[Header]) -> bool:
    """Whether a request's head announces a body (a length above 0, or chunks)."""
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            return True
    return False


class Callers:
    """The caller checks of one config."""

    __slots__ = ("addresses", "config", "expiry", "keys", "listen")

    def __init__(self, config: Config) -> None:
        self.config = config
        # A disabled key is not on the ring: it is refused as a wrong key is, so a caller
        # holding it learns nothing about the entry.
        usable = [c for c in config.clients if not c.disabled]
        self.keys = KeyRing.of(
            [(c.key, c.name) for c in usable],
            [
                (c.previous_key, c.name, c.previous_key_until)
                for c in usable
                if c.previous_key and c.previous_key_until is not None
            ],
        )
        # The keys with an expiry (`clients[].expires_at`), by name.
        self.expiry = {c.name: c.expires_at for c in usable if c.expires_at is not None}
        self.addresses = AddressFilter(list(config.listen.gateway.allow_from))
        self.listen = config.listen.gateway

    def check(
        self, head: CallerHead, *, now: float, browser: GatewayError | None = None
    ) -> tuple[PathRoute | None, str | None, Refusal | LocalAnswer | None]:
        """The request's route, its key's client name, and `check_caller`'s verdict at
        wall-clock `now` (keys expire, a rotation's previous key lapses); `browser` is
        `web_page`'s (the head check asks it, once per request)."""
        route = match_path(head.method, head.path, head.query)
        presented = find_key(head.headers, head.query)
        matched = self.keys.lookup(presented, now)
        client = self.config.client_for(matched, presented=bool(presented))
        expires = self.expiry.get(client) if self.expiry and client is not None else None
        verdict = check_caller(
            method=head.method,
            path=head.path,
            route=route,
            address_allowed=self.addresses.allows(head.client[0]),
            client=client,
            key_presented=bool(presented),
            browser=browser,
            expired_at=expires if expires is not None and now >= expires else None,
        )
        return route, client, verdict

    def web_page(self, head: CallerHead) -> GatewayError | None:
        """`twengine.browser`'s verdict on the request's head: one pass over its headers, and
        no call at all for what SDKs and tools send (no Origin, no Sec-Fetch-Site, JSON)."""
        origin = fetch_site = content_type = host = None
        for name, value in head.headers:
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
            method=head.method,
            origin=origin,
            fetch_site=fetch_site,
            content_type=content_type,
            host=host,
        )

    def head_refusal(self, head: CallerHead, *, now: float) -> GatewayError | None:
        """The refusal a request's head is enough for — address, web page, content type, key,
        and the path when a body follows — so that no body is buffered for a request that would
        be refused anyway; None lets the request on, to the handler, which makes the same checks
        again (`check`) but for the web page's, made once here."""
        _, _, verdict = self.check(head, now=now, browser=self.web_page(head))
        if not isinstance(verdict, Refusal):
            return None  # the handler answers (generation, listing, warm-up probe, health)
        err = verdict.error
        if err.status not in _HEAD_REFUSED and not (
            err.status == 404 and announces_body(head.headers)
        ):
            return None  # a bodiless 404 keeps its connection: the handler answers it
        return err
