"""Large answers through the gateway, judged by the official SDKs (docs/conversion.md).

A Responses upstream's closing events (``response.output_text.done``, ``response.output_item.done``,
``response.completed``) repeat the whole text, so a 1 MiB answer arrives as events of more than
1 MiB each. Every client format gets it whole, streamed and not; a 5 MiB answer too. An Anthropic,
Chat or Gemini upstream sending a large tool call's arguments in one event gets through the
same way. An event over the provider's ``max_answer_bytes`` ends the answer with
``gw.upstream.answer_too_large``, in the client's format.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.twserve.support.sdk_clients import SdkClients, sdk_clients
from tests.twserve.support.stack import Stack, Upstream, running_stack
from twmock.script import MockSettings, parse_script

pytestmark = pytest.mark.sdk

MIB = 1 << 20
# 1 MiB of text with non-ASCII in it (each "ü" is two bytes in UTF-8, "🌍" four).
ONE_MIB = ("Grüße aus Zürich 🌍 " * (MIB // 24 + 1))[: MIB // 2]
FIVE_MIB = "0123456789abcdef" * (5 * MIB // 16)
# A tool call whose arguments are 1.5 MiB of JSON, sent in one event.
BIG_ARGS = json.dumps({"path": "notes.txt", "content": "x" * (3 * MIB // 2)})
# Over the bound the over-bound provider sets (256 KiB), whole in its closing events.
OVER = "y" * (512 * 1024)
FORMATS = ("anthropic", "openai-chat", "openai-responses", "gemini")


def _script(text: str) -> MockSettings:
    # 64 KiB deltas: the answer arrives in a few dozen events, then the closing ones.
    return MockSettings(script=parse_script({"text": text, "chunk_size": 64 * 1024}))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {
        "resp-1mib": Upstream("openai-responses", _script(ONE_MIB), models=["big-1"]),
        "resp-5mib": Upstream("openai-responses", _script(FIVE_MIB), models=["big-5"]),
        "resp-over": Upstream(
            "openai-responses",
            _script(OVER),
            models=["big-over"],
            extra={"max_answer_bytes": 256 * 1024},
        ),
    }
    for fmt in ("anthropic", "openai-chat", "gemini"):
        script = {"tool_calls": 1, "tool_name": "write_file", "tool_arguments": BIG_ARGS}
        upstreams[f"tool-{fmt}"] = Upstream(
            fmt,
            MockSettings(script=parse_script({**script, "tool_pieces": 1})),
            models=[f"tool-{fmt}"],
        )
    data_dir: Path = tmp_path_factory.mktemp("large-answers")
    with running_stack(data_dir, upstreams) as stack:
        yield stack


@pytest.fixture(scope="module")
def clients(gateway: Stack) -> Iterator[SdkClients]:
    with sdk_clients(gateway.url, timeout=60.0) as made:
        yield made


def _text(clients: SdkClients, client: str, model: str, *, stream: bool) -> str:
    """The answer's text as the client's SDK has it."""
    if client == "anthropic":
        kwargs = {
            "model": model,
            "max_tokens": 4096,
            "messages": [{"role": "user", "content": "Write it all."}],
        }
        if stream:
            with clients.anthropic.messages.stream(**kwargs) as events:  # type: ignore[arg-type]
                message = events.get_final_message()
        else:
            message = clients.anthropic.messages.create(**kwargs)  # type: ignore[call-overload]
        assert message.stop_reason == "end_turn"
        return "".join(b.text for b in message.content if b.type == "text")
    if client == "openai-chat":
        messages = [{"role": "user", "content": "Write it all."}]
        if stream:
            chunks = clients.openai.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                stream=True,
            )
            parts, finish = [], None
            for chunk in chunks:
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
            assert finish == "stop"
            return "".join(parts)
        done = clients.openai.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
        assert done.choices[0].finish_reason == "stop"
        return done.choices[0].message.content or ""
    if client == "openai-responses":
        if stream:
            with clients.openai.responses.stream(model=model, input="Write it all.") as events:
                response = events.get_final_response()
        else:
            response = clients.openai.responses.create(model=model, input="Write it all.")
        assert response.status == "completed"
        return response.output_text
    if stream:
        pieces = clients.genai.models.generate_content_stream(model=model, contents="Write it all.")
        return "".join(piece.text or "" for piece in pieces)
    return clients.genai.models.generate_content(model=model, contents="Write it all.").text or ""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("client", FORMATS)
def test_a_one_mib_responses_answer_reaches_every_client_whole(
    clients: SdkClients, client: str, stream: bool
) -> None:
    text = _text(clients, client, "big-1", stream=stream)
    assert len(text.encode()) > MIB // 2
    assert text == ONE_MIB


@pytest.mark.parametrize("client", ["openai-chat", "openai-responses"])
def test_a_five_mib_responses_answer_streams_whole(clients: SdkClients, client: str) -> None:
    assert _text(clients, client, "big-5", stream=True) == FIVE_MIB


@pytest.mark.parametrize("upstream", ["anthropic", "openai-chat", "gemini"])
def test_a_large_tool_call_in_one_event_streams_whole(clients: SdkClients, upstream: str) -> None:
    chunks = clients.openai.chat.completions.create(
        model=f"tool-{upstream}",
        messages=[{"role": "user", "content": "Save the notes."}],
        tools=[
            {
                "type": "function",
                "function": {"name": "write_file", "parameters": {"type": "object"}},
            }
        ],
        stream=True,
    )
    arguments, finish = [], None
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                if call.function is not None:
                    arguments.append(call.function.arguments or "")
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert json.loads("".join(arguments)) == json.loads(BIG_ARGS)


def test_an_event_over_max_answer_bytes_ends_with_its_code(
    gateway: Stack, clients: SdkClients
) -> None:
    before = gateway.app.store.written
    chunks = clients.openai.chat.completions.create(
        model="big-over", messages=[{"role": "user", "content": "Write it all."}], stream=True
    )
    text: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in chunks:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
    # The deltas came through; the closing events, each holding the whole text, did not.
    assert "".join(text) == OVER
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["code"] == "gw.upstream.answer_too_large"
    assert "max_answer_bytes" in caught.value.message
    rows = gateway.wait_rows(before + 1)
    assert rows[-1]["error_code"] == "gw.upstream.answer_too_large"
