"""A rule's `set` reaches the upstream: model, max_tokens and reasoning level
(docs/configuration.md, routes; docs/conversion.md, "Reasoning effort")."""

from __future__ import annotations

import json
from pathlib import Path

import httpcore

from tests.twserve.support.stack import KEY, Upstream, running_stack

ROUTES = {
    "routes": [
        {
            "name": "default",
            "rules": [
                {
                    "name": "cap-thinking",
                    "when": {"thinking": True},
                    "set": {"max_tokens": 4000, "reasoning": "low"},
                    "on_match": "continue",
                },
                {
                    "name": "plain-off",
                    "when": {"model": "quiet"},
                    "set": {"reasoning": "off"},
                    "on_match": "continue",
                },
            ],
        }
    ],
}


def _send(url: str, body: dict[str, object]) -> int:
    resp = httpcore.request(
        "POST",
        url + "/v1/messages",
        headers=[(b"x-api-key", KEY.encode())],
        content=json.dumps(body).encode(),
    )
    return resp.status


def test_set_rewrites_what_the_upstream_receives(tmp_path: Path) -> None:
    thinking = {"type": "enabled", "budget_tokens": 31999}
    msgs = [{"role": "user", "content": "hi"}]
    with running_stack(tmp_path, {"a": Upstream("anthropic")}, config=ROUTES) as st:
        assert (
            _send(
                st.url, {"model": "m", "max_tokens": 32000, "thinking": thinking, "messages": msgs}
            )
            == 200
        )
        first = st.mock("a").received[-1].json()
        plain = {"model": "m", "max_tokens": 100, "messages": msgs}
        assert _send(st.url, plain) == 200
        second = st.mock("a").received[-1]
        assert (
            _send(st.url, {**plain, "model": "quiet", "thinking": thinking, "max_tokens": 32000})
            == 200
        )
        third = st.mock("a").received[-1].json()
    assert first["max_tokens"] == 4000
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # No rule matched: passed through byte for byte, reasoning never turned on.
    assert second.body == json.dumps(plain).encode()
    # thinking:true matches first (low), then "off" for this model removes it (docs/operations.md).
    assert "thinking" not in third and "output_config" not in third
