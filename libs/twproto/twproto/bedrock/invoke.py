"""The InvokeModel request for a ``bedrock-anthropic`` upstream.

Bedrock's Anthropic models take the Anthropic Messages body with three changes: the model id is
in the path (``/model/{id}/invoke``, or ``/invoke-with-response-stream`` for a stream), so the
body has no ``model`` and no ``stream``; ``anthropic_version`` is ``bedrock-2023-05-31``; and
the beta flags an Anthropic client sends as the ``anthropic-beta`` header go in the body as
``anthropic_beta``. The request is signed with SigV4 (`twproto.sigv4`), or carries a Bedrock API
key as a bearer token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from twproto import _json
from twproto.sigv4 import AwsCredentials, sign_request

__all__ = (
    "BEDROCK_ANTHROPIC_VERSION",
    "AwsAuth",
    "bedrock_base_url",
    "host_header",
    "invoke_body",
    "invoke_path",
    "invoke_request",
    "signed_headers",
)

BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"

Header = tuple[bytes, bytes]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True, kw_only=True)
class AwsAuth:
    """How a Bedrock request is authenticated: SigV4 with `credentials` in `region`, or (with
    `credentials` None) the Bedrock API key as a bearer token."""

    region: str
    credentials: AwsCredentials | None = None


def bedrock_base_url(region: str) -> str:
    """The Bedrock runtime endpoint of `region`."""
    return f"https://bedrock-runtime.{region}.amazonaws.com"


def invoke_path(model: str, *, stream: bool) -> str:
    """``/model/{id}/invoke`` (or ``invoke-with-response-stream``), the id percent-encoded
    whole (an inference profile ARN holds ``:`` and ``/``)."""
    action = "invoke-with-response-stream" if stream else "invoke"
    return f"/model/{quote(model, safe='')}/{action}"


def _betas(headers: Sequence[Header]) -> list[str]:
    betas: list[str] = []
    for name, value in headers:
        if name == b"anthropic-beta":
            for flag in value.decode("latin-1").split(","):
                flag = flag.strip()
                if flag and flag not in betas:
                    betas.append(flag)
    return betas


def invoke_body(body: bytes, client_headers: Sequence[Header] = ()) -> bytes:
    """The Anthropic Messages `body` (already translated for the upstream) as InvokeModel takes
    it; `client_headers`' ``anthropic-beta`` flags join the body's ``anthropic_beta``."""
    obj: dict[str, Any] = _json.loads(body)
    obj.pop("model", None)
    obj.pop("stream", None)
    obj["anthropic_version"] = BEDROCK_ANTHROPIC_VERSION
    betas = _betas(client_headers)
    if betas:
        have = obj.get("anthropic_beta")
        merged = list(have) if isinstance(have, list) else []
        merged += [b for b in betas if b not in merged]
        obj["anthropic_beta"] = merged
    return _json.dumps(obj)


def host_header(url: str) -> bytes:
    """The Host header an HTTP client writes for `url`: the host, and the port unless it is the
    scheme's default (what `twserve.upstream` sends, so what must be signed)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    named = f"[{host}]" if ":" in host else host
    port = parts.port
    if port is None or port == _DEFAULT_PORTS.get(parts.scheme.lower()):
        return named.encode("ascii", "replace")
    return f"{named}:{port}".encode("ascii", "replace")


def invoke_request(
    base_url: str,
    model: str,
    body: bytes,
    *,
    stream: bool,
    auth: AwsAuth,
    key: str,
    headers: Sequence[Header] = (),
    client_headers: Sequence[Header] = (),
    now: float,
) -> tuple[str, list[Header], bytes]:
    """The URL, headers and body of the InvokeModel call for `model` carrying the Anthropic
    `body`: `headers` (the provider's own and the mock's) are sent and signed; `key` is the
    bearer token when `auth` has no credentials. `now` (epoch seconds) dates the signature."""
    url = base_url.rstrip("/") + invoke_path(model, stream=stream)
    data = invoke_body(body, client_headers)
    accept = b"application/vnd.amazon.eventstream" if stream else b"application/json"
    return url, *signed_headers(
        url, data, accept=accept, auth=auth, key=key, headers=headers, now=now
    )


def signed_headers(
    url: str,
    data: bytes,
    *,
    accept: bytes,
    auth: AwsAuth,
    key: str,
    headers: Sequence[Header] = (),
    now: float,
) -> tuple[list[Header], bytes]:
    """The headers of a Bedrock POST of `data` to `url` (JSON, `accept`, `headers`, then the
    SigV4 headers, or `key` as the bearer token when `auth` has no credentials), and `data`."""
    out: list[Header] = [
        (b"content-type", b"application/json"),
        (b"accept", accept),
        (b"accept-encoding", b"identity"),
        *headers,
    ]
    if auth.credentials is None:
        out.append((b"authorization", b"Bearer " + key.encode("latin-1")))
        return out, data
    signing = [(b"host", host_header(url)), *out]
    added = sign_request(
        "POST", url, signing, data, region=auth.region, credentials=auth.credentials, now=now
    )
    return out + added, data
