"""The upstream request of one hop, table by table: path, query, headers, framing; where a
client's key is found; which format an unknown path is answered in."""

from __future__ import annotations

import pytest

from twproto.dialect import Dialect
from twproto.keys import credential_headers, find_key
from twproto.paths import Operation, guess_client_dialect
from twproto.upstream_request import ClientCall, UpstreamTarget, upstream_request

A, C, R, G = Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.GEMINI
GEN, COUNT = Operation.GENERATE, Operation.COUNT_TOKENS


def target(dialect: Dialect, **kw: object) -> UpstreamTarget:
    fields: dict[str, object] = {
        "dialect": dialect,
        "base_url": "https://up.example/api/",
        "key": "sk-up",
        "model": "m/x 1",
    }
    fields.update(kw)
    return UpstreamTarget(**fields)  # type: ignore[arg-type]


# (upstream, client, operation, stream, client sse, client query) -> (url suffix, upstream sse)
URLS = [
    (A, A, GEN, True, True, "", "/v1/messages", True),
    (A, A, GEN, True, True, "beta=true&key=", "/v1/messages?beta=true&key=", True),
    (A, C, GEN, True, True, "beta=true", "/v1/messages", True),  # not another format's query
    (A, A, COUNT, False, True, "", "/v1/messages/count_tokens", True),
    (C, C, GEN, True, True, "", "/chat/completions", True),
    (R, R, GEN, False, True, "", "/responses", True),
    (G, G, GEN, False, True, "", "/v1beta/models/m%2Fx%201:generateContent", True),
    (
        G,
        G,
        GEN,
        True,
        True,
        "alt=sse",
        "/v1beta/models/m%2Fx%201:streamGenerateContent?alt=sse",
        True,
    ),
    (G, G, GEN, True, False, "", "/v1beta/models/m%2Fx%201:streamGenerateContent", False),
    (
        G,
        G,
        GEN,
        True,
        True,
        "alt=sse&x=1",
        "/v1beta/models/m%2Fx%201:streamGenerateContent?alt=sse&x=1",
        True,
    ),
    (G, A, GEN, True, True, "", "/v1beta/models/m%2Fx%201:streamGenerateContent?alt=sse", True),
    (G, G, COUNT, False, True, "", "/v1beta/models/m%2Fx%201:countTokens", True),
    (C, G, GEN, True, False, "", "/chat/completions", True),  # a JSON-array client, SSE upstream
]


@pytest.mark.parametrize(("up", "client", "op", "stream", "sse", "query", "suffix", "up_sse"), URLS)
def test_url_and_framing(
    up: Dialect,
    client: Dialect,
    op: Operation,
    stream: bool,
    sse: bool,
    query: str,
    suffix: str,
    up_sse: bool,
) -> None:
    call = ClientCall(dialect=client, operation=op, stream=stream, sse=sse, query=query)
    request = upstream_request(target(up), call, b"{}")
    assert request.method == "POST"
    assert request.url == "https://up.example/api" + suffix
    assert request.sse is up_sse
    assert request.body == b"{}"


CLIENT_HEADERS = [
    (b"anthropic-beta", b"tools"),
    (b"anthropic-version", b"2024-01-01"),
    (b"x-stainless-os", b"Linux"),
    (b"openai-organization", b"org"),
    (b"originator", b"codex"),
    (b"x-goog-api-client", b"genai"),
    (b"user-agent", b"sdk/1"),
    (b"x-mock-script", b"{}"),  # only with forward_mock_headers
    # never forwarded
    (b"x-api-key", b"gateway-key"),
    (b"authorization", b"Bearer gateway-key"),
    (b"x-goog-api-key", b"gateway-key"),
    (b"cookie", b"c"),
    (b"content-length", b"2"),
    (b"content-type", b"text/plain"),
    (b"connection", b"close"),
    (b"accept-encoding", b"gzip"),
    (b"x-unrelated", b"1"),
]

# upstream == client: what reaches the upstream besides the gateway's own headers
FORWARDED = {
    A: [
        b"anthropic-beta",
        b"anthropic-version",
        b"x-stainless-os",
        b"user-agent",
    ],
    C: [b"x-stainless-os", b"openai-organization", b"user-agent"],
    R: [b"x-stainless-os", b"openai-organization", b"originator", b"user-agent"],
    G: [b"x-goog-api-client", b"user-agent"],
}
CREDENTIAL = {
    A: (b"x-api-key", b"sk-up"),
    C: (b"authorization", b"Bearer sk-up"),
    R: (b"authorization", b"Bearer sk-up"),
    G: (b"x-goog-api-key", b"sk-up"),
}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_same_format_headers(dialect: Dialect) -> None:
    call = ClientCall(dialect=dialect, operation=GEN, stream=True, headers=CLIENT_HEADERS)
    headers = upstream_request(target(dialect, headers=((b"x-org", b"o"),)), call, b"{}").headers
    assert headers[:4] == [
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"identity"),
        CREDENTIAL[dialect],
        (b"x-org", b"o"),
    ]
    assert [name for name, _ in headers[4:]] == FORWARDED[dialect]


@pytest.mark.parametrize("client", list(Dialect))
@pytest.mark.parametrize("up", list(Dialect))
def test_another_format_gets_no_client_headers(up: Dialect, client: Dialect) -> None:
    if up is client:
        return
    call = ClientCall(dialect=client, operation=GEN, stream=True, headers=CLIENT_HEADERS)
    headers = upstream_request(target(up), call, b"{}").headers
    expected = [(b"content-type", b"application/json"), (b"accept-encoding", b"identity")]
    expected.append(CREDENTIAL[up])
    if up is A:
        expected.append((b"anthropic-version", b"2023-06-01"))
    assert headers == expected


def test_anthropic_version_is_a_default_only() -> None:
    call = ClientCall(dialect=C, operation=GEN, stream=False)
    mine = target(A, headers=((b"anthropic-version", b"2025-01-01"),))
    headers = upstream_request(mine, call, b"{}").headers
    assert [v for k, v in headers if k == b"anthropic-version"] == [b"2025-01-01"]
    same = ClientCall(dialect=A, operation=GEN, stream=False, headers=CLIENT_HEADERS)
    headers = upstream_request(target(A), same, b"{}").headers
    assert [v for k, v in headers if k == b"anthropic-version"] == [b"2024-01-01"]


def test_no_key_no_credential() -> None:
    assert credential_headers(A, "") == []
    call = ClientCall(dialect=C, operation=GEN, stream=False)
    headers = upstream_request(target(C, key=""), call, b"{}").headers
    assert not any(k == b"authorization" for k, _ in headers)


@pytest.mark.parametrize(
    ("headers", "query", "expected"),
    [
        ([(b"x-api-key", b"k1"), (b"authorization", b"Bearer k2")], "", "k1"),
        ([(b"x-goog-api-key", b"g"), (b"authorization", b"Bearer k2")], "", "g"),
        ([(b"x-api-key", b""), (b"authorization", b"Bearer k2")], "", "k2"),
        ([(b"authorization", b"bearer  k3 ")], "", "k3"),
        ([(b"authorization", b"Basic abc")], "key=q", "q"),
        ([], "alt=sse&key=q2", "q2"),
        ([], "key=", None),
        ([], "", None),
    ],
)
def test_key_lookup_order(
    headers: list[tuple[bytes, bytes]], query: str, expected: str | None
) -> None:
    assert find_key(headers, query) == expected


@pytest.mark.parametrize(
    ("path", "headers", "expected"),
    [
        ("/v1/messages", [], A),
        ("/v1/chat/completions", [(b"x-api-key", b"k")], C),  # a known path decides
        ("/v1/responses", [], R),
        ("/v1beta/models/x:generateContent", [], G),
        ("/v1beta/unknown", [], G),
        ("/v2/messages/x", [], A),
        ("/v1/models", [(b"anthropic-version", b"2023-06-01")], A),
        ("/v1/models", [(b"x-api-key", b"k")], A),
        ("/v1/models", [(b"x-goog-api-key", b"k")], G),
        ("/v1/models", [(b"x-goog-api-key", b"k"), (b"x-api-key", b"k")], A),
        ("/v1/models", [(b"authorization", b"Bearer k")], C),
        ("/nowhere", [], C),
        (None, [], C),
    ],
)
def test_guess_client_dialect(
    path: str | None, headers: list[tuple[bytes, bytes]], expected: Dialect
) -> None:
    assert guess_client_dialect(path, headers) is expected


@pytest.mark.parametrize("client", list(Dialect))
def test_mock_headers_go_only_to_a_provider_that_asks(client: Dialect) -> None:
    call = ClientCall(dialect=client, operation=GEN, stream=True, headers=CLIENT_HEADERS)
    plain = upstream_request(target(A), call, b"{}").headers
    assert not any(k.startswith(b"x-mock-") for k, _ in plain)
    mock = upstream_request(target(A, forward_mock_headers=True), call, b"{}").headers
    assert [(k, v) for k, v in mock if k.startswith(b"x-mock-")] == [(b"x-mock-script", b"{}")]
