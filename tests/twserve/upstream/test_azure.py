"""``azure-openai`` upstreams (Chat Completions and Responses) through the real gateway, driven
by the official SDKs.

The upstream is the mock speaking Azure OpenAI: the deployment paths with ``api-version`` and
the v1 paths, the resource key in ``api-key`` (or an Entra ID bearer token) checked and refused
with Azure's own 401, a streamed Chat answer opening with Azure's ``prompt_filter_results``
chunk, and Azure's error shapes (429 with ``retry-after-ms``, the content filter's 400).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.twserve.conftest import ERRORS, FORMATS, MODELS, Sdks, StackFactory, ask, attempts
from tests.twserve.conftest import fallback as _fallback
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

TEXT = "Sunny in Paris, 21 degrees."
MODEL = "gpt-4o"
DEPLOYMENT = "my-gpt4o-deployment"
KEY = "azure-resource-key-0123"
VERSION = "2024-10-21"


def _settings(script: dict[str, Any], **kw: Any) -> MockSettings:
    kw.setdefault("azure_api_key", KEY)
    return MockSettings(script=parse_script(script), seed=7, **kw)


def _azure(script: dict[str, Any], *, api: str = "chat", **extra: Any) -> Upstream:
    fields: dict[str, Any] = {
        "key": "${AZURE_KEY}",
        "deployments": {MODEL: DEPLOYMENT},
        "api": api,
    }
    if api == "chat":
        fields["api_version"] = VERSION
    fields.update(extra)
    return Upstream("azure-openai", _settings(script), extra=fields)


def _config(*names: str) -> dict[str, Any]:
    config = _fallback(*names, failures_to_pause=5)
    config["aliases"] = {m: [MODEL] for m in set(MODELS.values())}
    return config


def _start(stack: StackFactory, ups: dict[str, Upstream], *order: str) -> Stack:
    return stack(ups, config=_config(*(order or tuple(ups))), env={"AZURE_KEY": KEY})


def _calls(st: Stack, name: str) -> list[Any]:
    return [r for r in st.mock(name).received if r.path.startswith("/openai/")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_azure_chat_on_its_deployment(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "usage": {"input": 31, "output": 9}}
    st = _start(stack, {"azure": _azure(script)})
    answer = ask(sdks, st, fmt, stream=stream, tools=True)
    assert answer.tool_calls and answer.tool_calls[0][0] == "get_weather"
    assert answer.usage[2] == 9
    (seen,) = _calls(st, "azure")
    assert seen.path == f"/openai/deployments/{DEPLOYMENT}/chat/completions"
    assert seen.query == f"api-version={VERSION}"
    assert seen.header("api-key") == KEY and seen.header("authorization") is None
    assert seen.json()["model"] == DEPLOYMENT
    assert seen.json()["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_azure_responses_on_the_v1_path(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "usage": {"input": 31, "output": 9}}
    st = _start(stack, {"azure": _azure(script, api="responses")})
    answer = ask(sdks, st, fmt, stream=stream, tools=True)
    assert answer.tool_calls and answer.tool_calls[0][0] == "get_weather"
    assert answer.usage[2] == 9
    (seen,) = _calls(st, "azure")
    assert seen.path == "/openai/v1/responses" and seen.query == ""
    assert seen.json()["model"] == DEPLOYMENT


def test_responses_with_an_api_version_use_the_versioned_path(
    stack: StackFactory, sdks: Sdks
) -> None:
    st = _start(stack, {"azure": _azure({"text": TEXT}, api="responses", api_version="preview")})
    assert ask(sdks, st, "openai-responses", stream=True).text == TEXT
    (seen,) = _calls(st, "azure")
    assert (seen.path, seen.query) == ("/openai/responses", "api-version=preview")


def test_chat_v1_path_when_no_api_version(stack: StackFactory, sdks: Sdks) -> None:
    up = _azure({"text": TEXT})
    del up.extra["api_version"]
    st = _start(stack, {"azure": up})
    assert ask(sdks, st, "anthropic", stream=False).text == TEXT
    (seen,) = _calls(st, "azure")
    assert seen.path == "/openai/v1/chat/completions" and seen.json()["model"] == DEPLOYMENT


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_azure_answers_equal_first_party_answers(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool, api: str
) -> None:
    """Azure's first filter-results chunk leaves nothing behind in any client's answer."""
    # The input count is given: the mock's estimate would count the deployment's longer name.
    script = {
        "text": TEXT,
        "tool_calls": 1,
        "reasoning": "thinking it over",
        "usage": {"input": 40},
    }
    got = ask(
        sdks, _start(stack, {"azure": _azure(script, api=api)}), fmt, stream=stream, tools=True
    )
    protocol = "openai-chat" if api == "chat" else "openai-responses"
    direct = stack(
        {"direct": Upstream(protocol, MockSettings(script=parse_script(script), seed=7))},
        config=_config("direct"),
    )
    assert got == ask(sdks, direct, fmt, stream=stream, tools=True)


def test_a_chat_stream_opens_with_the_prompt_filter_chunk(stack: StackFactory, sdks: Sdks) -> None:
    st = _start(stack, {"azure": _azure({"text": TEXT})})
    client = sdks.openai(st)
    chunks = list(
        client.chat.completions.create(
            model=MODELS["openai-chat"],
            messages=[{"role": "user", "content": "weather?"}],
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT


def test_entra_id_token_goes_as_bearer(stack: StackFactory, sdks: Sdks) -> None:
    up = Upstream(
        "azure-openai",
        MockSettings(script=parse_script({"text": TEXT}), azure_entra_token="eyJ.entra.token"),
        extra={"key": "${AZURE_AD_TOKEN}", "auth": "entra-id", "api_version": VERSION},
    )
    st = stack({"azure": up}, config=_config("azure"), env={"AZURE_AD_TOKEN": "eyJ.entra.token"})
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (seen,) = _calls(st, "azure")
    assert seen.header("authorization") == "Bearer eyJ.entra.token"
    assert seen.header("api-key") is None
    # No deployments table: the model is its own deployment.
    assert seen.path == f"/openai/deployments/{MODEL}/chat/completions"


def test_the_key_from_azures_own_variable(stack: StackFactory, sdks: Sdks) -> None:
    up = _azure({"text": TEXT})
    up.extra["key"] = None
    st = stack({"azure": up}, config=_config("azure"), env={"AZURE_OPENAI_API_KEY": KEY})
    assert ask(sdks, st, "gemini", stream=True).text == TEXT
    assert _calls(st, "azure")[0].header("api-key") == KEY


def test_a_wrong_key_is_refused_with_azures_401_and_fails_over(
    stack: StackFactory, sdks: Sdks
) -> None:
    ups = {
        "azure": _azure({"text": "never"}),
        "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = stack(ups, config=_config("azure", "direct"), env={"AZURE_KEY": "not-the-key"})
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (refused,) = _calls(st, "azure")
    assert refused.status == 401
    (row,) = st.wait_rows(1)
    assert attempts(row)[0]["error"] == "auth_rejected"


def test_a_missing_key_skips_the_upstream(stack: StackFactory, sdks: Sdks) -> None:
    ups = {
        "azure": _azure({"text": "never"}),
        "direct": Upstream("openai-chat", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = stack(ups, config=_config("azure", "direct"))
    assert ask(sdks, st, "openai-responses", stream=False).text == TEXT
    assert _calls(st, "azure") == []
    (row,) = st.wait_rows(1)
    assert attempts(row)[0]["provider"] == "azure"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"shape": "azure-rate-limit", "retry_after": 3}, "rate_limited"),
        ({"status": 503}, "overloaded"),
        ({"status": 500}, "server"),
    ],
)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_azure_errors_fail_over_to_first_party(
    stack: StackFactory, sdks: Sdks, api: str, error: dict[str, Any], kind: str
) -> None:
    ups = {
        "azure": _azure({"error": error}, api=api),
        "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, ups)
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    tried = attempts(row)
    assert [a["provider"] for a in tried] == ["azure", "direct"]
    assert tried[0]["error"] == kind


def test_azure_429_hint_pauses_the_upstream(stack: StackFactory, sdks: Sdks) -> None:
    ups = {
        "azure": _azure({"error": {"shape": "azure-rate-limit", "retry_after": 30}}),
        "direct": Upstream("openai-chat", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, ups)
    for _ in range(2):
        assert ask(sdks, st, "openai-chat", stream=False).text == TEXT
    # The first 429's retry-after-ms paused it: the second request went straight on.
    assert len(_calls(st, "azure")) == 1


def test_content_filter_refusal_reaches_the_client(stack: StackFactory, sdks: Sdks) -> None:
    ups = {
        "azure": _azure({"error": {"shape": "azure-content-filter"}}),
        "direct": Upstream("openai-chat", MockSettings(script=parse_script({"text": "never"}))),
    }
    st = _start(stack, ups)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdks, st, "openai-chat", stream=False)
    assert refused.value.status_code == 400
    assert "content management policy" in str(refused.value)
    assert st.mock("direct").count() == 0


def test_first_party_failure_fails_over_to_azure(stack: StackFactory, sdks: Sdks) -> None:
    ups = {
        "direct": Upstream("openai-chat", MockSettings(script=parse_script({"error": {}}))),
        "azure": _azure({"text": TEXT}),
    }
    st = _start(stack, ups, "direct", "azure")
    for fmt in ("openai-chat", "gemini"):
        for stream in (True, False):
            assert ask(sdks, st, fmt, stream=stream).text == TEXT
    assert len(_calls(st, "azure")) == 4


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "fault",
    [
        {"break_after": 2},
        {"stream_error_after": 2, "error": {"status": 500}},
    ],
    ids=["cut", "error"],
)
def test_an_azure_stream_failing_after_content_is_an_error_for_the_client(
    stack: StackFactory, sdks: Sdks, fmt: str, fault: dict[str, Any]
) -> None:
    st = _start(stack, {"azure": _azure({"text": TEXT, "chunks": 4, **fault})})
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


def test_cut_azure_stream_before_content_fails_over(stack: StackFactory, sdks: Sdks) -> None:
    ups = {
        "azure": _azure({"text": TEXT, "break_after": 0}),
        "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, ups)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert [a["provider"] for a in attempts(row)] == ["azure", "direct"]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_rows_price_the_model_not_the_deployment(stack: StackFactory, sdks: Sdks, api: str) -> None:
    script = {"text": TEXT, "usage": {"input": 1000, "output": 100}}
    st = _start(stack, {"azure": _azure(script, api=api)})
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    # gpt-4o: 2.50 $/M input, 10 $/M output.
    assert (row["cost_micros"], row["cost_state"]) == (2500 + 1000, "known"), row


def test_gemini_token_counts_to_azure_are_estimated_locally(
    stack: StackFactory, sdks: Sdks
) -> None:
    st = _start(stack, {"azure": _azure({"text": TEXT})})
    client, options = sdks.genai(st)
    counted = client.models.count_tokens(
        model=MODELS["gemini"], contents="How many tokens?", config={"http_options": options}
    )
    assert (counted.total_tokens or 0) > 0
    assert _calls(st, "azure") == []
