"""While an upstream is slow to its first content the client gets its 200 and SSE keep-alive
comments (Gemini clients: the headers only), and failover continues under that 200
(docs/failover.md, "Keep-alive"). The 15 s of production are shortened here through the gateway's
attempt settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpcore

from tests.twserve.support.stack import KEY, Upstream, running_stack
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


# --- while the request waits for its key's max_concurrent permit ------------------------------

_QUEUED = {
    "clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}],
}
_ANTHROPIC_BODY = {
    "model": "m",
    "max_tokens": 9,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def _behind_a_held_permit(st, path: str, body: dict[str, object], headers):  # type: ignore[no-untyped-def]
    """Send `body` while another streamed request of the same key holds its only permit."""
    import threading
    import time

    first: list[tuple[int, bytes]] = []
    holder = threading.Thread(
        target=lambda: first.append(
            _stream(st.url, "/v1/messages", _ANTHROPIC_BODY, [(b"x-api-key", KEY.encode())])
        )
    )
    holder.start()
    time.sleep(0.2)  # the first request holds the key's permit
    try:
        return _timed_stream(st.url, path, body, headers)
    finally:
        holder.join()


def _timed_stream(url: str, path: str, body: dict[str, object], headers):  # type: ignore[no-untyped-def]
    """Status, body, and how long the status line took to come."""
    import time

    sent = time.monotonic()
    with httpcore.stream(
        "POST", url + path, headers=headers, content=json.dumps(body).encode()
    ) as resp:
        head_secs = time.monotonic() - sent
        return resp.status, resp.read(), head_secs


def test_a_request_queued_for_its_key_gets_keepalives_then_its_answer(tmp_path: Path) -> None:
    # The first answer takes about 1.5 s; the second waits for the key that long, under a 200
    # and keep-alive comments, then streams its own answer.
    slow = MockSettings(script=Script(first_delay=1.5, chunks=2))
    with running_stack(
        tmp_path,
        {"a": Upstream("anthropic", slow)},
        config={**_QUEUED, "failover": {"wait_secs": 10}},
    ) as st:
        _fast_keepalive(st)
        status, body, head_secs = _behind_a_held_permit(
            st, "/v1/messages", _ANTHROPIC_BODY, [(b"x-api-key", KEY.encode())]
        )
        rows = st.wait_rows(2)
    # The 200 came about keepalive_after (0.3 s) from arrival, while the key was still busy
    # (until about 1.3 s), not once its permit came.
    assert status == 200 and head_secs < 1.0, head_secs
    head, _, rest = body.partition(b"event: message_start")
    # Comments while queued for the key (about 1.3 s) and again during its own 1.5 s start.
    assert head.count(b": keep-alive\n\n") >= 4, head
    assert rest.rstrip().endswith(b'"message_stop"}')
    assert all(r["status"] == 200 and not r["error_code"] for r in rows)


def test_a_request_whose_key_wait_fails_ends_with_an_error_event(tmp_path: Path) -> None:
    slow = MockSettings(script=Script(first_delay=2.0, chunks=2))
    with running_stack(
        tmp_path,
        {"a": Upstream("anthropic", slow)},
        config={**_QUEUED, "failover": {"wait_secs": 1}},
    ) as st:
        _fast_keepalive(st)
        status, body, _ = _behind_a_held_permit(
            st, "/v1/messages", _ANTHROPIC_BODY, [(b"x-api-key", KEY.encode())]
        )
        rows = st.wait_rows(2)
    assert status == 200  # committed early by the keep-alive
    head, _, error = body.partition(b"event: error\ndata: ")
    assert head.count(b": keep-alive\n\n") >= 2 and b"message_start" not in head
    assert json.loads(error.split(b"\n")[0])["error"]["type"] == "rate_limit_error"
    assert sorted(r["error_code"] or "" for r in rows) == ["", "gw.key.busy"]
    assert len(st.mock("a").received) == 1  # the queued request never went upstream


def test_a_gemini_client_queued_for_its_key_gets_headers_only(tmp_path: Path) -> None:
    slow = MockSettings(script=Script(first_delay=1.5, chunks=2))
    with running_stack(
        tmp_path,
        {"a": Upstream("anthropic", slow), "g": Upstream("gemini", MockSettings())},
        config={**_QUEUED, "failover": {"wait_secs": 1}},
    ) as st:
        _fast_keepalive(st)
        status, body, _ = _behind_a_held_permit(
            st,
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
            [(b"x-goog-api-key", KEY.encode())],
        )
    assert status == 200 and b"keep-alive" not in body
    error = json.loads(body.split(b"data: ")[1])
    assert error["error"]["status"] == "RESOURCE_EXHAUSTED"
