"""A raw HTTP/2 client over a blocking socket, with h2: for the cases a polished client will not
produce (a small window read slowly, a stream reset mid-answer, too many streams, bad frames).

`RawH2` keeps every event it has seen; `wait(predicate)` reads until one arrives. Data is
acknowledged only when asked (`ack`), so flow control is the test's to play.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

__all__ = ["Answer", "RawH2"]


@dataclass
class Answer:
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None  # the error code of a RST_STREAM from the server

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class RawH2:
    def __init__(
        self,
        port: int,
        *,
        settings: dict[int, int] | None = None,
        upgrade: tuple[bytes, bytes] | None = None,
        auto_ack: bool = True,
        timeout: float = 5.0,
    ) -> None:
        """Connect and open HTTP/2 by prior knowledge, or with `upgrade` = (request head
        without the final blank line, body) by ``Upgrade: h2c``."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        if settings:
            self.h2.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.auto_ack = auto_ack
        self.answers: dict[int, Answer] = {}
        self.events: list[h2.events.Event] = []
        self.closed = False
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.switched_head = b""
        if upgrade is None:
            self.h2.initiate_connection()
            self.flush()
        else:
            head, body = upgrade
            token = self.h2.initiate_upgrade_connection()
            assert token is not None
            self.sock.sendall(
                head + b"\r\nhttp2-settings: " + token + b"\r\n\r\n" + body,
            )
            self.answers[1] = Answer()  # the upgrade request is stream 1
            self._read_switch()

    def _read_switch(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before the 101: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        self.switched_head = head
        assert head.startswith(b"HTTP/1.1 101"), head
        self.flush()
        if rest:
            self._feed(rest)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(
        self,
        path: str,
        body: bytes = b"",
        *,
        method: str = "POST",
        headers: Sequence[tuple[str, str]] = (),
        end: bool = True,
        length: bool = True,
    ) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"http"),
            (b":authority", b"127.0.0.1"),
            (b":path", path.encode()),
            *((k.lower().encode(), v.encode()) for k, v in headers),
        ]
        if body and length:
            fields.append((b"content-length", str(len(body)).encode()))
        self.h2.send_headers(stream_id, fields, end_stream=end and not body)
        if body:
            self.h2.send_data(stream_id, body, end_stream=end)
        self.answers[stream_id] = Answer()
        self.flush()
        return stream_id

    def reset(self, stream_id: int, code: int = 8) -> None:  # 8: CANCEL
        self.h2.reset_stream(stream_id, code)
        self.flush()

    def ack(self, stream_id: int, size: int) -> None:
        self.h2.acknowledge_received_data(size, stream_id)
        self.flush()

    def _feed(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            self.events.append(event)
            sid = getattr(event, "stream_id", None)
            answer = self.answers.get(sid) if sid else None
            if isinstance(event, h2.events.ResponseReceived) and answer is not None:
                headers = list(event.headers or ())
                answer.status = int(dict(headers)[b":status"])
                answer.headers = [(bytes(k), bytes(v)) for k, v in headers]
            elif isinstance(event, h2.events.DataReceived) and answer is not None:
                answer.body += event.data or b""
                if self.auto_ack:
                    self.h2.acknowledge_received_data(event.flow_controlled_length or 0, sid or 0)
            elif isinstance(event, h2.events.StreamEnded) and answer is not None:
                answer.ended = True
            elif isinstance(event, h2.events.StreamReset) and answer is not None:
                answer.reset = int(event.error_code or 0)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event
        self.flush()

    def read_once(self, timeout: float) -> bool:
        """Read what arrives within `timeout`; False when the connection is closed."""
        if self.closed:
            return False
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except OSError:
            self.closed = True
            return False
        if not data:
            self.closed = True
            return False
        try:
            self._feed(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return False
        return True

    def wait(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting"
            if not self.read_once(min(left, 0.5)) and not done():
                raise AssertionError("connection closed while waiting")

    def finish(self, stream_id: int, timeout: float = 5.0) -> Answer:
        answer = self.answers[stream_id]
        self.wait(lambda: answer.ended or answer.reset is not None, timeout)
        return answer

    def wait_closed(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.read_once(0.2):
            assert time.monotonic() < deadline, "the server kept the connection open"

    def close(self) -> None:
        self.sock.close()
