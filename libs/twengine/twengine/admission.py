"""Admission: whether a generation request goes upstream, is answered here, or is refused.

`admit` runs the checks a request passes before any upstream sees it, in order, and returns
one of three values (docs/operations.md, "What a client may send"; docs/balancing.md):

1. the body must be a JSON object, and name a model (in the body, or for Gemini in the path) —
   else `Refusal` with 400 ``gw.request.bad_json``; a name longer than
   ``listen.gateway.max_model_name_chars`` is 400 ``gw.request.model_name_too_long`` (it would
   be echoed in headers, rows, events and metrics);
2. every `AdmissionCheck` the caller passes, in order; the first refusal wins. This is where
   per-key limits plug in: a check sees the `RequestFacts` routing will see and the time, and
   returns a `GatewayError` to refuse with, or None. No upstream has been chosen yet, so a
   refused request moves no balancer and takes no slot;
3. routing (`Router.plan`, which takes the balancer's step): a rule's ``deny`` is `Refusal` 403
   ``gw.rule.denied``; no candidate is `Refusal` 404 (no upstream offers the model) or 503 (no
   upstream at all), ``gw.no_upstream``;
4. a token count goes only to an upstream of the client's own format, the first one; with none,
   it is `LocalAnswer` with an estimate (``x-thinkwatch-local: 1``).

Otherwise the request is `Routed` with its plan. Every outcome carries `RequestView`, what the
request row records of it so far. Waiting for a key's ``max_concurrent`` permit is not a
decision but a wait, and stays with the caller.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twengine.affinity import conversation_key, fingerprint, is_new_turn, session_id
from twengine.config import BedrockCount, Config
from twengine.router import RoutePlan, Router
from twengine.rules import Candidate, RequestFacts
from twproto import json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.paths import Operation, PathRoute
from twproto.structure import check_structure
from twproto.summary import RequestSummary, count_tokens_body, summarize

__all__ = (
    "AdmissionCheck",
    "AdmissionRequest",
    "LocalAnswer",
    "Refusal",
    "RequestView",
    "Routed",
    "admit",
    "check_caller",
    "key_busy",
    "model_name_refusal",
    "routing_view",
    "shown_model",
)

#: One more admission step: refuse with an error, or None to let the request on.
AdmissionCheck = Callable[[RequestFacts, float], GatewayError | None]

_SESSION_LIMIT = 200  # characters of a session id kept in the row


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """A generation request as admission sees it: the recognised `route`, the client's
    `dialect`, the raw `body`, the name of its gateway key and its headers (names lower-case).
    `parsed` is `body` already parsed where the caller had to read it anyway (a Responses
    WebSocket turn comes as a JSON message): admission takes it instead of parsing again."""

    route: PathRoute
    dialect: Dialect
    body: bytes
    client: str
    headers: Sequence[tuple[bytes, bytes]] = ()
    parsed: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestView:
    """What the request row records of an admission: the model asked, stream or not, the
    session id, and the routing JSON (route, rule, group, skipped, paused, full, sticky)."""

    model: str | None = None
    stream: bool = False
    session: str | None = None
    routing: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Answer `error` in the client's format; nothing goes upstream."""

    error: GatewayError
    view: RequestView = field(default_factory=RequestView)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalAnswer:
    """Answer here: `status`, `headers` and `body`; `input_tokens` is the estimate it gives."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    input_tokens: int
    view: RequestView


@dataclass(frozen=True, slots=True, kw_only=True)
class Routed:
    """Send the request to `candidates`, in order (a token count: to the first that can take
    it).

    `conversation` is its conversation key (None when it belongs to none), for recording which
    upstream answered it.
    """

    model: str
    stream: bool
    plan: RoutePlan
    candidates: tuple[Candidate, ...]
    conversation: str | None
    summary: RequestSummary
    body: dict[str, Any]  # the parsed request body
    view: RequestView


Admission = Routed | LocalAnswer | Refusal


def _bad_json(message: str, view: RequestView | None = None) -> Refusal:
    error = GatewayError(
        status=400, category=ErrorCategory.REQUEST, code="gw.request.bad_json", message=message
    )
    return Refusal(error=error, view=view or RequestView())


def model_name_refusal(model: str, limit: int) -> GatewayError | None:
    """The refusal of a model name longer than `limit` characters, or None."""
    if len(model) <= limit:
        return None
    return GatewayError(
        status=400,
        category=ErrorCategory.REQUEST,
        code="gw.request.model_name_too_long",
        message=f"the model name is {len(model)} characters long; at most {limit} are accepted",
    )


def shown_model(model: str, limit: int) -> str:
    """`model` as a row or event records it: cut at `limit` characters, marked with ``…``."""
    return model if len(model) <= limit else model[:limit] + "…"


def routing_view(plan: RoutePlan) -> dict[str, Any]:
    """The routing JSON of the request row for `plan`."""
    decision = plan.decision
    return {
        "route": decision.route,
        "rule": decision.rule,
        "group": decision.group,
        "skipped": [
            {"provider": s.provider, "model": s.model, "reason": s.reason.value}
            for s in decision.skipped
        ],
        # Candidates ordered last because they were paused or full when the request came.
        "paused": list(plan.paused),
        "full": list(plan.full),
        "sticky": plan.sticky,
        # Whether the conversation stayed on the upstream that last answered it, and why.
        "affinity": (
            {"upstream": plan.last_upstream, "kept": plan.sticky is not None, "why": plan.affinity}
            if plan.affinity is not None
            else None
        ),
        "held": plan.held,  # the routing decision made at the turn's start, kept for it
    }


def admit(
    request: AdmissionRequest,
    *,
    router: Router,
    config: Config,
    now: float,
    checks: Sequence[AdmissionCheck] = (),
) -> Admission:
    """Admit, answer or refuse `request` (see the module notes). `now` is the router's clock."""
    body: object = request.parsed
    if body is None:
        try:
            body = json_loads(request.body) if request.body else None
        except ValueError:
            body = None
    if not isinstance(body, dict):
        return _bad_json("the request body must be a JSON object")
    route, dialect = request.route, request.dialect
    fault = check_structure(dialect, body)
    if fault is not None:
        # Checked here because a same-format body goes upstream without being decoded.
        error = GatewayError(
            status=400,
            category=ErrorCategory.REQUEST,
            code="gw.request.invalid_body",
            message=fault.message,
        )
        return Refusal(error=error)
    model = route.model if route.model is not None else body.get("model")
    stream = route.stream if dialect is Dialect.GEMINI else bool(body.get("stream"))
    if not isinstance(model, str) or not model:
        return _bad_json("the request names no model")
    limit = config.listen.gateway.max_model_name_chars
    too_long = model_name_refusal(model, limit)
    if too_long is not None:
        return Refusal(error=too_long, view=RequestView(model=shown_model(model, limit)))
    summary = summarize(body, dialect)
    session = session_id(request.headers, prompt_cache_key=summary.prompt_cache_key)
    view = RequestView(
        model=model, stream=stream, session=session[:_SESSION_LIMIT] if session else None
    )
    if config.has_client(request.client) and not config.client(request.client).allows_model(model):
        error = GatewayError(
            status=403,
            category=ErrorCategory.DENIED,
            code="gw.key.model_not_allowed",
            message=f"this gateway key may not use the model {model!r}",
        )
        return Refusal(error=error, view=view)
    facts = RequestFacts(
        model=model,
        dialect=dialect,
        client=request.client,
        input_tokens=summary.input_tokens,
        max_tokens=summary.max_tokens,
        tool_count=summary.tool_count,
        tools=summary.tool_count > 0,
        image=summary.image,
        thinking=summary.thinking,
        stream=stream,
    )
    for check in checks:
        refusal = check(facts, now)
        if refusal is not None:
            return Refusal(error=refusal, view=view)
    first_user = summary.first_user_text
    conversation = conversation_key(
        session, fingerprint(summary.system_text, first_user) if first_user else None
    )
    counting = route.operation is Operation.COUNT_TOKENS
    plan = router.plan(
        facts,
        now=now,
        conversation=conversation,
        new_turn=is_new_turn(summary.last_kind),
        take_turn=not counting,  # a token count is no turn of the balancer or the conversation
    )
    decision = plan.decision
    view = RequestView(
        model=view.model, stream=view.stream, session=view.session, routing=routing_view(plan)
    )
    if decision.denied:
        error = GatewayError(
            status=403,
            category=ErrorCategory.DENIED,
            code="gw.rule.denied",
            message=decision.deny_message or "this request is not allowed",
        )
        return Refusal(error=error, view=view)
    if not plan.candidates:
        error = GatewayError(
            status=404 if decision.skipped else 503,
            category=ErrorCategory.CONFIG,
            code="gw.no_upstream",
            message=f"no upstream offers the model {model!r}"
            if decision.skipped
            else "no upstream is configured",
        )
        return Refusal(error=error, view=view)
    candidates = plan.candidates
    if counting:
        # Token counts go only to an upstream of the client's own format (the first whose
        # credentials resolve: the caller takes it), never retried; with none, they are
        # estimated here. A Bedrock upstream counts through CountTokens, for an Anthropic and a
        # Gemini client alike (the count is Bedrock's own call, not a generation request),
        # unless its `count_tokens` says to estimate (left out here) or to refuse (the first
        # such: 501).
        candidates = tuple(
            c
            for c in candidates
            if _counts_for(config, c, dialect)
            and _bedrock_count(config, c) is not BedrockCount.ESTIMATE
            and config.provider(c.provider).cloud is None  # nor Vertex's or Azure's
        )
        if candidates and _bedrock_count(config, candidates[0]) is BedrockCount.REFUSE:
            error = GatewayError(
                status=501,
                category=ErrorCategory.CONFIG,
                code="gw.count_tokens.refused",
                message=f"token counts are not served through the upstream "
                f"{candidates[0].provider!r} (count_tokens: refuse)",
            )
            return Refusal(error=error, view=view)
        if not candidates:
            body_out = count_tokens_body(dialect, summary.input_tokens)
            return LocalAnswer(
                status=200,
                headers=((b"content-type", b"application/json"), (b"x-thinkwatch-local", b"1")),
                body=body_out,
                input_tokens=summary.input_tokens,
                view=view,
            )
    return Routed(
        model=model,
        stream=stream,
        plan=plan,
        candidates=candidates,
        conversation=conversation,
        summary=summary,
        body=body,
        view=view,
    )


def _counts_for(config: Config, cand: Candidate, dialect: Dialect) -> bool:
    """Whether `cand` can answer a token count from a `dialect` client."""
    provider = config.provider(cand.provider)
    if provider.bedrock is not None:
        return dialect in (Dialect.ANTHROPIC, Dialect.GEMINI)
    return provider.protocol is dialect


def _bedrock_count(config: Config, cand: Candidate) -> BedrockCount | None:
    """A Bedrock candidate's ``count_tokens`` setting; None for any other upstream."""
    bedrock = config.provider(cand.provider).bedrock
    return bedrock.count_tokens if bedrock is not None else None


def check_caller(
    *,
    method: str,
    path: str,
    route: PathRoute | None,
    address_allowed: bool,
    client: str | None,
    key_presented: bool,
    browser: GatewayError | None = None,
    expired_at: float | None = None,
) -> Refusal | LocalAnswer | None:
    """The checks every request passes first, in order: the client's address (before the key),
    the path, what gives a web page's request away (`browser`: `twengine.browser`'s verdict),
    the gateway key (`expired_at`: the wall-clock time the client's key expired, if it has).
    None: go on (model listing or generation).

    A path the gateway does not serve is 404, except ``HEAD`` anything and ``GET /``, Claude
    Code's warm-up probe, answered 200 at once without a key; ``/healthz`` answers ``ok``.
    """
    if not address_allowed:
        return _refused(
            403,
            ErrorCategory.DENIED,
            "gw.auth.denied_address",
            "this address may not use the gateway",
        )
    if route is None:
        if method == "HEAD" or (method == "GET" and path == "/"):
            return _plain(b"")
        return _refused(
            404, ErrorCategory.REQUEST, "gw.request.not_found", f"no API at {method} {path}"
        )
    if route.operation is Operation.HEALTH:
        return _plain(b"ok")
    if browser is not None:
        return Refusal(error=browser)
    if client is None:
        if key_presented:
            return _refused(401, ErrorCategory.AUTH, "gw.auth.bad_key", "invalid gateway key")
        return _refused(401, ErrorCategory.AUTH, "gw.auth.missing_key", "missing gateway key")
    if expired_at is not None:
        when = dt.datetime.fromtimestamp(expired_at, dt.UTC).isoformat(timespec="seconds")
        return _refused(
            401, ErrorCategory.AUTH, "gw.auth.key_expired", f"this gateway key expired at {when}"
        )
    return None


def key_busy(limit: int) -> GatewayError:
    """The refusal of a request whose key stayed at its ``max_concurrent`` until the wait's
    end."""
    return GatewayError(
        status=429,
        category=ErrorCategory.RATE_LIMITED,
        code="gw.key.busy",
        message=f"this key already has {limit} requests running",
        retry_after=1.0,
    )


def _refused(status: int, category: ErrorCategory, code: str, message: str) -> Refusal:
    error = GatewayError(status=status, category=category, code=code, message=message)
    return Refusal(error=error)


def _plain(body: bytes) -> LocalAnswer:
    return LocalAnswer(
        status=200,
        headers=((b"content-type", b"text/plain"),),
        body=body,
        input_tokens=0,
        view=RequestView(),
    )
