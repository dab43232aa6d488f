"""``twserve demo``: the gateway and a built-in mock upstream, ready to be tried with curl.

The mock speaks all four APIs on one port; the gateway's config puts one upstream of each format
behind it, each offering its own demo model. Asking for a model routes to the upstream that
offers it, so a request in one format for another format's model shows conversion at work.
Every finished request prints one line (upstream, status, first-content time, tokens, attempts)
so the request store's view is visible while you try it.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpcore

from twengine.config import Config, build_config
from twmock.script import ErrorSpec, MockSettings, Script
from twproto.dialect import Dialect
from twproto.paths import Operation
from twproto.upstream_request import ClientCall, UpstreamTarget, upstream_request
from twserve.app.wiring import GatewayApp
from twserve.store.sqlite import RequestRow

DEMO_KEY = "demo-key"

MODELS = {
    "anthropic": "claude-demo",
    "openai-chat": "gpt-demo",
    "openai-responses": "gpt-demo-responses",
    "gemini": "gemini-demo",
}
# Served by a load-balance group of three Anthropic-format upstreams, one of them flaky.
POOL_MODEL = "claude-pool"


def demo_mock_settings() -> MockSettings:
    """One mock process playing every demo upstream: a profile per path prefix."""
    streamy = Script(chunks=12, chunk_delay=0.02)
    return MockSettings(
        script=streamy,
        profiles={
            "main": streamy,
            "relay": replace(streamy, first_delay=0.15),
            # Fails one request in three before its first content, like an overloaded relay.
            "flaky": replace(streamy, fail_rate=0.35, error=ErrorSpec(status=529)),
        },
        seed=7,
    )


def demo_config(mock_port: int) -> Config:
    base = f"http://127.0.0.1:{mock_port}"
    providers: list[dict[str, Any]] = [
        {
            "name": "mock-anthropic",
            "protocol": "anthropic",
            "base_url": base,
            "key": "mock",
            "models": [MODELS["anthropic"]],
        },
        {
            "name": "mock-openai",
            "protocol": "openai-chat",
            "base_url": base + "/v1",
            "key": "mock",
            "models": [MODELS["openai-chat"]],
        },
        {
            "name": "mock-responses",
            "protocol": "openai-responses",
            "base_url": base + "/v1",
            "key": "mock",
            "models": [MODELS["openai-responses"]],
        },
        {
            "name": "mock-gemini",
            "protocol": "gemini",
            "base_url": base,
            "key": "mock",
            "models": [MODELS["gemini"]],
        },
        {
            "name": "pool-main",
            "protocol": "anthropic",
            "base_url": base + "/main",
            "key": "mock",
            "models": [POOL_MODEL],
        },
        {
            "name": "pool-relay",
            "protocol": "anthropic",
            "base_url": base + "/relay",
            "key": "mock",
            "models": [POOL_MODEL],
        },
        {
            "name": "pool-flaky",
            "protocol": "anthropic",
            "base_url": base + "/flaky",
            "key": "mock",
            "models": [POOL_MODEL],
        },
    ]
    for provider in providers:
        # Every upstream is the mock: let a curl's x-mock-script header script its answer.
        provider["forward_mock_headers"] = True
    return build_config(
        {
            "version": 1,
            "clients": [{"name": "demo", "key": DEMO_KEY}],
            "providers": providers,
            "groups": [
                {
                    "name": "pool",
                    "type": "load-balance",
                    "providers": [
                        {"name": "pool-main", "weight": 5},
                        {"name": "pool-relay", "weight": 3},
                        {"name": "pool-flaky", "weight": 2},
                    ],
                }
            ],
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {"name": "pool", "when": {"model": POOL_MODEL}, "to": "pool"},
                    ],
                }
            ],
        }
    )


def banner_requests(port: int) -> list[tuple[str, str, dict[str, str], str]]:
    """(title, url, headers, body) for each request the banner shows.

    Each is written the way its client's SDK writes it: to the demo client, the gateway is one
    more upstream of the client's own format (`twproto.upstream_request`).
    """
    gateway = f"http://127.0.0.1:{port}"
    hello = [{"role": "user", "content": "Say hello in five words."}]
    gemini_hello = {"contents": [{"role": "user", "parts": [{"text": "Say hello in five words."}]}]}

    def anthropic(model: str) -> dict[str, Any]:
        return {"model": model, "max_tokens": 256, "stream": True, "messages": hello}

    def chat(model: str) -> dict[str, Any]:
        return {"model": model, "stream": True, "messages": hello}

    def request(
        title: str, dialect: Dialect, model: str, stream: bool, body: dict[str, Any]
    ) -> tuple[str, str, dict[str, str], str]:
        # The base URL each SDK is given: the OpenAI SDKs' includes /v1, as for the mock above.
        openai = dialect in (Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES)
        base_url = gateway + "/v1" if openai else gateway
        target = UpstreamTarget(dialect=dialect, base_url=base_url, key=DEMO_KEY, model=model)
        call = ClientCall(dialect=dialect, operation=Operation.GENERATE, stream=stream)
        raw = json.dumps(body, separators=(",", ":"))
        built = upstream_request(target, call, raw.encode())
        # curl sets its own content-type line; identity encoding is its default.
        headers = {
            k.decode(): v.decode()
            for k, v in built.headers
            if k not in (b"content-type", b"accept-encoding")
        }
        return title, built.url, headers, raw

    gemini_model = MODELS["gemini"]
    responses_model = MODELS["openai-responses"]
    a, c, r, g = Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.GEMINI
    return [
        request(
            "Anthropic Messages client → Anthropic upstream, streamed",
            a,
            MODELS["anthropic"],
            True,
            anthropic(MODELS["anthropic"]),
        ),
        request(
            "OpenAI Chat client → OpenAI Chat upstream, streamed",
            c,
            MODELS["openai-chat"],
            True,
            chat(MODELS["openai-chat"]),
        ),
        request(
            "OpenAI Responses client → Responses upstream, whole answer",
            r,
            responses_model,
            False,
            {"model": responses_model, "input": "Say hello in five words."},
        ),
        request(
            "Gemini client → Gemini upstream, streamed (SSE)",
            g,
            gemini_model,
            True,
            gemini_hello,
        ),
        request(
            "OpenAI Chat client → Anthropic upstream (converted both ways), streamed",
            c,
            MODELS["anthropic"],
            True,
            chat(MODELS["anthropic"]),
        ),
        request(
            "Anthropic client → Gemini upstream (converted), streamed",
            a,
            gemini_model,
            True,
            anthropic(gemini_model),
        ),
        request(
            "Load-balance group 5:3:2 with a flaky member: run it a few times and watch the"
            " [row] lines spread across pool-main / pool-relay / pool-flaky, failing over"
            " invisibly when pool-flaky answers 529",
            c,
            POOL_MODEL,
            True,
            chat(POOL_MODEL),
        ),
        request(
            "Gemini client → OpenAI Responses upstream (converted), whole answer",
            g,
            responses_model,
            False,
            gemini_hello,
        ),
    ]


def curl_line(url: str, headers: dict[str, str], body: str) -> str:
    parts = ["curl", "-N", shlex.quote(url), "-H", "'content-type: application/json'"]
    for name, value in headers.items():
        parts += ["-H", shlex.quote(f"{name}: {value}")]
    parts += ["-d", shlex.quote(body)]
    return " ".join(parts)


def row_line(row: RequestRow) -> str:
    attempts = (row.routing or {}).get("attempts", [])
    path = (
        " → ".join(
            f"{a['provider']}:{a['outcome']}" + (f"({a['error']})" if a.get("error") else "")
            for a in attempts
        )
        or "-"
    )
    tokens = (
        f"in={row.input_tokens} out={row.output_tokens}" if row.input_tokens is not None else ""
    )
    if row.cancelled:
        path += " (the client left)"
    return (
        f"[row] {row.format} {row.model} status={row.status} via {row.provider} "
        f"ttfb={row.ttfb_ms}ms {tokens} attempts: {path}"
    )


async def _run_once(port: int) -> None:
    """Send each banner request once (the pool's ten times) and print what came back."""
    async with httpcore.AsyncConnectionPool() as pool:
        for title, url, headers, body in banner_requests(port):
            print(f"\n== {title}", flush=True)
            repeat = 10 if POOL_MODEL in body else 1
            for _ in range(repeat):
                resp = await pool.request(
                    "POST", url, headers=list(headers.items()), content=body.encode()
                )
                if repeat == 1:
                    text = resp.content.decode("utf-8", "replace")
                    print(f"HTTP {resp.status}\n{text[:900]}", flush=True)


async def run_demo(*, port: int = 8788, mock_port: int = 0, once: bool = False) -> None:
    from twmock import serve_mock

    home = Path(tempfile.mkdtemp(prefix="twserve-demo-"))
    async with anyio.create_task_group() as tg:
        bound_mock = await tg.start(
            lambda task_status: serve_mock(
                demo_mock_settings(), host="127.0.0.1", port=mock_port, task_status=task_status
            )
        )
        config = demo_config(bound_mock)
        app = GatewayApp(config, home, env={}, port=0 if once else port)
        app.gateway.on_finished = lambda row: print(row_line(row), flush=True)
        bound = await tg.start(app.run)
        gport = bound.gateway_port
        print(
            f"twserve demo: gateway on http://127.0.0.1:{gport}, mock upstream on "
            f"http://127.0.0.1:{bound_mock}, request rows in {home}/requests.sqlite3"
        )
        print(f"gateway key: {DEMO_KEY}\n")
        if once:
            await _run_once(gport)
            tg.cancel_scope.cancel()
            return
        print("Paste any of these into another terminal:\n")
        for title, url, headers, body in banner_requests(gport):
            print(f"# {title}\n{curl_line(url, headers, body)}\n")
        print("Ctrl-C stops the demo.", flush=True)
