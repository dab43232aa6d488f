"""What a flooding client makes a live gateway hold: its RSS while the client sends and never
reads, sampled from /proc.

`twserve serve` and `twserve mock-upstream` run as processes of their own
(benchmarks/support/harness.py); the client, in this process, opens one connection and does one
of:

* ``h2-ping`` / ``h2-settings`` — HTTP/2 by prior knowledge, then PING (or empty SETTINGS)
  frames back to back, no key needed;
* ``ws-ping`` — a Responses WebSocket, then pings of `--payload` bytes back to back;
* ``ws-turns`` — `--sockets` Responses WebSockets (3), each sending nine ``response.create``
  messages of `--mb` MB (one runs, eight wait in its queue) against a slow upstream.

It reads nothing, for `--secs` seconds, and prints the gateway's RSS every half second, its
peak, how many bytes it got to send and whether the gateway dropped the connection.

    python -m benchmarks.e2e.floods h2-ping|h2-settings|ws-ping|ws-turns [--secs 6] [--mb 30]
        [--sockets 3] [--payload 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, TextMessage
from wsproto.events import Request as WSRequest

from benchmarks.support.harness import KEY, gateway_yaml, memory_kib, mock_and_gateway

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"


def config(mock_port: int, gateway_port: int) -> str:
    provider = (
        "  - {name: m, protocol: openai-responses, "
        f"base_url: 'http://127.0.0.1:{mock_port}/v1', key: k}}"
    )
    return gateway_yaml(gateway_port, provider)


def flood_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the gateway's writes wait soon
    sock.connect(("127.0.0.1", port))
    return sock


def flood(sock: socket.socket, first: bytes, blob: bytes, secs: float) -> tuple[int, bool]:
    """`first`, then `blob` over and over for `secs`, reading nothing: (bytes sent, dropped)."""
    sock.settimeout(0.25)
    sent, pending = 0, memoryview(first + blob)
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        try:
            n = sock.send(pending)
        except TimeoutError:
            continue
        except OSError:
            return sent, True
        sent += n
        pending = pending[n:] or memoryview(blob)
    return sent, False


_AUTH = [(b"authorization", f"Bearer {KEY}".encode())]


def ws_open(sock: socket.socket) -> WSConnection:
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(WSRequest(host="127.0.0.1", target="/v1/responses", extra_headers=_AUTH)))
    while True:
        ws.receive_data(sock.recv(65536))
        for event in ws.events():
            assert isinstance(event, AcceptConnection), event
            return ws


def _h2(port: int, frame: bytes, secs: float) -> tuple[int, bool]:
    with flood_socket(port) as sock:
        return flood(sock, PREFACE + SETTINGS, frame * (65536 // len(frame)), secs)


def _ws_ping(port: int, secs: float, payload: int) -> tuple[int, bool]:
    # Ping frames made by hand (masked with a zero key), sent behind the upgrade request in
    # its very write, as a client that does not wait for the 101 would.
    ping = bytes([0x89, 0x80 | payload]) + b"\0\0\0\0" + b"p" * payload
    upgrade = WSConnection(ConnectionType.CLIENT).send(
        WSRequest(host="127.0.0.1", target="/v1/responses", extra_headers=_AUTH)
    )
    with flood_socket(port) as sock:
        return flood(sock, upgrade, ping * (65536 // len(ping)), secs)


def _ws_turns(port: int, secs: float, mb: int, sockets: int) -> tuple[int, bool]:
    sent, closed = 0, False
    socks = []
    text = json.dumps({"type": "response.create", "model": "m", "input": "x" * (mb << 20)})
    for _ in range(sockets):
        sock = flood_socket(port)
        socks.append(sock)
        message = ws_open(sock).send(TextMessage(data=text))
        sock.settimeout(secs)
        try:
            for _ in range(9):
                sock.sendall(message)
                sent += len(message)
        except OSError:
            closed = True
    time.sleep(secs)
    for sock in socks:
        sock.close()
    return sent, closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["h2-ping", "h2-settings", "ws-ping", "ws-turns"])
    parser.add_argument("--secs", type=float, default=6.0)
    parser.add_argument("--mb", type=int, default=30)
    parser.add_argument("--sockets", type=int, default=3, help="sockets of ws-turns")
    parser.add_argument("--payload", type=int, default=0, help="bytes in each ping (0-125)")
    args = parser.parse_args()
    # A slow upstream, so that the turns of ws-turns wait.
    mock_args = ["--chunks", "200", "--chunk-delay", "0.5"]
    served_pid = None
    try:
        with mock_and_gateway(config, mock_args, prefix="twserve-floods-") as served:
            served_pid = served.gateway_pid
            print(json.dumps(measure(args, served.gateway_pid, served.gateway_port)), flush=True)
    except subprocess.TimeoutExpired:
        # A gateway still busy with what the flood sent does not stop in time: stop it.
        print("the gateway did not stop within 10 s of SIGTERM; killed", file=sys.stderr)
        if served_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(served_pid, signal.SIGKILL)


def measure(args: argparse.Namespace, pid: int, port: int) -> dict[str, object]:
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            samples.append(memory_kib(pid)["VmRSS"] // 1024)

    start = memory_kib(pid)["VmRSS"] // 1024
    threading.Thread(target=sample, daemon=True).start()
    began = time.monotonic()
    if args.mode == "h2-ping":
        sent, closed = _h2(port, PING, args.secs)
    elif args.mode == "h2-settings":
        sent, closed = _h2(port, SETTINGS, args.secs)
    elif args.mode == "ws-ping":
        sent, closed = _ws_ping(port, args.secs, args.payload)
    else:
        sent, closed = _ws_turns(port, args.secs, args.mb, args.sockets)
    took = time.monotonic() - began
    done.set()
    return {
        "mode": args.mode,
        "rss_start_mb": start,
        "rss_samples_mb": samples,
        "rss_peak_mb": memory_kib(pid)["VmHWM"] // 1024,
        "client_sent_mb": round(sent / 2**20, 1),
        "dropped": closed,
        "secs": round(took, 1),
    }


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
