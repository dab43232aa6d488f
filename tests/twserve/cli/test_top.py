"""``twserve top`` in a pseudo-terminal against a running gateway: a request made through the
gateway with the openai SDK appears on its screen (its id, key, model, upstream and state), as
do the upstreams and keys; ``--once`` prints one screen; a wrong control key is said so.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.twserve.conftest import MODELS
from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.cli.top import TopState

# Colours, cursor moves and other escapes rich writes to a terminal.
_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")


@pytest.fixture(scope="module")
def st(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ups = {
        "chat-up": Upstream(
            "openai-chat",
            MockSettings(script=Script(text="hello from the top test")),
            models=[MODELS["openai-chat"]],
        )
    }
    with running_stack(tmp_path_factory.mktemp("top"), ups, control=True) as running:
        yield running


def _top(st: Stack, *extra: str, key: str = CONTROL_KEY) -> list[str]:
    code = "from twserve.cli.main import main; raise SystemExit(main())"
    return [
        sys.executable,
        "-c",
        code,
        "top",
        "--control",
        st.control_url,
        "--control-key",
        key,
        *extra,
    ]


class Terminal:
    """A process on a pseudo-terminal of 200×60, and the text it wrote (escapes removed)."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "60"}
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.seen = b""

    def text(self) -> str:
        return _ESCAPES.sub(b"", self.seen).decode("utf-8", "replace")

    def wait_for(self, *wanted: str, timeout: float = 20.0) -> str:
        """Read until every one of `wanted` has been written; the text so far."""
        deadline = time.monotonic() + timeout
        while not all(w in self.text() for w in wanted):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{wanted} not on the screen:\n{self.text()[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the process ended and the terminal closed
                    if self.proc.poll() is not None:
                        raise AssertionError(f"top ended: {self.text()[-3000:]}") from None
        return self.text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        os.close(self.master)
        return code


def test_a_request_appears_on_the_screen(st: Stack, tmp_path: Path) -> None:
    term = Terminal(_top(st, "--interval", "0.5"), tmp_path)
    try:
        # The views are on screen before any request: the upstream and the key.
        term.wait_for("Traffic", "Upstreams", "chat-up", "Keys", "tester", "events live")
        client = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
        raw = client.chat.completions.with_raw_response.create(
            model=MODELS["openai-chat"], messages=[{"role": "user", "content": "hi"}]
        )
        client.close()
        request_id = raw.headers["x-request-id"]
        screen = term.wait_for(request_id)
        line = next(line for line in screen.splitlines()[::-1] if request_id in line)
        assert "tester" in line and MODELS["openai-chat"] in line
        term.wait_for("ok 200")
    finally:
        code = term.stop()
    assert code == 0  # Ctrl-C ends it cleanly


def test_once_prints_one_screen_with_the_stored_requests(st: Stack, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    raw = client.chat.completions.with_raw_response.create(
        model=MODELS["openai-chat"], messages=[{"role": "user", "content": "hi"}]
    )
    client.close()
    request_id = raw.headers["x-request-id"]
    st.wait_rows(1)
    deadline = time.monotonic() + 10
    while True:  # the row reaches the store in its writer's next batch
        done = subprocess.run(
            _top(st, "--once"),
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "COLUMNS": "200"},
        )
        if request_id in done.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done.returncode == 0, done.stderr
    assert request_id in done.stdout and "chat-up" in done.stdout and "tester" in done.stdout


def test_a_wrong_control_key_is_said_so(st: Stack, tmp_path: Path) -> None:
    done = subprocess.run(
        _top(st, "--once", key="wrong"),
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 1
    assert "control.auth.bad_key" in done.stdout


def test_events_become_rows_newest_first_and_bounded() -> None:
    state = TopState(keep=3)
    for n in range(5):
        state.on_event("RequestStarted", {"id": f"r{n}", "ts": 1.0 + n, "key": "k"})
    assert list(state.requests) == ["r2", "r3", "r4"]  # the oldest went
    state.on_event("RequestRouted", {"id": "r4", "model": "m", "candidates": ["up", "b"]})
    state.on_event("RequestAborted", {"id": "r3", "stage": "relay"})
    assert state.requests["r3"]["state"] == "aborting"
    state.on_event(
        "RequestFailed",
        {"id": "r3", "status": 200, "error_code": "gw.request.aborted", "cancelled": True},
    )
    state.on_event("RequestFailed", {"id": "r2", "status": 502, "error_code": "gw.all_failed"})
    state.on_event("RequestFinished", {"id": "r4", "status": 200, "input_tokens": 3})
    state.on_event("RequestFinished", {"id": "gone", "status": 200})  # never seen start: no row
    assert {k: r["state"] for k, r in state.requests.items()} == {
        "r2": "failed",
        "r3": "aborted",
        "r4": "ok",
    }
    assert state.requests["r4"]["provider"] == "up" and state.requests["r4"]["model"] == "m"
    # Stored rows go under what the events brought, never twice, and only while there is room.
    state.add_stored([{"id": "r4", "status": 200}, {"id": "s1", "status": 429, "ts": 0.5}])
    assert list(state.requests) == ["r2", "r3", "r4"]
    fresh = TopState(keep=3)
    fresh.on_event("RequestStarted", {"id": "new", "ts": 9.0, "key": "k"})
    fresh.add_stored([{"id": "s2", "status": 200}, {"id": "s1", "status": 429, "cancelled": 0}])
    assert list(fresh.requests) == ["s1", "s2", "new"]
    assert (fresh.requests["s1"]["state"], fresh.requests["s2"]["state"]) == ("failed", "ok")
