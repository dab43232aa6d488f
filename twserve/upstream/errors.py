"""The two ways an upstream request fails, named by when it happened.

`UpstreamUnreachable`: no response head arrived (refused, reset, TLS, DNS, a timeout while
connecting): the request may not have reached the upstream at all; it carries the `TransportFault`
the failure classifier takes. `UpstreamBroken`: the body broke off after the head. Every way to an
upstream (the HTTP/1.1 pool in twserve/upstream/h1_pool.py, httpcore's HTTP/2 pools and the sockets
in twserve/upstream/responses_socket.py) raises these; twserve/upstream/client.py exports them with
the `Upstream` protocol.

A connect that fails because the gateway's own host is short of something (`LOCAL_SHORTAGE`: file
descriptors, socket buffers, local ports) is `TransportFault.LOCAL_RESOURCES`, not a refusal by
the upstream: under thousands of streams it is the gateway's load, and the upstream it was
dialling must not be paused for it (docs/failures.md, "Transport faults").
"""

from __future__ import annotations

import errno

from twproto.failures import TransportFault

__all__ = ["LOCAL_SHORTAGE", "UpstreamBroken", "UpstreamUnreachable"]

#: `OSError.errno` values of a connect the gateway's host refused to make itself.
LOCAL_SHORTAGE = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)


class UpstreamUnreachable(Exception):
    """No response head arrived: the request may not have reached the upstream at all."""

    def __init__(self, fault: TransportFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault
        self.detail = detail


class UpstreamBroken(Exception):
    """The answer's body broke off after its head."""
