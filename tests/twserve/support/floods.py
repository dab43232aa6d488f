"""A client that sends without reading, for the flood tests: how much the server lets it send
before it stops reading (the socket's buffers full) or drops the connection."""

from __future__ import annotations

import socket
import time

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection
from wsproto.events import Request as WSRequest

__all__ = ["flood", "flood_socket", "ws_connect", "ws_ping", "ws_upgrade"]


def flood_socket(port: int) -> socket.socket:
    """A connected socket with a small receive buffer: the server's writes fill it soon."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


def flood(
    sock: socket.socket,
    first: bytes,
    blob: bytes,
    *,
    cap: int = 256 * 1024 * 1024,
    stall: float = 2.0,
) -> tuple[int, bool]:
    """Send `first`, then `blob` over and over, reading nothing, until the server closes the
    connection, takes nothing for `stall` seconds (it stopped reading), or `cap` bytes went
    out. Returns (bytes sent, closed). A test that waits for the close gives a long `stall`:
    a loaded machine's server reads slowly without having stopped."""
    sock.settimeout(0.25)
    sent, stalled_since = 0, None
    pending = memoryview(first + blob)
    deadline = time.monotonic() + 60
    while sent < cap and time.monotonic() < deadline:
        try:
            n = sock.send(pending)
        except TimeoutError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > stall:
                return sent, False
            continue
        except OSError:
            return sent, True
        sent += n
        stalled_since = None
        pending = pending[n:] or memoryview(blob)
    return sent, False


def ws_upgrade(path: str, key: str) -> bytes:
    """A WebSocket upgrade request for `path` with `key` as a bearer token."""
    ws = WSConnection(ConnectionType.CLIENT)
    headers = [(b"authorization", b"Bearer " + key.encode())]
    return ws.send(WSRequest(host="127.0.0.1", target=path, extra_headers=headers))


def ws_connect(sock: socket.socket, path: str, key: str) -> WSConnection:
    """The WebSocket handshake on `sock`, waiting for the 101; the client's connection."""
    ws = WSConnection(ConnectionType.CLIENT)
    headers = [(b"authorization", b"Bearer " + key.encode())]
    sock.settimeout(10)
    sock.sendall(ws.send(WSRequest(host="127.0.0.1", target=path, extra_headers=headers)))
    while True:
        data = sock.recv(65536)
        assert data, "closed during the handshake"
        ws.receive_data(data)
        for event in ws.events():
            assert isinstance(event, AcceptConnection), event
            return ws


def ws_ping(payload: bytes = b"") -> bytes:
    """One client ping frame (FIN, opcode 9, masked with a zero key) carrying `payload`, which
    its pong carries back. Made by hand: it may follow the upgrade request in the same write,
    before the server's 101 has been read (wsproto sends nothing before it)."""
    assert len(payload) <= 125
    return bytes([0x89, 0x80 | len(payload)]) + b"\0\0\0\0" + payload
