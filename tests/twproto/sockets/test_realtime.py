"""What the gateway reads of Realtime events: pure functions over one text message."""

from __future__ import annotations

import pytest

from twproto.sockets import read_realtime_event, realtime_started_response


def test_a_response_created_event_names_its_response() -> None:
    text = '{"type":"response.created","event_id":"e1","response":{"id":"resp_1"}}'
    assert realtime_started_response(text) == "resp_1"


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"response.done","response":{"id":"resp_1"}}',
        '{"type":"conversation.item.created","item":{"text":"response.created"}}',
        '{"type":"response.created"}',
        'not json, though it says "response.created"',
        "[1, 2]",
    ],
)
def test_other_messages_start_no_response(text: str) -> None:
    assert realtime_started_response(text) is None


def test_an_event_type_is_read_or_left_empty() -> None:
    assert read_realtime_event('{"type":"response.create"}').type == "response.create"
    assert read_realtime_event('{"kind":1}').type == ""
