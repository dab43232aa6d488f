"""Who is calling: the client address check and the gateway key lookup (docs/operations.md).

Where a client puts its key is a protocol fact (`twproto.keys.find_key`). Every configured key is
compared with `hmac.compare_digest` and all of them are compared every time, so neither the
answer's timing nor its early exit tells which key came close.

Keys are compared as UTF-8 bytes: a header value's raw bytes, a query value's percent-decoded
bytes, a configured key encoded as UTF-8. Bytes that are not UTF-8 ride along as surrogate
escapes, so they compare as themselves and never collapse into a replacement character that
some other key might also contain.

The query is read as ``application/x-www-form-urlencoded`` (`urllib.parse`), the way clients
write it, so a name spelt with escapes (``%6Bey=``) is the ``key`` parameter both when the key
is looked for and when it is taken out before the request goes upstream.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote_plus

__all__ = ["AddressFilter", "KeyRing", "strip_key_param"]


def strip_key_param(query: str) -> str:
    """The query string without the ``key`` parameter (however its name is escaped), so the
    gateway key never travels upstream. Every other parameter is kept exactly as written."""
    kept = [
        part
        for part in query.split("&")
        if part and unquote_plus(part.partition("=")[0], errors="surrogateescape") != "key"
    ]
    return "&".join(kept)


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The configured gateway keys, each with the name of the client it belongs to."""

    entries: tuple[tuple[bytes, str], ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, str]]) -> KeyRing:
        return cls(tuple((key.encode(), name) for key, name in pairs if key))

    def lookup(self, presented: str | None) -> str | None:
        """The client name for `presented`, or None; constant time in the key's content."""
        if not presented:
            return None
        raw = presented.encode("utf-8", "surrogateescape")
        match: str | None = None
        for key, name in self.entries:
            if hmac.compare_digest(key, raw) and match is None:
                match = name
        return match


class AddressFilter:
    """``listen.gateway.allow_from``: CIDRs allowed to connect; loopback is always allowed."""

    def __init__(self, cidrs: Sequence[object]) -> None:
        self.networks = tuple(ipaddress.ip_network(str(c), strict=False) for c in cidrs)

    def allows(self, address: str) -> bool:
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
