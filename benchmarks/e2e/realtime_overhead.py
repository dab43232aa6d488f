"""Per-frame overhead of the Realtime proxy against talking to the upstream directly.

The gateway and a mock upstream run in processes of their own on loopback. The client opens a
Realtime socket either straight to the mock (``direct``) or through the gateway's
``/v1/realtime`` (``gateway``, the mock configured as a Realtime upstream), then sends binary
frames of `--frame-bytes` (an audio chunk's size) one after another, each echoed back by the
mock, and waits for each echo before sending the next. Each round trip is two frames through the
proxy (one each way). The two paths are alternated in one run so that drift in the machine's
load hits both.

Reported as medians over `--runs` of wall time per round trip for both paths, the difference
(the proxy's added latency per round trip), and the gateway's CPU time per frame relayed.
Machines are noisy: read the medians, not one run.

    python -m benchmarks.e2e.realtime_overhead [--frames 2000] [--runs 5] [--frame-bytes 960]
        [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import anyio
import websockets

from benchmarks.support.harness import KEY, cpu_seconds, gateway_yaml, mock_and_gateway, report

MODEL = "bench-realtime"


def config(mock_port: int, port: int) -> str:
    return gateway_yaml(
        port,
        f"""  - name: up
    protocol: openai-responses
    base_url: 'http://127.0.0.1:{mock_port}/v1'
    key: k
    realtime: true
""",
    )


async def round_trips(url: str, n: int, frame_bytes: int) -> float:
    """Seconds per echoed frame over one open Realtime socket at `url`."""
    frame = os.urandom(frame_bytes)
    async with websockets.connect(
        url,
        additional_headers={"authorization": f"Bearer {KEY}"},
        compression=None,
        max_size=None,
    ) as ws:
        created = json.loads(await ws.recv())
        if created.get("type") != "session.created":
            raise RuntimeError(f"unexpected first event: {created}")

        async def one() -> None:
            await ws.send(frame)
            echo = await ws.recv()
            if echo != frame:
                raise RuntimeError("the echo differs from the frame sent")

        for _ in range(10):  # the socket is warm before the clock starts
            await one()
        start = time.perf_counter()
        for _ in range(n):
            await one()
        return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=2000, help="round trips per run and path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--frame-bytes", type=int, default=960, help="20 ms of 24 kHz PCM16 audio")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    wall: dict[str, list[float]] = {"direct": [], "gateway": []}
    cpu_per_frame: list[float] = []
    with mock_and_gateway(config, prefix="twserve-realtime-bench-") as served:
        urls = {
            "direct": f"ws://127.0.0.1:{served.mock_port}/v1/realtime?model={MODEL}",
            "gateway": f"ws://127.0.0.1:{served.gateway_port}/v1/realtime?model={MODEL}",
        }
        for url in urls.values():  # warm up both paths
            anyio.run(round_trips, url, 50, args.frame_bytes)
        for _ in range(args.runs):
            for name, url in urls.items():
                before = cpu_seconds(served.gateway_pid)
                secs = anyio.run(round_trips, url, args.frames, args.frame_bytes)
                wall[name].append(secs * 1e6)
                if name == "gateway":
                    spent = cpu_seconds(served.gateway_pid) - before
                    cpu_per_frame.append(spent / (2 * args.frames) * 1e6)

    med = {name: round(statistics.median(values), 1) for name, values in wall.items()}
    figures: dict[str, object] = {
        "frame_bytes": args.frame_bytes,
        "round_trips_per_run": args.frames,
        "runs": args.runs,
        "wall_us_per_round_trip": med,
        "added_us_per_round_trip": round(med["gateway"] - med["direct"], 1),
        "gateway_cpu_us_per_frame": round(statistics.median(cpu_per_frame), 1),
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
