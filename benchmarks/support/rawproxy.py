"""A raw byte-copying TCP proxy: the floor the gateway's overhead is measured against.

It parses nothing; each accepted connection is joined to a new connection to the target and
bytes are copied both ways until either side closes. Plain asyncio protocols (no streams, no
tasks per read) on uvloop when it is installed: the cheapest proxy Python can be.
"""

from __future__ import annotations

import argparse
import asyncio


class _Side(asyncio.Protocol):
    """One end of a joined pair: what it reads it writes to `peer` unchanged."""

    def __init__(self, peer: _Side | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # client bytes that arrive before the target connects

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # Back-pressure: stop reading one side while the other's write buffer is full.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def _join(client: _Side, target_port: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        _, upstream = await loop.create_connection(lambda: _Side(client), "127.0.0.1", target_port)
    except OSError:
        assert client.transport is not None
        client.transport.close()
        return
    client.peer = upstream
    for data in client.early:
        assert upstream.transport is not None
        upstream.transport.write(data)
    client.early.clear()


async def serve(listen_port: int, target_port: int) -> None:
    loop = asyncio.get_running_loop()

    def accept() -> _Side:
        client = _Side()
        loop.call_soon(lambda: loop.create_task(_join(client, target_port)))
        return client

    server = await loop.create_server(accept, "127.0.0.1", listen_port)
    print(f"rawproxy on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.target))
    else:
        uvloop.run(serve(args.port, args.target))


if __name__ == "__main__":
    main()
