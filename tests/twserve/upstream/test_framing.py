"""Answers from upstreams that frame them as real APIs do: by length, by chunks, or by closing.

Real servers spell ``Content-Length`` with capitals and add headers of their own. A same-format
whole answer used to keep the upstream's ``Content-Length`` next to the gateway's own (the model
renamed changes the length), which h11 refuses: the connection dropped with no answer. Every
path is checked here — whole answers, streams, token counts, passed-through errors, same format
and converted — through each framing, with the official SDKs as clients.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.twserve.conftest import FORMATS, MODELS, Sdks, ask, http
from tests.twserve.support.reframe import FRAMINGS, reframer
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script

_BASE_PATH = {"anthropic": "", "openai-chat": "/v1", "openai-responses": "/v1", "gemini": ""}

# What an upstream sends that is about the upstream's account or its own hop, not the answer.
_PRIVATE = [
    (b"Set-Cookie", b"session=upstream-secret"),
    (b"Openai-Organization", b"operator-org"),
    (b"Anthropic-Ratelimit-Tokens-Remaining", b"12345"),
    (b"X-Upstream-Debug", b"internal"),
    (b"Request-Id", b"req_upstream_1"),
]


@contextmanager
def _through(
    tmp_path: Path, protocol: str, framing: str, settings: MockSettings | None = None
) -> Iterator[Stack]:
    # The upstream answers with a dated model name, as real APIs do, which the gateway renames
    # back to the name the client asked for: the answer changes length on the way.
    aliases = {name: f"{name}-20250101" for name in set(MODELS.values())}
    with reframer(framing, _PRIVATE) as proxy:
        base = f"http://127.0.0.1:{proxy.port}{_BASE_PATH[protocol]}"
        up = Upstream(protocol, settings or MockSettings(), extra={"base_url": base})
        with running_stack(tmp_path, {"u": up}, config={"aliases": aliases}) as st:
            proxy.target_port = st.mocks["u"][1]
            yield st


@pytest.mark.sdk
@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_same_format_answers_through_every_framing(
    tmp_path: Path, sdks: Sdks, fmt: str, framing: str
) -> None:
    with _through(tmp_path, fmt, framing) as st:
        whole = ask(sdks, st, fmt, stream=False)
        streamed = ask(sdks, st, fmt, stream=True)
        raw = http(
            st.url + ("/v1/messages" if fmt == "anthropic" else "/v1/chat/completions"),
            body=b'{"model":"gpt-e2e-1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}',
            headers=[("x-api-key", KEY), ("content-type", "application/json")],
        )
    assert whole.text and whole.text == streamed.text
    names = [k.lower() for k, _ in raw.headers]
    assert names.count(b"content-length") <= 1
    # Only what the allow-list lets through: nothing of the upstream's account or hop.
    assert not {b"set-cookie", b"openai-organization", b"x-upstream-debug"} & set(names)
    assert b"anthropic-ratelimit-tokens-remaining" not in names


@pytest.mark.sdk
@pytest.mark.parametrize("framing", FRAMINGS)
def test_converted_answers_through_every_framing(tmp_path: Path, sdks: Sdks, framing: str) -> None:
    with _through(tmp_path, "openai-chat", framing) as st:
        whole = ask(sdks, st, "anthropic", stream=False)
        streamed = ask(sdks, st, "gemini", stream=True)
    assert whole.text and streamed.text


@pytest.mark.sdk
@pytest.mark.parametrize("framing", FRAMINGS)
def test_token_counts_through_every_framing(tmp_path: Path, sdks: Sdks, framing: str) -> None:
    with _through(tmp_path, "anthropic", framing) as st:
        ant = sdks.anthropic(st)
        raw = ant.messages.with_raw_response.count_tokens(
            model="claude-e2e-1", messages=[{"role": "user", "content": "hello " * 50}]
        )
        counted = raw.parse()
    assert counted.input_tokens > 0
    assert raw.headers.get("request-id") == "req_upstream_1"  # allowed: SDKs report it
    assert "set-cookie" not in raw.headers
    with _through(tmp_path / "g", "gemini", framing) as st:
        client, options = sdks.genai(st)
        g = client.models.count_tokens(
            model="gemini-e2e-1",
            contents="hello " * 50,
            config=gtypes.CountTokensConfig(http_options=options),
        )
    assert g.total_tokens is not None and g.total_tokens > 0


@pytest.mark.sdk
@pytest.mark.parametrize("framing", FRAMINGS)
def test_passed_through_errors_through_every_framing(
    tmp_path: Path, sdks: Sdks, framing: str
) -> None:
    settings = MockSettings(script=Script(error=ErrorSpec(status=400, message="bad field")))
    with _through(tmp_path, "anthropic", framing, settings) as st:
        with pytest.raises(anthropic.BadRequestError) as ant_err:
            ask(sdks, st, "anthropic", stream=False)
    with _through(tmp_path / "o", "openai-chat", framing, settings) as st:
        with pytest.raises(openai.BadRequestError) as oa_err:
            ask(sdks, st, "openai-chat", stream=True)
    with _through(tmp_path / "g", "gemini", framing, settings) as st:
        with pytest.raises(genai_errors.ClientError) as g_err:
            ask(sdks, st, "gemini", stream=False)
    assert "bad field" in str(ant_err.value)
    assert "bad field" in str(oa_err.value)
    assert g_err.value.code == 400
    assert ant_err.value.response.headers.get("set-cookie") is None
    assert ant_err.value.response.headers.get("x-thinkwatch-error") == "upstream"
