"""Any frames an HTTP/2 client sends after the preface end in answers, GOAWAY or a closed
connection — never a crash, a hang or a connection the server forgets — and the gateway keeps
serving (docs/transports.md). Real sockets against a running gateway with short timeouts."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twserve.server.base import ServerLimits
from twserve.server.http2 import PREFACE

LIMITS = ServerLimits(head_timeout=0.2, body_timeout=0.2, keepalive_timeout=0.2)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    path: Path = tmp_path_factory.mktemp("fuzz-h2")
    with running_stack(path, {"a": Upstream("anthropic")}, limits=LIMITS) as stack:
        yield stack


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream_id)
        + payload
    )


def _request_block() -> bytes:
    return hpack.Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "x"),
            (":path", "/v1/messages"),
            ("x-api-key", KEY),
        ]
    )


BODY = json.dumps(
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
).encode()

frames = st.one_of(
    # anything at all
    st.builds(
        _frame,
        st.integers(0, 12),
        st.integers(0, 255),
        st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
        st.binary(max_size=64),
    ),
    # well-formed pieces of a real request, for the fuzz to shuffle and cut
    st.sampled_from(
        [
            _frame(0x1, 0x4, 1, _request_block()),  # HEADERS, END_HEADERS
            _frame(0x1, 0x5, 3, _request_block()),  # HEADERS, END_HEADERS | END_STREAM
            _frame(0x0, 0x1, 1, BODY),  # DATA, END_STREAM
            _frame(0x3, 0x0, 1, struct.pack(">I", 8)),  # RST_STREAM CANCEL
            _frame(0x8, 0x0, 0, struct.pack(">I", 1 << 20)),  # WINDOW_UPDATE
            _frame(0x6, 0x0, 0, b"12345678"),  # PING
            _frame(0x4, 0x1, 0, b""),  # SETTINGS ACK
        ]
    ),
)


def _exchange(port: int, data: bytes) -> bytes:
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sent=st.lists(frames, max_size=8))
def test_arbitrary_frames_after_the_preface(
    gateway: Stack, sent: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="twserve"):
        answer = _exchange(gateway.port, PREFACE + _frame(0x4, 0, 0, b"") + b"".join(sent))
    assert answer[3:4] == b"\x04"  # the server's SETTINGS came first
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # Every connection ends and is forgotten (after its linger), and the gateway still answers.
    deadline = time.monotonic() + 5
    while gateway.app.gateway_server.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gateway.app.gateway_server.connections
    hello = PREFACE + _frame(0x4, 0, 0, b"") + _frame(0x1, 0x4, 1, _request_block())
    reply = _exchange(gateway.port, hello + _frame(0x0, 0x1, 1, BODY))
    assert b"message_stop" in reply or b'"type":"message"' in reply
