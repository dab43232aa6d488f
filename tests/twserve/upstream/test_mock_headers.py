"""The mock upstream's ``x-mock-*`` headers reach an upstream only where the provider sets
``forward_mock_headers`` (docs/configuration.md): a test scripts one request through the
gateway with it, and nothing of the mock's goes to a provider without it.
"""

from __future__ import annotations

import json

import pytest

from tests.twserve.conftest import KEY, StackFactory, http
from tests.twserve.support.stack import Upstream

SCRIPT = json.dumps({"text": "scripted through the gateway", "chunk_size": 100})
CHAT_BODY = json.dumps(
    {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
).encode()


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic"])  # same format, converted
def test_forwarded_when_the_provider_asks_for_it(stack: StackFactory, protocol: str) -> None:
    st = stack({"up": Upstream(protocol, extra={"forward_mock_headers": True})})
    reply = http(
        st.url + "/v1/chat/completions",
        body=CHAT_BODY,
        headers=[("authorization", f"Bearer {KEY}"), ("x-mock-script", SCRIPT)],
    )
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == "scripted through the gateway"
    assert st.mock("up").received[-1].header("x-mock-script") == SCRIPT


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic"])
def test_dropped_by_default(stack: StackFactory, protocol: str) -> None:
    st = stack({"up": Upstream(protocol)})
    reply = http(
        st.url + "/v1/chat/completions",
        body=CHAT_BODY,
        headers=[
            ("authorization", f"Bearer {KEY}"),
            ("x-mock-script", SCRIPT),
            ("x-mock-anything", "1"),
        ],
    )
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] != "scripted through the gateway"
    received = st.mock("up").received[-1]
    assert [k for k, _ in received.headers if k.startswith(b"x-mock-")] == []
