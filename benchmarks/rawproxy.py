"""A raw byte-copying TCP proxy: the floor the gateway's overhead is measured against.

It parses nothing; each accepted connection is joined to a new connection to the target and
bytes are copied both ways until either side closes.
"""

from __future__ import annotations

import argparse

import anyio
import anyio.abc


async def _copy(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
    try:
        async for chunk in src:
            await dst.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        try:
            await dst.send_eof()
        except Exception:
            pass


async def serve(
    listen_port: int,
    target_port: int,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async def handle(client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", target_port) as upstream:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_copy, client, upstream)
                tg.start_soon(_copy, upstream, client)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=listen_port)
    async with listener:
        task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
        await listener.serve(handle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    args = parser.parse_args()

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            port = await tg.start(serve, args.port, args.target)
            print(f"rawproxy on {port}", flush=True)

    anyio.run(run)


if __name__ == "__main__":
    main()
