"""The one exception family of twproto.

Everything twproto raises about bytes or JSON it was given is a `ProtocolError`; any other
exception out of twproto is a bug. Like h11's ``ProtocolError``, each carries
`error_status_hint`: the HTTP status a server should answer with when the error reaches it
unhandled. The subclasses name *whose* input was bad, because that decides the answer:

- `ClientTranslationError` (400): the client's request cannot be converted. Trying another
  upstream would not help; the client has to fix it.
- `UpstreamTranslationError` (502): an upstream's answer cannot be converted to the client's
  format. The gateway failed, not the client.
- `SSEError` (502): a stream's framing is broken (twproto decodes streams from upstreams), with
  `SSEEventTooLarge` and `JSONArrayError` below it.
- `EventStreamError` (502 for what a decoder read, 500 for what cannot be encoded): an AWS event
  stream's framing is broken, with `EventStreamCorrupt`, `EventStreamTooLarge` and
  `EventStreamTruncated` below it (`twproto.eventstream`).

`ProtocolError` and `TranslationError` only group the others and cannot be raised themselves.
"""

from __future__ import annotations

__all__ = (
    "ClientTranslationError",
    "ProtocolError",
    "TranslationError",
    "UpstreamTranslationError",
)


class ProtocolError(Exception):
    """Input twproto cannot accept. `error_status_hint` is the HTTP status to answer with."""

    error_status_hint: int = 400

    def __init__(self, message: str, *, error_status_hint: int | None = None) -> None:
        if type(self) in _ABSTRACT:
            raise TypeError(f"raise a subclass of {type(self).__name__}, not the class itself")
        super().__init__(message)
        if error_status_hint is not None:
            self.error_status_hint = error_status_hint


class TranslationError(ProtocolError):
    """A body could not be converted between formats (see the two kinds below)."""


class ClientTranslationError(TranslationError):
    """The client's request cannot be converted (not JSON, not an object, a wrong shape)."""

    error_status_hint = 400


class UpstreamTranslationError(TranslationError):
    """An upstream's answer cannot be converted to the client's format."""

    error_status_hint = 502


_ABSTRACT: frozenset[type[ProtocolError]] = frozenset({ProtocolError, TranslationError})
