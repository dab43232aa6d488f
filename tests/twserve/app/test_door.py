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

from twengine.config import GatewayListen
from twengine.shedding import LoadGauge, overloaded
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
    behind: Callable[[float, float], GatewayError | None],
    admit: Callable[[str], bool] | None = None,
    accepted: Callable[[], int] | None = None,
) -> Iterator[tuple[socket.socket, Door]]:
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    keeper = Door([listening], behind=behind, answer=answer, admit=admit, accepted=accepted)
    keeper.start()
    try:
        yield listening, keeper
    finally:
        keeper.stop()
        listening.close()


@contextmanager
def gauged(accepted: Callable[[], int]) -> Iterator[tuple[socket.socket, Door]]:
    """A door judged as the gateway's is, by a `LoadGauge` at a bound of 100 ms whose loop keeps
    its timers on time, with the loop's count of accepts from `accepted`."""
    listen = GatewayListen(shed_loop_lag_ms=100)
    gauge = LoadGauge()
    with running(lambda now, waited: gauge.at_door(now, listen, waited), accepted=accepted) as (
        listening,
        keeper,
    ):
        keeper.wakes = lambda now, waited: gauge.door_wakes(now, listen, waited)
        yield listening, keeper


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
    with running(lambda now, waited: None) as (listening, keeper):
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
    with running(lambda now, waited: REFUSAL) as (listening, keeper):
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
    with running(lambda now, waited: REFUSAL) as (listening, _keeper):
        client = connect(listening)
        begun = time.monotonic()
        status, _headers, body = split(read_all(client))
        assert time.monotonic() - begun >= door_module.HEAD_WAIT * 0.9
        assert status.startswith("HTTP/1.1 503")
        # No path to go by: the default format, OpenAI's.
        assert json.loads(body)["error"]["code"] == "gw.overloaded"
        client.close()


def test_an_http2_client_is_told_goaway_with_no_stream_processed() -> None:
    with running(lambda now, waited: REFUSAL) as (listening, _keeper):
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
    with running(lambda now, waited: REFUSAL, admit=lambda host: False) as (listening, keeper):
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
    with running(lambda now, waited: state[0]) as (listening, keeper):
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
    with running(lambda now, waited: REFUSAL) as (listening, keeper):
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
    with running(lambda now, waited: REFUSAL) as (listening, keeper):
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


def test_queued_reads_a_listening_sockets_accept_queue() -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    clients = [connect(listening) for _ in range(3)]
    try:
        assert door_module.queued(listening) == 3
        taken, _ = listening.accept()
        taken.close()
        assert door_module.queued(listening) == 2
        assert door_module.queued(clients[0]) is None  # not a listening socket
    finally:
        for client in clients:
            client.close()
        listening.close()


def test_clients_the_loop_is_too_slow_to_accept_are_refused_after_the_bound() -> None:
    """The loop's timers on time (no lag at all), its accepts slower than clients arrive: once
    the oldest waiting client has waited the bound (100 ms) the door takes and answers it."""
    count = [0]
    taken_ports: set[int] = set()  # the clients the loop took (the door takes the others)
    with gauged(lambda: count[0]) as (listening, keeper):
        start = time.monotonic()
        clients = []
        try:
            for _ in range(8):
                client = connect(listening)
                client.sendall(CLAUDE)
                clients.append(client)
            answered: list[tuple[str, dict[str, str], bytes]] = []
            while not keeper.turned_away and time.monotonic() - start < 2:
                time.sleep(0.06)  # the loop takes one client every 60 ms
                try:
                    taken, peer = listening.accept()
                except BlockingIOError:
                    break  # the door took the rest
                count[0] += 1
                taken_ports.add(peer[1])
                taken.close()
            took = time.monotonic() - start
            assert keeper.turned_away and 0.1 <= took < 1.0  # the bound, plus a look or two
            assert count[0] < 8
            # The door's: those the loop did not take (the loop may take one more while the
            # door begins to take, so not simply the last ones).
            for client in clients:
                if client.getsockname()[1] not in taken_ports:
                    client.settimeout(5)
                    answered.append(split(read_all(client)))
            assert answered and keeper.turned_away == len(answered)
            for status, headers, body in answered:
                assert status.startswith("HTTP/1.1 503") and headers["retry-after"] == "1"
                error = json.loads(body)
                assert error["type"] == "error"  # Anthropic's format: it asked /v1/messages
                assert "to be accepted" in error["error"]["message"]
        finally:
            for client in clients:
                client.close()


def test_a_loop_that_accepts_nobody_is_left_to_the_lag() -> None:
    """A paused loop (a collection, a first request's imports) accepts nobody: the queue's wait
    does not count, the client stays for the loop."""
    with gauged(lambda: 0) as (listening, keeper):
        client = connect(listening)
        time.sleep(0.4)
        assert not keeper.taking and keeper.turned_away == 0
        taken, _ = listening.accept()  # the loop's, once it runs again
        taken.close()
        client.close()


def test_a_loop_that_accepts_in_time_leaves_the_door_idle() -> None:
    """Clients arrive all the time and the loop accepts each within a few ms: the queue never
    waits the bound, the door takes nobody."""
    count = [0]
    with gauged(lambda: count[0]) as (listening, keeper):
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            client = connect(listening)
            time.sleep(0.005)
            taken, _ = listening.accept()  # the loop's accept, 5 ms after the client came
            count[0] += 1
            taken.close()
            client.close()
        assert not keeper.taking and keeper.turned_away == 0
