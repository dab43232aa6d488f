"""Stateful Responses conversations (twserve/gateway/conversations.py) through the real gateway,
driven by the official openai SDK: ``previous_response_id`` chains over HTTP (``store`` true)
and over the Responses WebSocket, to upstreams of every format; the API's own 400 for an id not
found (unknown, another key's, expired, not stored); two gateways on one PostgreSQL finding each
other's responses. The mock Anthropic upstream refuses a ``tool_result`` without its
``tool_use`` with the real API's 400, so a chain that lost its history fails there.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai
import pytest

from tests.support.servers import PostgresServer
from tests.twserve.conftest import KEY, MODELS, StackFactory, fallback
from tests.twserve.store.test_store_pg import new_database
from tests.twserve.support.responses_socket import TOOL_SCRIPT, WEATHER, socket_turn
from tests.twserve.support.stack import Upstream, running_stack
from twmock.script import MockSettings, parse_script

pytestmark = [pytest.mark.anyio, pytest.mark.sdk]

FORMATS = ("anthropic", "openai-chat", "openai-responses", "gemini")
MODEL = MODELS["openai-responses"]
OTHER_KEY = "other-test-key"
QUESTION = "Wie ist das Wetter in Oslo? 🌨️"
RESULT = "-3 °C, Schnee ❄️"
TEXT = "In Oslo schneit es bei -3 °C ☃️"
THANKS = "Danke! Und morgen?"


def _up(fmt: str, script: dict[str, Any], **extra: Any) -> Upstream:
    return Upstream(fmt, MockSettings(script=parse_script(script), seed=3), extra=extra)


def _config(*names: str, **retention: Any) -> dict[str, Any]:
    return {
        **fallback(*names),
        "clients": [{"name": "tester", "key": KEY}, {"name": "other", "key": OTHER_KEY}],
        "retention": retention,
    }


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)


def _script(st: Any, name: str, script: dict[str, Any]) -> None:
    mock = st.mock(name)
    mock.settings = replace(mock.settings, script=parse_script(script))


def _ask(client: openai.OpenAI, stream: bool, **fields: Any) -> Any:
    """One Responses request; the completed response (streamed: from its closing event)."""
    if not stream:
        return client.responses.create(model=MODEL, tools=WEATHER, **fields)
    with client.responses.stream(model=MODEL, tools=WEATHER, **fields) as events:
        for _ in events:
            pass
        return events.get_final_response()


def _text_of(body: bytes) -> str:
    """A request body as text, escapes undone."""
    return json.dumps(json.loads(body), ensure_ascii=False)


def _not_found(exc: openai.BadRequestError, response_id: str) -> None:
    assert exc.status_code == 400
    assert exc.body == {
        "message": f"Previous response with id '{response_id}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }


# --- HTTP chains, store: true ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_three_turn_chain_with_a_tool_round(
    stack: StackFactory, fmt: str, stream: bool
) -> None:
    st = stack({"a": _up(fmt, TOOL_SCRIPT)}, config=_config("a"))
    client = _client(st.url)

    def chain() -> tuple[Any, Any, Any]:
        first = _ask(client, stream, input=QUESTION)
        (call,) = [o for o in first.output if o.type == "function_call"]
        _script(st, "a", {"text": TEXT})
        second = _ask(
            client,
            stream,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}],
        )
        third = _ask(client, stream, previous_response_id=second.id, input=THANKS)
        return first, second, third

    with client:
        _, second, third = await anyio.to_thread.run_sync(chain)
    assert second.output_text == TEXT and third.output_text == TEXT
    received = st.mock("a").received
    assert len(received) == 3
    second_sent = json.loads(received[1].body)
    # The whole history went out: the question, the call and its result (Anthropic's mock
    # refuses a lone tool_result), then the answer and the new question.
    for needle in (QUESTION, RESULT):
        assert needle in _text_of(received[1].body)
    for needle in (QUESTION, RESULT, TEXT, THANKS):
        assert needle in _text_of(received[2].body), needle
    assert "previous_response_id" not in second_sent  # the upstream does not know our ids
    if fmt == "anthropic":
        roles = [m["role"] for m in second_sent["messages"]]
        assert roles == ["user", "assistant", "user"]
        assert second_sent["messages"][1]["content"][-1]["type"] == "tool_use"
        assert second_sent["messages"][2]["content"][0]["type"] == "tool_result"
    if fmt == "openai-responses":
        kinds = [i.get("type", "message") for i in second_sent["input"]]
        assert kinds == ["message", "function_call", "function_call_output"]
    rows = st.wait_rows(3)
    assert [r["status"] for r in rows] == [200, 200, 200]


async def test_a_lone_tool_result_gets_anthropics_own_400(stack: StackFactory) -> None:
    """What the chain above would get without the expansion: the mock enforces the API's rule."""
    st = stack({"a": _up("anthropic", {"text": TEXT})}, config=_config("a"))
    client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=10)
    message = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_01abc", "content": RESULT}],
    }

    def ask() -> None:
        client.messages.create(model=MODELS["anthropic"], max_tokens=64, messages=[message])

    with client, pytest.raises(anthropic.BadRequestError) as refused:
        await anyio.to_thread.run_sync(ask)
    assert refused.value.status_code == 400
    assert (
        "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: "
        "toolu_01abc. Each `tool_result` block must have a corresponding `tool_use` block in "
        "the previous message." in str(refused.value)
    )


async def test_unknown_other_keys_and_unstored_ids_are_not_found(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-chat", {"text": TEXT})}, config=_config("a"))
    mine, other = _client(st.url), _client(st.url, OTHER_KEY)

    def run() -> tuple[Any, Any]:
        kept = mine.responses.create(model=MODEL, input=QUESTION)
        unstored = mine.responses.create(model=MODEL, input=QUESTION, store=False)
        return kept, unstored

    with mine, other:
        kept, unstored = await anyio.to_thread.run_sync(run)
        for client, response_id in (
            (mine, "resp_never_made"),
            (other, kept.id),  # a key never reads another key's response
            (mine, unstored.id),  # store: false keeps nothing
        ):
            ask = partial(
                client.responses.create, model=MODEL, input=THANKS, previous_response_id=response_id
            )
            with pytest.raises(openai.BadRequestError) as refused:
                await anyio.to_thread.run_sync(ask)
            _not_found(refused.value, response_id)
        again = await anyio.to_thread.run_sync(
            lambda: mine.responses.create(model=MODEL, input=THANKS, previous_response_id=kept.id)
        )
    assert again.output_text == TEXT
    assert len(st.mock("a").received) == 3  # the refused ones never reached the upstream
    rows = st.wait_rows(6)
    assert sorted(r["error_code"] or "" for r in rows).count("gw.responses.previous_not_found") == 3


async def test_a_response_expires(stack: StackFactory) -> None:
    st = stack({"a": _up("gemini", {"text": TEXT})}, config=_config("a", responses_secs=1))
    client = _client(st.url)
    with client:
        kept = await anyio.to_thread.run_sync(
            lambda: client.responses.create(model=MODEL, input=QUESTION)
        )
        await anyio.sleep(1.2)
        with pytest.raises(openai.BadRequestError) as refused:
            await anyio.to_thread.run_sync(
                lambda: client.responses.create(
                    model=MODEL, input=THANKS, previous_response_id=kept.id
                )
            )
    _not_found(refused.value, kept.id)
    # The hourly clean-up deletes the expired record from the store's file.
    db_path = st.data_dir / "requests.sqlite3"
    assert _responses_kept(db_path) == 1
    await anyio.to_thread.run_sync(st.portal.call, st.app.maintenance.prune)
    assert _responses_kept(db_path) == 0


def _responses_kept(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])


async def test_per_key_count_cap_drops_the_oldest(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-chat", {"text": TEXT})}, config=_config("a", responses_per_key=2))
    client = _client(st.url)
    with client:
        made = [
            await anyio.to_thread.run_sync(
                lambda: client.responses.create(model=MODEL, input=QUESTION)
            )
            for _ in range(3)
        ]
        with pytest.raises(openai.BadRequestError) as refused:
            await anyio.to_thread.run_sync(
                lambda: client.responses.create(
                    model=MODEL, input=THANKS, previous_response_id=made[0].id
                )
            )
        newest = await anyio.to_thread.run_sync(
            lambda: client.responses.create(
                model=MODEL, input=THANKS, previous_response_id=made[2].id
            )
        )
    _not_found(refused.value, made[0].id)
    assert newest.output_text == TEXT


# --- the Responses WebSocket -------------------------------------------------------------------


async def _turn(conn: Any, **fields: Any) -> list[Any]:
    return await socket_turn(conn, {"model": MODEL, **fields})


@pytest.mark.parametrize("fmt", ["anthropic", "openai-responses"])
async def test_socket_turns_chain_after_a_warm_up(stack: StackFactory, fmt: str) -> None:
    st = stack({"a": _up(fmt, TOOL_SCRIPT)}, config=_config("a"))
    client = openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    question = [{"role": "user", "content": QUESTION}]
    async with client.responses.connect() as conn:
        # Codex's warm-up: no upstream has a socket, so it is answered here.
        warm = await _turn(conn, input=question, tools=WEATHER, generate=False, store=False)
        assert [e.type for e in warm] == ["response.created", "response.completed"]
        assert warm[-1].response.output == []
        assert len(st.mock("a").received) == 0
        first = await _turn(
            conn, input=[], tools=WEATHER, previous_response_id=warm[-1].response.id, store=False
        )
        (call,) = [o for o in first[-1].response.output if o.type == "function_call"]
        _script(st, "a", {"text": TEXT})
        output = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
        second = await _turn(
            conn,
            input=[output],
            tools=WEATHER,
            previous_response_id=first[-1].response.id,
            store=False,
        )
        assert second[-1].type == "response.completed", second[-1]
        assert second[-1].response.output_text == TEXT
        missing = await _turn(conn, input="x", previous_response_id="resp_elsewhere", store=False)
    assert missing[-1].type in ("error", "response.failed")
    assert "Previous response with id 'resp_elsewhere' not found." in str(missing[-1])
    received = st.mock("a").received
    assert len(received) == 2
    assert QUESTION in _text_of(received[0].body)
    assert QUESTION in _text_of(received[1].body) and RESULT in _text_of(received[1].body)


# --- two instances, one PostgreSQL -------------------------------------------------------------


def test_two_instances_on_postgres_share_responses(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    dsn = new_database(postgres_server)
    config = {**_config("a"), "store": {"postgres_dsn": dsn}}
    up = {"a": _up("anthropic", TOOL_SCRIPT)}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with (
        running_stack(tmp_path / "one", up, config=config) as one,
        running_stack(
            tmp_path / "two", {"a": _up("anthropic", {"text": TEXT})}, config=config
        ) as two,
    ):
        with _client(one.url) as first_client, _client(two.url) as second_client:
            first = first_client.responses.create(model=MODEL, input=QUESTION, tools=WEATHER)
            (call,) = [o for o in first.output if o.type == "function_call"]
            deadline = time.monotonic() + 5
            second = second_client.responses.create(
                model=MODEL,
                tools=WEATHER,
                previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}],
            )
            assert time.monotonic() < deadline
        assert second.output_text == TEXT
        sent = json.loads(two.mock("a").received[0].body)
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
