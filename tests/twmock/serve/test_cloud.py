"""The mock's cloud endpoints, without a server: Vertex's token endpoint verifying signed
grants, the platforms' refusals with their real bodies, Azure's first filter-results chunk."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt, jwt

from tests.twmock.serve.test_handler import request as _request
from twmock.plan import Chunk, RequestInfo
from twmock.script import MockSettings, parse_script
from twmock.serve.cloud import (
    GOOGLE_TOKEN_AUDIENCE,
    JWT_BEARER,
    GoogleTokenLog,
    as_first_party,
    cloud_call,
    cloud_refusal,
    token_plan,
)
from twmock.serve.handler import make_handler

EMAIL = "sa@p.iam.gserviceaccount.com"


def _keys() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


PRIVATE, PUBLIC = _keys()
SETTINGS = MockSettings(google_service_accounts={EMAIL: PUBLIC}, google_token_lifetime=60)


def _grant(private: str = PRIVATE, **claims: Any) -> bytes:
    now = int(time.time())
    payload = {
        "iss": EMAIL,
        "aud": GOOGLE_TOKEN_AUDIENCE,
        "iat": now,
        "exp": now + 3600,
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        **claims,
    }
    assertion = jwt.encode(crypt.RSASigner.from_string(private), payload).decode()
    return f"grant_type={JWT_BEARER}&assertion={assertion}".encode()


def _info(body: bytes = b"", path: str = "/token", **kw: Any) -> RequestInfo:
    return RequestInfo(method="POST", path=path, body=body, now=time.time(), **kw)


def test_a_signed_grant_gets_a_token_the_vertex_paths_take() -> None:
    log = GoogleTokenLog()
    answer = token_plan(SETTINGS, log, _info(_grant()))
    assert answer.status == 200
    issued = json.loads(answer.body)
    assert issued["token_type"] == "Bearer" and issued["expires_in"] == 60
    call = cloud_call(
        "POST", "/v1/projects/p/locations/global/publishers/google/models/g:generateContent"
    )
    assert call is not None
    headers = ((b"authorization", f"Bearer {issued['access_token']}".encode()),)
    assert cloud_refusal(SETTINGS, log, _info(headers=headers), call) is None
    later = RequestInfo(method="POST", path="/", headers=headers, now=time.time() + 61)
    expired = cloud_refusal(SETTINGS, log, later, call)
    assert expired is not None and expired.status == 401


@pytest.mark.parametrize(
    ("grant", "error", "description"),
    [
        (lambda: _grant(_keys()[0]), "invalid_grant", "Invalid JWT Signature."),
        (lambda: _grant(exp=int(time.time()) - 100), "invalid_grant", "Invalid JWT: Token must"),
        (lambda: _grant(iss="other@p.iam"), "invalid_grant", "Invalid grant: account not found"),
        (lambda: _grant(scope="email"), "invalid_scope", "Invalid OAuth scope"),
        (lambda: b"grant_type=password", "unsupported_grant_type", "Invalid grant_type"),
    ],
)
def test_bad_grants_are_refused_as_google_refuses_them(
    grant: Any, error: str, description: str
) -> None:
    log = GoogleTokenLog()
    answer = token_plan(SETTINGS, log, _info(grant()))
    assert answer.status == 400
    body = json.loads(answer.body)
    assert body["error"] == error and body["error_description"].startswith(description)
    assert log.issued == {} and log.refused == 1


def test_vertex_refusals_are_googles_401() -> None:
    call = cloud_call("POST", "/v1/projects/p/locations/l/publishers/anthropic/models/c:rawPredict")
    assert call is not None and call.anthropic
    missing = cloud_refusal(SETTINGS, GoogleTokenLog(), _info(), call)
    assert missing is not None and missing.status == 401
    assert json.loads(missing.body)["error"]["message"].startswith(
        "Request is missing required authentication credential."
    )
    wrong = cloud_refusal(
        SETTINGS, GoogleTokenLog(), _info(headers=((b"authorization", b"Bearer nope"),)), call
    )
    assert wrong is not None
    error = json.loads(wrong.body)["error"]
    assert (error["code"], error["status"]) == (401, "UNAUTHENTICATED")
    assert error["message"].startswith("Request had invalid authentication credentials.")


def test_azure_refusals_are_azures_401_and_404() -> None:
    settings = MockSettings(azure_api_key="k")
    call = cloud_call("POST", "/openai/deployments/d/chat/completions")
    assert call is not None
    versioned = dict(query="api-version=2024-10-21")
    bad = cloud_refusal(
        settings, GoogleTokenLog(), _info(headers=((b"api-key", b"x"),), **versioned), call
    )
    assert bad is not None and bad.status == 401
    assert json.loads(bad.body)["error"]["message"].startswith(
        "Access denied due to invalid subscription key or wrong API endpoint."
    )
    good = _info(headers=((b"api-key", b"k"),), **versioned)
    assert cloud_refusal(settings, GoogleTokenLog(), good, call) is None
    unversioned = cloud_refusal(
        settings, GoogleTokenLog(), _info(headers=((b"api-key", b"k"),)), call
    )
    assert unversioned is not None and unversioned.status == 404


def test_vertex_anthropic_body_must_carry_vertexs_version_and_no_model() -> None:
    call = cloud_call(
        "POST", "/v1/projects/p/locations/l/publishers/anthropic/models/c:streamRawPredict"
    )
    assert call is not None
    ok = as_first_party(_info(b'{"anthropic_version":"vertex-2023-10-16","messages":[]}'), call)
    assert isinstance(ok, RequestInfo)
    assert json.loads(ok.body) == {"messages": [], "model": "c", "stream": True}
    for body in (b'{"messages":[]}', b'{"anthropic_version":"vertex-2023-10-16","model":"c"}'):
        refused = as_first_party(_info(body), call)
        assert not isinstance(refused, RequestInfo) and refused.status == 400


def test_an_azure_chat_stream_opens_with_prompt_filter_results() -> None:
    mock = make_handler(MockSettings(script=parse_script({"text": "hi"})))
    request = _request(
        "/openai/v1/chat/completions",
        b'{"model":"dep","stream":true,"messages":[{"role":"user","content":"x"}]}',
    )
    answer = mock.plan_for(request)
    chunks = [s.data for s in answer.steps if isinstance(s, Chunk)]
    first = json.loads(chunks[0].removeprefix(b"data: "))
    assert first["choices"] == [] and first["prompt_filter_results"][0]["prompt_index"] == 0
    whole = mock.plan_for(
        _request(
            "/openai/v1/chat/completions",
            b'{"model":"dep","messages":[{"role":"user","content":"x"}]}',
        )
    )
    assert b"prompt_filter_results" not in whole.body


def test_vertex_gemini_refuses_a_content_without_its_role() -> None:
    call = cloud_call(
        "POST", "/v1/projects/p/locations/l/publishers/google/models/g:generateContent"
    )
    assert call is not None
    refused = as_first_party(_info(b'{"contents":[{"parts":[{"text":"hi"}]}]}'), call)
    assert not isinstance(refused, RequestInfo) and refused.status == 400
    assert json.loads(refused.body)["error"]["message"] == "Please use a valid role: user, model."
    ok = as_first_party(_info(b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}'), call)
    assert isinstance(ok, RequestInfo) and ok.path == "/v1beta/models/g:generateContent"
