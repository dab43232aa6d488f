"""The door (twserve/app/door.py) on real sockets, without an event loop: while `behind` says
the loop is behind it takes the new clients and answers each from its head, in the client's
format; otherwise it takes none."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import h2.config
import h2.connection
import h2.events
import pytest

from twengine.shedding import overloaded
from twproto.dialect import Dialect
from twproto.errors import GatewayError, error_body, error_headers
from twproto.paths import guess_client_dialect
from twserve.app import door as door_module
from twserve.app.door import Door
from twserve.server.base import HeadRefusal, Request

PSEUDO = [(":method", "GET"), (":path", "/v1/models"), (":scheme", "http")]
REFUSAL = overloaded("event loop 300 ms behind, shed_loop_lag_ms")
CLAUDE = (
    b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: k\r\ncontent-type: application/json"
    b"\r\ncontent-length: 2\r\n\r\n{}"
)


def answer(request: Request | None, refusal: GatewayError) -> HeadRefusal:
    """As the gateway's: the client's format from its path and headers."""
    dialect = guess_client_dialect(
        request.path if request else None, request.headers if request else None
    )
    return HeadRefusal(
        status=refusal.status, headers=error_headers(refusal), body=error_body(dialect, refusal)
    )


@contextmanager
def running(
    behind: Callable[[float], GatewayError | None], admit: Callable[[str], bool] | None = None
) -> Iterator[tuple[socket.socket, Door]]:
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    keeper = Door([listening], behind=behind, answer=answer, admit=admit)
    keeper.start()
    try:
        yield listening, keeper
    finally:
        keeper.stop()
        listening.close()


def connect(listening: socket.socket) -> socket.socket:
    client = socket.create_connection(listening.getsockname()[:2], timeout=5)
    return client


def read_all(client: socket.socket) -> bytes:
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    return data


def split(answer_bytes: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer_bytes.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_while_the_loop_keeps_up_the_door_takes_nobody() -> None:
    with running(lambda now: None) as (listening, keeper):
        client = connect(listening)
        client.sendall(CLAUDE)
        time.sleep(5 * door_module.TICK)
        assert not keeper.taking and keeper.turned_away == 0
        # The client still waits in the backlog, for the loop's accept.
        taken, _ = listening.accept()
        assert taken.recv(100).startswith(b"POST /v1/messages")
        taken.close()
        client.close()


def test_while_behind_a_client_is_answered_at_once_in_its_own_format() -> None:
    with running(lambda now: REFUSAL) as (listening, keeper):
        client = connect(listening)
        begun = time.monotonic()
        client.sendall(CLAUDE)
        status, headers, body = split(read_all(client))  # the door closes after its answer
        took = time.monotonic() - begun
        assert status == "HTTP/1.1 503 Service Unavailable"
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert headers["x-thinkwatch-error"] == "rate_limited"
        assert int(headers["content-length"]) == len(body)
        error = json.loads(body)
        assert error == json.loads(error_body(Dialect.ANTHROPIC, REFUSAL))
        assert error["type"] == "error" and "event loop" in error["error"]["message"]
        assert took < door_module.HEAD_WAIT  # the whole head came: no waiting for more
        assert keeper.taking and keeper.turned_away == 1
        client.close()


def test_a_client_that_sends_no_head_is_answered_after_the_head_wait() -> None:
    with running(lambda now: REFUSAL) as (listening, _keeper):
        client = connect(listening)
        begun = time.monotonic()
        status, _headers, body = split(read_all(client))
        assert time.monotonic() - begun >= door_module.HEAD_WAIT * 0.9
        assert status.startswith("HTTP/1.1 503")
        # No path to go by: the default format, OpenAI's.
        assert json.loads(body)["error"]["code"] == "gw.overloaded"
        client.close()


def test_an_http2_client_is_told_goaway_with_no_stream_processed() -> None:
    with running(lambda now: REFUSAL) as (listening, _keeper):
        client = connect(listening)
        h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        h2c.initiate_connection()
        h2c.send_headers(
            1,
            [*PSEUDO, (":authority", "gw")],
            end_stream=True,
        )
        client.sendall(h2c.data_to_send())
        events = h2c.receive_data(read_all(client))
        ended = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert len(ended) == 1
        assert ended[0].last_stream_id == 0  # stream 1 was not processed: safe to retry
        assert ended[0].additional_data is not None
        assert ended[0].additional_data.startswith(b"gw.overloaded")
        client.close()


def test_a_refused_address_is_closed_without_an_answer() -> None:
    with running(lambda now: REFUSAL, admit=lambda host: False) as (listening, keeper):
        client = connect(listening)
        client.sendall(CLAUDE)
        try:
            said = read_all(client)
        except ConnectionResetError:
            said = b""  # closed with the request unread: the kernel resets it
        assert said == b""
        deadline = time.monotonic() + 2
        while keeper.turned_away == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert keeper.turned_away == 0  # closed by address, not answered
        client.close()


def test_the_door_follows_the_loop_as_it_falls_behind_and_catches_up() -> None:
    state: list[GatewayError | None] = [None]
    with running(lambda now: state[0]) as (listening, keeper):
        state[0] = REFUSAL
        deadline = time.monotonic() + 2
        while not keeper.taking and time.monotonic() < deadline:
            time.sleep(0.005)
        assert keeper.taking
        state[0] = None
        deadline = time.monotonic() + 2
        while keeper.taking and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not keeper.taking
        client = connect(listening)
        time.sleep(3 * door_module.TICK)
        taken, _ = listening.accept()  # left to the loop again
        taken.close()
        client.close()


def test_stop_closes_the_clients_the_door_holds() -> None:
    with running(lambda now: REFUSAL) as (listening, keeper):
        client = connect(listening)
        client.sendall(CLAUDE)
        split(client.recv(65536))  # answered; the door lingers, reading what else comes
        keeper.stop()
        client.settimeout(2)
        assert read_all(client) == b""  # closed by the stop, not left to linger
        assert not any(t.name == "twserve-door" for t in threading.enumerate())
        client.close()


def test_holding_its_most_the_door_leaves_the_next_client_waiting_not_to_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(door_module, "MAX_HELD", 1)
    with running(lambda now: REFUSAL) as (listening, keeper):
        first = connect(listening)
        first.sendall(CLAUDE)
        assert split(first.recv(65536))[0].startswith("HTTP/1.1 503")  # held, lingering
        second = connect(listening)
        second.sendall(CLAUDE)
        second.settimeout(0.2)
        with pytest.raises(TimeoutError):
            second.recv(100)  # in the backlog: the door holds its most
        assert keeper.taking  # and the loop's accept still keeps off
        first.close()  # the first one's linger ends: room for the next
        second.settimeout(5)
        assert split(read_all(second))[0].startswith("HTTP/1.1 503")
        second.close()
