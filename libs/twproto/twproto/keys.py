"""Where API keys travel: the gateway key a client presents, and the credential each upstream API
expects (docs/operations.md, "Keys and concurrency").

A client presents its gateway key the way its SDK sends an API key: Anthropic's ``x-api-key``,
Gemini's ``x-goog-api-key``, OpenAI's ``Authorization: Bearer``, or Gemini's ``key`` query
parameter. `find_key` looks in that order and skips empty values. An upstream gets the provider's
own key in the header of its API (`credential_headers`); the client's key headers are never
forwarded (`KEY_HEADERS`).

Keys are read as UTF-8 bytes; bytes that are not UTF-8 ride along as surrogate escapes, so they
compare as themselves (twengine.callers compares them). The query is read as
``application/x-www-form-urlencoded``, the way clients write it, so a name spelt with escapes
(``%6Bey=``) is the ``key`` parameter both when the key is looked for (`find_key`) and when it
is taken out before the request goes upstream (`strip_key_param`).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl, unquote_plus

from twproto.dialect import Dialect

__all__ = ("KEY_HEADERS", "credential_headers", "find_key", "strip_key_param")

#: Request headers that carry an API key, in every format.
KEY_HEADERS: frozenset[bytes] = frozenset({b"x-api-key", b"x-goog-api-key", b"authorization"})

_BY_NAME = (b"x-api-key", b"x-goog-api-key")


def find_key(headers: Sequence[tuple[bytes, bytes]], query: str) -> str | None:
    """The gateway key the client presented (lower-case header names), or None."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in KEY_HEADERS and name not in found:
            found[name] = value.strip()
    for wanted in _BY_NAME:
        presented = found.get(wanted)
        if presented:
            return presented.decode("utf-8", "surrogateescape")
    bearer = found.get(b"authorization")
    if bearer and bearer[:7].lower() == b"bearer ":
        token = bearer[7:].strip()
        if token:
            return token.decode("utf-8", "surrogateescape")
    if query:
        for qname, qvalue in parse_qsl(query, keep_blank_values=False, errors="surrogateescape"):
            if qname == "key" and qvalue:
                return qvalue
    return None


def strip_key_param(query: str) -> str:
    """The query string without the ``key`` parameter (however its name is escaped), so the
    gateway key never travels upstream. Every other parameter is kept exactly as written."""
    kept = [
        part
        for part in query.split("&")
        if part and unquote_plus(part.partition("=")[0], errors="surrogateescape") != "key"
    ]
    return "&".join(kept)


def credential_headers(dialect: Dialect, key: str) -> list[tuple[bytes, bytes]]:
    """The header that carries `key` to an upstream of `dialect` (none for an empty key)."""
    if not key:
        return []
    raw = key.encode()
    if dialect is Dialect.ANTHROPIC:
        return [(b"x-api-key", raw)]
    if dialect is Dialect.GEMINI:
        return [(b"x-goog-api-key", raw)]
    return [(b"authorization", b"Bearer " + raw)]
