"""The log's writer thread: a stream that takes nothing never stops the producers (the event
loop); lines past the queue's bound are dropped and counted, and one line says how many once
the stream moves again; closing writes what is queued. End to end: ``twserve serve`` with its
stderr on a pipe nobody reads keeps answering. A Hypothesis property holds the access line the
thread makes from the row to the one the logging module's formatters made."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.twserve.conftest import KEY, http
from tests.twserve.observe.test_logs import _free_port
from tests.twserve.support.stack import CONTROL_KEY
from twserve.observe.logs import (
    JsonFormatter,
    TextFormatter,
    access_fields,
    outcome,
    render_json,
    render_text,
)
from twserve.observe.writer import GATHER_SECS, LineWriter
from twserve.store.sqlite import RequestRow


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("twserve.x", logging.INFO, __file__, 1, text, None, None)


def _drain(fd: int, into: bytearray, until: bytes, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while until not in into and time.monotonic() < deadline:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        into.extend(chunk)


def test_a_stream_nobody_reads_drops_and_counts_then_says_so() -> None:
    read_fd, write_fd = os.pipe()
    stream = io.TextIOWrapper(os.fdopen(write_fd, "wb"), encoding="utf-8")
    writer = LineWriter(stream, bound=16)
    writer.setFormatter(TextFormatter())
    try:
        started = time.monotonic()
        for i in range(3000):  # ~300 KiB: the pipe holds 64 KiB
            writer.handle(_record(f"line {i} " + "x" * 90))
        took = time.monotonic() - started
        assert took < 1.0, took  # the producer never waited for the stream
        assert writer.dropped > 2000 and writer.queued <= 16
        got = bytearray()
        last = f"total={writer.dropped}".encode()  # the producer is done: no drop after
        reader = threading.Thread(target=_drain, args=(read_fd, got, last))
        reader.start()
        reader.join(30)
        assert b"log lines dropped" in got and last in got
        notices = [line for line in got.decode().splitlines() if "log lines dropped" in line]
        assert all("WARNING twserve.log:" in n and "event=log_lines_dropped" in n for n in notices)
        # The notices count every line dropped, each once.
        counts = [int(n.split(" dropped=")[1].split()[0]) for n in notices]
        assert f"total={writer.dropped}" in notices[-1] and sum(counts) == writer.dropped
        assert writer.status()["dropped"] == writer.dropped
    finally:
        rest = threading.Thread(target=_drain, args=(read_fd, bytearray(), b"\0"), daemon=True)
        rest.start()
        writer.close()
        stream.close()
        rest.join(10)
        os.close(read_fd)


def test_close_writes_what_is_queued_in_json() -> None:
    out = io.StringIO()
    writer = LineWriter(out, bound=10_000)
    writer.setFormatter(JsonFormatter())
    for i in range(500):
        writer.handle(_record(f"n {i}"))
    writer.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == [f"n {i}" for i in range(500)]
    assert writer.dropped == 0 and writer.written == 500
    writer.handle(_record("after close"))  # counted, not written, not raised
    assert writer.dropped == 1


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_that_come_a_millisecond_apart_gather_into_few_writes() -> None:
    # Steady traffic: a line per millisecond. A thread waiting on the queue would be woken, and
    # would write, once per line; one that sleeps `GATHER_SECS` after each write takes a
    # window's lines at once.
    out = _CountingStream()
    writer = LineWriter(out, bound=10_000)
    writer.setFormatter(TextFormatter())
    try:
        for i in range(40):
            writer.handle(_record(f"n {i}"))
            time.sleep(0.001)
        writer.flush()
        assert out.getvalue().splitlines()[-1].endswith("n 39")
        assert out.getvalue().count("\n") == 40  # every line, in order
        windows = 40 * 0.001 / GATHER_SECS  # about two windows' worth of lines (sleeps overrun)
        assert out.writes <= windows + 3, out.writes
    finally:
        writer.close()


def test_serve_with_stderr_on_a_pipe_nobody_reads_keeps_answering(tmp_path: Path) -> None:
    mock_port, port, control_port = _free_port(), _free_port(), _free_port()
    config = {
        "version": 1,
        "listen": {
            "gateway": {"bind": "127.0.0.1", "port": port},
            "control": {"bind": "127.0.0.1", "port": control_port, "key": CONTROL_KEY},
        },
        "clients": [{"name": "me", "key": KEY}],
        "providers": [
            {
                "name": "mock",
                "protocol": "openai-chat",
                "base_url": f"http://127.0.0.1:{mock_port}/v1",
                "key": "upstream-secret-key-000",
                "models": ["m"],
            }
        ],
        "observability": {"log_queue_lines": 16},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    env = {**os.environ, "TWSERVE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "twserve.cli.main"]
    got = bytearray()
    reader = threading.Thread(target=lambda: None)
    mock = subprocess.Popen(
        [*cmd, "mock-upstream", "--port", str(mock_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    gateway = subprocess.Popen(
        [*cmd, "serve", "--config", str(path), "--data-dir", str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # read by nobody until the end
    )
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    auth = (("authorization", f"Bearer {KEY}"),)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http(f"http://127.0.0.1:{port}/v1/chat/completions", body=body, headers=auth):
                    break
            except Exception:
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
        statuses = [
            http(
                f"http://127.0.0.1:{port}/v1/chat/completions", body=body, headers=auth, timeout=10
            ).status
            for _ in range(300)  # ~200 KiB of access lines: more than the pipe holds
        ]
        assert statuses == [200] * 300
        status = http(
            f"http://127.0.0.1:{control_port}/status",
            method="GET",
            headers=(("authorization", f"Bearer {CONTROL_KEY}"),),
        ).json()
        assert status["log"]["dropped"] > 0 and status["log"]["queue_lines"] == 16
        # Now read: the writer moves again and says what it dropped.
        assert gateway.stderr is not None
        got = bytearray()
        reader = threading.Thread(
            target=_drain, args=(gateway.stderr.fileno(), got, b"\0", 90.0)
        )  # to the end of the output
        reader.start()
        deadline = time.monotonic() + 20
        while b"log lines dropped" not in got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b"log lines dropped" in got, bytes(got[-2000:])
        # The queue empties before the stop, so that the stop's own lines find room in it (on
        # a busy machine the reader may still be behind the last lines queued).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = http(
                f"http://127.0.0.1:{control_port}/status",
                method="GET",
                headers=(("authorization", f"Bearer {CONTROL_KEY}"),),
            ).json()
            if now["log"]["queued"] == 0:
                break
            time.sleep(0.05)
    finally:
        gateway.terminate()  # the lines of the stop are written before the process ends
        mock.terminate()
        gateway.wait(timeout=60)
        mock.wait(timeout=30)
    reader.join(30)
    if gateway.stderr is not None:
        gateway.stderr.close()
    text = got.decode()
    notice = next(line for line in text.splitlines() if "log lines dropped" in line)
    assert "event=log_lines_dropped" in notice
    assert "draining requests" in text.split(notice, 1)[1]


# --- the access line made on the thread is the line the logging module made ----------------

_TEXTS = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.sampled_from(["me", "openai-chat", "a b", 'q"uote', "x=y", "tab\there", "é", "\u2028"]),
)
_INTS = st.one_of(st.none(), st.integers(min_value=0, max_value=2**40))


@st.composite
def _rows(draw: st.DrawFn) -> RequestRow:
    provider = draw(_TEXTS)
    attempts = [{"provider": provider, "model": draw(_TEXTS), "outcome": "ok"}]
    return RequestRow(
        id=draw(st.text(min_size=1, max_size=30)),
        ts=1.0,
        path=draw(st.text(max_size=30)),
        key_name=draw(_TEXTS),
        format=draw(_TEXTS),
        model=draw(_TEXTS),
        provider=provider,
        status=draw(st.one_of(st.none(), st.integers(min_value=100, max_value=599))),
        stream=draw(st.booleans()),
        ttfb_ms=draw(_INTS),
        duration_ms=draw(_INTS),
        input_tokens=draw(_INTS),
        output_tokens=draw(_INTS),
        cost_micros=draw(_INTS),
        cost_state=draw(_TEXTS),
        routing=draw(st.sampled_from([None, {"attempts": attempts}])),
        error_code=draw(_TEXTS),
        local=draw(st.booleans()),
        cancelled=draw(st.booleans()),
        correlation_id=draw(_TEXTS),
        request_bytes=draw(st.integers(min_value=0, max_value=2**31)),
        answer_bytes=draw(st.integers(min_value=0, max_value=2**31)),
    )


def _through_logging(formatter: logging.Formatter, created: float, row: RequestRow) -> str:
    fields = access_fields(row)
    level = logging.WARNING if fields["outcome"] == "error" else logging.INFO
    record = logging.LogRecord("twserve.access", level, __file__, 1, "request", None, None)
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    record.fields = fields
    return formatter.format(record)


@settings(max_examples=300, deadline=None)
@given(row=_rows(), created=st.floats(min_value=0, max_value=4e9))
def test_the_threads_access_line_is_the_logging_modules(row: RequestRow, created: float) -> None:
    level = logging.WARNING if outcome(row) == "error" else logging.INFO
    assert render_text(created, level, row) == _through_logging(TextFormatter(), created, row)
    assert json.loads(render_json(created, level, row)) == json.loads(
        _through_logging(JsonFormatter(), created, row)
    )
    # The text line splits back into its pairs: a value with a space, quote or = is JSON.
    line = render_text(created, level, row)
    assert " twserve.access: request request_id=" in line and "\n" not in line
