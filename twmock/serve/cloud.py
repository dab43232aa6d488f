"""The mock's cloud endpoints: Vertex AI (Gemini and Anthropic publishers), its OAuth token
endpoint, and Azure OpenAI.

Each cloud call is planned as the first-party request it wraps — so every script knob (errors,
``fail_first``, stream errors, cuts, stalls) plays the same — after the platform's own checks:

* **Vertex AI**: ``POST /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:
  generateContent`` (``:streamGenerateContent``, ``:countTokens``) is the Gemini API's call;
  ``…/publishers/anthropic/models/{m}:rawPredict`` (``:streamRawPredict``) is a Messages call
  whose body has no ``model`` and has ``anthropic_version: vertex-2023-10-16``. With
  ``MockSettings.vertex_tokens`` or ``google_service_accounts`` set, a request needs
  ``Authorization: Bearer`` with a token the mock issued (and not expired) or a static one;
  else it is Google's 401 ``UNAUTHENTICATED``.
* **The token endpoint** ``POST /token``: the OAuth 2.0 JWT-bearer grant a service-account key
  file's ``token_uri`` names. The assertion's signature is verified (google-auth's own
  verifier) with the public key of its issuer in ``google_service_accounts``, its audience
  must be this endpoint and its times current; the access token issued lasts
  ``google_token_lifetime`` seconds. A bad grant is Google's 400 ``invalid_grant``.
* **Azure OpenAI**: ``/openai/deployments/{d}/chat/completions?api-version=…``,
  ``/openai/responses?api-version=…`` and the v1 paths ``/openai/v1/chat/completions``,
  ``/openai/v1/responses``. With ``azure_api_key`` or ``azure_entra_token`` set, the
  ``api-key`` header (or the bearer token) must match, else Azure's 401. A streamed Chat answer
  opens with Azure's ``prompt_filter_results`` chunk (no choices), as Azure's does.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, unquote

from twmock.answer import Ids
from twmock.formats._wire import compact
from twmock.plan import Chunk, End, Head, Plan, RequestInfo
from twmock.script import ErrorSpec, MockSettings
from twmock.shapes import named_error
from twproto import json_dumps, json_loads

__all__ = [
    "CloudCall",
    "GoogleTokenLog",
    "as_first_party",
    "cloud_call",
    "cloud_refusal",
    "token_plan",
    "with_azure_filter_chunk",
]

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"

_VERTEX = re.compile(
    r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/publishers/"
    r"(?P<publisher>google|anthropic)/models/(?P<model>[^/:]+):(?P<method>[A-Za-z]+)"
)
_AZURE = re.compile(
    r"/openai/(?:deployments/(?P<deployment>[^/]+)/(?P<chat>chat/completions)"
    r"|(?P<responses>responses)|v1/(?P<v1>chat/completions|responses))"
)
_GEMINI_METHODS = {"generateContent", "streamGenerateContent", "countTokens"}
_ANTHROPIC_METHODS = {"rawPredict", "streamRawPredict"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudCall:
    """A cloud call: `platform` ``vertex`` or ``azure``; the first-party `path` it wraps; the
    model (Vertex) or deployment (Azure, None when the body names it); the Vertex method."""

    platform: str
    path: str
    model: str | None = None
    method: str = ""
    anthropic: bool = False
    versioned: bool = False


@dataclass(slots=True)
class GoogleTokenLog:
    """The access tokens the token endpoint issued (token → expiry, epoch seconds) and how many
    grants it answered."""

    issued: dict[str, float] = field(default_factory=dict)
    grants: int = 0
    refused: int = 0


def cloud_call(method: str, path: str) -> CloudCall | None:
    """The Vertex or Azure call `path` (profile segment removed) names, or None."""
    if method != "POST":
        return None
    found = _VERTEX.fullmatch(path)
    if found is not None:
        model = unquote(found["model"])
        verb = found["method"]
        if found["publisher"] == "google" and verb in _GEMINI_METHODS:
            return CloudCall(
                platform="vertex", path=f"/v1beta/models/{model}:{verb}", model=model, method=verb
            )
        if found["publisher"] == "anthropic" and verb in _ANTHROPIC_METHODS:
            return CloudCall(
                platform="vertex", path="/v1/messages", model=model, method=verb, anthropic=True
            )
        return None
    found = _AZURE.fullmatch(path)
    if found is None:
        return None
    if found["chat"]:
        deployment = unquote(found["deployment"])
        return CloudCall(
            platform="azure", path="/v1/chat/completions", model=deployment, versioned=True
        )
    if found["responses"]:
        return CloudCall(platform="azure", path="/v1/responses", versioned=True)
    return CloudCall(platform="azure", path="/v1/" + found["v1"])


def _shape(name: str, info: RequestInfo, outcome: str = "auth") -> Plan:
    reply = named_error(name, ErrorSpec(), model="", ids=Ids(info.seed), now=int(info.now))
    steps = (Head(status=reply.status, headers=reply.headers), Chunk(data=reply.body), End())
    return Plan(steps=steps, outcome=outcome)


def _header(info: RequestInfo, name: bytes) -> str | None:
    value = info.header(name)
    return None if value is None else value.decode("latin-1")


def cloud_refusal(
    settings: MockSettings, tokens: GoogleTokenLog, info: RequestInfo, call: CloudCall
) -> Plan | None:
    """The platform's 401 (or 404 for an Azure path without its api-version) for this request,
    or None when it passes."""
    auth = _header(info, b"authorization") or ""
    bearer = auth[7:] if auth.startswith("Bearer ") else None
    if call.platform == "vertex":
        if not settings.vertex_tokens and not settings.google_service_accounts:
            return None
        if bearer is None:
            return _shape("vertex-missing-credential", info)
        expiry = tokens.issued.get(bearer)
        if bearer in settings.vertex_tokens or (expiry is not None and info.now < expiry):
            return None
        return _shape("vertex-unauthenticated", info)
    if call.versioned and "api-version" not in dict(parse_qsl(info.query)):
        body = compact({"error": {"code": "404", "message": "Resource not found"}})
        headers = ((b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)))
        return Plan(
            steps=(Head(status=404, headers=headers), Chunk(data=body), End()), outcome="not_found"
        )
    if settings.azure_api_key is None and settings.azure_entra_token is None:
        return None
    if bearer is not None and settings.azure_entra_token is not None:
        if secrets.compare_digest(bearer, settings.azure_entra_token):
            return None
        return _shape("azure-token-unauthorized", info)
    key = _header(info, b"api-key")
    if (
        key is not None
        and settings.azure_api_key is not None
        and secrets.compare_digest(key, settings.azure_api_key)
    ):
        return None
    return _shape("azure-unauthorized", info)


def _bad_request(message: str, *, google: bool) -> Plan:
    if google:
        error = {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}
    else:
        error = {"type": "invalid_request_error", "message": message}
    body = compact({"error": error} if google else {"type": "error", "error": error})
    headers = ((b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)))
    return Plan(
        steps=(Head(status=400, headers=headers), Chunk(data=body), End()), outcome="bad_request"
    )


def _roleless(body: bytes) -> bool:
    try:
        parsed = json_loads(body)
    except ValueError:
        return False
    contents = parsed.get("contents") if isinstance(parsed, dict) else None
    if not isinstance(contents, list):
        return False
    return any(isinstance(c, dict) and c.get("role") not in ("user", "model") for c in contents)


def as_first_party(info: RequestInfo, call: CloudCall) -> RequestInfo | Plan:
    """`info` as the first-party request the cloud call wraps, or the platform's 400."""
    if call.platform == "vertex" and not call.anthropic:
        # Vertex, unlike the Gemini API, refuses a content without its role.
        if _roleless(info.body):
            return _bad_request("Please use a valid role: user, model.", google=True)
        query = info.query if call.method == "streamGenerateContent" else ""
        return replace(info, path=call.path, query=query)
    try:
        body = json_loads(info.body)
    except ValueError:
        return _bad_request("Invalid JSON payload received.", google=call.platform == "vertex")
    if not isinstance(body, dict):
        return _bad_request("Invalid JSON payload received.", google=call.platform == "vertex")
    if call.anthropic:
        version = body.pop("anthropic_version", None)
        if version != VERTEX_ANTHROPIC_VERSION:
            return _bad_request(
                f"anthropic_version: Input should be '{VERTEX_ANTHROPIC_VERSION}'", google=False
            )
        if "model" in body:
            return _bad_request("model: Extra inputs are not permitted", google=False)
        body["model"] = call.model
        if call.method == "streamRawPredict":
            body["stream"] = True
    elif call.model is not None:
        body["model"] = call.model  # the deployment serves its model whatever the body says
    return replace(info, path=call.path, query="", body=json_dumps(body))


_FILTER_RESULTS = {
    "hate": {"filtered": False, "severity": "safe"},
    "jailbreak": {"filtered": False, "detected": False},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": False, "severity": "safe"},
}


def with_azure_filter_chunk(result: Plan, call: CloudCall) -> Plan:
    """A streamed Chat answer as Azure opens it: a first chunk with no choices that carries
    the prompt's content filter results."""
    if not call.path.endswith("/chat/completions") or result.status != 200:
        return result
    head = result.head
    kind = (result.header(b"content-type") or b"").split(b";")[0]
    if head is None or kind != b"text/event-stream":
        return result
    first = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": _FILTER_RESULTS}],
    }
    chunk = Chunk(data=b"data: " + json_dumps(first) + b"\n\n")
    steps = list(result.steps)
    at = steps.index(head) + 1
    steps.insert(at, chunk)
    return replace(result, steps=tuple(steps))


def _grant_error(tokens: GoogleTokenLog, error: str, description: str) -> Plan:
    tokens.refused += 1
    body = compact({"error": error, "error_description": description})
    headers = (
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
    )
    return Plan(steps=(Head(status=400, headers=headers), Chunk(data=body), End()), outcome="auth")


_TIMES = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)


def token_plan(settings: MockSettings, tokens: GoogleTokenLog, info: RequestInfo) -> Plan:
    """The token endpoint's answer to a JWT-bearer grant."""
    form = dict(parse_qsl(info.body.decode("latin-1")))
    if form.get("grant_type") != JWT_BEARER:
        return _grant_error(
            tokens, "unsupported_grant_type", f"Invalid grant_type: {form.get('grant_type', '')}"
        )
    assertion = form.get("assertion", "")
    from google.auth import jwt  # google-auth is in the test extra, as the mock's verifier

    try:
        unverified = jwt.decode(assertion, verify=False)  # type: ignore[no-untyped-call]
    except ValueError:
        return _grant_error(tokens, "invalid_grant", _TIMES)
    issuer = str(unverified.get("iss", ""))
    public_key = settings.google_service_accounts.get(issuer)
    if public_key is None:
        return _grant_error(tokens, "invalid_grant", "Invalid grant: account not found")
    host = _header(info, b"host") or "localhost"
    # google-auth addresses a service account's grant to Google's token endpoint whatever the
    # key file's token_uri (Google's endpoint takes that audience); the mock's own URL too.
    audience = [GOOGLE_TOKEN_AUDIENCE, f"http://{host}/token"]
    try:
        claims = jwt.decode(  # type: ignore[no-untyped-call]
            assertion, certs=public_key, audience=audience, clock_skew_in_seconds=10
        )
    except ValueError as exc:
        if "signature" in str(exc).lower():
            return _grant_error(tokens, "invalid_grant", "Invalid JWT Signature.")
        return _grant_error(tokens, "invalid_grant", _TIMES)
    if "cloud-platform" not in str(claims.get("scope", "")):
        return _grant_error(
            tokens, "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        )
    token = "ya29.mock-" + secrets.token_urlsafe(24)
    lifetime = settings.google_token_lifetime
    tokens.issued[token] = info.now + lifetime
    tokens.grants += 1
    body = compact({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"})
    headers = (
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
    )
    return Plan(steps=(Head(status=200, headers=headers), Chunk(data=body), End()), outcome="ok")
