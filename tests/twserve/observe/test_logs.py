"""The gateway's log on real sockets: the access line per request (JSON and text), the request
id the client sees and finds its row by, the upstream's own id kept under another name, the
operator's events as structured lines, and ``twserve serve --log-format json``."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore
import pytest

from tests.twserve.conftest import KEY, Sdks, http
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twengine.config import LogFormat
from twmock.script import MockSettings, parse_script
from twserve.events import ConfigProblem, ConfigRejected, ConfigReloaded, HealthChanged
from twserve.observe.logs import (
    JsonFormatter,
    ObservationLog,
    TextFormatter,
    configure_logging,
)
from twserve.observe.request_ids import correlation_id

TIMEOUT = {"timeout": {"connect": 5.0, "read": 10.0, "write": 5.0, "pool": 5.0}}
ACCESS_FIELDS = {
    "request_id",
    "correlation_id",
    "key",
    "format",
    "path",
    "stream",
    "model",
    "model_served",
    "upstream",
    "status",
    "outcome",
    "code",
    "attempts",
    "ttfc_ms",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost_usd",
    "cost_state",
    "bytes_in",
    "bytes_out",
}
CONFIG: dict[str, Any] = {
    "aliases": {"fast": "m-served"},
    # A failed request fails at once (no retry round waits), and pauses its upstream.
    "failover": {"failures_to_pause": 1, "pause_secs": 30, "wait_secs": 0},
}


class Captured:
    """The lines the ``twserve`` loggers wrote, through the gateway's own formatters."""

    def __init__(self) -> None:
        self.out = io.StringIO()
        self.handler = logging.StreamHandler(self.out)
        self.handler.setFormatter(JsonFormatter())

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines() if line]

    def wait(self, msg: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The lines whose ``msg`` is `msg`, once `count` of them are written."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.lines() if line["msg"] == msg]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)


@pytest.fixture
def captured() -> Iterator[Captured]:
    cap = Captured()
    logger = logging.getLogger("twserve")
    before = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(cap.handler)
    try:
        yield cap
    finally:
        logger.removeHandler(cap.handler)
        logger.setLevel(before)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {
        "a": Upstream("openai-chat", models=["m", "m-served"]),
        # Every answer of b fails: its first failure pauses it.
        "b": Upstream(
            "anthropic", MockSettings(script=parse_script({"error": 500})), models=["claude"]
        ),
    }
    data = tmp_path_factory.mktemp("logs")
    with running_stack(data, upstreams, config=CONFIG, control=True) as s:
        yield s


def chat(stack: Stack, model: str, headers: tuple[tuple[str, str], ...] = ()) -> Any:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return http(
        stack.url + "/v1/chat/completions",
        body=body.encode(),
        headers=(
            ("authorization", f"Bearer {KEY}"),
            ("content-type", "application/json"),
            *headers,
        ),
    )


def header(reply: Any, name: bytes) -> str | None:
    for key, value in reply.headers:
        if key.lower() == name:
            return str(value.decode())
    return None


def requests_view(stack: Stack, query: str, want: int = 1) -> list[dict[str, Any]]:
    """``/requests`` with `query`, asked again until `want` rows are there (the writer is
    asynchronous) or 10 s passed."""
    deadline = time.monotonic() + 10
    while True:
        rows = _requests_once(stack, query)
        if len(rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def _requests_once(stack: Stack, query: str) -> list[dict[str, Any]]:
    response = httpcore.request(
        "GET",
        stack.control_url + "/requests" + query,
        headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
        extensions=TIMEOUT,
    )
    assert response.status == 200, response.content
    rows = json.loads(response.content)["requests"]
    assert isinstance(rows, list)
    return rows


def access_line(captured: Captured, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in captured.lines():
            if line["msg"] == "request" and line.get("request_id") == request_id:
                return line
        time.sleep(0.02)
    raise AssertionError(f"no access line for {request_id}: {captured.out.getvalue()}")


def test_access_line_of_a_streamed_sdk_request(
    stack: Stack, sdks: Sdks, captured: Captured
) -> None:
    client = sdks.openai(stack)
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text
    request_id = raw.headers["x-request-id"]
    line = access_line(captured, request_id)
    assert set(line) >= ACCESS_FIELDS | {"ts", "level", "logger", "msg"}
    assert line["logger"] == "twserve.access" and line["level"] == "info"
    assert line["key"] == "tester" and line["format"] == "openai-chat"
    assert line["model"] == "fast" and line["model_served"] == "m-served"
    assert line["upstream"] == "a" and line["status"] == 200 and line["outcome"] == "ok"
    assert line["stream"] is True and line["attempts"] == 1 and line["code"] is None
    assert line["input_tokens"] > 0 and line["output_tokens"] > 0
    assert line["ttfc_ms"] is not None and line["duration_ms"] >= line["ttfc_ms"]
    assert line["bytes_in"] > 0 and line["bytes_out"] > len(text)
    assert line["cost_state"] in ("known", "unknown", "free")
    # The access line is the row: the same id, found by it on the control plane.
    (row,) = requests_view(stack, f"?id={request_id}")
    assert row["id"] == request_id and row["model"] == "fast"
    assert KEY not in captured.out.getvalue() and "upstream-key-a" not in captured.out.getvalue()


def test_the_upstreams_request_id_is_kept_under_another_name(
    stack: Stack, captured: Captured
) -> None:
    reply = chat(stack, "m")  # a same-format whole answer: the mock's head passes the allow-list
    assert reply.status == 200
    mine, theirs = header(reply, b"x-request-id"), header(reply, b"x-upstream-request-id")
    assert theirs is not None and theirs.startswith("req_")
    assert mine is not None and mine != theirs
    assert [v for k, v in reply.headers if k.lower() == b"x-request-id"] == [mine.encode()]
    assert access_line(captured, mine)["status"] == 200


def test_a_clients_own_id_is_its_correlation_id(stack: Stack, captured: Captured) -> None:
    reply = chat(stack, "m", (("x-request-id", "trace-7f3a.01"),))
    mine = header(reply, b"x-request-id")
    assert mine is not None and mine != "trace-7f3a.01"
    assert access_line(captured, mine)["correlation_id"] == "trace-7f3a.01"
    (row,) = requests_view(stack, "?id=trace-7f3a.01")
    assert row["id"] == mine and row["correlation_id"] == "trace-7f3a.01"
    # Not an id: not stored, not logged (it would reach the log and the console as sent).
    odd = chat(stack, "m", (("x-request-id", "a b <script>"),))
    odd_id = header(odd, b"x-request-id")
    assert odd_id is not None
    assert access_line(captured, odd_id)["correlation_id"] is None
    assert requests_view(stack, f"?id={odd_id}")[0]["correlation_id"] is None


def test_refusals_and_failures_have_their_access_lines(stack: Stack, captured: Captured) -> None:
    refused = chat(stack, "no-such-model")
    assert refused.status >= 400
    line = access_line(captured, header(refused, b"x-request-id") or "")
    assert line["outcome"] == "refused" and line["code"] and line["upstream"] is None
    assert line["attempts"] == 0 and line["status"] == refused.status
    # An upstream that fails pauses (failures_to_pause: 1): the failed request's line, then the
    # structured health change.
    failed = http(
        stack.url + "/v1/messages",
        body=json.dumps(
            {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        ).encode(),
        headers=(("x-api-key", KEY), ("anthropic-version", "x")),
    )
    assert failed.status >= 500
    line = access_line(captured, header(failed, b"x-request-id") or "")
    assert line["outcome"] == "error" and line["level"] == "warning" and line["attempts"] == 1
    (paused,) = captured.wait("upstream paused")
    assert paused["event"] == "upstream_paused" and paused["upstream"] == "b"
    assert paused["pause_secs"] == 30 and paused["until"].endswith("Z")
    assert paused["reason"] and paused["failures_in_row"] == 1
    stack.portal.call(_resume, stack, "b")  # as the control plane's /provider-pause does
    (resumed,) = captured.wait("upstream resumed")
    assert resumed["upstream"] == "b" and resumed["reason"] == "manual"


async def _resume(stack: Stack, name: str) -> None:
    gateway = stack.app.gateway
    gateway.hooks.publish(gateway.router.health.resume(name, gateway.clock()))


def test_config_events_are_structured_and_keep_secrets_out() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    watcher = ObservationLog(lambda: _config())
    logger = logging.getLogger("twserve.events")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        watcher.on_event(
            ConfigRejected(
                ts=1.0,
                stage="schema",
                config_version="blake3:abc",
                problems=(
                    ConfigProblem(
                        code="config.unknown_field",
                        path="providers[0].kye",
                        message="unknown field 'kye'",
                        line=7,
                        excerpt="    kye: ***",
                    ),
                ),
            )
        )
        watcher.on_event(ConfigReloaded(ts=2.0, generation=2, version=1, config_version="v2"))
        watcher.follow(handler)  # the config's format is text
        watcher.on_event(
            HealthChanged(
                ts=0.0,
                upstream="a",
                paused=True,
                reason="server_error",
                pause_secs=60.0,
                failures_in_row=3,
            )
        )
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert "config refused; the previous config keeps serving" in lines[0]
    assert " event=config_refused stage=schema " in lines[0]
    assert " message=\"unknown field 'kye'\"" in lines[0] and "line=7" in lines[0]
    assert "***" not in lines[0]  # the excerpt is the console's, not the log's
    assert lines[1].endswith(
        "config applied event=config_applied generation=2 config_version=v2 origin=file"
    )
    assert "until=1970-01-01T00:01:00.000Z" in lines[2] and "WARNING" in lines[2]


def _config() -> Any:
    from twengine.config import build_config

    return build_config({"version": 1})


def test_correlation_ids_are_plain_tokens() -> None:
    assert correlation_id([(b"x-request-id", b"0f1e-2d3c")]) == "0f1e-2d3c"
    assert correlation_id([(b"x-request-id", b"x" * 128)]) == "x" * 128
    assert correlation_id([(b"x-request-id", b"x" * 129)]) is None
    assert correlation_id([(b"x-request-id", b"a\x00b")]) is None
    assert correlation_id([(b"x-request-id", b"\xc3\xa9")]) is None
    assert correlation_id([(b"other", b"id")]) is None


def test_configure_logging_json_and_text() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    out = io.StringIO()
    try:
        configure_logging(LogFormat.JSON, stream=out)
        logging.getLogger("twserve.x").info("hello %s", "there", extra={"fields": {"n": 1}})
        configure_logging("text", stream=out)
        fields = {"a": "b c", "z": None, "e": "x=y", "t": "tab\there", "ok": "m-1.5", "n": 2}
        logging.getLogger("twserve.x").info("plain", extra={"fields": fields})
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()  # the writer's thread writes what it holds
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    first, second = out.getvalue().splitlines()
    data = json.loads(first)
    assert data["msg"] == "hello there" and data["n"] == 1 and data["level"] == "info"
    assert data["ts"].endswith("Z") and data["logger"] == "twserve.x"
    assert second.endswith('twserve.x: plain a="b c" z=- e="x=y" t="tab\\there" ok=m-1.5 n=2')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_writes_json_lines(tmp_path: Path) -> None:
    """``twserve serve --log-format json`` end to end: a process of its own, over a mock
    upstream process; every line on stderr after start-up is one JSON object."""
    mock_port, port = _free_port(), _free_port()
    config = {
        "version": 1,
        "listen": {"gateway": {"bind": "127.0.0.1", "port": port}},
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
        "observability": {"log_format": "text"},  # the flag wins over the config
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = {**os.environ, "TWSERVE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "twserve.cli.main"]
    mock = subprocess.Popen(
        [*cmd, "mock-upstream", "--port", str(mock_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    gateway = subprocess.Popen(
        [*cmd, "serve", "--config", str(path), "--data-dir", str(tmp_path), "--log-format", "json"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        reply = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
                reply = http(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    body=body.encode(),
                    headers=(("authorization", f"Bearer {KEY}"),),
                )
                if reply.status == 200:
                    break
            except httpcore.ConnectError:
                time.sleep(0.1)
        assert reply is not None and reply.status == 200, reply
        request_id = header(reply, b"x-request-id")
    finally:
        gateway.terminate()
        mock.terminate()
        _, err = gateway.communicate(timeout=30)
        mock.wait(timeout=30)
    text = err.decode().splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("{"))
    lines = [json.loads(line) for line in text[first:]]  # from the switch on, JSON only
    access = [line for line in lines if line["msg"] == "request"]
    assert [a["request_id"] for a in access] == [request_id]
    assert access[0]["upstream"] == "mock" and access[0]["key"] == "me"
    assert any(line["msg"].startswith("draining requests") for line in lines), err.decode()
    assert KEY not in err.decode() and "upstream-secret-key-000" not in err.decode()
