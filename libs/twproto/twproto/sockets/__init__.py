"""The two WebSocket APIs the gateway speaks, as values and text (docs/transports.md).

`responses` — the Responses WebSocket: what a client's event asks for, the events the gateway
writes itself on that socket, and the gateway's own socket to an upstream. `realtime` — the
Realtime API, read only as far as usage, the events that start a response, and errors.

A folder, not a facade: every public name is exported by ``twproto`` itself.
"""

__all__ = ()
