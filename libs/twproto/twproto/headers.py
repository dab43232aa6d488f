"""Which upstream response headers a client may see (a wire fact, kept as data).

An upstream's answer carries headers about the upstream's own hop (framing, connection, date,
server, compression), about the operator's account there (organisation and project ids, rate
limit counters, cookies), and a few that describe the answer itself. Only the last kind is the
client's business, so the gateway passes an upstream's headers through an allow-list rather
than a deny-list: a header a provider adds tomorrow stays with the gateway until it is listed
here. Names are compared lower-cased, whatever case the upstream wrote them in (HTTP/1.1 servers
commonly send ``Content-Length``; the gateway writes its own framing).

The list applies where an upstream's head reaches a client as it came: same-format whole
answers and passed-through errors. Streams and converted answers get headers the gateway writes.
The gateway's own ``x-twserve-provider`` and ``x-twserve-model`` (who answered) are never on the
list: an upstream that sends headers of those names (another gateway in front of it) cannot
speak for this one.

``x-request-id`` is the gateway's own: it names the request's row in the gateway's store. The
upstream's id of that name reaches the client as ``x-upstream-request-id`` (`_RENAMED`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ("CLIENT_RESPONSE_HEADERS", "client_response_headers")

# name -> why a client needs it
CLIENT_RESPONSE_HEADERS: dict[bytes, str] = {
    b"content-type": "how to read the body",
    b"request-id": "Anthropic's request id; SDKs report it with errors",
    b"x-request-id": "OpenAI's request id, shown as x-upstream-request-id",
    b"retry-after": "when a refused request may be tried again (seconds or a date)",
    b"retry-after-ms": "the same in milliseconds (OpenAI, Anthropic SDKs read it)",
    b"x-should-retry": "the upstream's own word on retrying (Anthropic, OpenAI SDKs obey it)",
}

# Upstream header names a client sees under another name, because the gateway writes its own
# header of that name.
_RENAMED: dict[bytes, bytes] = {b"x-request-id": b"x-upstream-request-id"}


def client_response_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers of `headers` a client may see, names lower-cased, in their order."""
    kept: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lowered = name.lower()
        if lowered in CLIENT_RESPONSE_HEADERS:
            kept.append((_RENAMED.get(lowered, lowered), value))
    return kept
