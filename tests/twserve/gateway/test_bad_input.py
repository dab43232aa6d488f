"""Bad input to the real gateway: each is refused with the right status and an error body in the
client's format (with ``x-thinkwatch-error``), never reaches an upstream, and the server goes on
serving the next request (docs/operations.md, "What a client may send")."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors

from tests.twserve.conftest import (
    KEY,
    MODELS,
    TIMEOUT,
    Reply,
    Sdks,
    StackFactory,
    ask,
    http,
)
from tests.twserve.support.stack import Stack, Upstream
from twserve.server import base

# One upstream per format, each format routed to its own.
_UPSTREAMS = {
    "anthropic": Upstream("anthropic"),
    "openai-chat": Upstream("openai-chat"),
    "openai-responses": Upstream("openai-responses"),
    "gemini": Upstream("gemini"),
}
_BY_FORMAT = {
    "routes": [
        {
            "name": "default",
            "rules": [
                {"name": fmt, "when": {"dialect": fmt}, "to": fmt}
                for fmt in ("anthropic", "openai-chat", "openai-responses", "gemini")
            ],
        }
    ]
}

# Where each format generates, and a valid body for it.
_PATHS = {
    "anthropic": "/v1/messages",
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "gemini": f"/v1beta/models/{MODELS['gemini']}:generateContent",
}
_GOOD = {
    "anthropic": b'{"model":"%s","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
    % MODELS["anthropic"].encode(),
    "openai-chat": b'{"model":"gpt-e2e-1","messages":[{"role":"user","content":"hi"}]}',
    "openai-responses": b'{"model":"gpt-e2e-1","input":"hi"}',
    "gemini": b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
}
_KEY_HEADER = {
    "anthropic": ("x-api-key", KEY),
    "openai-chat": ("authorization", f"Bearer {KEY}"),
    "openai-responses": ("authorization", f"Bearer {KEY}"),
    "gemini": ("x-goog-api-key", KEY),
}


@pytest.fixture
def st(stack: StackFactory) -> Iterator[Stack]:
    started = stack(_UPSTREAMS, config=_BY_FORMAT)
    yield started
    # Whatever was refused, the next request is served as usual ...
    for fmt in _UPSTREAMS:
        started.mock(fmt).reset()
    reply = http(
        started.url + _PATHS["anthropic"],
        body=_GOOD["anthropic"],
        headers=[_KEY_HEADER["anthropic"]],
    )
    assert reply.status == 200, reply.body
    assert len(started.mock("anthropic").received) == 1


def _nothing_reached_upstream(st: Stack) -> None:
    for fmt in _UPSTREAMS:
        assert not st.mock(fmt).received, f"{fmt} upstream was called"


def _assert_error(reply: Reply, status: int, fmt: str, category: str) -> None:
    """`reply` is a gateway error of `status` written in `fmt`'s error shape."""
    assert reply.status == status, reply.body
    assert reply.header("x-thinkwatch-error") == category
    assert reply.header("content-type") == "application/json"
    body = reply.json()
    if fmt == "anthropic":
        assert body["type"] == "error"
        assert isinstance(body["error"]["type"], str) and body["error"]["message"]
    elif fmt == "gemini":
        assert body["error"]["code"] == status
        assert isinstance(body["error"]["status"], str) and body["error"]["message"]
    else:
        assert set(body["error"]) >= {"message", "type", "code"} and body["error"]["message"]


def _raw(st: Stack, data: bytes, *, half_close: bool = False) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", st.port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            # Refused before the whole request was read, the server's close may come as a reset
            # after the answer; what arrived before it is the answer.
            pass
    return out


def _parse(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = tuple(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(b":") for line in lines)
    )
    return Reply(status=int(status_line.split()[1]), headers=headers, body=body)


# --- broken HTTP ------------------------------------------------------------------------------


def test_garbage_bytes(st: Stack) -> None:
    reply = _parse(_raw(st, b"\x00\x01\x02\xff garbage \x7f\r\n\r\n"))
    _assert_error(reply, 400, "openai-chat", "request")
    _nothing_reached_upstream(st)


def test_truncated_body(st: Stack) -> None:
    # content-length promises more than is sent, then the client stops sending.
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: %s\r\ncontent-type: "
        b"application/json\r\ncontent-length: 1000\r\n\r\n" % KEY.encode()
    )
    reply = _parse(_raw(st, head + b'{"model": "claude', half_close=True))
    _assert_error(reply, 400, "anthropic", "request")
    _nothing_reached_upstream(st)


def test_truncated_body_then_gone(st: Stack) -> None:
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: %s\r\ncontent-length: 1000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", st.port), timeout=TIMEOUT) as sock:
        sock.sendall(head % KEY.encode() + b"{")
    time.sleep(0.05)
    _nothing_reached_upstream(st)


def test_oversized_headers_in_one_read(st: Stack) -> None:
    head = b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: %s\r\nx-padding: %s\r\n\r\n" % (
        KEY.encode(),
        b"a" * 100_000,
    )
    reply = _parse(_raw(st, head))
    _assert_error(reply, 431, "anthropic", "request")
    _nothing_reached_upstream(st)


def test_oversized_headers_counted_by_the_server(stack: StackFactory) -> None:
    # A head that h11 parses whole in one read (under its incomplete-event bound) but that is
    # over the configured limit: only the server's own count catches it.
    st = stack(
        {"anthropic": Upstream("anthropic")}, limits=base.ServerLimits(max_header_bytes=8 * 1024)
    )
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 90) for i in range(120))
    head = b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: %s\r\n%s\r\n" % (
        KEY.encode(),
        headers,
    )
    assert 8 * 1024 < len(head) < 16 * 1024
    reply = _parse(_raw(st, head))
    _assert_error(reply, 431, "anthropic", "request")
    assert not st.mock("anthropic").received
    ok = http(st.url + "/v1/messages", body=_GOOD["anthropic"], headers=[_KEY_HEADER["anthropic"]])
    assert ok.status == 200


def test_oversized_body(st: Stack) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
        b"content-length: %d\r\n\r\n" % (KEY.encode(), 40 * 1024 * 1024)
    )
    reply = _parse(_raw(st, head))  # refused on the head alone: nothing of the body is read
    _assert_error(reply, 413, "openai-chat", "request")
    _nothing_reached_upstream(st)


# --- bad bodies -------------------------------------------------------------------------------

_BAD_BODIES = {
    "invalid-json": b'{"model": "x", "messages": [',
    "not-an-object": b'["model", "x"]',
    "empty": b"",
    "missing-model": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}',
}


@pytest.mark.parametrize(
    ("fmt", "case"),
    [
        (fmt, case)
        for fmt in _PATHS
        for case in _BAD_BODIES
        # a Gemini request names its model in the path
        if not (fmt == "gemini" and case == "missing-model")
    ],
)
def test_bad_body(st: Stack, fmt: str, case: str) -> None:
    reply = http(st.url + _PATHS[fmt], body=_BAD_BODIES[case], headers=[_KEY_HEADER[fmt]])
    _assert_error(reply, 400, fmt, "request")
    _nothing_reached_upstream(st)
    (row,) = st.wait_rows(1)
    assert row["status"] == 400 and row["provider"] is None


# --- paths and keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "fmt"),
    [
        ("/v1/nothing", [("x-api-key", KEY)], "anthropic"),
        ("/v1/nothing", [("anthropic-version", "2023-06-01")], "anthropic"),
        ("/v1beta/nothing", [], "gemini"),
        ("/nothing", [("x-goog-api-key", KEY)], "gemini"),
        ("/v2/chat", [("authorization", f"Bearer {KEY}")], "openai-chat"),
        ("/nothing", [], "openai-chat"),
    ],
)
def test_unknown_path(st: Stack, path: str, headers: list[tuple[str, str]], fmt: str) -> None:
    reply = http(st.url + path, body=b"{}", headers=headers)
    _assert_error(reply, 404, fmt, "request")
    _nothing_reached_upstream(st)


def _key_header(fmt: str, key: str) -> tuple[str, str]:
    name, _ = _KEY_HEADER[fmt]
    # h11 refuses a header value with trailing whitespace, so an empty bearer is "Bearer".
    return (name, f"Bearer {key}".strip()) if name == "authorization" else (name, key)


@pytest.mark.parametrize(
    "key", [None, "", "wrong-key", KEY + "x"], ids=["none", "empty", "wrong", "longer"]
)
@pytest.mark.parametrize("fmt", list(_PATHS))
def test_missing_or_wrong_key(st: Stack, fmt: str, key: str | None) -> None:
    headers = [] if key is None else [_key_header(fmt, key)]
    reply = http(st.url + _PATHS[fmt], body=_GOOD[fmt], headers=headers)
    _assert_error(reply, 401, fmt, "auth")
    _nothing_reached_upstream(st)


_AUTH_ERRORS: dict[str, type[Exception]] = {
    "anthropic": anthropic.AuthenticationError,
    "openai-chat": openai.AuthenticationError,
    "openai-responses": openai.AuthenticationError,
    "gemini": genai_errors.ClientError,
}


@pytest.mark.sdk
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", list(_PATHS))
def test_wrong_key_is_each_sdks_authentication_error(
    st: Stack, sdks: Sdks, fmt: str, stream: bool
) -> None:
    with pytest.raises(_AUTH_ERRORS[fmt]) as caught:
        ask(sdks, st, fmt, stream=stream, key="not-the-key")
    if fmt == "gemini":
        assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"  # type: ignore[attr-defined]
    else:
        assert caught.value.status_code == 401  # type: ignore[attr-defined]
    _nothing_reached_upstream(st)


def test_head_probe_without_key(st: Stack) -> None:
    started = time.monotonic()
    reply = http(st.url + "/", "HEAD")
    assert reply.status < 400 and reply.body == b""
    # Answered without waiting on any upstream (none is asked); the bound only catches a hang.
    assert time.monotonic() - started < 5.0
    _nothing_reached_upstream(st)


def test_healthz_without_key(st: Stack) -> None:
    reply = http(st.url + "/healthz", "GET")
    assert (reply.status, reply.body) == (200, b"ok")
    _nothing_reached_upstream(st)


@pytest.mark.parametrize(
    ("fmt", "path", "forwarded_query"),
    [
        (
            "gemini",
            f"/v1beta/models/{MODELS['gemini']}:streamGenerateContent?alt=sse&key={KEY}",
            "alt=sse",
        ),
        ("gemini", f"/v1beta/models/{MODELS['gemini']}:generateContent?key={KEY}", ""),
        ("anthropic", f"/v1/messages?key={KEY}", ""),
    ],
)
def test_query_key_is_accepted_and_stripped(
    st: Stack, fmt: str, path: str, forwarded_query: str
) -> None:
    reply = http(st.url + path, body=_GOOD[fmt])
    assert reply.status == 200, reply.body
    (received,) = st.mock(fmt).received
    assert received.query == forwarded_query
    for _, value in received.headers:
        assert KEY.encode() not in value
    assert KEY.encode() not in received.body
