"""How long a client that stops reading holds an upstream slot on a live gateway.

`twserve serve` (default limits: a 60 s write timeout) in front of a mock upstream whose one
slot (`max_concurrent: 1`) the client's request takes; the client then reads nothing more:

* ``ws`` — a Responses WebSocket turn with a long answer;
* ``realtime`` — a Realtime connection asked for one large message after another;
* ``h2-trickle`` — an HTTP/2 stream with a 1 KiB window, opened by one byte every `--every`
  seconds (40).

A second key asks for the same upstream every 2 s (its wait for a slot cut short, so that a
full slot is a quick 429); the time until it is served is how long the first client held the
slot. Gives up after `--cap` seconds.

    python -m benchmarks.e2e.held ws|realtime|h2-trickle [--cap 150] [--every 40]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import h2.config
import h2.connection
import h2.settings
import httpx2
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, TextMessage
from wsproto.events import Request as WSRequest

from benchmarks.support.harness import KEY, mock_and_gateway

OTHER = "bench-other-key"


def config(mock_port: int, port: int) -> str:
    return f"""version: 1
listen:
  gateway: {{bind: 127.0.0.1, port: {port}}}
clients:
  - {{name: bench, key: {KEY}}}
  - {{name: other, key: {OTHER}}}
failover: {{wait_secs: 0.5}}
providers:
  - name: m
    protocol: openai-responses
    base_url: 'http://127.0.0.1:{mock_port}/v1'
    key: k
    max_concurrent: 1
    realtime: true
"""


def _socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


def _ws(port: int, path: str) -> tuple[socket.socket, WSConnection]:
    sock, ws = _socket(port), WSConnection(ConnectionType.CLIENT)
    auth = [(b"authorization", f"Bearer {KEY}".encode())]
    sock.sendall(ws.send(WSRequest(host="127.0.0.1", target=path, extra_headers=auth)))
    while True:
        ws.receive_data(sock.recv(65536))
        if any(isinstance(e, AcceptConnection) for e in ws.events()):
            return sock, ws


def stop_reading_ws(port: int) -> socket.socket:
    sock, ws = _ws(port, "/v1/responses")
    create = {"type": "response.create", "model": "m", "input": "hi"}
    sock.sendall(ws.send(TextMessage(data=json.dumps(create))))
    return sock


def stop_reading_realtime(port: int) -> socket.socket:
    sock, ws = _ws(port, "/v1/realtime?model=m")
    big = ws.send(TextMessage(data=json.dumps({"type": "mock.big", "bytes": 1 << 20})))
    sock.sendall(big * 64)
    return sock


def trickle_h2(port: int, every: float, stop: threading.Event) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024}
    )
    conn.initiate_connection()
    body = json.dumps({"model": "m", "input": "hi", "stream": True}).encode()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "127.0.0.1"),
        (":path", "/v1/responses"),
        ("authorization", f"Bearer {KEY}"),
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
    ]
    conn.send_headers(1, headers)
    conn.send_data(1, body, end_stream=True)
    sock.sendall(conn.data_to_send())

    def run() -> None:
        sock.settimeout(0.5)
        next_byte = time.monotonic() + every
        while not stop.is_set():
            try:
                data = sock.recv(65536)
                if not data:
                    return
                conn.receive_data(data)
            except TimeoutError:
                pass
            except Exception:
                return
            if time.monotonic() >= next_byte:
                next_byte += every
                conn.increment_flow_control_window(1, stream_id=1)
                sock.sendall(conn.data_to_send())

    threading.Thread(target=run, daemon=True).start()
    return sock


def slot_free(port: int) -> bool:
    try:
        with httpx2.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/responses",
            json={"model": "m", "input": "hi", "stream": True},
            headers={"authorization": f"Bearer {OTHER}"},
            timeout=10,
        ) as reply:
            return reply.status_code == 200
    except httpx2.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["ws", "realtime", "h2-trickle"])
    parser.add_argument("--cap", type=float, default=150.0)
    parser.add_argument("--every", type=float, default=40.0)
    args = parser.parse_args()
    # A long answer: far more than the socket buffers hold.
    mock_args = ["--chunks", "200000", "--chunk-size", "256"]
    with mock_and_gateway(config, mock_args, prefix="twserve-held-") as served:
        stop = threading.Event()
        port = served.gateway_port
        if args.mode == "ws":
            sock = stop_reading_ws(port)
        elif args.mode == "realtime":
            sock = stop_reading_realtime(port)
        else:
            sock = trickle_h2(port, args.every, stop)
        began = time.monotonic()
        time.sleep(1)
        held = None
        while time.monotonic() - began < args.cap:
            if slot_free(port):
                held = round(time.monotonic() - began, 1)
                break
            time.sleep(2)
        stop.set()
        sock.close()
    print(json.dumps({"mode": args.mode, "slot_held_secs": held, "cap_secs": args.cap}))


if __name__ == "__main__":
    main()
