"""The upstream request: method, URL, headers, body and answer framing for one hop.

Given where a hop goes (`UpstreamTarget`: format, base URL, key, model, the provider's own
headers), what the client called (`ClientCall`: format, operation, stream or not, its query and
headers) and the body already translated for that upstream, `upstream_request` returns what to
send (docs/operations.md, "What goes upstream"):

* the path the official SDK of the upstream's format appends to its base URL
  (`twproto.paths.upstream_path`); a same-format upstream also gets the client's own query
  (Claude Code's ``?beta=true``) minus the stream framing parameter the path already sets. The
  gateway key has been removed from the query before it gets here;
* ``content-type``, ``accept-encoding: identity`` (the gateway reads streams), the provider key
  in the header its API expects, the provider's configured headers, and — same format only —
  the client's protocol headers (beta flags, API versions, SDK identification);
  hop-by-hop headers, cookies and the client's own credentials never go;
* the default headers an API requires when nobody set them (Anthropic's ``anthropic-version``);
* for a cloud platform's upstream (`twproto.cloud`: Vertex AI, Azure OpenAI), that platform's
  path, credential header and body changes (docs/cloud.md);
* the framing the upstream answers a stream in: SSE, or for a Gemini client without
  ``alt=sse`` talking to a Gemini upstream, Gemini's JSON array (``sse=False``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twproto.bedrock.converse.bridge import converse_count_body, converse_request
from twproto.bedrock.count import count_invoke_body, count_path
from twproto.bedrock.invoke import AwsAuth, invoke_body, invoke_request, signed_headers
from twproto.cloud.azure import AzureRoute, azure_body, azure_key_headers, azure_path
from twproto.cloud.vertex import VertexPublisher, VertexRoute, vertex_anthropic_body, vertex_path
from twproto.dialect import Dialect
from twproto.keys import KEY_HEADERS, credential_headers
from twproto.paths import Operation, upstream_path

__all__ = (
    "ClientCall",
    "UpstreamRequest",
    "UpstreamTarget",
    "forwardable_headers",
    "upstream_request",
)

Header = tuple[bytes, bytes]

# Headers that describe one hop, or that the gateway sets itself, never forwarded as they came.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"content-type",
        b"accept-encoding",
        b"cookie",
        *KEY_HEADERS,  # the client's own credentials for the gateway
    }
)

# Headers a same-format upstream needs to see to behave as the client expects (beta features,
# API versions, SDK identification). Cross-format requests carry none of these.
_PROTOCOL_PREFIXES: dict[Dialect, tuple[bytes, ...]] = {
    Dialect.ANTHROPIC: (
        b"anthropic-",
        b"x-stainless-",
        b"x-app",
        b"user-agent",
        b"x-claude-",
    ),
    Dialect.OPENAI_CHAT: (b"openai-", b"x-stainless-", b"user-agent"),
    Dialect.OPENAI_RESPONSES: (
        b"openai-",
        b"x-stainless-",
        b"user-agent",
        b"originator",
        b"session-id",
        b"session_id",
        b"thread-id",
        b"x-client-request-id",
        b"x-codex-",
        b"chatgpt-account-id",
    ),
    Dialect.GEMINI: (b"x-goog-", b"user-agent"),
}

# The mock upstream's per-request steering headers (docs/mock-upstream.md): forwarded, in any
# format, only to a provider configured with ``forward_mock_headers``.
_MOCK_PREFIX = b"x-mock-"

# Headers an API requires, added when neither the provider's headers nor the client's set them.
_DEFAULT_HEADERS: dict[Dialect, tuple[Header, ...]] = {
    Dialect.ANTHROPIC: ((b"anthropic-version", b"2023-06-01"),),
    Dialect.OPENAI_CHAT: (),
    Dialect.OPENAI_RESPONSES: (),
    Dialect.GEMINI: (),
}

# The client's query parameter that picks the stream framing; the upstream path sets its own.
_FRAMING_PARAM = "alt=sse"


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamTarget:
    """Where one hop goes: the upstream's format, base URL, key, the model name it is sent, and
    the provider's configured headers (lower-case names). `forward_mock_headers`: the client's
    ``x-mock-*`` headers go along (a provider that is the project's mock upstream)."""

    dialect: Dialect
    base_url: str
    key: str
    model: str
    headers: tuple[Header, ...] = ()
    forward_mock_headers: bool = False
    # A ``bedrock-anthropic`` upstream (`dialect` is Anthropic): InvokeModel at `base_url`,
    # signed with these credentials, or `key` as a Bedrock API key (docs/bedrock.md).
    aws: AwsAuth | None = None
    # ``bedrock-converse``: with `aws`, the Anthropic body goes as Converse / ConverseStream.
    converse: bool = False
    # A cloud platform's upstream (docs/cloud.md): Vertex AI (`key` an OAuth access token) or
    # Azure OpenAI (`key` the resource key or an Entra ID token), at `base_url`.
    cloud: VertexRoute | AzureRoute | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCall:
    """What the client asked for, as far as the upstream request depends on it.

    `sse` is False only for a Gemini client streaming without ``alt=sse`` (a JSON array).
    `query` is the client's query string with the gateway key removed; `headers` its request
    headers, names lower-case.
    """

    dialect: Dialect
    operation: Operation
    stream: bool
    sse: bool = True
    query: str = ""
    headers: Sequence[Header] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamRequest:
    """The request to send upstream. `sse` tells how the upstream frames a streamed answer:
    SSE, or (False) Gemini's JSON array; `eventstream` True: AWS event-stream messages that
    carry Anthropic SSE events (Bedrock's InvokeModelWithResponseStream). `fields`: the
    top-level object `body` holds, when the caller has it (`TranslatedRequest.fields`): read,
    never changed, by a leg over the upstream's socket."""

    method: str
    url: str
    headers: list[Header]
    body: bytes
    sse: bool
    eventstream: bool = False
    # The event stream is ConverseStream's (`twproto.bedrock.converse`), not InvokeModel's.
    converse: bool = False
    fields: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


def forwardable_headers(headers: Sequence[Header], dialect: Dialect) -> list[Header]:
    """The client's headers that go to an upstream of the client's own format `dialect`."""
    prefixes = _PROTOCOL_PREFIXES[dialect]
    return [
        (name, value)
        for name, value in headers
        if name not in _HOP_BY_HOP and name.startswith(prefixes)
    ]


def upstream_request(
    target: UpstreamTarget,
    call: ClientCall,
    body: bytes,
    *,
    now: float = 0.0,
    fields: Mapping[str, Any] | None = None,
) -> UpstreamRequest:
    """The request for `target`, carrying `body` (already translated for it); `now` (epoch
    seconds) dates a Bedrock request's signature; `fields`: `body`'s top-level object when the
    caller has it (`TranslatedRequest.fields`), kept on the request."""
    if target.aws is not None:
        return _bedrock_request(target, call, body, now)
    same = target.dialect is call.dialect
    sse = call.sse if same else True
    cloud = target.cloud
    if cloud is None:
        path = upstream_path(
            target.dialect, call.operation, model=target.model, stream=call.stream, sse=sse
        )
        credentials = credential_headers(target.dialect, target.key)
    else:
        path, credentials, body = _cloud_parts(target, cloud, call, body, sse)
    if same and call.query:
        extra = "&".join(p for p in call.query.split("&") if p and p != _FRAMING_PARAM)
        if extra:
            path += ("&" if "?" in path else "?") + extra
    headers: list[Header] = [
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"identity"),
        *credentials,
        *target.headers,
    ]
    if same:
        headers += forwardable_headers(call.headers, call.dialect)
    if target.forward_mock_headers:
        headers += [(k, v) for k, v in call.headers if k.startswith(_MOCK_PREFIX)]
    # Vertex takes the Anthropic version in the body (`vertex_anthropic_body`).
    defaults = _DEFAULT_HEADERS[target.dialect] if cloud is None else ()
    for name, value in defaults:
        if not any(k == name for k, _ in headers):
            headers.append((name, value))
    return UpstreamRequest(
        method="POST",
        url=target.base_url.rstrip("/") + path,
        headers=headers,
        body=body,
        sse=sse,
        fields=fields,
    )


def _bedrock_request(
    target: UpstreamTarget, call: ClientCall, body: bytes, now: float
) -> UpstreamRequest:
    assert target.aws is not None
    extra = list(target.headers)
    if target.forward_mock_headers:
        extra += [(k, v) for k, v in call.headers if k.startswith(_MOCK_PREFIX)]
    # An Anthropic client's beta flags travel in the body; other clients' headers never go.
    betas = call.headers if call.dialect is Dialect.ANTHROPIC else ()
    if call.operation is Operation.COUNT_TOKENS:
        url = target.base_url.rstrip("/") + count_path(target.model)
        if target.converse:
            data = converse_count_body(body, target.model)
        else:
            data = count_invoke_body(invoke_body(body, betas))
        headers, data = signed_headers(
            url,
            data,
            accept=b"application/json",
            auth=target.aws,
            key=target.key,
            headers=extra,
            now=now,
        )
        return UpstreamRequest(method="POST", url=url, headers=headers, body=data, sse=True)
    if target.converse:
        url, headers, data = converse_request(
            target.base_url,
            target.model,
            body,
            stream=call.stream,
            auth=target.aws,
            key=target.key,
            headers=extra,
            now=now,
        )
        return UpstreamRequest(
            method="POST",
            url=url,
            headers=headers,
            body=data,
            sse=True,
            eventstream=call.stream,
            converse=True,
        )
    url, headers, data = invoke_request(
        target.base_url,
        target.model,
        body,
        stream=call.stream,
        auth=target.aws,
        key=target.key,
        headers=extra,
        client_headers=betas,
        now=now,
    )
    return UpstreamRequest(
        method="POST", url=url, headers=headers, body=data, sse=True, eventstream=call.stream
    )


def _cloud_parts(
    target: UpstreamTarget,
    cloud: VertexRoute | AzureRoute,
    call: ClientCall,
    body: bytes,
    sse: bool,
) -> tuple[str, list[Header], bytes]:
    """A cloud upstream's path, credential headers and body."""
    if isinstance(cloud, AzureRoute):
        return (
            azure_path(cloud, target.dialect),
            azure_key_headers(cloud, target.key),
            azure_body(body, cloud, target.model),
        )
    bearer = [(b"authorization", b"Bearer " + target.key.encode())] if target.key else []
    count = call.operation is Operation.COUNT_TOKENS
    path = vertex_path(cloud, target.model, stream=call.stream, count=count, sse=sse)
    if cloud.publisher is VertexPublisher.ANTHROPIC:
        body = vertex_anthropic_body(body)
    return path, bearer, body
