"""Routing's last step: each candidate as its attempts reach it.

`twengine.router.Router.plan` orders the candidates (`twengine.rules.Candidate`: a provider and
the model to send it). `destinations` turns each into a `Destination`: where its attempts go
(`UpstreamTarget`: the provider's URL, protocol, key and headers, the key and headers read from
the environment at send time), what a routing rule's ``set`` adds (an output limit, a reasoning
level), the model facts the attempts need (`twengine.catalog`: the output limit a conversion to
Anthropic fills in, the context window a context overflow compares), the name the answer shows
(``answer_model``), and the `Transport` the provider speaks. The transport is carried with every
attempt from here, so the upstream layer never finds the provider again from a URL: two
providers on one base URL may speak differently.

A candidate whose credentials do not resolve (a variable not set, a value no header can carry)
is a `twengine.config.credentials.CredentialFault`, which never holds the value: it is skipped,
and reported with the request. `request_destinations` is this step for one admitted request:
with no candidate usable it is refused (`no_usable_credentials`), and a token
count goes to the first usable one only, never retried (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from twengine.attempt.actions import CandidateRef
from twengine.catalog import Catalog, ConfigCatalog
from twengine.config.cloud_access import GoogleTokenSource, resolve_cloud
from twengine.config.credentials import (
    CredentialFault,
    bedrock_key,
    resolve_aws,
    resolve_credentials,
)
from twengine.config.model import AnswerModel, Config, Provider, ResponsesTransport
from twengine.rules import Candidate
from twproto.bedrock import bedrock_base_url
from twproto.errors import ErrorCategory, GatewayError
from twproto.ir import Effort, ReasoningLevel
from twproto.stream import DEFAULT_MAX_EVENT_BYTES
from twproto.upstream_request import UpstreamTarget

__all__ = (
    "Destination",
    "Transport",
    "destination",
    "destinations",
    "no_usable_credentials",
    "reasoning_level",
    "request_destinations",
    "transport_of",
)


class Transport(StrEnum):
    """How an attempt reaches its upstream, as its provider is configured: HTTP/1.1, HTTP/2
    (``http2: true``), or — for a client Responses WebSocket's turns to a provider with
    ``responses_transport: websocket`` — that upstream's own Responses socket."""

    HTTP1 = "http1"
    HTTP2 = "http2"
    RESPONSES_SOCKET = "responses_socket"


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """One upstream to try, as routing decided it: `target` says where, with which key and
    model; a routing rule's `set` adds an output limit and a reasoning level (docs/balancing.md)."""

    name: str
    target: UpstreamTarget
    sticky: bool = False
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None
    # The model's output limit (model_specs, else the price table): a conversion to Anthropic
    # of a request without max_tokens sends it.
    output_limit: int | None = None
    connect_timeout: float | None = None
    # The bound on one event of its stream (``providers[].max_answer_bytes``).
    max_answer_bytes: int = DEFAULT_MAX_EVENT_BYTES
    # This upstream refused the conversation's sealed reasoning before: leave it out up front.
    drop_sealed: bool = False
    # The model's context window (model_specs, else the price table), where known: a context
    # overflow moves on only to a larger one.
    context_window: int | None = None
    # ``answer_model: served``: the answer's body shows `target.model`, not the client's name.
    show_served: bool = False
    # How attempts reach the upstream (its provider's ``responses_transport``, ``http2``),
    # carried to the upstream layer with each attempt, never looked up again by URL; and how
    # those go that its own Responses socket does not carry (all but a client socket's turns).
    transport: Transport = Transport.HTTP1
    http_transport: Transport = Transport.HTTP1
    # A Vertex upstream whose access token the gateway obtains: `target.key` is empty until
    # the token is put in (docs/cloud.md); a token that cannot be had skips the upstream.
    token_source: GoogleTokenSource | None = None

    def candidate(self) -> CandidateRef:
        """This destination as the attempt machine takes it."""
        return CandidateRef(name=self.name, sticky=self.sticky, context_window=self.context_window)

    def client_model(self, requested: str) -> str:
        """The model name the client's answer shows: `requested`, or the one sent upstream."""
        return self.target.model if self.show_served else requested


def transport_of(provider: Provider, *, http: bool = False) -> Transport:
    """How `provider` is reached: over its own Responses socket with ``responses_transport:
    websocket`` (a client socket's turns; `http` True: what goes over HTTP all the same), else
    HTTP/2 with ``http2: true``, else HTTP/1.1."""
    if not http and provider.responses_transport is ResponsesTransport.WEBSOCKET:
        return Transport.RESPONSES_SOCKET
    return Transport.HTTP2 if provider.http2 else Transport.HTTP1


_CONFIG_CATALOG = ConfigCatalog()


def destination(
    config: Config,
    cand: Candidate,
    sticky: str | None,
    env: Mapping[str, str],
    catalog: Catalog | None = None,
) -> Destination | CredentialFault:
    """Where routing's candidate `cand` goes: its provider's URL, key, headers and transport,
    the key and headers read from `env` at send time, the model's figures from `catalog`
    (default: `ConfigCatalog`, the config's ``model_specs`` only). A variable not set or a value
    no header can carry is a `CredentialFault` (which never holds the value): that upstream is
    skipped."""
    provider = config.provider(cand.provider)
    creds = resolve_credentials(provider, env)
    if isinstance(creds, CredentialFault):
        return creds
    key, base_url, aws = creds.key, provider.base_url, None
    if provider.bedrock is not None:
        signing = resolve_aws(provider, env)
        if isinstance(signing, CredentialFault):
            return signing
        aws = signing
        if aws.credentials is None and provider.key is None:
            found = bedrock_key(provider, env)
            if isinstance(found, CredentialFault):
                return found
            key = found
        base_url = base_url or bedrock_base_url(aws.region)
    cloud, token_source = None, None
    if provider.cloud is not None:
        access = resolve_cloud(provider, cand.model, key, env)
        if isinstance(access, CredentialFault):
            return access
        cloud, base_url, key = access.route, access.base_url, access.key
        token_source = access.token_source
    facts = catalog if catalog is not None else _CONFIG_CATALOG
    return Destination(
        name=provider.name,
        target=UpstreamTarget(
            dialect=provider.protocol,
            base_url=base_url,
            key=key,
            model=cand.model,
            headers=tuple((k.lower().encode(), v.encode()) for k, v in creds.headers),
            forward_mock_headers=provider.forward_mock_headers,
            aws=aws,
            converse=provider.bedrock is not None and provider.bedrock.converse,
            cloud=cloud,
        ),
        sticky=cand.provider == sticky,
        max_tokens=cand.overrides.max_tokens,
        reasoning=cand.overrides.reasoning,
        output_limit=facts.max_output_tokens(config, cand.provider, cand.model),
        connect_timeout=provider.connect_timeout_secs,
        max_answer_bytes=provider.max_answer_bytes,
        context_window=facts.context_window(config, cand.provider, cand.model),
        show_served=config.answer_model is AnswerModel.SERVED,
        transport=transport_of(provider),
        http_transport=transport_of(provider, http=True),
        token_source=token_source,
    )


def destinations(
    config: Config,
    candidates: Sequence[Candidate],
    sticky: str | None,
    env: Mapping[str, str],
    catalog: Catalog | None = None,
) -> tuple[list[Destination], list[CredentialFault]]:
    """`destination` of each candidate, in order: the usable ones, and the faults of those
    skipped for their credentials."""
    usable: list[Destination] = []
    faults: list[CredentialFault] = []
    for cand in candidates:
        built = destination(config, cand, sticky, env, catalog)
        if isinstance(built, CredentialFault):
            faults.append(built)
        else:
            usable.append(built)
    return usable, faults


def request_destinations(
    config: Config,
    candidates: Sequence[Candidate],
    sticky: str | None,
    env: Mapping[str, str],
    catalog: Catalog | None = None,
    *,
    counting: bool = False,
) -> tuple[list[Destination], list[CredentialFault], GatewayError | None]:
    """`destinations` for one admitted request: the usable ones (for a token count, `counting`,
    only the first: a count is never retried), the faults of those skipped, and the refusal
    when every candidate was skipped (None: go on). Admission routes a request only with
    candidates (`twengine.admission.Routed`; it refuses or answers the others)."""
    usable, faults = destinations(config, candidates, sticky, env, catalog)
    if faults and not usable:
        return usable, faults, no_usable_credentials(faults)
    return (usable[:1] if counting else usable), faults, None


def reasoning_level(effort: Effort | None) -> ReasoningLevel:
    """The rule level that sends `effort`: none is off, and minimal (OpenAI's lowest, with no
    rule level of its own) is low."""
    if effort is None or effort is Effort.NONE:
        return ReasoningLevel.OFF
    if effort is Effort.MINIMAL:
        return ReasoningLevel.LOW
    return ReasoningLevel(effort.value)


def no_usable_credentials(faults: Sequence[CredentialFault]) -> GatewayError:
    """The refusal of a request none of whose upstreams has usable credentials: what is wrong
    with each (a variable not set, a value no header can carry — never the value itself)."""
    return GatewayError(
        status=503,
        category=ErrorCategory.CONFIG,
        code=faults[0].code,
        message="no upstream for this request has usable credentials: "
        + "; ".join(f.message for f in faults),
    )
