"""A request's body is parsed once, however many upstreams and resends it takes.

Admission parses it (`twengine.admission.admit`); every upstream's translation, the level a
refused effort is resent with and the reasoning memories read that dict. A Responses WebSocket
turn is parsed where its message is read, and not again. The parsers the gateway reaches are
wrapped to count what they are handed that carries the request's marker text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpcore
import pytest
import websockets

from tests.twserve.conftest import KEY, MODELS, fallback
from tests.twserve.support.stack import Upstream, running_stack
from twengine import admission
from twengine.attempt import requests
from twmock.script import ErrorSpec, MockSettings, Script, parse_script
from twproto import translate

MARKER = "parse-me-once-7f3a"


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Wrap every parser a request body can reach in the gateway; the list fills with the
    module of each call handed text with `MARKER` in it."""
    seen: list[str] = []

    def counting(where: str, parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def parse_counted(data: Any) -> Any:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            if MARKER in text:
                seen.append(where)
            return parse(data)

        return parse_counted

    monkeypatch.setattr(admission, "json_loads", counting("admission", admission.json_loads))
    monkeypatch.setattr(requests, "json_loads", counting("requests", requests.json_loads))
    # twproto.translate parses through its JSON module (`_json.loads`).
    parser = translate._json
    monkeypatch.setattr(parser, "loads", counting("translate", parser.loads))
    return seen


def test_a_converted_request_resent_after_an_effort_refusal_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An Anthropic client before a Chat upstream that refuses the effort once: the request is
    # translated, the refused level looked up in it, and translated again for the resend.
    refusal = ErrorSpec(status=400, message="reasoning_effort is not supported")
    up = {"a": Upstream("openai-chat", MockSettings(script=Script(fail_first=1, error=refusal)))}
    body = {
        "model": MODELS["anthropic"],
        "max_tokens": 2000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "messages": [{"role": "user", "content": MARKER}],
    }
    with running_stack(tmp_path, up, config=fallback("a")) as st:
        seen = count_parses(monkeypatch)
        status = httpcore.request(
            "POST",
            st.url + "/v1/messages",
            headers=[(b"x-api-key", KEY.encode())],
            content=json.dumps(body).encode(),
        ).status
        first, second = (r.json() for r in st.mock("a").received)
        (row,) = st.wait_rows(1)
    assert status == 200
    assert first["reasoning_effort"] == "high" and "reasoning_effort" not in second
    assert [a["resend"] for a in json.loads(row["routing"])["attempts"]] == [None, "effort_refused"]
    assert seen == ["admission"]


@pytest.mark.anyio
async def test_a_socket_turn_is_parsed_where_its_message_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = {"a": Upstream("anthropic", MockSettings(script=parse_script({"text": "hello"})))}
    with running_stack(tmp_path, up, config=fallback("a")) as st:
        seen = count_parses(monkeypatch)
        async with websockets.connect(
            f"ws://127.0.0.1:{st.port}/v1/responses",
            additional_headers={"authorization": f"Bearer {KEY}"},
            open_timeout=5,
            close_timeout=5,
        ) as ws:
            for _ in range(2):
                event = {"type": "response.create", "model": MODELS["openai-responses"]}
                await ws.send(json.dumps({**event, "input": MARKER}))
                with anyio.fail_after(10):
                    while (got := json.loads(await ws.recv()))["type"] != "response.completed":
                        assert got["type"] not in ("error", "response.failed"), got
        rows = st.wait_rows(2)
    assert [r["status"] for r in rows] == [200, 200]
    # Read from the message (twproto.read_ws_client_event), then never parsed again.
    assert seen == []
