"""Which API a request path belongs to, and where a request goes upstream.

Clients are recognised by path alone (docs/operations.md); a leading ``/v1`` is optional where the
real API has one, so SDKs configured with or without it both work. Upstream paths are what each
official SDK appends to its base URL (docs/configuration.md, "providers").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote

from twproto.dialect import Dialect

__all__ = (
    "Operation",
    "PathRoute",
    "guess_client_dialect",
    "match_path",
    "split_target",
    "upstream_path",
)


class Operation(StrEnum):
    GENERATE = "generate"
    COUNT_TOKENS = "count_tokens"
    LIST_MODELS = "list_models"
    GET_MODEL = "get_model"
    HEALTH = "health"


@dataclass(frozen=True, slots=True, kw_only=True)
class PathRoute:
    """A recognised client path.

    `dialect` is None for paths that do not fix one (model listing, health): the caller picks
    the shape from headers. `model` is set for Gemini (the model is in the path) and for
    ``GET /v1/models/{id}``. `stream` is True for Gemini's ``:streamGenerateContent``; `sse`
    tells whether that stream is SSE (``alt=sse``) or a JSON array.
    """

    operation: Operation
    dialect: Dialect | None = None
    model: str | None = None
    stream: bool = False
    sse: bool = True


_POST_ROUTES: dict[str, tuple[Dialect, Operation]] = {
    "/v1/messages": (Dialect.ANTHROPIC, Operation.GENERATE),
    "/messages": (Dialect.ANTHROPIC, Operation.GENERATE),
    "/v1/messages/count_tokens": (Dialect.ANTHROPIC, Operation.COUNT_TOKENS),
    "/messages/count_tokens": (Dialect.ANTHROPIC, Operation.COUNT_TOKENS),
    "/v1/chat/completions": (Dialect.OPENAI_CHAT, Operation.GENERATE),
    "/chat/completions": (Dialect.OPENAI_CHAT, Operation.GENERATE),
    "/v1/responses": (Dialect.OPENAI_RESPONSES, Operation.GENERATE),
    "/responses": (Dialect.OPENAI_RESPONSES, Operation.GENERATE),
    "/backend-api/codex/responses": (Dialect.OPENAI_RESPONSES, Operation.GENERATE),
}

_GEMINI_METHOD = re.compile(r"^/(?:v1beta|v1|v1alpha)/models/([^/:]+):([A-Za-z]+)$")
_GET_MODEL = re.compile(r"^/(?:v1/|v1beta/)?models/([^/]+)$")


def split_target(target: bytes) -> tuple[str, str]:
    """Split a request target into (path, query) as text; ``?`` itself is dropped."""
    text = target.decode("latin-1")
    path, _, query = text.partition("?")
    return path, query


def _query_has(query: str, name: str, value: str) -> bool:
    return any(part == f"{name}={value}" for part in query.split("&"))


def match_path(method: str, path: str, query: str = "") -> PathRoute | None:
    """Recognise a client request; None when the path is not one the gateway serves."""
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/")
    if method == "POST":
        known = _POST_ROUTES.get(path)
        if known is not None:
            return PathRoute(operation=known[1], dialect=known[0])
        m = _GEMINI_METHOD.match(path)
        if m is not None:
            model, verb = m.group(1), m.group(2)
            if verb == "generateContent":
                return PathRoute(operation=Operation.GENERATE, dialect=Dialect.GEMINI, model=model)
            if verb == "streamGenerateContent":
                return PathRoute(
                    operation=Operation.GENERATE,
                    dialect=Dialect.GEMINI,
                    model=model,
                    stream=True,
                    sse=_query_has(query, "alt", "sse"),
                )
            if verb == "countTokens":
                return PathRoute(
                    operation=Operation.COUNT_TOKENS, dialect=Dialect.GEMINI, model=model
                )
        return None
    if method in ("GET", "HEAD"):
        if path == "/healthz":
            return PathRoute(operation=Operation.HEALTH)
        if path in ("/v1/models", "/models"):
            return PathRoute(operation=Operation.LIST_MODELS)
        if path == "/v1beta/models":
            return PathRoute(operation=Operation.LIST_MODELS, dialect=Dialect.GEMINI)
        m = _GET_MODEL.match(path)
        if m is not None:
            dialect = Dialect.GEMINI if path.startswith("/v1beta/") else None
            return PathRoute(operation=Operation.GET_MODEL, dialect=dialect, model=m.group(1))
    return None


def guess_client_dialect(
    path: str | None, headers: Sequence[tuple[bytes, bytes]] | None = None
) -> Dialect:
    """The format to answer in when the path does not fix one (an unknown path, a refusal, the
    model listing).

    A known path decides; then a path that looks like one API's (``/v1beta…`` is Gemini's,
    ``…/messages…`` Anthropic's); then the SDK's key header: Anthropic's (or its
    ``anthropic-version``) before Gemini's, since google-genai also lists models under
    ``/v1/models``. Anything else is answered as OpenAI Chat, the format most clients read.
    """
    if path:
        route = match_path("POST", path) or match_path("GET", path)
        if route is not None and route.dialect is not None:
            return route.dialect
        if path.startswith("/v1beta"):
            return Dialect.GEMINI
        if "/messages" in path:
            return Dialect.ANTHROPIC
    names = {name for name, _ in headers or ()}
    if b"anthropic-version" in names or b"x-api-key" in names:
        return Dialect.ANTHROPIC
    if b"x-goog-api-key" in names:
        return Dialect.GEMINI
    return Dialect.OPENAI_CHAT


def upstream_path(
    dialect: Dialect, operation: Operation, *, model: str, stream: bool, sse: bool = True
) -> str:
    """The path (with query) the official SDK of `dialect` appends to its base URL."""
    if dialect is Dialect.ANTHROPIC:
        return (
            "/v1/messages/count_tokens" if operation is Operation.COUNT_TOKENS else "/v1/messages"
        )
    if dialect is Dialect.OPENAI_CHAT:
        return "/chat/completions"
    if dialect is Dialect.OPENAI_RESPONSES:
        return "/responses"
    name = quote(model, safe="-._~")
    if operation is Operation.COUNT_TOKENS:
        return f"/v1beta/models/{name}:countTokens"
    if not stream:
        return f"/v1beta/models/{name}:generateContent"
    return f"/v1beta/models/{name}:streamGenerateContent" + ("?alt=sse" if sse else "")
