"""The unchanged (watch) path still ends a broken Responses stream as its own response."""

from __future__ import annotations

from pathlib import Path

from twproto import json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.sse import SSEDecoder
from twproto.stream import new_stream_translator

FIXTURE = Path(__file__).parents[2] / "data/fixtures/streams/openai-responses-text.sse"
ERR = GatewayError(status=502, category=ErrorCategory.UPSTREAM, code="gw.x", message="broke")


def test_failed_event_continues_the_relayed_response() -> None:
    data = FIXTURE.read_bytes()
    cut = data.index(b"response.output_text.delta") + 400
    relayed = SSEDecoder().feed(data[:cut])
    created = json_loads(relayed[0].data)["response"]
    last_seq = max(json_loads(e.data)["sequence_number"] for e in relayed)

    for split in (1, 7, len(data)):
        t = new_stream_translator(
            Dialect.OPENAI_RESPONSES, Dialect.OPENAI_RESPONSES, client_model="x"
        )
        out = b"".join(t.feed(data[i : min(i + split, cut)]) for i in range(0, cut, split))
        assert out == data[:cut]  # relayed unchanged
        (failed,) = SSEDecoder().feed(t.fail(ERR))
        body = json_loads(failed.data)
        assert failed.event == "response.failed"
        assert body["sequence_number"] == last_seq + 1
        assert body["response"]["id"] == created["id"]
        assert body["response"]["model"] == created["model"]
        assert body["response"]["created_at"] == created["created_at"]
