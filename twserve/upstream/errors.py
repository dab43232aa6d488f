"""The two ways an upstream request fails, named by when it happened.

`UpstreamUnreachable`: no response head arrived (refused, reset, TLS, DNS, a timeout while
connecting): the request may not have reached the upstream at all; it carries the `TransportFault`
the failure classifier takes. `UpstreamBroken`: the body broke off after the head. Every way to an
upstream (the HTTP/1.1 pool in twserve/upstream/h1_pool.py, httpcore's HTTP/2 pools and the sockets
in twserve/upstream/responses_socket.py) raises these; twserve/upstream/client.py exports them with
the `Upstream` protocol.
"""

from __future__ import annotations

from twproto.failures import TransportFault

__all__ = ["UpstreamBroken", "UpstreamUnreachable"]


class UpstreamUnreachable(Exception):
    """No response head arrived: the request may not have reached the upstream at all."""

    def __init__(self, fault: TransportFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault
        self.detail = detail


class UpstreamBroken(Exception):
    """The answer's body broke off after its head."""
