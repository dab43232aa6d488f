"""Any bytes a client sends end in a typed answer or a closed connection, never a crash or a
hang, and the gateway keeps serving (docs/operations.md, "What a client may send"). Real sockets
against a running gateway."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twserve.server.base import ServerLimits

LIMITS = ServerLimits(head_timeout=0.2, body_timeout=0.2, keepalive_timeout=0.2)
PATHS = [
    "/v1/messages",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1beta/models/m:streamGenerateContent?alt=sse",
    "/v1/models",
    "/nope",
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    path: Path = tmp_path_factory.mktemp("fuzz")
    with running_stack(path, {"a": Upstream("anthropic")}, limits=LIMITS) as stack:
        yield stack


def _exchange(port: int, data: bytes) -> bytes:
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        try:
            sock.sendall(data)
            # No half-close: the gateway reads end of input as the client leaving. An
            # incomplete request is ended by the server's own timeouts (0.2 s here).
            while chunk := sock.recv(65536):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return out


def _still_serving(stack: Stack) -> None:
    body = json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    )
    req = (
        f"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {KEY}\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}"
    ).encode()
    assert _exchange(stack.port, req).startswith(b"HTTP/1.1 200")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes(gateway: Stack, data: bytes) -> None:
    answer = _exchange(gateway.port, data)
    # The HTTP/2 preface is answered with HTTP/2 frames, the server's SETTINGS first.
    h2_settings = data.startswith(b"PRI * HTTP/2.0") and answer[3:4] == b"\x04"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ") or h2_settings


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(PATHS),
    body=st.one_of(
        st.binary(max_size=512),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "model",
                            "messages",
                            "stream",
                            "contents",
                            "input",
                            "tools",
                            "max_tokens",
                            "x",
                        ]
                    ),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=12,
        ).map(lambda v: json.dumps(v).encode()),
    ),
)
def test_arbitrary_bodies_get_a_client_format_answer(
    gateway: Stack, path: str, body: bytes
) -> None:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\nx-api-key: {KEY}\r\nx-goog-api-key: {KEY}\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    answer = _exchange(gateway.port, head + body)
    status = int(answer.split(b" ", 2)[1])
    assert status < 500 or status in (502, 503, 504), answer[:300]
    if status >= 400:
        assert b"x-thinkwatch-error" in answer.lower()


def test_server_survives_the_fuzzing(gateway: Stack) -> None:
    _still_serving(gateway)
