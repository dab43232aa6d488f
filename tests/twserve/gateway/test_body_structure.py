"""A body of the wrong shape sent to a same-format upstream is refused with 400 in the client's
format before any upstream sees it (docs/operations.md): same-format bodies pass byte for byte
without being decoded, so nothing else would catch ``messages`` that is not a list."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.twserve.conftest import KEY, MODELS, Sdks, StackFactory, http
from tests.twserve.gateway.test_bad_input import (
    _BY_FORMAT,
    _KEY_HEADER,
    _PATHS,
    _UPSTREAMS,
    _assert_error,
    _nothing_reached_upstream,
)
from tests.twserve.support.stack import Stack

BAD = {
    "anthropic": [
        ({"model": MODELS["anthropic"], "max_tokens": 8, "messages": "hi"}, "messages"),
        ({"model": MODELS["anthropic"], "max_tokens": 8, "messages": ["hi"]}, "messages[0]"),
    ],
    "openai-chat": [
        ({"model": "gpt-e2e-1", "messages": {"role": "user", "content": "hi"}}, "messages"),
        ({"model": "gpt-e2e-1", "messages": [{"role": "user", "content": "x"}, 3]}, "messages[1]"),
    ],
    "openai-responses": [
        ({"model": "gpt-e2e-1", "input": ["hi"]}, "input[0]"),
    ],
    "gemini": [
        ({"contents": {"parts": [{"text": "hi"}]}}, "contents"),
        ({"contents": ["hi"]}, "contents[0]"),
    ],
}
CASES = [(fmt, body, path) for fmt, items in BAD.items() for body, path in items]


@pytest.mark.parametrize(("fmt", "body", "path"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_wrong_shape_is_refused_before_any_upstream(
    stack: StackFactory, fmt: str, body: dict[str, object], path: str
) -> None:
    st: Stack = stack(_UPSTREAMS, config=_BY_FORMAT)
    reply = http(st.url + _PATHS[fmt], body=json.dumps(body).encode(), headers=[_KEY_HEADER[fmt]])
    _assert_error(reply, 400, fmt, "request")
    assert path in json.dumps(reply.json())
    _nothing_reached_upstream(st)
    row = st.wait_rows(1)[0]
    assert row["status"] == 400 and row["error_code"] == "gw.request.invalid_body"


def test_anthropic_sdk_sees_a_bad_request(stack: StackFactory, sdks: Sdks) -> None:
    st = stack(_UPSTREAMS, config=_BY_FORMAT)
    client = sdks.anthropic(st, KEY, 5.0)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model=MODELS["anthropic"],
            max_tokens=8,
            messages=[{"role": "user", "content": [7]}],  # type: ignore[list-item]
        )
    assert "messages[0].content[0]" in info.value.message
    _nothing_reached_upstream(st)
