"""An alias sends another model name upstream; the client still reads the name it asked for."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.twserve.support.stack import KEY, Upstream, running_stack


@pytest.mark.sdk
def test_same_format_answer_names_the_alias(tmp_path: Path) -> None:
    ups = {"a": Upstream("anthropic", models=["real-model"])}
    with running_stack(tmp_path, ups, config={"aliases": {"nice": "real-model"}}) as st:
        client = anthropic.Anthropic(base_url=st.url, api_key=KEY, max_retries=0, timeout=10)
        ask = {"model": "nice", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        whole = client.messages.create(**ask)
        with client.messages.stream(**ask) as stream:
            streamed = stream.get_final_message()
        sent = [json.loads(r.body)["model"] for r in st.mock("a").received]
    assert whole.model == "nice" and streamed.model == "nice"
    assert streamed.content[0].text == whole.content[0].text
    assert sent == ["real-model", "real-model"]


def test_a_client_leaving_right_after_the_final_event_is_not_cancelled(tmp_path: Path) -> None:
    # Renamed by the alias, the stream is decoded and encoded again. A client whose SDK is done
    # at message_stop closes at once; here the upstream holds its own end back a moment, so
    # the client is gone before the upstream's stream ends.
    import socket
    from functools import partial

    import anyio
    from anyio.from_thread import start_blocking_portal

    from twserve.server import listener
    from twserve.server.base import Request, Responder

    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "real-model",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hello"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    sse = b"".join(
        b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(data).encode())
        for name, data in events
    )

    async def upstream(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-type", b"text/event-stream")])
        await responder.send(sse)
        await anyio.sleep(0.5)  # the upstream's end comes late
        await responder.end()

    body = json.dumps(
        {
            "model": "nice",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: %s\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (KEY.encode(), len(body))
    )
    runs = 3
    with start_blocking_portal() as portal:
        served, port = portal.start_task(
            partial(listener.serve, upstream, host="127.0.0.1", port=0)
        )
        config = {
            "aliases": {"nice": "real-model"},
            "providers": [
                {"name": "a", "protocol": "anthropic", "base_url": f"http://127.0.0.1:{port}"}
            ],
        }
        try:
            with running_stack(tmp_path, {}, config=config) as st:
                for _ in range(runs):
                    with socket.create_connection(("127.0.0.1", st.port), timeout=10) as sock:
                        sock.sendall(head + body)
                        seen = b""
                        while b"event: message_stop" not in seen:
                            chunk = sock.recv(65536)
                            assert chunk, seen
                            seen += chunk
                rows = st.wait_rows(runs)
        finally:
            served.cancel()
    assert [(r["cancelled"], r["provider"], r["status"]) for r in rows] == [(0, "a", 200)] * runs
