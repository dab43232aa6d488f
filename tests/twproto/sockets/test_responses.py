"""The Responses WebSocket's messages (twproto/sockets/responses.py), as values and text."""

from __future__ import annotations

import json

import pytest
from openai.types.responses.response_steer_failed_event import ResponseSteerFailedEvent
from openai.types.responses.responses_server_event import ResponseWsError

from twproto import Dialect, ErrorCategory, GatewayError, match_path, translate_request
from twproto.sockets import (
    WS_RESPONSES_PATHS,
    EventRejected,
    FailedResponse,
    SteerRequested,
    TurnRequested,
    read_ws_client_event,
    read_ws_upstream_event,
    ws_answer_error_event,
    ws_answer_failed_event,
    ws_completed_event,
    ws_error_event,
    ws_gateway_error_event,
    ws_gateway_failed_event,
    ws_steer_failed_event,
    ws_stream_message,
    ws_tag_stream_id,
    ws_upstream_create,
    ws_upstream_error_answer,
    ws_upstream_url,
)


def test_a_create_is_the_request_body_streamed_without_its_envelope() -> None:
    event = read_ws_client_event(
        json.dumps(
            {
                "type": "response.create",
                "model": "m",
                "input": [{"role": "user", "content": "hi"}],
                "stream": False,
                "stream_id": "lane",
                "tools": [],
            }
        )
    )
    assert isinstance(event, TurnRequested)
    assert event.stream_id == "lane"
    assert json.loads(event.body) == {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
        "tools": [],
    }
    # The body as it was read, for the gateway to take instead of parsing `body` again.
    assert event.parsed == json.loads(event.body)


def test_a_create_without_a_lane() -> None:
    event = read_ws_client_event(b'{"type": "response.create", "model": "m", "stream_id": 7}')
    assert isinstance(event, TurnRequested) and event.stream_id is None


def test_a_steer() -> None:
    event = read_ws_client_event(
        '{"type": "response.steer", "previous_response_id": "resp_1", "input": "go on"}'
    )
    assert event == SteerRequested(input="go on", previous_response_id="resp_1")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{nope", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "not a JSON object"),
        ("42", "not a JSON object"),
        ('{"type": "response.cancel"}', "unknown client event type 'response.cancel'"),
        ('{"model": "m"}', "unknown client event type None"),
        ('{"type": "response.create", "background": true}', "background is not supported"),
    ],
)
def test_anything_else_is_rejected_with_its_reason(text: str, reason: str) -> None:
    event = read_ws_client_event(text)
    assert isinstance(event, EventRejected) and reason in event.message


def test_a_rejected_create_keeps_its_lane() -> None:
    event = read_ws_client_event(
        '{"type": "response.create", "background": true, "stream_id": "b"}'
    )
    assert isinstance(event, EventRejected) and event.stream_id == "b"


def test_error_events_are_what_the_sdk_reads() -> None:
    err = GatewayError(
        status=429, category=ErrorCategory.RATE_LIMITED, code="gw.ws.busy", message="wait"
    )
    parsed = ResponseWsError.model_validate(json.loads(ws_gateway_error_event(err, "l")))
    assert (parsed.type, parsed.status, parsed.stream_id) == ("error", 429, "l")
    assert (parsed.error.code, parsed.error.message) == ("gw.ws.busy", "wait")
    plain = json.loads(ws_error_event({"type": "x", "message": "m"}, status=400))
    assert "stream_id" not in plain


def test_an_error_answer_keeps_its_error_object() -> None:
    body = json.dumps(
        {"error": {"type": "invalid_request_error", "code": "gw.rule.denied", "message": "no"}}
    ).encode()
    refused = ws_answer_error_event(403, body)
    assert (refused.status, refused.code) == (403, "gw.rule.denied")
    event = json.loads(refused.event)
    assert event["error"] == json.loads(body)["error"] and event["status"] == 403


def test_a_refused_turn_is_a_failed_response_carrying_the_error_answer() -> None:
    body = json.dumps(
        {"error": {"type": "invalid_request_error", "code": "gw.rule.denied", "message": "no"}}
    ).encode()
    made = FailedResponse(id="resp_gw_1", created_at=1_800_000_000, model="forbidden-1")
    refused = ws_answer_failed_event(403, body, made, "lane")
    assert (refused.status, refused.code) == (403, "gw.rule.denied")
    event = json.loads(refused.event)
    assert (event["type"], event["status"], event["stream_id"]) == ("response.failed", 403, "lane")
    response = event["response"]
    assert (response["id"], response["created_at"], response["model"]) == (
        "resp_gw_1",
        1_800_000_000,
        "forbidden-1",
    )
    assert response["object"] == "response" and response["status"] == "failed"
    assert response["output"] == [] and response["usage"] is None
    assert response["error"] == json.loads(body)["error"]


def test_a_turn_the_transport_refuses_is_a_failed_response_too() -> None:
    err = GatewayError(
        status=429, category=ErrorCategory.RATE_LIMITED, code="gw.ws.busy", message="wait"
    )
    event = json.loads(ws_gateway_failed_event(err, FailedResponse(id="r", created_at=0)))
    assert (event["type"], event["status"]) == ("response.failed", 429)
    assert "stream_id" not in event
    error = event["response"]["error"]
    assert (error["code"], error["message"], error["type"]) == (
        "gw.ws.busy",
        "wait",
        "rate_limit_error",
    )


def test_a_create_names_its_model() -> None:
    event = read_ws_client_event(json.dumps({"type": "response.create", "model": "gpt-x"}))
    assert isinstance(event, TurnRequested) and event.model == "gpt-x"
    unnamed = read_ws_client_event(json.dumps({"type": "response.create", "model": 3}))
    assert isinstance(unnamed, TurnRequested) and unnamed.model == ""


@pytest.mark.parametrize("body", [b"", b"<html>bad gateway</html>", b'{"error": "text"}'])
def test_an_error_answer_without_an_error_object_gets_one(body: bytes) -> None:
    refused = ws_answer_error_event(502, body, "l")
    parsed = ResponseWsError.model_validate(json.loads(refused.event))
    assert (parsed.status, parsed.error.code, parsed.stream_id) == (502, "gw.internal", "l")
    assert "502" in parsed.error.message


def test_an_oversized_error_body_is_not_parsed() -> None:
    message = "x" * (70 * 1024)
    body = json.dumps({"error": {"type": "t", "code": "c", "message": message}}).encode()
    assert ws_answer_error_event(500, body).code == "gw.internal"


def test_a_whole_answer_becomes_the_completed_event() -> None:
    event = ws_completed_event(b'{"id": "resp_1", "status": "completed"}')
    assert event is not None
    assert json.loads(event) == {
        "type": "response.completed",
        "response": {"id": "resp_1", "status": "completed"},
    }
    assert ws_completed_event(b"[1]") is None
    assert ws_completed_event(b"nope") is None


def test_steer_failed_is_what_the_sdk_reads() -> None:
    steer = SteerRequested(
        input=[{"type": "message", "role": "user", "content": "x"}], previous_response_id="r"
    )
    parsed = ResponseSteerFailedEvent.model_validate(json.loads(ws_steer_failed_event(steer)))
    assert parsed.error.code == "steering_not_supported"
    assert parsed.steer.previous_response_id == "r"


def test_tagging_a_stream_event_with_its_lane() -> None:
    tagged = ws_tag_stream_id('{"type": "response.created", "sequence_number": 0}', "a")
    assert json.loads(tagged) == {
        "type": "response.created",
        "sequence_number": 0,
        "stream_id": "a",
    }
    assert ws_tag_stream_id("[DONE]", "a") == "[DONE]"
    assert ws_tag_stream_id("[1]", "a") == "[1]"


def test_stream_messages_leave_out_what_is_no_event() -> None:
    event = '{"type": "response.output_text.delta", "delta": "x"}'
    assert ws_stream_message(event) == event
    assert json.loads(ws_stream_message(event, "b") or "")["stream_id"] == "b"
    assert ws_stream_message("") is None
    assert ws_stream_message("[DONE]", "b") is None


def test_the_socket_paths_are_responses_generate_paths() -> None:
    for path in WS_RESPONSES_PATHS:
        route = match_path("POST", path)
        assert route is not None and route.dialect is Dialect.OPENAI_RESPONSES


# --- the gateway as a client of an upstream's socket ----------------------------------------


def test_the_upstream_socket_url_follows_the_request_url() -> None:
    assert ws_upstream_url("https://api.openai.com/v1/responses") == (
        "wss://api.openai.com/v1/responses"
    )
    assert ws_upstream_url("http://127.0.0.1:9/p/v1/responses?x=1") == (
        "ws://127.0.0.1:9/p/v1/responses?x=1"
    )
    with pytest.raises(ValueError):
        ws_upstream_url("ftp://example.com/responses")


def test_only_a_streamed_create_becomes_a_socket_event() -> None:
    body = {"model": "m", "input": "hi", "stream": True, "stream_options": {}, "store": False}
    event = ws_upstream_create("http://h/v1/responses", json.dumps(body).encode())
    assert event is not None
    assert json.loads(event) == {
        "type": "response.create",
        "model": "m",
        "input": "hi",
        "store": False,
    }
    whole = json.dumps({"model": "m", "input": "hi"}).encode()
    assert ws_upstream_create("http://h/v1/responses", whole) is None
    streamed = json.dumps(body).encode()
    assert ws_upstream_create("http://h/v1/responses/input_tokens", streamed) is None
    assert ws_upstream_create("http://h/v1/responses/compact", streamed) is None
    assert ws_upstream_create("http://h/v1/responses", b"[1]") is None
    assert ws_upstream_create("http://h/v1/responses", b"{not json") is None


@pytest.mark.parametrize(
    ("event", "kind", "ends", "error"),
    [
        ({"type": "response.created"}, "response.created", False, False),
        ({"type": "response.output_text.delta"}, "response.output_text.delta", False, False),
        ({"type": "response.completed"}, "response.completed", True, False),
        ({"type": "response.failed"}, "response.failed", True, False),
        ({"type": "response.incomplete"}, "response.incomplete", True, False),
        ({"type": "error", "status": 429}, "error", True, True),
        ({"no": "type"}, "", False, False),
    ],
)
def test_what_an_upstream_message_is_to_the_turn(
    event: dict[str, object], kind: str, ends: bool, error: bool
) -> None:
    got = read_ws_upstream_event(json.dumps(event))
    assert (got.type, got.ends, got.error) == (kind, ends, error)
    assert read_ws_upstream_event("not json").type == ""


@pytest.mark.parametrize(
    ("event", "kept"),
    [
        ({"type": "response.completed", "response": {"id": "resp_1"}}, "resp_1"),
        ({"type": "response.incomplete", "response": {"id": "resp_2"}}, "resp_2"),
        # A failed response is no conversation to continue; nor is an event without an id.
        ({"type": "response.failed", "response": {"id": "resp_3"}}, None),
        ({"type": "response.created", "response": {"id": "resp_4"}}, None),
        ({"type": "response.completed", "response": {"id": 7}}, None),
        ({"type": "response.completed"}, None),
    ],
)
def test_the_response_a_closing_event_leaves_on_the_socket(
    event: dict[str, object], kept: str | None
) -> None:
    assert read_ws_upstream_event(json.dumps(event)).kept == kept


def test_an_upstream_error_event_is_the_http_answer_it_stands_for() -> None:
    error = {
        "type": "rate_limit_error",
        "code": "rate_limit_error",
        "message": "slow down",
        "param": None,
        "headers": {"Retry-After": "7", "bad name": "x", "x-ok": "a\nb", "x-n": 3},
    }
    answer = ws_upstream_error_answer(json.dumps({"type": "error", "status": 429, "error": error}))
    assert answer.status == 429
    assert answer.headers == [(b"retry-after", b"7")]
    assert json.loads(answer.body) == {"error": error}
    # No status, or one that is not an HTTP error: 500; no error object: one is made.
    answer = ws_upstream_error_answer(json.dumps({"type": "error", "status": 200}))
    assert (answer.status, answer.headers) == (500, [])
    assert json.loads(answer.body)["error"]["message"]


def test_a_socket_leg_reads_the_fields_it_is_given_and_parses_nothing() -> None:
    fields = {"model": "m", "input": "hi", "stream": True, "background": False}
    # The body is not read when its fields come with it: even bytes that are not JSON.
    event = ws_upstream_create("http://h/v1/responses", b"{not json", fields)
    assert event is not None
    assert json.loads(event) == {"type": "response.create", "model": "m", "input": "hi"}
    assert ws_upstream_create("http://h/v1/responses", b"", {"stream": False}) is None


@pytest.mark.parametrize(
    ("source", "body", "model"),
    [
        # Passed through as it came, with the model renamed, and converted from another format.
        (Dialect.OPENAI_RESPONSES, {"model": "m", "input": "hi", "stream": True}, None),
        (Dialect.OPENAI_RESPONSES, {"model": "m", "input": "hi", "stream": True}, "up-m"),
        (
            Dialect.OPENAI_CHAT,
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            "up-m",
        ),
        (
            Dialect.ANTHROPIC,
            {
                "model": "m",
                "stream": True,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}],
            },
            "up-m",
        ),
    ],
)
def test_the_translated_fields_make_the_same_event_as_the_body(
    source: Dialect, body: dict[str, object], model: str | None
) -> None:
    raw = json.dumps(body).encode()
    translated = translate_request(
        raw, source, Dialect.OPENAI_RESPONSES, model=model, stream=True, parsed=json.loads(raw)
    )
    assert translated.fields is not None
    url = "http://h/v1/responses"
    from_fields = ws_upstream_create(url, b"", translated.fields)
    assert from_fields is not None
    assert from_fields == ws_upstream_create(url, translated.body)
    # Other targets keep no fields: only a Responses leg can go over a socket.
    other = translate_request(raw, source, Dialect.ANTHROPIC, model="x", stream=True)
    assert other.fields is None
