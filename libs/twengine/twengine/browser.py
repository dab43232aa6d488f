"""Requests a web browser sends on a page's behalf: refused unless the config allows them.

A gateway with a ``default_key`` serves requests that carry no key, so any web page its user
opens could otherwise spend tokens through it: a page may send a ``text/plain`` POST, or open
a WebSocket, to ``127.0.0.1`` without the browser asking the gateway first (only a request a
page could not make with a form needs CORS's preflight). What gives such a request away is
what the browser adds and a page cannot remove. The rule (docs/operations.md, "Requests from
web pages"):

1. a request carrying ``Origin`` is refused (403 ``gw.request.foreign_origin``) unless
   ``listen.gateway.allow_origins`` lists that origin, or ``*``. Browsers send ``Origin`` on
   every POST, every WebSocket handshake and every cross-origin fetch; SDKs, command-line tools
   and agents (curl, Claude Code, Codex) send none;
2. without ``Origin``, a ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (``none``:
   the user typed the address) marks another page's request, refused likewise unless
   ``allow_origins`` has ``*``;
3. with ``listen.gateway.allow_hosts`` set, a ``Host`` (HTTP/2: ``:authority``) naming another
   host is refused (403 ``gw.request.unexpected_host``): a DNS-rebound page reaches the gateway
   under the page's own host name;
4. a POST whose ``Content-Type`` is present and not JSON (``application/json`` or
   ``…+json``, parameters aside) is refused (415 ``gw.request.unsupported_media_type``): the
   types a page may send without a preflight are form and text types, and no API the gateway
   serves takes them. A POST without ``Content-Type`` passes (the body is still read as JSON).

Header values arrive as the client sent them (bytes); nothing here allocates for a request that
carries none of these headers but its JSON ``Content-Type``.
"""

from __future__ import annotations

from collections.abc import Sequence

from twengine.config.model import GatewayListen
from twproto.errors import ErrorCategory, GatewayError

__all__ = ("browser_refusal", "host_name", "is_json_type")

_SAME_PAGE = (b"same-origin", b"none")
_JSON = b"application/json"


def is_json_type(content_type: bytes) -> bool:
    """Whether a ``Content-Type`` value names JSON: ``application/json`` or a ``+json`` type,
    any parameters (``; charset=utf-8``) aside, in any case."""
    if content_type == _JSON:  # what SDKs send: no copy made
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == _JSON or (media.startswith(b"application/") and media.endswith(b"+json"))


def host_name(host: bytes) -> str:
    """The host name of a ``Host`` value, lower-case, without its port or IPv6 brackets."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        return text.split(":", 1)[0]
    return text


def browser_refusal(
    listen: GatewayListen,
    *,
    method: str,
    origin: bytes | None,
    fetch_site: bytes | None,
    content_type: bytes | None,
    host: bytes | None,
) -> GatewayError | None:
    """The refusal of a request a web page made without the config's leave (module notes), or
    None. Each argument is that header's value, None when absent."""
    allow_origins: Sequence[str] = listen.allow_origins
    if origin is not None:
        if "*" not in allow_origins:
            seen = origin.decode("latin-1").strip().lower().rstrip("/")
            if seen not in allow_origins:
                return _foreign_origin()
    elif (
        fetch_site is not None and fetch_site.lower() not in _SAME_PAGE and "*" not in allow_origins
    ):
        return _foreign_origin()
    allow_hosts: Sequence[str] = listen.allow_hosts
    if allow_hosts and (host is None or host_name(host) not in allow_hosts):
        return GatewayError(
            status=403,
            category=ErrorCategory.DENIED,
            code="gw.request.unexpected_host",
            message="this gateway does not answer to that host name (listen.gateway.allow_hosts)",
        )
    if content_type is not None and method == "POST" and not is_json_type(content_type):
        return GatewayError(
            status=415,
            category=ErrorCategory.REQUEST,
            code="gw.request.unsupported_media_type",
            message="the request body must be sent as Content-Type: application/json",
        )
    return None


def _foreign_origin() -> GatewayError:
    return GatewayError(
        status=403,
        category=ErrorCategory.DENIED,
        code="gw.request.foreign_origin",
        message="requests from web pages are refused unless listen.gateway.allow_origins "
        "lists the page's origin",
    )
