"""A Realtime WebSocket upgrade goes through the gateway's head check, as every request does:
a missing or bad key, or a path nothing serves, is answered over HTTP before any ``101`` —
the upstream is never dialled, and a body the upgrade announces is not waited for. Over a raw
loopback socket, so what comes back first is seen byte for byte.
"""

from __future__ import annotations

import json
import socket
import time

from tests.twserve.conftest import KEY, MODELS, StackFactory
from tests.twserve.support.stack import Stack, Upstream

MODEL = MODELS["openai-responses"]


def _stack(stack: StackFactory) -> Stack:
    return stack({"rt": Upstream("openai-responses", extra={"realtime": True})})


def _upgrade(path: str, headers: list[str]) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        "host: 127.0.0.1",
        "upgrade: websocket",
        "connection: Upgrade",
        "sec-websocket-version: 13",
        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(port: int, request: bytes) -> tuple[int, bytes, float]:
    """The status and body of the server's answer to `request`, and how long it took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk
            body += chunk
    return int(head.split(b" ", 2)[1]), body[:length], time.monotonic() - started


def _code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


def test_a_realtime_upgrade_without_a_key_is_refused_before_the_upgrade(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    status, body, _ = _answer(st.port, _upgrade(f"/v1/realtime?model={MODEL}", []))
    assert (status, _code(body)) == (401, "gw.auth.missing_key")
    assert not st.mock("rt").realtime.upgrades


def test_a_realtime_upgrade_with_a_bad_key_is_refused_before_the_upgrade(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    request = _upgrade(f"/v1/realtime?model={MODEL}", ["authorization: Bearer not-a-key"])
    status, body, _ = _answer(st.port, request)
    assert (status, _code(body)) == (401, "gw.auth.bad_key")
    assert not st.mock("rt").realtime.upgrades


def test_an_upgrade_that_announces_a_body_is_refused_without_waiting_for_it(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    # A body announced and never sent: the transport's head check refuses it at once (the
    # Realtime path takes no body), so nobody gets the gateway to hold one by upgrading.
    request = _upgrade(
        f"/v1/realtime?model={MODEL}",
        ["authorization: Bearer not-a-key", "content-length: 100000"],
    )
    status, body, took = _answer(st.port, request)
    assert 400 <= status < 500 and _code(body).startswith("gw."), body
    assert took < 5.0
    assert not st.mock("rt").realtime.upgrades


def test_a_websocket_upgrade_to_an_unknown_path_is_refused_over_http(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    for path in (f"/v1/realtime/other?model={MODEL}", "/v2/realtime", "/nowhere"):
        status, body, _ = _answer(st.port, _upgrade(path, [f"authorization: Bearer {KEY}"]))
        assert status == 404, (path, status, body)
        assert _code(body).startswith("gw.")
    assert not st.mock("rt").realtime.upgrades


def test_a_good_realtime_upgrade_is_switched(stack: StackFactory) -> None:
    # The same request with its key passes the head check and gets its 101: the refusals
    # above are the head check's, not a Realtime proxy that refuses everything.
    st = _stack(stack)
    request = _upgrade(f"/v1/realtime?model={MODEL}", [f"authorization: Bearer {KEY}"])
    with socket.create_connection(("127.0.0.1", st.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 101")
