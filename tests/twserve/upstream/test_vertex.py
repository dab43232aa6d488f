"""``vertex-gemini`` and ``vertex-anthropic`` upstreams through the real gateway, driven by the
official SDKs.

The upstream is the mock speaking Vertex AI: it takes only access tokens its own OAuth token
endpoint issued, and that endpoint verifies the JWT grant's signature against the public key of
a service account made here (an RSA key made with `cryptography`, written as a real
service-account key file whose ``token_uri`` is the mock). So the gateway's google-auth path —
loading the key file, signing the grant, caching the token, refreshing it — runs for real.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.twserve.conftest import (
    ERRORS,
    FORMATS,
    MODELS,
    Sdks,
    StackFactory,
    ask,
    attempts,
    mock_origin,
)
from tests.twserve.conftest import fallback as _fallback
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

TEXT = "Sunny in Paris, 21 degrees."
EMAIL = "gateway@mock-project.iam.gserviceaccount.com"
GEMINI_MODEL = "gemini-2.5-flash"
CLAUDE_MODEL = "claude-sonnet-4-5@20250929"


def _rsa_key() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


PRIVATE, PUBLIC = _rsa_key()


def _key_file(path: Path, token_uri: str, private: str = PRIVATE) -> None:
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "mock-project",
                "private_key_id": "0123456789abcdef",
                "private_key": private,
                "client_email": EMAIL,
                "client_id": "1234567890",
                "token_uri": token_uri,
            }
        )
    )


def _settings(script: dict[str, Any], **kw: Any) -> MockSettings:
    kw.setdefault("google_service_accounts", {EMAIL: PUBLIC})
    return MockSettings(script=parse_script(script), seed=7, **kw)


def _vertex(protocol: str, script: dict[str, Any], **kw: Any) -> Upstream:
    extra = {
        "key": None,
        "project": "${VERTEX_PROJECT}",
        "location": "us-east5",
        "credentials_file": "${SA_FILE}",
    }
    return Upstream(protocol, _settings(script, **kw), extra=extra)


def _config(*names: str, model: str) -> dict[str, Any]:
    config = _fallback(*names, failures_to_pause=5)
    config["aliases"] = {m: [model] for m in set(MODELS.values())}
    return config


def _start(
    stack: StackFactory,
    tmp_path: Path,
    ups: dict[str, Upstream],
    *order: str,
    model: str,
    token_mock: str = "vertex",
) -> Stack:
    key_file = tmp_path / "service-account.json"
    env = {"VERTEX_PROJECT": "mock-project", "SA_FILE": str(key_file)}
    st = stack(ups, config=_config(*(order or tuple(ups)), model=model), env=env)
    # The key file is read when the first token is needed, so it can name the mock's port.
    _key_file(key_file, mock_origin(st, token_mock) + "/token")
    return st


def _calls(st: Stack, name: str) -> list[Any]:
    return [r for r in st.mock(name).received if r.path.startswith("/v1/projects/")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_vertex_gemini(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "usage": {"input": 31, "output": 9}}
    st = _start(stack, tmp_path, {"vertex": _vertex("vertex-gemini", script)}, model=GEMINI_MODEL)
    answer = ask(sdks, st, fmt, stream=stream, tools=True)
    assert answer.tool_calls and answer.tool_calls[0][0] == "get_weather"
    assert answer.usage[2] == 9
    (seen,) = _calls(st, "vertex")
    method = "streamGenerateContent" if stream else "generateContent"
    assert seen.path == (
        "/v1/projects/mock-project/locations/us-east5/publishers/google/models/"
        f"{GEMINI_MODEL}:{method}"
    )
    assert seen.query == ("alt=sse" if stream else "")
    assert (seen.header("authorization") or "").startswith("Bearer ya29.mock-")
    assert seen.header("x-goog-api-key") is None
    assert seen.json()["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert st.mock("vertex").google_tokens.grants == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_vertex_anthropic(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "usage": {"input": 31, "output": 9}}
    up = _vertex("vertex-anthropic", script)
    st = _start(stack, tmp_path, {"vertex": up}, model=CLAUDE_MODEL)
    answer = ask(sdks, st, fmt, stream=stream, tools=True)
    assert answer.tool_calls and answer.tool_calls[0][0] == "get_weather"
    assert answer.usage[2] == 9
    (seen,) = _calls(st, "vertex")
    method = "streamRawPredict" if stream else "rawPredict"
    assert seen.path == (
        "/v1/projects/mock-project/locations/us-east5/publishers/anthropic/models/"
        f"{CLAUDE_MODEL}:{method}"
    )
    body = seen.json()
    assert body["anthropic_version"] == "vertex-2023-10-16" and "model" not in body
    assert body.get("stream", False) is stream
    assert seen.header("x-api-key") is None


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_vertex_answers_equal_first_party_answers(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "reasoning": "thinking it over"}
    for protocol, first_party, model in (
        ("vertex-gemini", "gemini", GEMINI_MODEL),
        ("vertex-anthropic", "anthropic", CLAUDE_MODEL),
    ):
        via_vertex = _start(stack, tmp_path, {"vertex": _vertex(protocol, script)}, model=model)
        got = ask(sdks, via_vertex, fmt, stream=stream, tools=True)
        direct = stack(
            {"direct": Upstream(first_party, MockSettings(script=parse_script(script), seed=7))},
            config=_config("direct", model=model),
        )
        assert got == ask(sdks, direct, fmt, stream=stream, tools=True), protocol


def test_anthropic_client_keeps_thinking_and_betas_on_vertex(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    up = _vertex("vertex-anthropic", {"text": TEXT, "reasoning": "let me see"})
    st = _start(stack, tmp_path, {"vertex": up}, model=CLAUDE_MODEL)
    client = sdks.anthropic(st)
    with client.messages.stream(
        model=MODELS["anthropic"],
        max_tokens=2048,
        messages=[{"role": "user", "content": "weather?"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    ) as events:
        message = events.get_final_message()
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking and thinking[0].thinking == "let me see" and thinking[0].signature
    (seen,) = _calls(st, "vertex")
    assert seen.header("anthropic-beta") == "interleaved-thinking-2025-05-14"
    assert seen.json()["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_token_is_cached_and_refreshed_after_it_expires(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    # Tokens lasting 2 s: every one is within google-auth's refresh threshold, so each request
    # finds its token stale and refreshes it ahead of its expiry; once it has expired, the mock
    # refuses it.
    up = _vertex("vertex-gemini", {"text": TEXT}, google_token_lifetime=2)
    st = _start(stack, tmp_path, {"vertex": up}, model=GEMINI_MODEL)
    assert ask(sdks, st, "gemini", stream=False).text == TEXT
    time.sleep(2.2)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    first, second = _calls(st, "vertex")
    assert first.header("authorization") != second.header("authorization")
    assert all(r.status == 200 for r in (first, second))
    assert st.mock("vertex").google_tokens.grants == 2
    assert st.app.gateway.upstream.tokens.refreshes == 2


def test_a_stale_token_is_refreshed_before_it_expires(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    # Tokens lasting 200 s are within google-auth's refresh threshold (225 s) from the start:
    # the second request refreshes while the first token is still valid.
    up = _vertex("vertex-gemini", {"text": TEXT}, google_token_lifetime=200)
    st = _start(stack, tmp_path, {"vertex": up}, model=GEMINI_MODEL)
    assert ask(sdks, st, "gemini", stream=True).text == TEXT
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    first, second = _calls(st, "vertex")
    old = (first.header("authorization") or "").removeprefix("Bearer ")
    assert second.header("authorization") != first.header("authorization")
    issued = st.mock("vertex").google_tokens.issued
    assert issued[old] > time.time()  # the first token had not expired
    assert st.mock("vertex").google_tokens.grants == 2


def test_a_stale_token_whose_refresh_fails_is_used_until_it_expires(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    up = _vertex("vertex-gemini", {"text": TEXT}, google_token_lifetime=200)
    st = _start(stack, tmp_path, {"vertex": up}, model=GEMINI_MODEL)
    assert ask(sdks, st, "gemini", stream=False).text == TEXT
    mock = st.mock("vertex")
    # The token endpoint no longer knows the account (its tokens stay valid).
    mock.settings = replace(mock.settings, google_service_accounts={"x@y": PUBLIC})
    assert ask(sdks, st, "gemini", stream=False).text == TEXT
    first, second = _calls(st, "vertex")
    assert first.header("authorization") == second.header("authorization")
    assert second.status == 200
    assert (mock.google_tokens.grants, mock.google_tokens.refused) == (1, 1)


def test_concurrent_first_requests_share_one_refresh(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    up = _vertex("vertex-gemini", {"text": TEXT, "head_delay": 0.05})
    st = _start(stack, tmp_path, {"vertex": up}, model=GEMINI_MODEL)
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _: ask(sdks, st, "openai-chat", stream=True), range(6)))
    assert all(a.text == TEXT for a in answers)
    assert len({r.header("authorization") for r in _calls(st, "vertex")}) == 1
    assert st.mock("vertex").google_tokens.grants == 1
    assert st.app.gateway.upstream.tokens.refreshes == 1


def test_fresh_token_is_reused(stack: StackFactory, sdks: Sdks, tmp_path: Path) -> None:
    st = _start(
        stack, tmp_path, {"vertex": _vertex("vertex-gemini", {"text": TEXT})}, model=GEMINI_MODEL
    )
    for fmt in FORMATS:
        assert ask(sdks, st, fmt, stream=True).text == TEXT
    tokens = {r.header("authorization") for r in _calls(st, "vertex")}
    assert len(tokens) == 1 and st.mock("vertex").google_tokens.grants == 1


def test_static_token_goes_as_bearer(stack: StackFactory, sdks: Sdks) -> None:
    up = Upstream(
        "vertex-gemini",
        MockSettings(script=parse_script({"text": TEXT}), vertex_tokens=frozenset({"ya29.static"})),
        extra={"key": "${VERTEX_TOKEN}", "project": "p1", "location": "global"},
    )
    st = stack(
        {"vertex": up},
        config=_config("vertex", model=GEMINI_MODEL),
        env={"VERTEX_TOKEN": "ya29.static"},
    )
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (seen,) = _calls(st, "vertex")
    assert seen.header("authorization") == "Bearer ya29.static"
    assert seen.path.startswith("/v1/projects/p1/locations/global/")


def test_a_key_the_token_endpoint_refuses_skips_the_upstream(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    other_private, _ = _rsa_key()  # signs grants the mock cannot verify
    ups = {
        "vertex": _vertex("vertex-gemini", {"text": "never"}),
        "direct": Upstream("gemini", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, tmp_path, ups, model=GEMINI_MODEL)
    _key_file(
        tmp_path / "service-account.json", mock_origin(st, "vertex") + "/token", other_private
    )
    assert ask(sdks, st, "gemini", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    skipped = attempts(row)[0]
    assert skipped["provider"] == "vertex"
    assert "gw.upstream.token_unavailable" in json.dumps(skipped)
    assert _calls(st, "vertex") == []
    assert st.mock("vertex").google_tokens.refused == 1


def test_missing_key_file_skips_the_upstream(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    ups = {
        "vertex": _vertex("vertex-anthropic", {"text": "never"}),
        "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = stack(
        ups,
        config=_config("vertex", "direct", model=CLAUDE_MODEL),
        env={"VERTEX_PROJECT": "p", "SA_FILE": str(tmp_path / "absent.json")},
    )
    assert ask(sdks, st, "openai-chat", stream=False).text == TEXT
    assert _calls(st, "vertex") == []


def test_a_wrong_static_token_is_refused_with_googles_401_and_fails_over(
    stack: StackFactory, sdks: Sdks
) -> None:
    up = Upstream(
        "vertex-gemini",
        MockSettings(script=parse_script({"text": "never"}), vertex_tokens=frozenset({"good"})),
        extra={"key": "wrong", "project": "p1"},
    )
    direct = Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT})))
    st = stack(
        {"vertex": up, "direct": direct}, config=_config("vertex", "direct", model=GEMINI_MODEL)
    )
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (refused,) = _calls(st, "vertex")
    assert refused.status == 401
    (row,) = st.wait_rows(1)
    assert attempts(row)[0]["error"] == "auth_rejected"


@pytest.mark.parametrize(
    ("protocol", "error", "kind"),
    [
        ("vertex-gemini", {"shape": "vertex-quota"}, "rate_limited"),
        ("vertex-anthropic", {"shape": "vertex-quota"}, "rate_limited"),
        ("vertex-gemini", {"status": 503}, "overloaded"),
        ("vertex-anthropic", {"status": 529}, "overloaded"),
        ("vertex-gemini", {"status": 500}, "server"),
        ("vertex-anthropic", {"status": 500}, "server"),
    ],
)
def test_vertex_errors_fail_over_to_first_party(
    stack: StackFactory,
    sdks: Sdks,
    tmp_path: Path,
    protocol: str,
    error: dict[str, Any],
    kind: str,
) -> None:
    ups = {
        "vertex": _vertex(protocol, {"error": error}),
        "direct": Upstream("openai-chat", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, tmp_path, ups, model=GEMINI_MODEL)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    tried = attempts(row)
    assert [a["provider"] for a in tried] == ["vertex", "direct"]
    assert tried[0]["error"] == kind


@pytest.mark.parametrize("fmt", ["gemini", "openai-responses"])
def test_first_party_failure_fails_over_to_vertex(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, fmt: str
) -> None:
    ups = {
        "direct": Upstream("gemini", MockSettings(script=parse_script({"error": {"status": 503}}))),
        "vertex": _vertex("vertex-gemini", {"text": TEXT}),
    }
    st = _start(stack, tmp_path, ups, "direct", "vertex", model=GEMINI_MODEL)
    for stream in (True, False):
        assert ask(sdks, st, fmt, stream=stream).text == TEXT
    assert len(_calls(st, "vertex")) == 2


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("protocol", ["vertex-gemini", "vertex-anthropic"])
def test_a_vertex_stream_cut_after_content_is_an_error_for_the_client(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, protocol: str, fmt: str
) -> None:
    up = _vertex(protocol, {"text": TEXT, "chunks": 4, "break_after": 2})
    st = _start(stack, tmp_path, {"vertex": up}, model=CLAUDE_MODEL)
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


@pytest.mark.parametrize("protocol", ["vertex-gemini", "vertex-anthropic"])
def test_cut_vertex_stream_before_content_fails_over(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, protocol: str
) -> None:
    ups = {
        "vertex": _vertex(protocol, {"text": TEXT, "break_after": 0}),
        "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
    }
    st = _start(stack, tmp_path, ups, model=CLAUDE_MODEL)
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert [a["provider"] for a in attempts(row)] == ["vertex", "direct"]


@pytest.mark.parametrize(
    ("protocol", "model", "micros"),
    [
        # claude-sonnet-4-5: 3 $/M input, 15 $/M output.
        ("vertex-anthropic", CLAUDE_MODEL, 3000 + 1500),
        # gemini-2.5-flash: 0.30 $/M input, 2.50 $/M output.
        ("vertex-gemini", GEMINI_MODEL, 300 + 250),
    ],
)
def test_vertex_rows_carry_the_models_cost(
    stack: StackFactory, sdks: Sdks, tmp_path: Path, protocol: str, model: str, micros: int
) -> None:
    script = {"text": TEXT, "usage": {"input": 1000, "output": 100}}
    st = _start(stack, tmp_path, {"vertex": _vertex(protocol, script)}, model=model)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert (row["cost_micros"], row["cost_state"]) == (micros, "known"), row


def test_token_counts_are_estimated_locally(
    stack: StackFactory, sdks: Sdks, tmp_path: Path
) -> None:
    up = _vertex("vertex-anthropic", {"text": TEXT})
    st = _start(stack, tmp_path, {"vertex": up}, model=CLAUDE_MODEL)
    raw = sdks.anthropic(st).messages.with_raw_response.count_tokens(
        model=MODELS["anthropic"], messages=[{"role": "user", "content": "How many tokens?"}]
    )
    assert raw.headers.get("x-thinkwatch-local") == "1"
    assert raw.parse().input_tokens > 0
    assert _calls(st, "vertex") == [] and st.mock("vertex").google_tokens.grants == 0
