"""The gateway's own shortages before an upstream is reached, through the gateway: the upstream
pool's cap (`pool.max_connections`) and its wait (`pool.wait_secs`) — a request that finds every
connection in use waits, then fails over — and a host out of file descriptors. Neither is the
upstream's doing: it is not paused for them, and the client is told 503 `gw.overloaded` with
Retry-After in its own format, as load shedding says it."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpcore
import pytest

from tests.twserve.support.live import wait_for
from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script

SLOW = Script(text="one two three four five six seven eight", chunk_size=4, chunk_delay=0.15)


def providers(stack: Stack) -> dict[str, dict[str, object]]:
    answer = httpcore.request(
        "GET",
        stack.control_url + "/providers",
        headers={"authorization": f"Bearer {CONTROL_KEY}"},
    )
    return {p["name"]: p for p in json.loads(answer.content)["providers"]}


def stream_in_background(stack: Stack, started: threading.Event) -> threading.Thread:
    def run() -> None:
        with sdk_clients(stack.url, timeout=20) as clients:
            with clients.anthropic.messages.stream(
                model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                for _ in stream.text_stream:
                    started.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_full_pool_fails_the_attempt_without_pausing_the_upstream(tmp_path: Path) -> None:
    config = {
        "pool": {"max_connections": 1, "wait_secs": 0.2},
        "failover": {"failures_to_pause": 1, "wait_secs": 0},
    }
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SLOW), models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        started = threading.Event()
        holder = stream_in_background(stack, started)
        assert started.wait(10)
        with sdk_clients(stack.url) as clients:
            for _ in range(3):
                with pytest.raises(anthropic.APIStatusError) as raised:
                    clients.anthropic.messages.create(
                        model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
                    )
                # In the client's own format, saying which bound it met, and that it is the
                # gateway's load: retry shortly (or elsewhere).
                assert raised.value.status_code == 503
                assert "pool.max_connections" in raised.value.message
                headers = raised.value.response.headers
                assert headers["retry-after"] == "1"
                assert headers["x-thinkwatch-error"] == "rate_limited"
        state = providers(stack)["a"]
        # failures_to_pause is 1: one counted failure would have paused it.
        assert state["paused_until"] is None and state["failures_in_row"] == 0, state
        holder.join(20)
        # The connection is back: the next request goes through.
        with sdk_clients(stack.url) as clients:
            answer = clients.anthropic.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
            )
        assert answer.content
        rows = stack.wait_rows(5)
        refused = [r for r in rows if r["status"] != 200]
        assert len(refused) == 3
        for row in refused:
            assert row["error_code"] == "gw.overloaded"
            (attempt,) = json.loads(row["routing"])["attempts"]
            # It waited pool.wait_secs for a connection, then failed as the gateway's shortage.
            assert attempt["error"] == "gateway_busy" and attempt["ms"] >= 190, attempt


def answer(client: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """Send an Anthropic request on `client` and read its answer (framed by Content-Length)."""
    body = json.dumps(
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}]}
    ).encode()
    client.sendall(
        b"POST /v1/messages HTTP/1.1\r\nhost: gateway\r\nx-api-key: "
        + KEY.encode()
        + b"\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    while len(rest) < int(headers[b"content-length"]):
        rest += client.recv(65536)
    return int(lines[0].split()[1]), headers, rest


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    """This process may open no further file (socket() fails with EMFILE) until the block ends:
    the soft limit is set just above the highest descriptor open, and the holes below it are
    filled with /dev/null."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_host_out_of_descriptors_is_not_blamed_on_the_upstream(tmp_path: Path) -> None:
    # No idle upstream connection to reuse: each request dials the upstream anew.
    config = {"pool": {"max_idle": 0}, "failover": {"failures_to_pause": 1, "wait_secs": 0}}
    upstreams = {"a": Upstream("anthropic", models=["m"])}
    with running_stack(tmp_path, upstreams, config=config, control=True) as stack:
        # The client's connection is made, and accepted, before the descriptors run out (an
        # SDK's pool may dial anew; a raw socket does not). No request before: the upstream
        # connection it made would be closed at a moment of its own and free a descriptor.
        before = len(os.listdir("/proc/self/fd"))
        with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as client:
            wait_for(lambda: len(os.listdir("/proc/self/fd")) >= before + 2, timeout=5)
            with no_descriptor_left():
                status, headers, body = answer(client)
        assert status == 503
        assert headers[b"retry-after"] == b"1"
        assert headers[b"x-thinkwatch-error"] == b"rate_limited"
        error = json.loads(body)["error"]  # in the client's format: Anthropic's
        assert "file descriptors" in error["message"], error
        state = providers(stack)["a"]
        # failures_to_pause is 1: a connect failure blamed on the upstream would have paused it.
        assert state["paused_until"] is None and state["failures_in_row"] == 0, state
        with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as client:
            assert answer(client)[0] == 200  # descriptors back: the upstream serves again
        rows = stack.wait_rows(2)
        assert rows[0]["error_code"] == "gw.overloaded"
        (attempt,) = json.loads(rows[0]["routing"])["attempts"]
        assert attempt["error"] == "gateway_busy", attempt
        assert rows[-1]["status"] == 200
