"""The allow-list of upstream response headers a client may see."""

from __future__ import annotations

from twproto.headers import CLIENT_RESPONSE_HEADERS, client_response_headers


def test_keeps_listed_headers_in_any_case_and_drops_the_rest() -> None:
    upstream = [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"12"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Set-Cookie", b"a=b"),
        (b"OpenAI-Organization", b"org-1"),
        (b"x-ratelimit-remaining-tokens", b"10"),
        (b"Request-Id", b"req_1"),
        (b"Retry-After", b"3"),
    ]
    assert client_response_headers(upstream) == [
        (b"content-type", b"application/json"),
        (b"request-id", b"req_1"),
        (b"retry-after", b"3"),
    ]


def test_framing_and_hop_headers_are_never_listed() -> None:
    for name in (b"content-length", b"transfer-encoding", b"connection", b"keep-alive"):
        assert name not in CLIENT_RESPONSE_HEADERS
    assert all(name == name.lower() for name in CLIENT_RESPONSE_HEADERS)


def test_an_upstreams_who_answered_headers_never_pass() -> None:
    upstream = [(b"X-Twserve-Provider", b"elsewhere"), (b"x-twserve-model", b"other")]
    assert client_response_headers(upstream) == []


def test_the_upstreams_request_id_is_renamed() -> None:
    # x-request-id is the gateway's own (its row's id): the upstream's id keeps another name.
    upstream = [(b"X-Request-Id", b"req_up"), (b"content-type", b"application/json")]
    assert client_response_headers(upstream) == [
        (b"x-upstream-request-id", b"req_up"),
        (b"content-type", b"application/json"),
    ]
