"""AWS Signature Version 4: signing a request and checking a signed one, with time as an argument.

Bedrock (and every AWS API) authenticates a request by an HMAC-SHA256 signature over a
canonical form of it. The algorithm, as AWS specifies it:

1. *Canonical request*: the method; the path with dot segments and repeated slashes removed,
   URI-encoded once more (the path as sent is already encoded, so a model id's ``%3A`` is
   signed as ``%253A``); the query pairs, each name and value URI-encoded, sorted; every signed
   header as ``name:value`` (lowercased name, value trimmed with inner runs of spaces
   collapsed, repeated headers joined by commas), sorted by name; the list of signed header
   names; the SHA-256 of the body, in hex.
2. *String to sign*: ``AWS4-HMAC-SHA256``, the request time (``x-amz-date``,
   ``YYYYMMDDTHHMMSSZ``), the credential scope ``date/region/service/aws4_request`` and the
   SHA-256 of the canonical request.
3. *Signing key*: HMAC chained over the date, region, service and ``aws4_request``, starting
   from ``"AWS4" + secret``; the signature is the HMAC of the string to sign under it.

`sign_request` returns the headers to add: ``x-amz-date``, ``x-amz-security-token`` with
temporary credentials, and ``authorization``. Every header given is signed except hop-by-hop and
tracing headers that proxies may change (``connection``, ``user-agent``…); ``host`` is the
given header or else the URL's authority, as an HTTP client writes it.

`verify_request` is the server's side, for the mock upstream: it parses ``authorization``,
checks the key, scope, time and token, recomputes the signature over the headers the request
says it signed and compares in constant time. It returns a `SignatureCheck`;
`SIGV4_REFUSALS` has the AWS error (exception name and message) for each refusal.

No clock is read here: ``now`` is epoch seconds, given by the caller.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from urllib.parse import quote, unquote, urlsplit

__all__ = (
    "SIGV4_MAX_SKEW_SECS",
    "SIGV4_REFUSALS",
    "AwsCredentials",
    "SignatureCheck",
    "sign_request",
    "verify_request",
)

#: How far a request's ``x-amz-date`` may be from the verifier's clock (AWS: five minutes).
SIGV4_MAX_SKEW_SECS = 300.0

_ALGORITHM = "AWS4-HMAC-SHA256"
_TERMINATOR = "aws4_request"
_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
# Headers a proxy or HTTP library may add, drop or rewrite on the way: signing them would make a
# signature fail for reasons that have nothing to do with the credentials.
_UNSIGNED = frozenset(
    {
        b"baggage",
        b"connection",
        b"expect",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"traceparent",
        b"tracestate",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"user-agent",
        b"x-amzn-trace-id",
    }
)
# Headers the signature itself sets: a stale copy (a resent request) is replaced, not signed.
_REPLACED = frozenset({b"authorization", b"x-amz-date", b"x-amz-security-token"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 +Credential=([^,\s]+), *SignedHeaders=([^,\s]+), *Signature=([0-9a-f]{64})"
)
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")


@dataclass(frozen=True, slots=True)
class AwsCredentials:
    """An access key, its secret, and the session token of temporary credentials."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


class SignatureCheck(StrEnum):
    """What `verify_request` found."""

    VALID = "valid"
    MISSING = "missing"  # no authorization header, or another scheme
    MALFORMED = "malformed"  # authorization or x-amz-date cannot be read
    UNKNOWN_KEY = "unknown_key"  # signed with another access key
    WRONG_SCOPE = "wrong_scope"  # scope date, region or service do not match
    SKEWED = "skewed"  # x-amz-date too far from now
    TOKEN_MISMATCH = "token_mismatch"  # session token missing, wrong, or not signed
    UNSIGNED_HEADER = "unsigned_header"  # host or x-amz-date not among the signed headers
    MISMATCH = "mismatch"  # the signature is not the one the secret gives


_BAD_SIGNATURE = (
    "InvalidSignatureException",
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details.",
)
_BAD_TOKEN = (
    "UnrecognizedClientException",
    "The security token included in the request is invalid.",
)
#: The 403 answer AWS gives for each refusal: (exception name, message).
SIGV4_REFUSALS: Mapping[SignatureCheck, tuple[str, str]] = {
    SignatureCheck.MISSING: ("MissingAuthenticationTokenException", "Missing Authentication Token"),
    SignatureCheck.MALFORMED: (
        "IncompleteSignatureException",
        "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' "
        "parameters, and a valid 'X-Amz-Date' header.",
    ),
    SignatureCheck.UNKNOWN_KEY: _BAD_TOKEN,
    SignatureCheck.WRONG_SCOPE: (
        "InvalidSignatureException",
        "Credential should be scoped to a valid region and service, and to the request date.",
    ),
    SignatureCheck.SKEWED: ("InvalidSignatureException", "Signature expired."),
    SignatureCheck.TOKEN_MISMATCH: _BAD_TOKEN,
    SignatureCheck.UNSIGNED_HEADER: _BAD_SIGNATURE,
    SignatureCheck.MISMATCH: _BAD_SIGNATURE,
}


def _amz_date(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime(_DATE_FORMAT)


def _canonical_path(path: str) -> str:
    # Dot segments are resolved and empty segments dropped, as AWS services do before checking.
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    normalized = "/" + "/".join(kept)
    if kept and path.endswith("/"):
        normalized += "/"
    return quote(normalized, safe="/~")


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        pairs.append((_encode(unquote(name)), _encode(unquote(value))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def _url_host(url: str) -> bytes:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{port}"
    return host.encode("ascii", "replace")


def _header_map(headers: Sequence[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    found: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        found.setdefault(name.strip().lower(), []).append(b" ".join(value.split()))
    return found


def _canonical_request(
    method: str, url: str, signed: Mapping[bytes, list[bytes]], body: bytes
) -> tuple[bytes, str]:
    parts = urlsplit(url)
    names = sorted(signed)
    lines = [
        method.upper().encode(),
        _canonical_path(parts.path or "/").encode(),
        _canonical_query(parts.query).encode(),
    ]
    lines += [name + b":" + b",".join(signed[name]) for name in names]
    signed_names = ";".join(n.decode("latin-1") for n in names)
    lines += [b"", signed_names.encode("latin-1"), hashlib.sha256(body).hexdigest().encode()]
    return b"\n".join(lines), signed_names


def _signature(
    secret: str, amz_date: str, region: str, service: str, canonical: bytes
) -> tuple[str, str]:
    """The signature and the credential scope."""
    day = amz_date[:8]
    scope = f"{day}/{region}/{service}/{_TERMINATOR}"
    to_sign = "\n".join(
        (_ALGORITHM, amz_date, scope, hashlib.sha256(canonical).hexdigest())
    ).encode()
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, _TERMINATOR):
        key = hmac.digest(key, part.encode(), "sha256")
    return hmac.new(key, to_sign, "sha256").hexdigest(), scope


def sign_request(
    method: str,
    url: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    *,
    region: str,
    credentials: AwsCredentials,
    now: float,
    service: str = "bedrock",
) -> list[tuple[bytes, bytes]]:
    """The headers that sign this request at `now` (epoch seconds); add them, replacing any
    ``authorization``, ``x-amz-date`` or ``x-amz-security-token`` already there."""
    amz_date = _amz_date(now)
    signed = {
        name: values
        for name, values in _header_map(headers).items()
        if name not in _UNSIGNED and name not in _REPLACED
    }
    signed.setdefault(b"host", [_url_host(url)])
    added = [(b"x-amz-date", amz_date.encode())]
    signed[b"x-amz-date"] = [added[0][1]]
    if credentials.session_token:
        token = credentials.session_token.encode()
        added.append((b"x-amz-security-token", token))
        signed[b"x-amz-security-token"] = [token]
    canonical, signed_names = _canonical_request(method, url, signed, body)
    signature, scope = _signature(
        credentials.secret_access_key, amz_date, region, service, canonical
    )
    authorization = (
        f"{_ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    added.append((b"authorization", authorization.encode()))
    return added


def verify_request(
    method: str,
    url: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    *,
    region: str,
    credentials: AwsCredentials,
    now: float,
    service: str = "bedrock",
    max_skew_secs: float = SIGV4_MAX_SKEW_SECS,
) -> SignatureCheck:
    """Check a signed request against the one key the verifier knows. Never raises."""
    found = _header_map(headers)
    auth = found.get(b"authorization")
    if not auth or not auth[0].startswith(_ALGORITHM.encode() + b" "):
        return SignatureCheck.MISSING
    m = _AUTHORIZATION.fullmatch(auth[0].decode("latin-1"))
    dates = found.get(b"x-amz-date")
    if m is None or len(auth) != 1 or not dates or len(dates) != 1:
        return SignatureCheck.MALFORMED
    amz_date = dates[0].decode("latin-1")
    if not _AMZ_DATE.fullmatch(amz_date):
        return SignatureCheck.MALFORMED
    try:
        stamped = datetime.strptime(amz_date, _DATE_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return SignatureCheck.MALFORMED
    credential, signed_list, given = m.groups()
    key_id, _, scope = credential.partition("/")
    if not hmac.compare_digest(key_id.encode(), credentials.access_key_id.encode()):
        return SignatureCheck.UNKNOWN_KEY
    if scope != f"{amz_date[:8]}/{region}/{service}/{_TERMINATOR}":
        return SignatureCheck.WRONG_SCOPE
    if abs(now - stamped) > max_skew_secs:
        return SignatureCheck.SKEWED
    names = signed_list.encode("latin-1").split(b";")
    if b"host" not in names or b"x-amz-date" not in names:
        return SignatureCheck.UNSIGNED_HEADER
    token = found.get(b"x-amz-security-token")
    if credentials.session_token:
        want = credentials.session_token.encode()
        if (
            token is None
            or len(token) != 1
            or not hmac.compare_digest(token[0], want)
            or b"x-amz-security-token" not in names
        ):
            return SignatureCheck.TOKEN_MISMATCH
    elif token is not None:
        return SignatureCheck.TOKEN_MISMATCH
    signed: dict[bytes, list[bytes]] = {}
    for name in names:
        if name == b"host" and name not in found:
            signed[name] = [_url_host(url)]  # HTTP/2 carries it as :authority
        elif name in found:
            signed[name] = found[name]
        else:
            return SignatureCheck.MISMATCH  # a signed header that is not there
    canonical, _ = _canonical_request(method, url, signed, body)
    expected, _ = _signature(credentials.secret_access_key, amz_date, region, service, canonical)
    if hmac.compare_digest(expected, given):
        return SignatureCheck.VALID
    return SignatureCheck.MISMATCH
