"""While an upstream is slow to its first content the client gets its 200 and SSE keep-alive
comments (Gemini clients: the headers only), and failover continues under that 200
(docs/failover.md, "Keep-alive"). The 15 s of production are shortened here through the gateway's
attempt settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpcore

from tests.twserve.stack import KEY, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script

SLOW = MockSettings(script=Script(first_delay=1.0, chunks=3))


def _fast_keepalive(st) -> None:  # type: ignore[no-untyped-def]
    gw = st.app.gateway
    gw.settings = replace(gw.settings, keepalive_after=0.3, keepalive_every=0.3)


def _stream(url: str, path: str, body: dict[str, object], headers) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    resp = httpcore.request("POST", url + path, headers=headers, content=json.dumps(body).encode())
    return resp.status, resp.content


def test_keepalive_comments_before_slow_content(tmp_path: Path) -> None:
    with running_stack(tmp_path, {"a": Upstream("anthropic", SLOW)}) as st:
        _fast_keepalive(st)
        status, body = _stream(
            st.url,
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            [(b"x-api-key", KEY.encode())],
        )
    assert status == 200
    head, _, rest = body.partition(b"event: message_start")
    assert head.count(b": keep-alive\n\n") >= 2 and rest.rstrip().endswith(b'"message_stop"}')


def test_gemini_clients_get_headers_but_no_comments(tmp_path: Path) -> None:
    with running_stack(tmp_path, {"g": Upstream("gemini", SLOW)}) as st:
        _fast_keepalive(st)
        status, body = _stream(
            st.url,
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
            [(b"x-goog-api-key", KEY.encode())],
        )
    assert status == 200 and b"keep-alive" not in body and b"candidates" in body


def test_failover_under_an_early_200_ends_with_an_error_event(tmp_path: Path) -> None:
    failing = MockSettings(script=Script(head_delay=0.8, error=ErrorSpec(status=529)))
    ups = {"a": Upstream("anthropic", failing), "b": Upstream("anthropic", failing)}
    with running_stack(tmp_path, ups, config={"failover": {"wait_secs": 0}}) as st:
        _fast_keepalive(st)
        status, body = _stream(
            st.url,
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            [(b"x-api-key", KEY.encode())],
        )
        (row,) = st.wait_rows(1)
    assert status == 200  # committed early by the keep-alive
    assert b": keep-alive" in body and b"event: error" in body
    error = json.loads(body.split(b"event: error\ndata: ")[1].split(b"\n")[0])
    assert (
        error["error"]["type"] == "overloaded_error"
        and "(tried: a → b)" in error["error"]["message"]
    )
    attempts = json.loads(row["routing"])["attempts"]
    assert [a["provider"] for a in attempts] == ["a", "b"]
