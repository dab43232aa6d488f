"""A Gemini upstream that blocks the prompt (no candidates, ``promptFeedback.blockReason``)
reaches every client format through its official SDK: a Gemini client as Gemini sent it, the
others as their own refusal (docs/conversion.md, "Blocked prompts")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.twserve.support.sdk_clients import SdkClients, sdk_clients
from tests.twserve.support.stack import Stack, Upstream, running_stack
from twmock.script import MockSettings, Script

MODEL = "gemini-2.5-flash"
PROMPT = [{"role": "user", "content": "something the upstream refuses"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {
        "g": Upstream("gemini", MockSettings(script=Script(finish="blocked")), models=[MODEL])
    }
    data_dir: Path = tmp_path_factory.mktemp("prompt-blocks")
    with running_stack(data_dir, upstreams) as stack:
        yield stack


@pytest.fixture(scope="module")
def clients(gateway: Stack) -> Iterator[SdkClients]:
    with sdk_clients(gateway.url) as made:
        yield made


def _last_row(gateway: Stack, count: int) -> dict[str, object]:
    return dict(gateway.wait_rows(count)[-1])


def test_a_gemini_client_gets_the_block_as_gemini_sent_it(
    gateway: Stack, clients: SdkClients
) -> None:
    rows = gateway.app.store.written
    whole = clients.genai.models.generate_content(model=MODEL, contents="something refused")
    assert not whole.candidates
    assert whole.prompt_feedback is not None
    assert whole.prompt_feedback.block_reason is not None
    assert whole.prompt_feedback.block_reason.value == "PROHIBITED_CONTENT"
    chunks = list(
        clients.genai.models.generate_content_stream(model=MODEL, contents="something refused")
    )
    assert len(chunks) == 1 and not chunks[0].candidates
    assert chunks[0].prompt_feedback is not None
    assert chunks[0].prompt_feedback.block_reason is not None
    assert chunks[0].prompt_feedback.block_reason.value == "PROHIBITED_CONTENT"
    row = _last_row(gateway, rows + 2)
    assert row["status"] == 200 and row["error_code"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_client_gets_a_refusal(
    gateway: Stack, clients: SdkClients, stream: bool
) -> None:
    if stream:
        with clients.anthropic.messages.stream(
            model=MODEL, max_tokens=64, messages=PROMPT
        ) as events:
            message = events.get_final_message()
    else:
        message = clients.anthropic.messages.create(model=MODEL, max_tokens=64, messages=PROMPT)
    assert message.stop_reason == "refusal"
    assert not [b for b in message.content if b.type == "text" and b.text]


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_client_gets_content_filter(
    gateway: Stack, clients: SdkClients, stream: bool
) -> None:
    if stream:
        chunks = list(
            clients.openai.chat.completions.create(model=MODEL, messages=PROMPT, stream=True)
        )
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "content_filter"
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = clients.openai.chat.completions.create(model=MODEL, messages=PROMPT)
        assert reply.choices[0].finish_reason == "content_filter"
        assert not reply.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_client_gets_an_incomplete_content_filter_response(
    gateway: Stack, clients: SdkClients, stream: bool
) -> None:
    if stream:
        # The SDK's helper returns only a `response.completed` one; the API (and the gateway)
        # ends an incomplete response with `response.incomplete`.
        events = list(
            clients.openai.responses.create(model=MODEL, input="something refused", stream=True)
        )
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = clients.openai.responses.create(model=MODEL, input="something refused")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "content_filter"
    assert not response.output_text
