"""Each attempt's upstream request, and the rewrites a resend makes: pure, no event loop."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.twproto.stream.test_resume import anthropic_stream
from twengine import AttemptRequests, Destination, ResendReason
from twengine.attempt import requests as requests_module
from twproto import (
    ClientCall,
    Dialect,
    FirstContent,
    Operation,
    UpstreamTarget,
    json_dumps,
    json_loads,
)
from twproto import translate as translate_module
from twproto.ir import ReasoningLevel
from twproto.stream import ResumableStream

CLAUDE = {
    "model": "claude",
    "max_tokens": 32000,
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "xhigh"},
    "messages": [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "c2VhbGVk"},
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": "and now?"},
    ],
}
# Spaced as a client writes it: a same-format upstream gets these very bytes.
CLAUDE_BYTES = json_dumps(CLAUDE).replace(b'":', b'": ')


def call(dialect: Dialect = Dialect.ANTHROPIC, *, stream: bool = False) -> ClientCall:
    return ClientCall(dialect=dialect, operation=Operation.GENERATE, stream=stream)


def dest(
    name: str = "a",
    dialect: Dialect = Dialect.ANTHROPIC,
    model: str = "claude",
    **extra: Any,
) -> Destination:
    target = UpstreamTarget(dialect=dialect, base_url="http://up.test", key="k", model=model)
    return Destination(name=name, target=target, **extra)


def sent(requests: AttemptRequests, to: Destination, **kw: Any) -> dict[str, Any]:
    request, _ = requests.build(to, now=1_700_000_000.0, **kw)
    body = json_loads(request.body)
    assert isinstance(body, dict)
    return body


def test_a_same_format_request_goes_out_byte_for_byte() -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=json_loads(CLAUDE_BYTES))
    request, opening = requests.build(dest(), now=0.0)
    assert request.body == CLAUDE_BYTES
    assert opening is None  # a whole answer: no stream opening


def test_the_parsed_body_is_translated_for_every_upstream_and_never_changed() -> None:
    # The dict admission parsed is what a conversion reads: the bytes are not parsed again (the
    # dict says "parsed", the bytes "bytes": only the dict's text reaches the converted body).
    parsed = copy.deepcopy(CLAUDE)
    parsed["messages"][0]["content"] = "parsed"
    kept = copy.deepcopy(parsed)
    requests = AttemptRequests(
        call(), CLAUDE_BYTES.replace(b'"hi"', b'"bytes"'), "claude", parsed=parsed
    )
    for name, dialect in [
        ("chat", Dialect.OPENAI_CHAT),
        ("resp", Dialect.OPENAI_RESPONSES),
        ("gem", Dialect.GEMINI),
    ]:
        body = sent(requests, dest(name, dialect, "up-model"))
        assert "parsed" in json_dumps(body).decode() and "bytes" not in json_dumps(body).decode()
    assert parsed == kept  # one dict, read by every upstream's translation
    # The same format still goes out as the client's own bytes.
    assert requests.build(dest(), now=0.0)[0].body == CLAUDE_BYTES.replace(b'"hi"', b'"bytes"')


def test_without_a_parsed_body_the_bytes_are_parsed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses: list[bytes] = []

    def counted(data: bytes) -> Any:
        parses.append(data)
        return json_loads(data)

    monkeypatch.setattr(requests_module, "json_loads", counted)
    monkeypatch.setattr(translate_module._json, "loads", counted)
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude")
    a = dest()
    assert requests.rewrite(a, ResendReason.EFFORT_REFUSED, "Supported levels: high") == "high"
    for name, dialect in [("chat", Dialect.OPENAI_CHAT), ("resp", Dialect.OPENAI_RESPONSES)]:
        sent(requests, dest(name, dialect, "gpt"))
    sent(requests, a)
    assert parses == [CLAUDE_BYTES]  # the asked effort and three translations: one parse


def test_each_upstream_is_translated_once_until_a_rewrite() -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    chat = dest("chat", Dialect.OPENAI_CHAT, "gpt")
    sent(requests, chat)
    first = requests.translated["chat"]
    sent(requests, chat)
    assert requests.translated["chat"] is first
    requests.rewrite(chat, ResendReason.SEALED_REASONING, "")
    sent(requests, chat)
    assert requests.translated["chat"] is not first


def test_an_effort_refusal_resends_the_nearest_accepted_level() -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    a = dest()
    assert sent(requests, a)["output_config"] == {"effort": "xhigh"}
    refusal = "does not support effort level 'xhigh'. Supported levels: high, low, max, medium"
    assert requests.rewrite(a, ResendReason.EFFORT_REFUSED, refusal) == "high"
    again = sent(requests, a)
    assert again["output_config"] == {"effort": "high"}
    assert again["thinking"] == {"type": "adaptive"}


def test_an_effort_refusal_naming_no_level_resends_without_one() -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    a = dest()
    assert requests.rewrite(a, ResendReason.EFFORT_REFUSED, "effort is not supported") == "off"
    assert "effort" not in sent(requests, a).get("output_config", {})


def test_the_rules_level_is_the_one_asked_when_a_rule_sets_it() -> None:
    # The refused level is the rule's (high), so the nearest accepted is medium, not xhigh's.
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    ruled = dest(reasoning=ReasoningLevel.HIGH)
    assert sent(requests, ruled)["output_config"] == {"effort": "high"}
    refusal = "Supported levels: low, medium, max"
    assert requests.rewrite(ruled, ResendReason.EFFORT_REFUSED, refusal) == "medium"
    assert sent(requests, ruled)["output_config"] == {"effort": "medium"}


def test_the_levels_resent_are_kept_per_upstream_for_the_row_and_the_memory() -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    a, b, c = dest("a"), dest("b"), dest("c")
    requests.rewrite(a, ResendReason.EFFORT_REFUSED, "Supported levels: high, low")
    requests.rewrite(b, ResendReason.EFFORT_REFUSED, "effort is not supported")
    requests.rewrite(c, ResendReason.SEALED_REASONING, "invalid signature")
    # Only effort refusals resend a level; "off" is a resend without one.
    assert requests.resent_levels() == {"a": "high", "b": "off"}


@pytest.mark.parametrize("how", ["refused", "remembered"])
def test_sealed_reasoning_is_left_out_after_a_refusal_or_up_front(how: str) -> None:
    requests = AttemptRequests(call(), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    a = dest(drop_sealed=how == "remembered")
    if how == "refused":
        assert requests.rewrite(a, ResendReason.SEALED_REASONING, "invalid signature") is None
    body = sent(requests, a)
    kinds = [part["type"] for part in body["messages"][1]["content"]]
    assert kinds == ["text"]
    assert requests.dropped == ("reasoning:sealed_for_account",)


def test_a_refused_prefill_continues_with_an_instruction_instead() -> None:
    answer = ResumableStream(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="claude")
    answer.feed(anthropic_stream(["The quick br"], end=False))
    requests = AttemptRequests(call(stream=True), CLAUDE_BYTES, "claude", parsed=dict(CLAUDE))
    a = dest()
    prefilled = sent(requests, a, continuing=answer)["messages"]
    said = {"role": "assistant", "content": [{"type": "text", "text": "The quick br"}]}
    assert prefilled[-1] == said
    requests.rewrite(a, ResendReason.PREFILL_REFUSED, "")
    instructed = sent(requests, a, continuing=answer)["messages"]
    assert instructed[-2] == said
    assert instructed[-1]["role"] == "user"


@pytest.mark.parametrize("served", [False, True])
def test_a_stream_opening_reads_the_upstream_and_writes_the_client(served: bool) -> None:
    chat = {"model": "gpt", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    requests = AttemptRequests(
        call(Dialect.OPENAI_CHAT, stream=True), json_dumps(chat), "gpt", parsed=chat
    )
    to = dest("a", Dialect.ANTHROPIC, "claude-up", show_served=served)
    request, opening = requests.build(to, now=1_700_000_000.9)
    assert opening is not None and request.sse
    assert json_loads(request.body)["stream"] is True
    # The opening reads Anthropic's events and writes Chat chunks, with the model the answer
    # shows and, as `created`, the wall clock handed in.
    released = opening.feed(anthropic_stream(["Hello"], end=False), now=0.0)
    assert isinstance(released, FirstContent)
    first = json_loads(released.data.split(b"\n\n")[0].removeprefix(b"data: "))
    assert first["created"] == 1_700_000_000
    assert first["model"] == ("claude-up" if served else "gpt")


@pytest.mark.parametrize("client", [Dialect.ANTHROPIC, Dialect.OPENAI_RESPONSES])
def test_a_responses_socket_leg_builds_its_event_without_parsing_the_body(
    monkeypatch: pytest.MonkeyPatch, client: Dialect
) -> None:
    from twproto.sockets import responses as sockets_module
    from twproto.sockets import ws_upstream_create

    body = (
        CLAUDE
        if client is Dialect.ANTHROPIC
        else {"model": "gpt", "input": "hi", "stream": True, "store": False}
    )
    raw = json_dumps(body)
    requests = AttemptRequests(call(client, stream=True), raw, "gpt", parsed=json_loads(raw))
    request, _ = requests.build(dest("resp", Dialect.OPENAI_RESPONSES, "up-gpt"), now=0.0)
    parses: list[object] = []
    monkeypatch.setattr(sockets_module, "loads", lambda data: parses.append(data))
    event = ws_upstream_create(request.url, request.body, request.fields)
    assert event is not None and parses == []
    created = json_loads(event)
    assert created["type"] == "response.create" and created["model"] == "up-gpt"
    assert "stream" not in created


def test_a_turn_as_sent_and_its_expansion_are_each_written_and_kept() -> None:
    from twengine.attempt import TurnAsSent

    output = {"type": "function_call_output", "call_id": "call_1", "output": "-3 °C"}
    bare = {"model": "gpt", "input": [output], "previous_response_id": "resp_1", "stream": True}
    history = [
        {"type": "message", "role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
    ]
    expanded = {"model": "gpt", "input": [*history, output], "stream": True}
    raw = json_dumps(expanded)
    requests = AttemptRequests(
        call(Dialect.OPENAI_RESPONSES, stream=True), raw, "gpt", parsed=json_loads(raw)
    )
    as_sent = TurnAsSent(body=json_dumps(bare), parsed=bare, previous="resp_1")
    to = dest("socket", Dialect.OPENAI_RESPONSES, "up-gpt")
    for _ in range(2):  # each form from its own kept translation, in either order
        written = sent(requests, to, as_sent=as_sent)
        assert written["previous_response_id"] == "resp_1" and written["input"] == [output]
        assert written["model"] == "up-gpt"
        whole = sent(requests, to)
        assert "previous_response_id" not in whole and whole["input"] == [*history, output]
