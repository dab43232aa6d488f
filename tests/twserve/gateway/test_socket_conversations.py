"""A client Responses socket's conversation when some upstream has its own socket and another
has none (twserve/gateway/conversations.py, twserve/relay/reader.py; docs/conversion.md,
"Responses state").

Driven by the official openai SDK's ``responses.connect()`` through the real gateway. Upstream
``a`` is a mock OpenAI Responses upstream taking turns over its own socket
(``responses_transport: websocket``), which holds a ``previous_response_id`` only as the API
does (the response that socket completed); ``b`` is a mock upstream without a socket: an
Anthropic one refuses a ``tool_result`` without its ``tool_use`` with the API's 400, an HTTP
Responses one knows none of the gateway's ids. Each attempt decides, after routing, which form
of the turn it sends: the bare turn to the socket that holds the response it continues, the
history the gateway kept to any other.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import openai
import pytest

from tests.twserve.conftest import KEY, MODELS, StackFactory, attempts, fallback
from tests.twserve.support.responses_socket import TOOL_SCRIPT, WEATHER, socket_turn
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

pytestmark = [pytest.mark.anyio, pytest.mark.sdk]

MODEL = MODELS["openai-responses"]
OTHER = "claude-e2e-1"  # routed to `b` by its name
WS = {"responses_transport": "websocket"}
QUESTION = {"role": "user", "content": "Wie ist das Wetter in Oslo? 🌨️"}
RESULT = "-3 °C, Schnee ❄️"
TEXT = "In Oslo schneit es bei -3 °C ☃️"
LATER = "Und morgen? 🌤️"


def _up(fmt: str, script: dict[str, Any], **extra: Any) -> Upstream:
    return Upstream(fmt, MockSettings(script=parse_script(script), seed=7), extra=extra)


def _by_model() -> dict[str, Any]:
    """`OTHER` goes to `b`, every other model to `a`."""
    rules = [
        {"name": "other", "when": {"model": "claude-*"}, "to": "b"},
        {"name": "all", "to": "a"},
    ]
    return {"routes": [{"name": "default", "rules": rules}], "failover": {"wait_secs": 1}}


def _by_model_stack(stack: StackFactory) -> Stack:
    """`a`, a socket upstream that calls the tool, and `b`, an Anthropic one, routed by model."""
    upstreams = {
        "a": _up("openai-responses", TOOL_SCRIPT, **WS),
        "b": _up("anthropic", {"text": TEXT}),
    }
    return stack(upstreams, config=_by_model())


def _script(st: Stack, name: str, script: dict[str, Any]) -> None:
    mock = st.mock(name)
    mock.settings = replace(mock.settings, script=parse_script(script))


def _client(st: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


async def _turn(conn: Any, **fields: Any) -> list[Any]:
    return await socket_turn(conn, {"model": MODEL, "tools": WEATHER, **fields})


def _completed(events: list[Any]) -> Any:
    assert events[-1].type == "response.completed", events[-1]
    return events[-1].response


def _output(response: Any) -> dict[str, Any]:
    (call,) = [o for o in response.output if o.type == "function_call"]
    return {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}


async def _tool_round(st: Stack, conn: Any) -> tuple[Any, dict[str, Any], Any]:
    """The question, answered by `a` with a tool call, then the tool's result, which `a`
    answers with `TEXT`: the first response, the result item, the second response."""
    first = _completed(await _turn(conn, input=[QUESTION]))
    output = _output(first)
    _script(st, "a", {"text": TEXT})
    second = _completed(await _turn(conn, input=[output], previous_response_id=first.id))
    assert second.output_text == TEXT
    return first, output, second


def _sent(st: Stack, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(st.mock(name).received[-1].body)
    return body


def _anthropic_round(body: dict[str, Any], call_id: str) -> None:
    """`body` (to Anthropic) carries the whole tool round: the question, the ``tool_use``,
    then its ``tool_result``."""
    roles = [m["role"] for m in body["messages"]]
    assert roles[:3] == ["user", "assistant", "user"]
    (use,) = [c for c in body["messages"][1]["content"] if c["type"] == "tool_use"]
    (result,) = [c for c in body["messages"][2]["content"] if c["type"] == "tool_result"]
    assert use["id"] == result["tool_use_id"] == call_id
    assert use["name"] == "weather" and use["input"] == {"city": "Oslo"}
    assert "Oslo" in json.dumps(body["messages"][0], ensure_ascii=False)
    assert RESULT in json.dumps(result, ensure_ascii=False)


async def test_a_tool_round_routed_away_from_the_socket_gets_the_history(
    stack: StackFactory,
) -> None:
    st = _by_model_stack(stack)
    async with _client(st).responses.connect() as conn:
        first = _completed(await _turn(conn, input=[QUESTION]))
        output = _output(first)
        # The tool's result goes to the Anthropic upstream: it needs the tool_use before it.
        second = _completed(
            await _turn(conn, model=OTHER, input=[output], previous_response_id=first.id)
        )
        assert second.output_text == TEXT
        # And back to the socket upstream, which never saw the second turn: the history again.
        _script(st, "a", {"text": TEXT})
        third = _completed(await _turn(conn, input=LATER, previous_response_id=second.id))
        assert third.output_text == TEXT
    _anthropic_round(_sent(st, "b"), output["call_id"])
    back = _sent(st, "a")
    assert "previous_response_id" not in back
    kinds = [item.get("type", "message") for item in back["input"]]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
    assert (back["input"][-1]["role"], back["input"][-1]["content"]) == ("user", LATER)
    assert st.mock("a").sockets.turns == [2]  # both of a's turns on its one socket
    rows = st.wait_rows(3)
    assert [(r["status"], r["provider"]) for r in rows] == [(200, "a"), (200, "b"), (200, "a")]


async def test_the_socket_upstream_gets_the_bare_turn(stack: StackFactory) -> None:
    st = _by_model_stack(stack)
    async with _client(st).responses.connect() as conn:
        first, output, second = await _tool_round(st, conn)
        # The kept conversation holds a's turns too: the next turn may go to b.
        third = _completed(
            await _turn(conn, model=OTHER, input=LATER, previous_response_id=second.id)
        )
        assert third.output_text == TEXT
    sent = [json.loads(r.body) for r in st.mock("a").received]
    assert sent[-1]["previous_response_id"] == first.id
    assert sent[-1]["input"] == [output]
    assert len(st.mock("b").received) == 1
    body = json.loads(st.mock("b").received[-1].body)
    _anthropic_round(body, output["call_id"])
    assert [m["role"] for m in body["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert TEXT in json.dumps(body["messages"][3], ensure_ascii=False)


@pytest.mark.parametrize("fmt", ["anthropic", "openai-responses"])
async def test_a_turn_failed_over_from_the_socket_gets_the_history(
    stack: StackFactory, fmt: str
) -> None:
    st = stack(
        {"a": _up("openai-responses", TOOL_SCRIPT, **WS), "b": _up(fmt, {"text": TEXT})},
        config=fallback("a", "b"),
    )
    async with _client(st).responses.connect() as conn:
        first = _completed(await _turn(conn, input=[QUESTION]))
        output = _output(first)
        # The socket upstream refuses the continuation before any content: b answers it.
        _script(st, "a", {"error": 503})
        second = _completed(await _turn(conn, input=[output], previous_response_id=first.id))
        assert second.output_text == TEXT
    # a was sent the bare turn (its socket holds the first response); b the whole round.
    refused = _sent(st, "a")
    assert refused["previous_response_id"] == first.id and refused["input"] == [output]
    sent = _sent(st, "b")
    if fmt == "anthropic":
        _anthropic_round(sent, output["call_id"])
    else:
        assert "previous_response_id" not in sent
        kinds = [item.get("type", "message") for item in sent["input"]]
        assert kinds == ["message", "function_call", "function_call_output"]
        assert sent["input"][2] == output
    row = st.wait_rows(2)[1]
    assert (row["status"], row["provider"]) == (200, "b")
    failed, ok = attempts(row)[:2]
    assert (failed["provider"], failed["outcome"], failed["transport"]) == (
        "a",
        "failed",
        "websocket",
    )
    assert ok["provider"] == "b" and "transport" not in ok


async def test_a_socket_opened_anew_gets_the_history(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", TOOL_SCRIPT, **WS)}, config=fallback("a"))
    # The upstream ends its socket after each response: the next socket holds nothing.
    st.mock("a").sockets.close_after_turn = 1001
    async with _client(st).responses.connect() as conn:
        await _tool_round(st, conn)
    assert st.mock("a").sockets.turns == [1, 1]
    sent = _sent(st, "a")
    assert "previous_response_id" not in sent
    assert [item.get("type", "message") for item in sent["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]


async def test_warm_up_turns_follow_the_routed_upstream(stack: StackFactory) -> None:
    st = stack(
        {
            "a": _up("openai-responses", {"text": TEXT}, **WS),
            "b": _up("anthropic", {"text": TEXT}),
        },
        config=_by_model(),
    )
    async with _client(st).responses.connect() as conn:
        # Routed to b, which has no socket: answered here, without an upstream call.
        here = await _turn(conn, model=OTHER, input=[QUESTION], generate=False, store=False)
        assert [e.type for e in here] == ["response.created", "response.completed"]
        assert here[-1].response.output == []
        assert len(st.mock("b").received) == 0
        after = _completed(
            await _turn(conn, model=OTHER, input=LATER, previous_response_id=here[-1].response.id)
        )
        # Routed to a: passed on over its socket, which holds what it answered.
        there = _completed(await _turn(conn, input=[QUESTION], generate=False, store=False))
        on = _completed(await _turn(conn, input=LATER, previous_response_id=there.id))
    assert after.output_text == on.output_text == TEXT
    to_b = json.loads(st.mock("b").received[-1].body)
    # The warm-up's input, kept here, then the turn's (one user turn, as Anthropic merges them).
    (message,) = to_b["messages"]
    assert message["role"] == "user"
    assert [c["text"] for c in message["content"]] == [QUESTION["content"], LATER]
    warm, then = [json.loads(r.body) for r in st.mock("a").received]
    assert warm["generate"] is False
    assert then["previous_response_id"] == there.id and then["input"] == LATER
    rows = st.wait_rows(4)
    assert [bool(r["local"]) for r in rows] == [True, False, False, False]


async def test_a_kept_socket_found_closed_gets_the_history_on_the_new_one(
    stack: StackFactory,
) -> None:
    st = stack({"a": _up("openai-responses", TOOL_SCRIPT, **WS)}, config=fallback("a"))
    async with _client(st).responses.connect() as conn:
        first = _completed(await _turn(conn, input=[QUESTION]))
        output = _output(first)
        # The kept socket held the first response, but the upstream closed it while idle: the
        # continuation, built as sent for it, goes whole on the new socket, which holds nothing.
        st.mock("a").sockets.close_before_next_turn = 1001
        _script(st, "a", {"text": TEXT})
        second = _completed(await _turn(conn, input=[output], previous_response_id=first.id))
        assert second.output_text == TEXT
    assert st.mock("a").sockets.turns == [1, 1]
    sent = _sent(st, "a")
    assert "previous_response_id" not in sent
    kinds = [item.get("type", "message") for item in sent["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
