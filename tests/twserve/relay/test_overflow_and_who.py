"""Context overflow and "who answered", through the real gateway and the official SDKs.

A prompt too long for one upstream's model moves on to a candidate whose context window is
larger, without counting against the first (docs/failover.md, "Context overflow"). Every answer
from an upstream names it in ``x-twserve-provider`` / ``x-twserve-model``, and ``answer_model``
picks the model name the body shows (docs/configuration.md, ``answer_model``).

The small upstream is the mock scripted to answer every request with its format's own context
overflow error (``"error": "context-overflow"``, docs/mock-upstream.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx2
import pytest
from google.genai import types as gtypes

from tests.twserve.conftest import FORMATS, KEY, MODELS, PROMPT, Sdks, StackFactory, http
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

OVERFLOW = MockSettings(script=parse_script({"error": "context-overflow"}), seed=3)
TEXT = "answered by the larger window"
ANSWER = MockSettings(script=parse_script({"text": TEXT}), seed=4)


def _config(answer_model: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "routes": [
            {
                "name": "default",
                "rules": [
                    {
                        "name": "all",
                        "to": [
                            {"provider": "small", "model": "small-model"},
                            {"provider": "big", "model": "big-model"},
                        ],
                    }
                ],
            }
        ],
        # One unexplained failure would pause an upstream: an overflow must not.
        "failover": {"wait_secs": 1, "failures_to_pause": 1},
    }
    if answer_model is not None:
        config["answer_model"] = answer_model
    return config


def _start(
    stack: StackFactory,
    fmt: str,
    *,
    small_window: int = 8_000,
    big_window: int = 200_000,
    answer_model: str | None = None,
) -> Stack:
    def up(settings: MockSettings, model: str, window: int) -> Upstream:
        spec = {"model_specs": {model: {"context_window": window}}}
        return Upstream(fmt, settings, extra=spec)

    return stack(
        {
            "small": up(OVERFLOW, "small-model", small_window),
            "big": up(ANSWER, "big-model", big_window),
        },
        config=_config(answer_model),
    )


def _ask(sdks: Sdks, st: Stack, fmt: str, *, stream: bool) -> tuple[dict[str, str], str, str]:
    """Ask through `fmt`'s SDK: the response headers it saw, the text, and the model name its
    parsed answer shows."""
    if fmt == "anthropic":
        return _anthropic(sdks.anthropic(st), stream=stream)
    if fmt == "openai-chat":
        return _chat(sdks, st, stream=stream)
    if fmt == "openai-responses":
        return _responses(sdks, st, stream=stream)
    return _gemini(sdks, st, stream=stream)


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _anthropic(client: anthropic.Anthropic, *, stream: bool) -> tuple[dict[str, str], str, str]:
    kwargs: dict[str, Any] = {
        "model": MODELS["anthropic"],
        "max_tokens": 256,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if not stream:
        raw = client.messages.with_raw_response.create(**kwargs)
        message = raw.parse()
        text = "".join(b.text for b in message.content if b.type == "text")
        return _lower(raw.headers), text, message.model
    with client.messages.stream(**kwargs) as events:
        headers = _lower(events.response.headers)
        message = events.get_final_message()
    text = "".join(b.text for b in message.content if b.type == "text")
    return headers, text, message.model


def _chat(sdks: Sdks, st: Stack, *, stream: bool) -> tuple[dict[str, str], str, str]:
    client = sdks.openai(st)
    kwargs: dict[str, Any] = {
        "model": MODELS["openai-chat"],
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        completion = raw.parse()
        return _lower(raw.headers), completion.choices[0].message.content or "", completion.model
    with client.chat.completions.with_streaming_response.create(**kwargs, stream=True) as resp:
        headers = _lower(resp.headers)
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    models = {c.model for c in chunks}
    assert len(models) == 1, models
    return headers, text, models.pop()


def _responses(sdks: Sdks, st: Stack, *, stream: bool) -> tuple[dict[str, str], str, str]:
    client = sdks.openai(st)
    kwargs: dict[str, Any] = {"model": MODELS["openai-responses"], "input": PROMPT}
    if not stream:
        raw = client.responses.with_raw_response.create(**kwargs)
        response = raw.parse()
        return _lower(raw.headers), response.output_text, response.model
    with client.responses.with_streaming_response.create(**kwargs, stream=True) as resp:
        headers = _lower(resp.headers)
        events = list(resp.parse())
    done = [e.response for e in events if e.type == "response.completed"]
    assert len(done) == 1, [e.type for e in events]
    return headers, done[0].output_text, done[0].model


def _gemini(sdks: Sdks, st: Stack, *, stream: bool) -> tuple[dict[str, str], str, str]:
    client, options = sdks.genai(st)
    config = gtypes.GenerateContentConfig(http_options=options)
    model = MODELS["gemini"]
    if stream:
        parts = list(
            client.models.generate_content_stream(model=model, contents=PROMPT, config=config)
        )
    else:
        parts = [client.models.generate_content(model=model, contents=PROMPT, config=config)]
    first = parts[0].sdk_http_response
    assert first is not None and first.headers is not None
    versions = {p.model_version for p in parts if p.model_version}
    assert len(versions) == 1, versions
    return _lower(first.headers), "".join(p.text or "" for p in parts), versions.pop()


def _not_paused(st: Stack) -> None:
    router = st.app.gateway.router
    assert router.health.paused(["small", "big"], time.monotonic()) == set()


# --- a larger window answers ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_overflow_moves_to_the_larger_window_and_the_answer_names_it(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    st = _start(stack, fmt, answer_model="served")
    headers, text, model = _ask(sdks, st, fmt, stream=stream)
    assert text == TEXT
    assert headers["x-twserve-provider"] == "big"
    assert headers["x-twserve-model"] == "big-model"
    # answer_model: served: the parsed answer shows the model the upstream was sent.
    assert model.removeprefix("models/") == "big-model"
    # The small upstream was asked first and refused for the window; it is not blamed.
    assert len(st.mock("small").received) == 1
    _not_paused(st)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_by_default_the_answer_shows_the_requested_model(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    st = _start(stack, fmt)
    headers, text, model = _ask(sdks, st, fmt, stream=stream)
    assert (text, headers["x-twserve-model"]) == (TEXT, "big-model")
    assert model.removeprefix("models/") == MODELS[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_overflow_that_opens_the_stream_moves_on_too(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    # The small upstream answers 200 and opens its stream with the overflow as an error event
    # (the Responses API does exactly this), before any content.
    opening = MockSettings(
        script=parse_script({"error": "context-overflow", "stream_error_after": 0}), seed=3
    )
    spec = {"model_specs": {"small-model": {"context_window": 8_000}}}
    big = {"model_specs": {"big-model": {"context_window": 200_000}}}
    st = stack(
        {"small": Upstream(fmt, opening, extra=spec), "big": Upstream(fmt, ANSWER, extra=big)},
        config=_config("served"),
    )
    headers, text, model = _ask(sdks, st, fmt, stream=True)
    assert (text, headers["x-twserve-provider"], model) == (TEXT, "big", "big-model")
    assert len(st.mock("small").received) == 1
    _not_paused(st)


def test_the_request_row_records_the_overflow_and_the_skip(stack: StackFactory) -> None:
    # Three candidates: the middle one's window is no larger than the first's, so it is
    # skipped without being asked.
    def up(settings: MockSettings, model: str, window: int) -> Upstream:
        return Upstream(
            "openai-chat", settings, extra={"model_specs": {model: {"context_window": window}}}
        )

    st = stack(
        {
            "small": up(OVERFLOW, "small-model", 8_000),
            "same": up(ANSWER, "same-model", 8_000),
            "big": up(ANSWER, "big-model", 200_000),
        },
        config={
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {
                            "name": "all",
                            "to": [
                                {"provider": "small", "model": "small-model"},
                                {"provider": "same", "model": "same-model"},
                                {"provider": "big", "model": "big-model"},
                            ],
                        }
                    ],
                }
            ],
        },
    )
    reply = http(
        st.url + "/v1/chat/completions",
        body=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers=[("authorization", f"Bearer {KEY}")],
    )
    assert reply.status == 200, reply.body
    assert reply.header("x-twserve-provider") == "big"
    assert len(st.mock("same").received) == 0
    row = st.wait_rows(1)[0]
    tried = json.loads(row["routing"])["attempts"]
    assert [(a["provider"], a["outcome"], a.get("skipped")) for a in tried] == [
        ("small", "failed", None),
        ("same", "skipped", "context_window"),
        ("big", "ok", None),
    ]
    assert tried[0]["error"] == "context_overflow"


# --- none larger: the error as before, naming who refused -----------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_with_none_larger_the_client_gets_the_overflow_error(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    st = _start(stack, fmt, small_window=8_000, big_window=4_000)
    with pytest.raises(Exception) as caught:
        _ask(sdks, st, fmt, stream=False)
    error: Any = caught.value
    response = getattr(error, "response", None)
    assert response is not None, error
    assert response.status_code == 400
    assert response.headers["x-twserve-provider"] == "small"
    assert response.headers["x-twserve-model"] == "small-model"
    assert len(st.mock("big").received) == 0
    _not_paused(st)


def test_a_converted_overflow_error_names_its_upstream(stack: StackFactory) -> None:
    # An Anthropic client, an OpenAI Chat upstream: the overflow is written again in the
    # client's format, still naming the upstream that refused.
    st = stack(
        {
            "small": Upstream(
                "openai-chat",
                OVERFLOW,
                extra={"model_specs": {"small-model": {"context_window": 8_000}}},
            )
        },
        config={
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {"name": "all", "to": [{"provider": "small", "model": "small-model"}]}
                    ],
                }
            ]
        },
    )
    client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=5.0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.response.headers["x-twserve-provider"] == "small"
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


# --- the gateway's own answers name nobody --------------------------------------------------------


def test_a_local_answer_has_no_provider_header(stack: StackFactory) -> None:
    st = stack({"up": Upstream("openai-chat", ANSWER)})
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    refused = http(
        st.url + "/v1/chat/completions", body=body, headers=[("authorization", "Bearer wrong")]
    )
    assert refused.status == 401
    assert refused.header("x-twserve-provider") is None
    assert refused.header("x-twserve-model") is None
    served = http(
        st.url + "/v1/chat/completions", body=body, headers=[("authorization", f"Bearer {KEY}")]
    )
    assert served.status == 200
    assert (served.header("x-twserve-provider"), served.header("x-twserve-model")) == ("up", "m")


# --- HTTP/2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_headers_show_over_http2(stack: StackFactory, stream: bool) -> None:
    st = _start(stack, "openai-chat", answer_model="served")
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    with httpx2.Client(http1=False, http2=True, timeout=5.0) as client:
        reply = client.post(
            st.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {KEY}"},
        )
    assert reply.http_version == "HTTP/2"
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-twserve-provider"] == "big"
    assert reply.headers["x-twserve-model"] == "big-model"
    assert '"model": "big-model"' in reply.text or '"model":"big-model"' in reply.text
