"""Requests a web page makes through its user's browser, against the real gateway
(twengine.browser; docs/operations.md, "Requests from web pages").

With ``default_key`` a request needs no key, so without these checks any page the user opens
could spend tokens through a gateway on loopback: a ``text/plain`` POST and a WebSocket are
what a page may send without the browser asking first. Every test here sends what a browser
sends (``Origin``, ``Sec-Fetch-Site``, a form or text type) over a real socket; the official
SDKs, which send none of it, must go on working.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import websockets
from websockets.typing import Origin

from tests.twserve.conftest import FORMATS, KEY, MODELS, Sdks, StackFactory, ask, http
from tests.twserve.support.h2_client import RawH2
from tests.twserve.support.stack import Stack, Upstream

_UPSTREAMS = {fmt: Upstream(fmt) for fmt in FORMATS}
_BY_FORMAT: dict[str, Any] = {
    "routes": [
        {
            "name": "default",
            "rules": [{"name": fmt, "when": {"dialect": fmt}, "to": fmt} for fmt in FORMATS],
        }
    ],
    "default_key": "tester",  # requests without a key are served: the case that needs this
}
_PATHS = {
    "anthropic": "/v1/messages",
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "gemini": f"/v1beta/models/{MODELS['gemini']}:generateContent",
}
_BODIES: dict[str, dict[str, Any]] = {
    "anthropic": {
        "model": MODELS["anthropic"],
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "openai-chat": {
        "model": MODELS["openai-chat"],
        "messages": [{"role": "user", "content": "hi"}],
    },
    "openai-responses": {"model": MODELS["openai-responses"], "input": "hi"},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
}
EVIL = "https://evil.example"


def _gateway(stack: StackFactory, **gateway: Any) -> Stack:
    listen = {"gateway": {"bind": "127.0.0.1", **gateway}}
    return stack(_UPSTREAMS, config={**_BY_FORMAT, "listen": listen})


def _post(st: Stack, fmt: str, headers: list[tuple[str, str]]) -> Any:
    return http(st.url + _PATHS[fmt], body=json.dumps(_BODIES[fmt]).encode(), headers=headers)


def _nothing_reached_upstream(st: Stack) -> None:
    for fmt in FORMATS:
        assert not st.mock(fmt).received, f"{fmt} upstream was called"


# What each refusal's message names (Anthropic's and Gemini's error shapes carry no code).
_SAYS = {
    "gw.request.foreign_origin": "allow_origins",
    "gw.request.unexpected_host": "allow_hosts",
    "gw.request.unsupported_media_type": "application/json",
}


def _refused(reply: Any, status: int, code: str, fmt: str) -> None:
    assert reply.status == status, reply.body
    assert reply.header("x-thinkwatch-error") == ("request" if status == 415 else "denied")
    body = reply.json()
    # In the client's own error shape.
    if fmt == "anthropic":
        assert body["type"] == "error"
        assert _SAYS[code] in body["error"]["message"]
    elif fmt == "gemini":
        assert body["error"]["code"] == status
        assert _SAYS[code] in body["error"]["message"]
    else:
        assert body["error"]["code"] == code


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_foreign_pages_simple_post_spends_nothing(stack: StackFactory, fmt: str) -> None:
    st = _gateway(stack)
    # What a page's fetch(..., {mode: "no-cors", method: "POST", body: "..."}) sends.
    reply = _post(st, fmt, [("origin", EVIL), ("content-type", "text/plain;charset=UTF-8")])
    _refused(reply, 403, "gw.request.foreign_origin", fmt)
    # With JSON (a page must pass CORS's preflight for that, which the gateway never grants)
    # the Origin alone refuses it.
    reply = _post(st, fmt, [("origin", EVIL), ("content-type", "application/json")])
    _refused(reply, 403, "gw.request.foreign_origin", fmt)
    _nothing_reached_upstream(st)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_body_that_is_not_json_is_refused_415(stack: StackFactory, fmt: str) -> None:
    st = _gateway(stack)
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        reply = _post(st, fmt, [("content-type", content_type)])
        _refused(reply, 415, "gw.request.unsupported_media_type", fmt)
    _nothing_reached_upstream(st)
    # No Origin and JSON (curl, scripts): served with the default key.
    assert _post(st, fmt, [("content-type", "application/json")]).status == 200


def test_another_sites_request_without_an_origin_is_refused(stack: StackFactory) -> None:
    st = _gateway(stack)
    reply = http(st.url + "/v1/models", "GET", headers=[("sec-fetch-site", "cross-site")])
    _refused(reply, 403, "gw.request.foreign_origin", "openai-chat")
    assert http(st.url + "/v1/models", "GET", headers=[("sec-fetch-site", "none")]).status == 200


async def _upgrade(st: Stack, origin: str | None) -> int:
    try:
        async with websockets.connect(
            f"ws://127.0.0.1:{st.port}/v1/responses",
            origin=None if origin is None else Origin(origin),
            open_timeout=5,
        ) as ws:
            await ws.send(json.dumps({"type": "response.create", **_BODIES["openai-responses"]}))
            while json.loads(await ws.recv())["type"] not in ("response.completed", "error"):
                pass
            return 101
    except websockets.InvalidStatus as refused:
        assert b"gw.request.foreign_origin" in refused.response.body
        return refused.response.status_code


@pytest.mark.anyio
async def test_a_foreign_pages_websocket_is_refused_at_the_upgrade(stack: StackFactory) -> None:
    st = _gateway(stack)
    assert await _upgrade(st, EVIL) == 403
    _nothing_reached_upstream(st)
    assert await _upgrade(st, None) == 101  # no Origin: a program, served


def test_a_foreign_origin_over_http2_is_refused_on_its_stream(stack: StackFactory) -> None:
    st = _gateway(stack)
    client = RawH2(st.port)
    body = json.dumps(_BODIES["openai-chat"]).encode()
    refused = client.request(
        "/v1/chat/completions", body, headers=[("origin", EVIL), ("content-type", "text/plain")]
    )
    served = client.request(
        "/v1/chat/completions", body, headers=[("content-type", "application/json")]
    )
    client.wait(lambda: client.answers[refused].ended and client.answers[served].ended)
    assert client.answers[refused].status == 403
    assert b"gw.request.foreign_origin" in client.answers[refused].body
    assert client.answers[served].status == 200
    client.sock.close()


def test_listed_origins_are_served(stack: StackFactory) -> None:
    st = _gateway(stack, allow_origins=["https://app.example.com"])
    ok = _post(
        st,
        "openai-chat",
        [("origin", "https://app.example.com"), ("content-type", "application/json")],
    )
    assert ok.status == 200, ok.body
    other = _post(st, "openai-chat", [("origin", EVIL), ("content-type", "application/json")])
    _refused(other, 403, "gw.request.foreign_origin", "openai-chat")


def test_allow_hosts_refuses_a_rebound_host_name(stack: StackFactory) -> None:
    st = _gateway(stack, allow_hosts=["127.0.0.1", "localhost"])
    json_type = ("content-type", "application/json")
    rebound = _post(st, "openai-chat", [("host", "rebound.evil.example:8788"), json_type])
    _refused(rebound, 403, "gw.request.unexpected_host", "openai-chat")
    assert _post(st, "openai-chat", [("host", f"localhost:{st.port}"), json_type]).status == 200
    # Probes and the warm-up answer whatever the Host (a load balancer's checks use addresses).
    health = http(st.url + "/healthz", "GET", headers=[("host", "10.1.2.3:8788")])
    assert health.status == 200


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_official_sdks_are_still_served(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    st = _gateway(stack, allow_hosts=["127.0.0.1"])
    answer = ask(sdks, st, fmt, stream=fmt != "gemini", key=KEY)
    assert answer.text
