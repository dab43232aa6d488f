"""A client that leaves mid-stream cancels the upstream call, frees the slot and still leaves
a row with the attempts made (docs/operations.md, "What a client may send")."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from tests.twserve.stack import KEY, Upstream, running_stack
from twmock.script import MockSettings, Script


def test_leaving_mid_stream_is_recorded_and_frees_the_slot(tmp_path: Path) -> None:
    slow = MockSettings(script=Script(chunks=200, chunk_delay=0.02))
    ups = {"a": Upstream("anthropic", slow, extra={"max_concurrent": 1})}
    with running_stack(tmp_path, ups) as st:
        body = json.dumps(
            {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        head = (
            f"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", st.port), timeout=5) as sock:
            sock.sendall(head + body)
            got = b""
            while b"content_block_delta" not in got:
                got += sock.recv(65536)
        # The client is gone: the slot (max_concurrent 1) must free up for the next request.
        deadline = time.monotonic() + 5
        slots = st.app.gateway.router.slots
        while slots.in_flight("a") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slots.in_flight("a") == 0
        (row,) = st.wait_rows(1)
    assert row["cancelled"] == 1 and row["provider"] == "a" and row["status"] == 200
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["provider"], a["outcome"]) for a in attempts] == [("a", "cancelled")]
