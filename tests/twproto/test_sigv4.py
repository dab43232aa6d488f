"""SigV4 signing and verification (docs/bedrock.md): AWS's published test-suite vectors, botocore's
signer as the reference on random requests, and the verifier refusing each kind of bad
signature."""

from __future__ import annotations

from datetime import UTC, datetime
from unittest import mock
from urllib.parse import quote

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from twproto.sigv4 import (
    SIGV4_MAX_SKEW_SECS,
    SIGV4_REFUSALS,
    AwsCredentials,
    SignatureCheck,
    sign_request,
    verify_request,
)

# The AWS SigV4 test suite's key, secret and time (2015-08-30T12:36:00Z).
SUITE = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_NOW = datetime(2015, 8, 30, 12, 36, tzinfo=UTC).timestamp()
SUITE_SCOPE = "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request"
C = SignatureCheck


def _suite(method: str, url: str) -> dict[bytes, bytes]:
    added = sign_request(
        method,
        url,
        [],
        b"",
        region="us-east-1",
        service="service",
        credentials=SUITE,
        now=SUITE_NOW,
    )
    return dict(added)


@pytest.mark.parametrize(
    ("name", "method", "url", "signature"),
    [
        (
            "get-vanilla",
            "GET",
            "https://example.amazonaws.com/",
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        ),
        (
            "post-vanilla",
            "POST",
            "https://example.amazonaws.com/",
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
        ),
        (
            "get-vanilla-query-order-key-case",
            "GET",
            "https://example.amazonaws.com/?Param2=value2&Param1=value1",
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        ),
    ],
)
def test_aws_test_suite_vectors(name: str, method: str, url: str, signature: str) -> None:
    added = _suite(method, url)
    assert added[b"x-amz-date"] == b"20150830T123600Z"
    assert added[b"authorization"].decode() == (
        f"AWS4-HMAC-SHA256 {SUITE_SCOPE}, SignedHeaders=host;x-amz-date, Signature={signature}"
    )
    assert b"x-amz-security-token" not in added


# --- botocore's signer as the reference --------------------------------------------------------


def botocore_sign(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    *,
    region: str,
    service: str,
    credentials: AwsCredentials,
    now: float,
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    creds = Credentials(
        credentials.access_key_id, credentials.secret_access_key, credentials.session_token
    )
    when = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        SigV4Auth(creds, service, region).add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


def ours(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    **kw: object,
) -> dict[str, str]:
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
    added = sign_request(method, url, pairs, body, **kw)  # type: ignore[arg-type]
    return {k.decode(): v.decode() for k, v in added}


BEDROCK_URL = (
    "https://bedrock-runtime.us-east-1.amazonaws.com/model/"
    "anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream"
)
BEDROCK_BODY = b'{"messages":[{"role":"user","content":[{"text":"Hello"}]}]}'
TEMPORARY = AwsCredentials("ASIAEXAMPLE", "secret/with+chars", "FwoGZXIvYXdzEJr//////////token")


@pytest.mark.parametrize("credentials", [SUITE, TEMPORARY])
def test_a_bedrock_request_signs_as_botocore_signs_it(credentials: AwsCredentials) -> None:
    headers = {"content-type": "application/json", "accept": "application/vnd.amazon.eventstream"}
    kw = {"region": "us-east-1", "service": "bedrock", "credentials": credentials, "now": 1.75e9}
    mine = ours("POST", BEDROCK_URL, headers, BEDROCK_BODY, **kw)
    theirs = botocore_sign("POST", BEDROCK_URL, headers, BEDROCK_BODY, **kw)  # type: ignore[arg-type]
    assert mine["authorization"] == theirs["authorization"]
    assert mine["x-amz-date"] == theirs["x-amz-date"] == "20250615T150640Z"
    if credentials.session_token:
        assert mine["x-amz-security-token"] == credentials.session_token
        signed_names = mine["authorization"].split("SignedHeaders=")[1].split(",")[0]
        assert "x-amz-security-token" in signed_names.split(";")
    else:
        assert "x-amz-security-token" not in mine


_SEGMENT = st.text(min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
_QUERY = st.lists(
    st.tuples(st.text(min_size=1, max_size=6), st.text(max_size=6)),
    max_size=3,
    unique_by=lambda p: p[0],
)
_HEADER_NAMES = st.sampled_from(
    ["content-type", "accept", "x-amz-target", "x-amzn-bedrock-trace", "x-custom", "user-agent"]
)
_HEADER_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=20
).filter(lambda v: v.strip())


@settings(max_examples=150, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    segments=st.lists(_SEGMENT, max_size=4),
    trailing=st.booleans(),
    query=_QUERY,
    headers=st.dictionaries(_HEADER_NAMES, _HEADER_VALUE, max_size=4),
    body=st.binary(max_size=200),
    region=st.sampled_from(["us-east-1", "eu-central-1", "ap-northeast-1"]),
    token=st.none() | st.text(alphabet="abcXYZ019+/=", min_size=1, max_size=30),
    now=st.floats(min_value=1e9, max_value=4e9),
)
def test_random_requests_sign_as_botocore_signs_them(
    method: str,
    segments: list[str],
    trailing: bool,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes,
    region: str,
    token: str | None,
    now: float,
) -> None:
    path = "/" + "/".join(quote(s, safe="") for s in segments)
    if trailing and segments:
        path += "/"
    # botocore signs the query as written; write it already in canonical encoding.
    q = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in query)
    url = f"https://bedrock-runtime.{region}.amazonaws.com{path}" + (f"?{q}" if q else "")
    creds = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    kw = {"region": region, "service": "bedrock", "credentials": creds, "now": now}
    mine = ours(method, url, headers, body, **kw)
    theirs = botocore_sign(method, url, headers, body, **kw)  # type: ignore[arg-type]
    assert mine["authorization"] == theirs["authorization"]
    pairs = [(k.encode(), v.encode()) for k, v in {**headers, **mine}.items()]
    assert (
        verify_request(method, url, pairs, body, region=region, credentials=creds, now=now)
        is C.VALID
    )


def test_a_resent_request_is_signed_afresh() -> None:
    first = sign_request(
        "POST", BEDROCK_URL, [], BEDROCK_BODY, region="us-east-1", credentials=TEMPORARY, now=1.75e9
    )
    again = sign_request(
        "POST",
        BEDROCK_URL,
        first,
        BEDROCK_BODY,
        region="us-east-1",
        credentials=TEMPORARY,
        now=1.75e9,
    )
    assert again == first


def test_secrets_stay_out_of_repr() -> None:
    text = repr(TEMPORARY)
    assert "ASIAEXAMPLE" in text
    assert TEMPORARY.secret_access_key not in text and "token" not in text


# --- the verifier ---------------------------------------------------------------------------------

NOW = 1.75e9
HEADERS = [
    (b"host", b"bedrock-runtime.us-east-1.amazonaws.com"),
    (b"content-type", b"application/json"),
]


def signed(credentials: AwsCredentials = TEMPORARY, **kw: object) -> list[tuple[bytes, bytes]]:
    args: dict[str, object] = {"region": "us-east-1", "credentials": credentials, "now": NOW, **kw}
    return HEADERS + sign_request("POST", BEDROCK_URL, HEADERS, BEDROCK_BODY, **args)  # type: ignore[arg-type]


def check(
    headers: list[tuple[bytes, bytes]],
    *,
    body: bytes = BEDROCK_BODY,
    credentials: AwsCredentials = TEMPORARY,
    now: float = NOW,
    region: str = "us-east-1",
) -> SignatureCheck:
    return verify_request(
        "POST", BEDROCK_URL, headers, body, region=region, credentials=credentials, now=now
    )


def _replace(
    headers: list[tuple[bytes, bytes]], name: bytes, value: bytes | None
) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in headers if k != name]
    return out if value is None else [*out, (name, value)]


def test_a_signed_request_is_valid() -> None:
    assert check(signed()) is C.VALID
    assert check(signed(SUITE), credentials=SUITE) is C.VALID


def test_a_request_botocore_signed_is_valid() -> None:
    theirs = botocore_sign(
        "POST",
        BEDROCK_URL,
        dict((k.decode(), v.decode()) for k, v in HEADERS),
        BEDROCK_BODY,
        region="us-east-1",
        service="bedrock",
        credentials=TEMPORARY,
        now=NOW,
    )
    assert check([(k.encode(), v.encode()) for k, v in theirs.items()]) is C.VALID


def test_http2_requests_without_a_host_header_check_against_the_url() -> None:
    without_host = [(k, v) for k, v in signed() if k != b"host"]
    assert check(without_host) is C.VALID


def test_headers_nobody_signed_may_change() -> None:
    assert (
        check([*signed(), (b"user-agent", b"curl/8"), (b"x-forwarded-for", b"10.0.0.1")]) is C.VALID
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda h: _replace(h, b"authorization", None), C.MISSING),
        (lambda h: _replace(h, b"authorization", b"Bearer abc"), C.MISSING),
        (lambda h: _replace(h, b"authorization", b"AWS4-HMAC-SHA256 Credential=x"), C.MALFORMED),
        (lambda h: _replace(h, b"x-amz-date", None), C.MALFORMED),
        (lambda h: [*h, (b"authorization", dict(h)[b"authorization"])], C.MALFORMED),
        (lambda h: [*h, (b"x-amz-date", b"20250615T150640Z")], C.MALFORMED),
        (lambda h: _replace(h, b"x-amz-date", b"20250615T990000Z"), C.MALFORMED),
        (lambda h: _replace(h, b"x-amz-date", b"20250616T170640Z"), C.WRONG_SCOPE),
        (lambda h: _replace(h, b"x-amz-security-token", None), C.TOKEN_MISMATCH),
        (lambda h: _replace(h, b"x-amz-security-token", b"other"), C.TOKEN_MISMATCH),
        (lambda h: _replace(h, b"content-type", b"text/plain"), C.MISMATCH),
        (lambda h: _replace(h, b"content-type", None), C.MISMATCH),
        (lambda h: _replace(h, b"host", b"evil.example.com"), C.MISMATCH),
    ],
)
def test_each_tampering_is_refused(change: object, expected: SignatureCheck) -> None:
    assert check(change(signed())) is expected  # type: ignore[operator]


def test_the_verifier_refuses_other_keys_scopes_and_secrets() -> None:
    headers = signed()
    assert (
        check(headers, credentials=AwsCredentials("AKIAOTHER", "x", TEMPORARY.session_token))
        is C.UNKNOWN_KEY
    )
    assert check(headers, region="eu-west-1") is C.WRONG_SCOPE
    wrong_secret = AwsCredentials(
        TEMPORARY.access_key_id, "not-the-secret", TEMPORARY.session_token
    )
    assert check(headers, credentials=wrong_secret) is C.MISMATCH
    assert check(headers, body=BEDROCK_BODY + b" ") is C.MISMATCH
    # A token the verifier does not expect is refused too.
    no_token = AwsCredentials(TEMPORARY.access_key_id, TEMPORARY.secret_access_key)
    assert check(headers, credentials=no_token) is C.TOKEN_MISMATCH


def test_time_skew() -> None:
    headers = signed()
    assert check(headers, now=NOW + SIGV4_MAX_SKEW_SECS - 1) is C.VALID
    assert check(headers, now=NOW - SIGV4_MAX_SKEW_SECS + 1) is C.VALID
    assert check(headers, now=NOW + SIGV4_MAX_SKEW_SECS + 1) is C.SKEWED
    assert check(headers, now=NOW - SIGV4_MAX_SKEW_SECS - 1) is C.SKEWED


def test_host_and_date_must_be_signed() -> None:
    headers = signed(SUITE)
    auth = dict(headers)[b"authorization"].replace(
        b"SignedHeaders=content-type;host;x-amz-date", b"SignedHeaders=content-type;x-amz-date"
    )
    assert auth != dict(headers)[b"authorization"]
    assert check(_replace(headers, b"authorization", auth), credentials=SUITE) is C.UNSIGNED_HEADER


def test_a_signed_header_that_is_missing_is_a_mismatch() -> None:
    headers = signed(SUITE)
    auth = dict(headers)[b"authorization"].replace(
        b"SignedHeaders=content-type;", b"SignedHeaders=accept;content-type;"
    )
    assert check(_replace(headers, b"authorization", auth), credentials=SUITE) is C.MISMATCH


@settings(max_examples=100, deadline=None)
@given(position=st.integers(min_value=0), bit=st.integers(min_value=0, max_value=7))
def test_any_changed_body_bit_is_refused(position: int, bit: int) -> None:
    body = bytearray(BEDROCK_BODY)
    body[position % len(body)] ^= 1 << bit
    assert check(signed(), body=bytes(body)) is C.MISMATCH


def test_every_refusal_has_an_aws_error() -> None:
    assert set(SIGV4_REFUSALS) == set(SignatureCheck) - {C.VALID}
    for name, message in SIGV4_REFUSALS.values():
        assert name.endswith("Exception") and message
