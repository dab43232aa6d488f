"""At the connection cap, an idle connection of any protocol makes room for a new client.

An HTTP/1.1 connection kept alive between requests always did (test_transport_hardening.py);
an HTTP/2 connection without a stream and a Responses WebSocket without a turn are idle too,
and are closed the same way, each saying why: a GOAWAY (NO_ERROR) whose debug data names
``gw.listen.idle_closed``, a close frame 1001 with that reason. A connection with a stream or a
turn in progress is never the one closed. On a real gateway over loopback.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import h2.errors
from wsproto import WSConnection
from wsproto.events import CloseConnection, TextMessage

from tests.twserve.conftest import KEY, MODELS, StackFactory, fallback
from tests.twserve.support.floods import ws_connect
from tests.twserve.support.h2_client import RawH2
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script
from twserve.server.http2 import EVICTED_GOAWAY
from twserve.server.websocket import EVICTED_REASON

CAP = 2
GATEWAY = {"bind": "127.0.0.1", "max_connections": CAP, "max_connections_per_address": CAP}


MODEL = MODELS["openai-responses"]


def _stack(stack: StackFactory, settings: MockSettings | None = None) -> Stack:
    return stack(
        {"c": Upstream("openai-responses", settings or MockSettings())},
        config={"listen": {"gateway": GATEWAY}, **fallback("c")},
    )


def _wait(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _idle_h2(port: int) -> RawH2:
    """An HTTP/2 connection that had one answer and now has no stream."""
    client = RawH2(port, timeout=10)
    sid = client.request("/healthz", method="GET")
    assert client.finish(sid, timeout=10).status == 200
    return client


def _served_over_h1(port: int) -> float:
    """A new client's request: the seconds it took to be answered."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return time.monotonic() - started


def _open_count(st: Stack) -> int:
    return st.app.gateway_server.open_count


def test_an_idle_http2_connection_makes_room_with_a_goaway_that_says_why(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    first = _idle_h2(st.port)
    time.sleep(0.02)  # so that the first is the one idle longest
    second = _idle_h2(st.port)
    try:
        _wait(lambda: _open_count(st) == CAP)
        # At the cap: without the idle HTTP/2 connections making room, this waits for their
        # 75 s keep-alive time.
        assert _served_over_h1(st.port) < 5.0
        first.wait(lambda: first.goaway is not None, timeout=10)
        assert first.goaway is not None
        assert first.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert first.goaway.additional_data == EVICTED_GOAWAY
        first.wait_closed(timeout=10)
        # The other is still served on its connection.
        sid = second.request("/healthz", method="GET")
        assert second.finish(sid, timeout=10).status == 200
        assert second.goaway is None
    finally:
        first.close()
        second.close()


def test_an_http2_connection_with_a_stream_in_progress_is_not_closed(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    busy = RawH2(st.port, timeout=10)
    # A request whose body is still coming: its stream is open.
    busy_sid = busy.request(
        "/v1/responses",
        b'{"model": "' + MODEL.encode() + b'", ',
        headers=[("authorization", f"Bearer {KEY}"), ("content-type", "application/json")],
        end=False,
        length=False,
    )
    time.sleep(0.02)
    idle = _idle_h2(st.port)
    try:
        _wait(lambda: _open_count(st) == CAP)
        assert _served_over_h1(st.port) < 5.0
        idle.wait(lambda: idle.goaway is not None, timeout=10)
        # The busy one, older, is untouched: it finishes its request.
        busy.h2.send_data(busy_sid, b'"input": "x", "stream": false}', end_stream=True)
        busy.flush()
        answer = busy.finish(busy_sid, timeout=10)
        assert answer.status == 200 and busy.goaway is None
    finally:
        busy.close()
        idle.close()


@contextmanager
def _responses_socket(port: int) -> Iterator[tuple[socket.socket, WSConnection]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        yield sock, ws_connect(sock, "/v1/responses", KEY)
    finally:
        sock.close()


def _close_of(sock: socket.socket, ws: WSConnection) -> CloseConnection:
    """Read until the server's close frame."""
    sock.settimeout(10)
    while True:
        data = sock.recv(65536)
        assert data, "closed without a close frame"
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, CloseConnection):
                return event


def test_an_idle_responses_websocket_makes_room_with_a_close_that_says_why(
    stack: StackFactory,
) -> None:
    st = _stack(stack)
    with _responses_socket(st.port) as (sock, ws), _responses_socket(st.port) as (sock2, ws2):
        _wait(lambda: _open_count(st) == CAP)
        assert _served_over_h1(st.port) < 5.0
        close = _close_of(sock, ws)
        assert (close.code, close.reason) == (1001, EVICTED_REASON)
        # The other socket still takes turns.
        sock2.sendall(
            ws2.send(
                TextMessage(
                    data=json.dumps({"type": "response.create", "model": MODEL, "input": "x"})
                )
            )
        )
        kinds: list[str] = []
        while "response.completed" not in kinds:
            data = sock2.recv(65536)
            assert data, kinds
            ws2.receive_data(data)
            kinds += [
                json.loads(e.data)["type"] for e in ws2.events() if isinstance(e, TextMessage)
            ]


def test_a_websocket_with_a_turn_in_progress_is_not_closed(stack: StackFactory) -> None:
    st = _stack(
        stack, MockSettings(script=parse_script({"chunks": 30, "chunk_delay": 0.05}), seed=3)
    )
    with _responses_socket(st.port) as (sock, ws):
        sock.sendall(
            ws.send(
                TextMessage(
                    data=json.dumps({"type": "response.create", "model": MODEL, "input": "x"})
                )
            )
        )
        # The turn has started streaming.
        kinds: list[str] = []
        while "response.output_text.delta" not in kinds:
            data = sock.recv(65536)
            assert data
            ws.receive_data(data)
            kinds += [json.loads(e.data)["type"] for e in ws.events() if isinstance(e, TextMessage)]
        idle = _idle_h2(st.port)
        try:
            _wait(lambda: _open_count(st) == CAP)
            assert _served_over_h1(st.port) < 5.0
            idle.wait(lambda: idle.goaway is not None, timeout=10)  # the idle one went
            # The socket with its turn in progress goes on to the turn's end.
            while "response.completed" not in kinds:
                data = sock.recv(65536)
                assert data, kinds
                ws.receive_data(data)
                for event in ws.events():
                    assert not isinstance(event, CloseConnection), event
                    if isinstance(event, TextMessage):
                        kinds.append(json.loads(event.data)["type"])
        finally:
            idle.close()
