"""Per-turn overhead of the Responses WebSocket against the same turn over HTTP/1.1.

The gateway and a mock upstream (OpenAI Responses) run in processes of their own on loopback;
the client asks for the same short streamed Responses answer either as ``POST /v1/responses``
on one kept-alive HTTP/1.1 connection or as a ``response.create`` on one open WebSocket, one
turn after another, reading each to its ``response.completed``. The gateway talks HTTP/1.1 to
the mock either way, so only the client side's transport differs — unless
``--upstream-transport websocket``, which configures the mock as ``responses_transport:
websocket``: then the socket's turns reach the mock over its own Responses WebSocket (the HTTP
requests still over HTTP). The two are alternated in one run so that drift in the machine's
load hits both.

Reported as medians over `--runs` of wall time and gateway CPU time per turn, with the ratio
WebSocket ÷ HTTP (below 1: the WebSocket is cheaper). Machines are noisy: read the ratios.

    python -m benchmarks.e2e.ws_overhead [--turns 200] [--runs 5] [--chunks 20]
        [--upstream-transport http|websocket] [--json F]
"""

from __future__ import annotations

import argparse
import json
import time

import anyio
import httpcore
import websockets

from benchmarks.support.harness import (
    KEY,
    cpu_seconds,
    gateway_yaml,
    medians,
    mock_and_gateway,
    ratio,
    report,
)

TURN = {"model": "bench", "input": "benchmark", "max_output_tokens": 64}


def config(mock_port: int, port: int, transport: str = "http") -> str:
    return gateway_yaml(
        port,
        f"""  - name: up
    protocol: openai-responses
    base_url: 'http://127.0.0.1:{mock_port}/v1'
    key: k
    responses_transport: {transport}
""",
    )


BODY = json.dumps({**TURN, "stream": True}).encode()
HEADERS = [(b"authorization", b"Bearer " + KEY.encode()), (b"content-type", b"application/json")]


async def http_turns(port: int, n: int) -> float:
    """Seconds per turn over one kept-alive HTTP/1.1 connection."""
    url = f"http://127.0.0.1:{port}/v1/responses"
    async with httpcore.AsyncConnectionPool(max_connections=1) as pool:

        async def one() -> None:
            async with pool.stream("POST", url, headers=HEADERS, content=BODY) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {await resp.aread()!r}")
                tail = b""
                async for chunk in resp.aiter_stream():
                    tail = (tail + chunk)[-4096:]
                if b"response.completed" not in tail:
                    raise RuntimeError("the stream did not complete")

        await one()  # the connection is open before the clock starts
        start = time.perf_counter()
        for _ in range(n):
            await one()
        return (time.perf_counter() - start) / n


async def ws_turns(port: int, n: int) -> float:
    """Seconds per turn over one open WebSocket."""
    create = json.dumps({"type": "response.create", **TURN})
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses",
        additional_headers={"authorization": f"Bearer {KEY}"},
        compression=None,
    ) as ws:

        async def one() -> None:
            await ws.send(create)
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.completed":
                    return
                if event["type"] in ("error", "response.failed"):
                    raise RuntimeError(f"turn failed: {event}")

        await one()
        start = time.perf_counter()
        for _ in range(n):
            await one()
        return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=20, help="chunks per answer")
    ap.add_argument(
        "--upstream-transport",
        choices=("http", "websocket"),
        default="http",
        help="how the socket's turns reach the mock (responses_transport)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    script = json.dumps({"chunks": args.chunks, "chunk_size": 8})
    wall: dict[str, list[float]] = {"http": [], "websocket": []}
    cpu: dict[str, list[float]] = {"http": [], "websocket": []}
    runners = {"http": http_turns, "websocket": ws_turns}
    with mock_and_gateway(
        lambda mock_port, port: config(mock_port, port, args.upstream_transport),
        ["--script", script],
        prefix="twserve-ws-bench-",
    ) as served:
        port, pid = served.gateway_port, served.gateway_pid
        for run in runners.values():  # warm up both paths
            anyio.run(run, port, 20)
        for _ in range(args.runs):
            for name, run in runners.items():
                before = cpu_seconds(pid)
                wall[name].append(anyio.run(run, port, args.turns) * 1e3)
                cpu[name].append((cpu_seconds(pid) - before) / args.turns * 1e3)

    figures: dict[str, object] = {
        "chunks_per_answer": args.chunks,
        "upstream_transport": args.upstream_transport,
        "turns_per_run": args.turns,
        "runs": args.runs,
        "wall_ms_per_turn": medians(wall),
        "gateway_cpu_ms_per_turn": medians(cpu),
        "ratio_websocket_to_http": {
            "wall": ratio(wall, "websocket", "http"),
            "cpu": ratio(cpu, "websocket", "http"),
        },
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
