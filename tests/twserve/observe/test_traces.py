"""OpenTelemetry traces against a real OTLP/HTTP receiver on loopback (tests/support/otlp.py):
the span tree of a request that fails over (a SERVER span, one CLIENT span per attempt), its
GenAI attributes, the client's ``traceparent`` continued and each attempt's passed upstream,
prompt text only with ``capture_content``, and ``twserve serve`` turned on by the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` variable alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpcore
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.servers import free_port
from tests.twserve.conftest import KEY, http
from tests.twserve.support.stack import Stack, Upstream, running_stack
from twmock.script import MockSettings, parse_script
from twserve.observe.otel_env import traces_wanted
from twserve.observe.traces import parse_traceparent
from twserve.server.base import Handler, Request, Responder

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
REFUSED_TRACE = "0af7651916cd43dd8448eb211c80319c"
PROMPT = "a prompt nobody may read in a trace"


def _recording(seen: list[str]) -> Any:
    def wrap(mock: Handler) -> Handler:
        async def handler(request: Request, responder: Responder) -> None:
            seen.append((request.header(b"traceparent") or b"").decode())
            await mock(request, responder)

        return handler

    return wrap


@pytest.fixture(autouse=True)
def _quick_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # The batch processor exports every 5 s by default; the SDK reads this at its start.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def _stack(
    tmp: Path, receiver: OtlpReceiver, seen: dict[str, list[str]], traces: dict[str, Any]
) -> Any:
    upstreams = {
        "bad": Upstream(
            "openai-chat",
            MockSettings(script=parse_script({"error": 500})),
            wrap=_recording(seen.setdefault("bad", [])),
        ),
        "good": Upstream("anthropic", wrap=_recording(seen.setdefault("good", []))),
        # Its first answer fails: a request routed to it alone is retried after a back-off.
        "flaky": Upstream(
            "openai-chat", MockSettings(script=parse_script({"fail_first": 1, "error": 503}))
        ),
    }
    config = {
        "groups": [{"name": "pool", "type": "fallback", "providers": ["bad", "good"]}],
        "routes": [
            {
                "name": "default",
                "rules": [
                    {"name": "solo", "when": {"model": "solo"}, "to": "flaky"},
                    {"name": "all", "to": "pool"},
                ],
            }
        ],
        "failover": {"failures_to_pause": 100, "wait_secs": 10},
        "observability": {"traces": {"endpoint": receiver.endpoint, **traces}},
    }
    return running_stack(tmp, upstreams, config=config)


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, OtlpReceiver, dict[str, list[str]]]]:
    seen: dict[str, list[str]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with otlp_receiver() as receiver:
            with _stack(tmp_path_factory.mktemp("traces"), receiver, seen, {}) as stack:
                yield stack, receiver, seen


def _tree(spans: list[ReceivedSpan], trace_id: str) -> tuple[ReceivedSpan, list[ReceivedSpan]]:
    mine = [s for s in spans if s.trace_id == trace_id]
    servers = [s for s in mine if s.kind == "SERVER"]
    assert len(servers) == 1, mine
    attempts = sorted((s for s in mine if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    return servers[0], attempts


def test_failover_is_a_server_span_with_two_attempt_spans(
    traced: tuple[Stack, OtlpReceiver, dict[str, list[str]]],
) -> None:
    stack, receiver, seen = traced
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    reply = client.chat.completions.with_raw_response.create(
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": PROMPT}],
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    request_id = reply.headers["x-request-id"]
    assert reply.parse().choices[0].message.content
    spans = receiver.wait_spans(3)
    server, attempts = _tree(spans, CLIENT_TRACE)

    # The client's traceparent continued: same trace, the client's span the parent.
    assert server.parent_span_id == CLIENT_SPAN
    assert server.name == "POST /v1/chat/completions"
    assert len(attempts) == 2, attempts
    assert all(a.parent_span_id == server.span_id for a in attempts)
    first, second = attempts
    assert first.start_ns <= first.end_ns <= second.start_ns <= second.end_ns <= server.end_ns

    a = server.attributes
    assert a["twserve.request_id"] == request_id
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "claude-sonnet-4-5"
    assert a["gen_ai.response.model"] == "claude-sonnet-4-5"
    assert a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["http.response.status_code"] == 200
    assert a["twserve.upstream"] == "good" and a["twserve.outcome"] == "ok"
    assert a["twserve.client_format"] == "openai-chat" and a["twserve.key"] == "tester"
    assert "error.type" not in a

    bad_port, good_port = stack.mocks["bad"][1], stack.mocks["good"][1]
    assert first.name == "chat claude-sonnet-4-5"
    assert first.attributes["gen_ai.provider.name"] == "openai"
    assert first.attributes["server.address"] == "127.0.0.1"
    assert first.attributes["server.port"] == bad_port
    assert first.attributes["http.response.status_code"] == 500
    assert first.attributes["error.type"] and first.status_code == 2  # STATUS_CODE_ERROR
    assert second.attributes["gen_ai.provider.name"] == "anthropic"
    assert second.attributes["server.port"] == good_port
    assert second.attributes["http.response.status_code"] == 200
    assert "error.type" not in second.attributes
    assert [name for name, _ in second.events] == ["first_content"]

    # Each attempt's own context went upstream, in the same trace.
    assert seen["bad"][-1] == f"00-{CLIENT_TRACE}-{first.span_id}-01"
    assert seen["good"][-1] == f"00-{CLIENT_TRACE}-{second.span_id}-01"
    # Capture is off by default: no prompt text anywhere.
    for span in (server, *attempts):
        assert "gen_ai.input.messages" not in span.attributes
        assert PROMPT not in json.dumps(span.attributes)
    assert all(path == "/v1/traces" for path, _ in receiver.posts)
    assert all(kind == "application/x-protobuf" for _, kind in receiver.posts)
    assert server.resource["service.name"] == "twserve"


def test_a_request_without_traceparent_starts_a_trace(
    traced: tuple[Stack, OtlpReceiver, dict[str, list[str]]],
) -> None:
    stack, receiver, seen = traced
    before = len(receiver.spans)
    client = anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0, timeout=10)
    with client.messages.stream(
        model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert stream.get_final_text()
    spans = receiver.wait_spans(before + 3)[before:]
    servers = [s for s in spans if s.kind == "SERVER"]
    assert len(servers) == 1 and servers[0].parent_span_id == ""
    server, attempts = _tree(spans, servers[0].trace_id)
    assert len(attempts) == 2
    assert server.attributes["twserve.client_format"] == "anthropic"
    assert server.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert seen["good"][-1] == f"00-{server.trace_id}-{attempts[1].span_id}-01"


def test_an_unstreamed_answer_names_its_finish_reason(
    traced: tuple[Stack, OtlpReceiver, dict[str, list[str]]],
) -> None:
    stack, receiver, _ = traced
    before = len(receiver.spans)
    client = anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0, timeout=10)
    message = client.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.stop_reason == "end_turn"
    spans = receiver.wait_spans(before + 3)[before:]
    servers = [s for s in spans if s.kind == "SERVER"]
    assert len(servers) == 1
    assert servers[0].attributes["gen_ai.response.finish_reasons"] == ["end_turn"]


def test_a_refused_request_is_a_span_with_its_code(
    traced: tuple[Stack, OtlpReceiver, dict[str, list[str]]],
) -> None:
    stack, receiver, _ = traced
    before = len(receiver.spans)
    reply = http(
        stack.url + "/v1/chat/completions",
        body=b'{"model": "m", "messages": "not a list"}',
        headers=(
            ("authorization", f"Bearer {KEY}"),
            ("traceparent", f"00-{REFUSED_TRACE}-{CLIENT_SPAN}-01"),
        ),
    )
    assert reply.status == 400
    spans = receiver.wait_spans(before + 1)[before:]
    assert [s.kind for s in spans] == ["SERVER"]
    assert spans[0].trace_id == REFUSED_TRACE and spans[0].parent_span_id == CLIENT_SPAN
    assert spans[0].name == "POST /v1/chat/completions"
    assert spans[0].start_ns <= spans[0].end_ns
    assert spans[0].attributes["error.type"].startswith("gw.")
    assert spans[0].attributes["twserve.outcome"] == "refused"
    assert spans[0].status_code == 2


def test_a_retry_is_an_event_of_the_retried_attempt(
    traced: tuple[Stack, OtlpReceiver, dict[str, list[str]]],
) -> None:
    stack, receiver, _ = traced
    before = len(receiver.spans)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    client.chat.completions.create(model="solo", messages=[{"role": "user", "content": "x"}])
    spans = receiver.wait_spans(before + 3)[before:]
    server = next(s for s in spans if s.kind == "SERVER")
    _, attempts = _tree(spans, server.trace_id)
    assert [a.attributes["twserve.upstream"] for a in attempts] == ["flaky", "flaky"]
    first, second = attempts
    assert first.attributes["error.type"] == "overloaded"
    assert "retry" not in [name for name, _ in first.events]
    retry = dict(second.events)["retry"]
    assert retry["twserve.retry"] == 1 and retry["twserve.backoff_ms"] >= 0
    assert second.attributes["twserve.outcome"] == "ok"
    assert server.attributes["twserve.upstream"] == "flaky"


def test_capture_content_puts_the_prompt_on_the_request_span(tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {}
    with otlp_receiver() as receiver:
        with _stack(tmp_path, receiver, seen, {"capture_content": True}) as stack:
            client = openai.OpenAI(
                base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10
            )
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": PROMPT}]
            )
            spans = receiver.wait_spans(3)
    server = next(s for s in spans if s.kind == "SERVER")
    assert PROMPT in server.attributes["gen_ai.input.messages"]


def test_sample_ratio_zero_exports_nothing_but_still_passes_context(tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {}
    with otlp_receiver() as receiver:
        with _stack(tmp_path, receiver, seen, {"sample_ratio": 0}) as stack:
            client = openai.OpenAI(
                base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10
            )
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            time.sleep(0.5)
        assert receiver.spans == []
    # Not sampled: the upstream gets a traceparent with the sampled flag off.
    assert seen["good"][-1].endswith("-00") and len(seen["good"][-1]) == 55


def test_serve_turns_traces_on_from_the_standard_variables(tmp_path: Path) -> None:
    """``twserve serve`` with no traces in its config and OTEL_EXPORTER_OTLP_ENDPOINT set: a
    process of its own exports to ``<endpoint>/v1/traces`` under OTEL_SERVICE_NAME."""
    mock_port, port = free_port(), free_port()
    config = {
        "version": 1,
        "listen": {"gateway": {"bind": "127.0.0.1", "port": port}},
        "clients": [{"name": "me", "key": KEY}],
        "providers": [
            {
                "name": "mock",
                "protocol": "openai-chat",
                "base_url": f"http://127.0.0.1:{mock_port}/v1",
                "key": "upstream-key",
                "models": ["m"],
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "twserve.cli.main"]
    with otlp_receiver() as receiver:
        env = {
            **os.environ,
            "TWSERVE_HOME": str(tmp_path),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_SERVICE_NAME": "gateway-under-test",
        }
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
            stderr=subprocess.PIPE,
        )
        try:
            _wait_listening(mock_port)  # else the gateway's first attempt finds no mock
            reply = None
            deadline = time.monotonic() + 30
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
            while time.monotonic() < deadline:
                try:
                    reply = http(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        body=body.encode(),
                        headers=(
                            ("authorization", f"Bearer {KEY}"),
                            ("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
                        ),
                    )
                    if reply.status == 200:
                        break
                except httpcore.ConnectError:
                    time.sleep(0.1)
            assert reply is not None and reply.status == 200, reply
        finally:
            gateway.terminate()  # a graceful stop exports what is queued
            mock.terminate()
            _, err = gateway.communicate(timeout=30)
            mock.wait(timeout=30)
        spans = receiver.wait_spans(2, timeout=5)
    server, attempts = _tree(spans, CLIENT_TRACE)
    assert len(attempts) == 1, err.decode()
    assert attempts[0].attributes["http.response.status_code"] == 200
    assert server.resource["service.name"] == "gateway-under-test"
    assert server.parent_span_id == CLIENT_SPAN
    assert {p for p, _ in receiver.posts} == {"/v1/traces"}


def _wait_listening(port: int, secs: float = 30.0) -> None:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def test_traces_are_off_without_config_or_variables() -> None:
    assert not traces_wanted(None, {})
    assert traces_wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    assert not traces_wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SDK_DISABLED": ""})
    assert not traces_wanted(
        None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}
    )


_hex = st.text(alphabet="0123456789abcdef", min_size=1, max_size=40)


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
def test_traceparent_parses_what_w3c_writes(trace_id: int, span_id: int, sampled: bool) -> None:
    text = f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
    found = parse_traceparent(text.encode())
    assert found is not None
    assert (found.trace_id, found.span_id, found.trace_flags.sampled) == (
        trace_id,
        span_id,
        sampled,
    )
    assert found.is_remote


@given(st.binary(max_size=80) | st.lists(_hex, min_size=1, max_size=6).map("-".join))
def test_traceparent_never_raises_and_takes_only_valid_forms(value: bytes | str) -> None:
    raw = value.encode() if isinstance(value, str) else value
    found = parse_traceparent(raw)
    if found is not None:
        parts = raw.decode().strip().lower().split("-")
        assert [len(p) for p in parts[:4]] == [2, 32, 16, 2]
        assert found.trace_id != 0 and found.span_id != 0


def test_traceparent_refuses_zero_ids_and_version_ff() -> None:
    assert parse_traceparent(b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01") is None
    assert parse_traceparent(b"00-" + CLIENT_TRACE.encode() + b"-" + b"0" * 16 + b"-01") is None
    assert parse_traceparent(b"ff-" + CLIENT_TRACE.encode() + b"-00f067aa0ba902b7-01") is None
    later = b"01-" + CLIENT_TRACE.encode() + b"-00f067aa0ba902b7-01-extra"
    assert parse_traceparent(later) is not None
