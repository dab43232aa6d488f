"""Failure classification (docs/failures.md), table-driven over real error responses and documented
shapes.

Every errors/*.json fixture has an expected row here, so a new fixture cannot go untested. The
expected failover/temporary of each kind is written out from docs/failures.md rather than read from
the code's own policy table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import pytest

from twproto.dialect import Dialect
from twproto.errors import error_for_failure
from twproto.failures import (
    KIND_POLICY,
    MAX_BODY_BYTES,
    RULES,
    Failure,
    FailureKind,
    PauseRule,
    TransportFault,
    classify_response,
    classify_stream_error,
    classify_transport,
    idle_timeout,
    next_pacific_midnight,
    stream_ended_early,
)

ROOT = Path(__file__).resolve().parents[2]
ERRORS = ROOT / "tests" / "data" / "fixtures" / "errors"
NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z

K = FailureKind
P = PauseRule

# docs/failures.md, "Kinds and what they do": (failover, temporary) per kind.
SPEC_POLICY: dict[FailureKind, tuple[bool, bool]] = {
    K.NO_BALANCE: (True, False),
    K.QUOTA_USED_UP: (True, False),
    K.RATE_LIMITED: (True, False),
    K.AUTH_REJECTED: (True, False),
    K.MODEL_UNAVAILABLE: (True, False),
    K.OVERLOADED: (True, True),
    K.SERVER: (True, True),
    K.CONNECT: (True, True),
    K.STREAM_ENDED_EARLY: (True, True),
    K.IDLE_TIMEOUT: (True, False),
    K.EFFORT_REFUSED: (False, False),
    K.SEALED_REASONING: (False, False),
    K.CONTEXT_OVERFLOW: (True, False),
    K.CLIENT_ERROR: (False, False),
    K.GATEWAY_BUSY: (True, False),
}


@dataclass(frozen=True)
class Expect:
    kind: FailureKind
    pause: PauseRule
    pause_secs: float | None = None
    reset_at: float | None = None
    retry_after: float | None = None
    rule: str | None = None
    now: float = NOW


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    body: bytes
    expect: Expect
    headers: dict[str, str] = field(default_factory=dict)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


CODEX_NOW = 1773389372.0  # the fixture's Date header, Fri, 13 Mar 2026 08:09:32 GMT
CODEX_EVENT_NOW = 1777936568.0 - 13872
GLM_1308_NOW = _epoch("2026-08-24T19:00:00+00:00")
ANTHROPIC_HEADERS_NOW = _epoch("2025-06-02T15:14:40+00:00")

FIXTURES: dict[str, Expect] = {
    "anthropic-400-effort-unsupported": Expect(K.EFFORT_REFUSED, P.NONE, rule="effort_refused"),
    "anthropic-400-invalid-request-tool-result": Expect(K.CLIENT_ERROR, P.NONE, rule="status_4xx"),
    "anthropic-400-invalid-thinking-signature": Expect(
        K.SEALED_REASONING, P.NONE, rule="sealed_thinking_signature"
    ),
    "anthropic-400-prompt-too-long": Expect(K.CONTEXT_OVERFLOW, P.NONE, rule="context_overflow"),
    "anthropic-401-authentication": Expect(K.AUTH_REJECTED, P.UNEXPLAINED),
    "anthropic-404-not-found-model": Expect(K.MODEL_UNAVAILABLE, P.NONE, rule="status_404"),
    "anthropic-429-rate-limit-with-ratelimit-headers": Expect(
        K.RATE_LIMITED,
        P.RATE_LIMIT,
        pause_secs=16.0,
        retry_after=16.0,
        reset_at=_epoch("2025-06-02T15:15:48+00:00"),  # the exhausted input-tokens window
        now=ANTHROPIC_HEADERS_NOW,
    ),
    "anthropic-429-rate-limit": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "anthropic-529-overloaded": Expect(K.OVERLOADED, P.UNEXPLAINED),
    "bedrock-400-validation-invalid-model": Expect(K.MODEL_UNAVAILABLE, P.NONE),
    "bedrock-429-throttling-exception": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "bedrock-converse-stream-throttling-exception-event": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "codex-429-usage-limit-reached": Expect(
        K.QUOTA_USED_UP,
        P.QUOTA,
        reset_at=1775317531.0,  # the body's resets_at outranks the headers
        pause_secs=1775317531.0 - CODEX_NOW,
        now=CODEX_NOW,
    ),
    "codex-usage-limit-reached-stream-error-event": Expect(
        K.QUOTA_USED_UP,
        P.QUOTA,
        reset_at=1777936568.0,
        pause_secs=13872.0,
        now=CODEX_EVENT_NOW,
    ),
    "deepseek-402-insufficient-balance": Expect(K.NO_BALANCE, P.NO_BALANCE, rule="no_balance"),
    "gemini-400-corrupted-thought-signature": Expect(
        K.SEALED_REASONING, P.NONE, rule="sealed_thinking_signature"
    ),
    "gemini-400-invalid-argument-schema": Expect(K.CLIENT_ERROR, P.NONE),
    "gemini-400-missing-thought-signature": Expect(K.CLIENT_ERROR, P.NONE),
    "gemini-429-resource-exhausted-help-only": Expect(
        K.QUOTA_USED_UP, P.QUOTA, rule="quota_used_up"
    ),
    "gemini-429-resource-exhausted-retryinfo": Expect(
        K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=5.0, retry_after=5.0, rule="gemini_retry_delay"
    ),
    "gemini-503-unavailable": Expect(K.OVERLOADED, P.UNEXPLAINED),
    "gemini-cloudcode-429-array-form": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "glm-429-1113-insufficient-balance": Expect(K.NO_BALANCE, P.NO_BALANCE),
    "glm-429-1302-rate-limit": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "glm-429-1303-frequency": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "glm-429-1304-daily-limit": Expect(K.QUOTA_USED_UP, P.QUOTA),
    "glm-429-1305-model-overloaded": Expect(K.OVERLOADED, P.UNEXPLAINED),
    "glm-429-1308-usage-limit": Expect(
        K.QUOTA_USED_UP,
        P.QUOTA,
        reset_at=_epoch("2026-08-25T07:41:44+08:00"),
        pause_secs=_epoch("2026-08-25T07:41:44+08:00") - GLM_1308_NOW,
        now=GLM_1308_NOW,
    ),
    "openai-400-context-length-exceeded": Expect(
        K.CONTEXT_OVERFLOW, P.NONE, rule="context_overflow"
    ),
    "openai-400-unsupported-parameter-max-tokens": Expect(K.CLIENT_ERROR, P.NONE),
    "openai-400-unsupported-value-reasoning-effort": Expect(K.EFFORT_REFUSED, P.NONE),
    "openai-400-unsupported-value-role": Expect(K.CLIENT_ERROR, P.NONE),
    "openai-401-invalid-api-key": Expect(K.AUTH_REJECTED, P.UNEXPLAINED, rule="auth_rejected"),
    "openai-404-model-not-found": Expect(K.MODEL_UNAVAILABLE, P.NONE, rule="model_unavailable"),
    "openai-429-insufficient-quota": Expect(K.NO_BALANCE, P.NO_BALANCE),
    "openai-429-rate-limit-exceeded": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    "openai-500-server-error": Expect(K.SERVER, P.UNEXPLAINED, rule="server_error_in_body"),
    "openai-responses-400-decimal-below-min": Expect(K.CLIENT_ERROR, P.NONE),
    "openai-responses-400-invalid-encrypted-content": Expect(
        K.SEALED_REASONING, P.NONE, rule="sealed_encrypted_content"
    ),
    "openai-responses-400-reasoning-item-without-following": Expect(K.CLIENT_ERROR, P.NONE),
    "openrouter-429-provider-rate-limited": Expect(K.RATE_LIMITED, P.UNEXPLAINED),
}


def _fixture_cases() -> list[Case]:
    cases = []
    for path in sorted(ERRORS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        cases.append(
            Case(
                id=path.stem,
                status=data["status"],
                headers=data["headers"],
                body=data["body"].encode(),
                expect=FIXTURES[path.stem],
            )
        )
    return cases


def _j(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


RETRY_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"
RETRY_DATE_EPOCH = _epoch("2015-10-21T07:28:00+00:00")
HTML_502 = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"

SHAPES: list[Case] = [
    Case(
        "anthropic-credit-balance-too-low",
        400,
        _j(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "Your credit balance is too low to access the Anthropic API. "
                    "Please go to Plans & Billing to upgrade or purchase credits.",
                },
            }
        ),
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    Case(
        "dashscope-arrearage",
        400,
        _j(
            {
                "code": "Arrearage",
                "message": "Access denied, please make sure your account is in good standing.",
                "request_id": "x",
            }
        ),
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    Case(
        "openrouter-402-more-credits",
        402,
        _j(
            {
                "error": {
                    "code": 402,
                    "message": "This request requires more credits, or fewer "
                    "max_tokens. You requested up to 8192 tokens, but can only afford 1000.",
                }
            }
        ),
        Expect(K.NO_BALANCE, P.NO_BALANCE, rule="no_balance"),
    ),
    Case(
        "relay-403-chinese-balance",
        403,
        _j({"error": {"message": "用户额度不足, 余额不足", "type": "new_api_error"}}),
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    Case("402-empty", 402, b"", Expect(K.NO_BALANCE, P.NO_BALANCE, rule="status_402")),
    Case(
        "truncated-json-insufficient-quota",
        429,
        b'{"error": {"code": "insufficient_quota", "message": "You exceeded your cur',
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    Case(
        "gemini-daily-quota-with-retry",
        429,
        _j(
            {
                "error": {
                    "code": 429,
                    "message": "You exceeded your current quota.",
                    "status": "RESOURCE_EXHAUSTED",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [
                                {
                                    "quotaMetric": "generativelanguage.googleapis.com/"
                                    "generate_content_free_tier_requests",
                                    "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                                }
                            ],
                        },
                        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "39s"},
                    ],
                }
            }
        ),
        # A daily quota resets at midnight Pacific (NOW is 08:06:40 PDT), whatever retryDelay says.
        Expect(
            K.QUOTA_USED_UP,
            P.QUOTA,
            pause_secs=57200.0,
            reset_at=_epoch("2025-06-16T07:00:00+00:00"),
            retry_after=39.0,
            rule="gemini_daily_quota",
        ),
    ),
    Case(
        "gemini-resource-exhausted-plain",
        429,
        _j(
            {
                "error": {
                    "code": 429,
                    "message": "Resource has been exhausted (e.g. check quota).",
                    "status": "RESOURCE_EXHAUSTED",
                }
            }
        ),
        Expect(K.RATE_LIMITED, P.UNEXPLAINED, rule="rate_limited"),
    ),
    Case(
        "vertex-per-minute-quota",
        429,
        _j(
            {
                "error": {
                    "code": 429,
                    "message": "Quota exceeded for aiplatform.googleapis.com/generate_content_"
                    "requests_per_minute_per_project_per_base_model with base model: "
                    "gemini-2.5-flash. Please submit a quota increase request. "
                    "https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.",
                    "status": "RESOURCE_EXHAUSTED",
                }
            }
        ),
        Expect(K.RATE_LIMITED, P.UNEXPLAINED, rule="vertex_minute_quota"),
    ),
    Case(
        "azure-429-retry-after-ms",
        429,
        _j(
            {
                "error": {
                    "code": "429",
                    "message": "Requests to the ChatCompletions_Create Operation under Azure "
                    "OpenAI API version 2024-10-21 have exceeded token rate limit of your current "
                    "OpenAI S0 pricing tier. Please retry after 6 seconds.",
                }
            }
        ),
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=6.0, retry_after=6.0),
        headers={"retry-after-ms": "6000", "retry-after": "6"},
    ),
    Case(
        "azure-400-content-filter",
        400,
        _j(
            {
                "error": {
                    "message": "The response was filtered due to the prompt triggering Azure "
                    "OpenAI's content management policy.",
                    "type": None,
                    "param": "prompt",
                    "code": "content_filter",
                    "status": 400,
                    "innererror": {"code": "ResponsibleAIPolicyViolation"},
                }
            }
        ),
        Expect(K.CLIENT_ERROR, P.NONE, rule="status_4xx"),
    ),
    Case(
        "bedrock-tokens-per-day",
        429,
        _j({"message": "Too many tokens per day, please wait before trying again."}),
        Expect(K.QUOTA_USED_UP, P.QUOTA),
        headers={"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/"},
    ),
    Case(
        "openai-requests-per-day",
        429,
        _j(
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o in organization org-x on "
                    "requests per day (RPD): Limit 10000, Used 10000, Requested 1.",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            }
        ),
        Expect(K.QUOTA_USED_UP, P.QUOTA),
    ),
    Case(
        "codex-headers-full-window",
        429,
        _j({"error": {"message": "Too many requests"}}),
        Expect(
            K.QUOTA_USED_UP,
            P.QUOTA,
            reset_at=NOW + 7200,
            pause_secs=7200.0,
            rule="quota_headers_full",
        ),
        headers={
            "x-codex-primary-used-percent": "100",
            "x-codex-primary-reset-at": str(int(NOW + 7200)),
            "x-codex-secondary-used-percent": "40",
        },
    ),
    Case(
        "codex-headers-reset-after",
        429,
        _j(
            {
                "error": {
                    "type": "usage_limit_reached",
                    "message": "The usage limit has been reached",
                }
            }
        ),
        Expect(K.QUOTA_USED_UP, P.QUOTA, reset_at=NOW + 600, pause_secs=600.0),
        headers={
            "x-codex-secondary-used-percent": "100.0",
            "x-codex-secondary-reset-after-seconds": "600",
        },
    ),
    Case(
        "quota-reset-written-with-zone",
        429,
        _j(
            {
                "error": {
                    "code": "quota_exceeded",
                    "message": "Usage limit reached; it resets at 2025-06-16T00:00:00Z.",
                }
            }
        ),
        Expect(
            K.QUOTA_USED_UP,
            P.QUOTA,
            reset_at=_epoch("2025-06-16T00:00:00+00:00"),
            pause_secs=_epoch("2025-06-16T00:00:00+00:00") - NOW,
        ),
    ),
    Case(
        "retry-after-http-date",
        429,
        b"",
        Expect(
            K.RATE_LIMITED,
            P.RATE_LIMIT,
            pause_secs=30.0,
            retry_after=30.0,
            rule="status_429",
            now=RETRY_DATE_EPOCH - 30,
        ),
        headers={"Retry-After": RETRY_DATE},
    ),
    Case(
        "retry-after-http-date-past",
        429,
        b"",
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=0.0, retry_after=0.0),
        headers={"Retry-After": RETRY_DATE},
    ),
    Case(
        "retry-after-ms-wins",
        429,
        _j({"error": {"type": "rate_limit_error", "message": "slow down please"}}),
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=1.5, retry_after=1.5),
        headers={"retry-after-ms": "1500", "retry-after": "2"},
    ),
    Case(
        "retry-after-garbage",
        429,
        b"",
        Expect(K.RATE_LIMITED, P.UNEXPLAINED),
        headers={"retry-after": "soon", "retry-after-ms": "NaN"},
    ),
    Case(
        "openai-ratelimit-reset-headers",
        429,
        _j(
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o on tokens per min (TPM).",
                    "type": "tokens",
                    "code": "rate_limit_exceeded",
                }
            }
        ),
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=360.0, reset_at=NOW + 360),
        headers={
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "6m0s",
        },
    ),
    Case(
        "openai-try-again-in-message",
        429,
        _j(
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o in organization org-x on tokens "
                    "per min (TPM): Limit 30000, Used 29937, Requested 385. "
                    "Please try again in 644ms.",
                    "type": "tokens",
                    "code": "rate_limit_exceeded",
                }
            }
        ),
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=0.644, retry_after=0.644),
    ),
    Case(
        "try-again-in-words",
        429,
        _j({"error": {"message": "Too many requests, try again in 20 seconds"}}),
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=20.0, retry_after=20.0),
    ),
    Case(
        "gemini-budget-zero",
        400,
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "Budget 0 is invalid. This model only works in thinking mode.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
        Expect(K.EFFORT_REFUSED, P.NONE),
    ),
    Case(
        "anthropic-redacted-thinking",
        400,
        _j(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "messages.3.content.0: Invalid `data` in `redacted_thinking` block",
                },
            }
        ),
        Expect(K.SEALED_REASONING, P.NONE),
    ),
    Case(
        "gemini-404-model",
        404,
        _j(
            {
                "error": {
                    "code": 404,
                    "message": "models/gemini-1.0-pro is not found for API "
                    "version v1beta, or is not supported for generateContent.",
                    "status": "NOT_FOUND",
                }
            }
        ),
        Expect(K.MODEL_UNAVAILABLE, P.NONE, rule="model_unavailable"),
    ),
    Case(
        "deepseek-model-not-exist",
        400,
        _j({"error": {"message": "Model Not Exist", "type": "invalid_request_error"}}),
        Expect(K.MODEL_UNAVAILABLE, P.NONE),
    ),
    Case(
        "openai-403-no-model-access",
        403,
        _j(
            {
                "error": {
                    "message": "Project `proj_x` does not have access to model `o3`",
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                }
            }
        ),
        Expect(K.MODEL_UNAVAILABLE, P.NONE),
    ),
    Case(
        "gemini-api-key-invalid",
        400,
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "API key not valid. Please pass a valid API key.",
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                        }
                    ],
                }
            }
        ),
        Expect(K.AUTH_REJECTED, P.UNEXPLAINED),
    ),
    Case(
        "gemini-user-location",
        400,
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "User location is not supported for the API use.",
                    "status": "FAILED_PRECONDITION",
                }
            }
        ),
        Expect(K.AUTH_REJECTED, P.UNEXPLAINED),
    ),
    Case(
        "403-html",
        403,
        b"<html><body>Forbidden</body></html>",
        Expect(K.AUTH_REJECTED, P.UNEXPLAINED, rule="status_401_403"),
    ),
    Case(
        "500-names-a-request-error",
        500,
        _j({"error": {"message": "messages: field required", "type": "invalid_request_error"}}),
        Expect(K.CLIENT_ERROR, P.NONE, rule="request_error_in_body"),
    ),
    Case(
        "bedrock-service-unavailable",
        503,
        _j({"message": "Bedrock is unable to process your request."}),
        Expect(K.OVERLOADED, P.UNEXPLAINED, rule="overloaded"),
        headers={"x-amzn-errortype": "ServiceUnavailableException:http://internal.amazon.com/"},
    ),
    Case(
        "bedrock-internal-server",
        500,
        _j({"__type": "com.amazon.coral.service#InternalServerException", "message": "boom"}),
        Expect(K.SERVER, P.UNEXPLAINED, rule="server_error_in_body"),
    ),
    Case(
        "bedrock-validation",
        400,
        _j({"message": "Malformed input request: #: extraneous key [foo] is not permitted"}),
        Expect(K.CLIENT_ERROR, P.NONE),
        headers={"x-amzn-ErrorType": "ValidationException:http://internal.amazon.com/"},
    ),
    Case("502-html", 502, HTML_502, Expect(K.SERVER, P.UNEXPLAINED)),
    Case(
        "503-html",
        503,
        b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>",
        Expect(K.OVERLOADED, P.UNEXPLAINED, rule="status_503_529"),
    ),
    Case("529-empty", 529, b"", Expect(K.OVERLOADED, P.UNEXPLAINED)),
    Case("500-plain", 500, b"oops", Expect(K.SERVER, P.UNEXPLAINED, rule="status_5xx")),
    Case("504-empty", 504, b"", Expect(K.SERVER, P.UNEXPLAINED)),
    # An upstream's 408 is an ordinary 4xx: the client's answer, not a temporary fault.
    Case("408-empty", 408, b"", Expect(K.CLIENT_ERROR, P.NONE, rule="status_4xx")),
    Case("413-empty", 413, b"", Expect(K.CLIENT_ERROR, P.NONE, rule="status_4xx")),
    Case("200-empty-object", 200, b"{}", Expect(K.SERVER, P.UNEXPLAINED, rule="unrecognised")),
    Case("binary-body", 500, bytes(range(256)) * 4, Expect(K.SERVER, P.UNEXPLAINED)),
    Case(
        "json-scalar-body",
        429,
        b'"insufficient balance"',
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    Case(
        "huge-body-is-cut",
        500,
        b"x" * (MAX_BODY_BYTES + 10) + b"insufficient balance" + b"y" * (1 << 20),
        Expect(K.SERVER, P.UNEXPLAINED, rule="status_5xx"),
    ),
    Case(
        "deeply-nested-json",
        500,
        b"[" * 100_000 + b"]" * 100_000,
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
]

ALL_CASES = _fixture_cases() + SHAPES


def test_every_fixture_has_an_expectation() -> None:
    assert {p.stem for p in ERRORS.glob("*.json")} == set(FIXTURES)
    assert len(ALL_CASES) >= 40


def check(failure: Failure, expect: Expect) -> None:
    assert failure.kind is expect.kind, failure
    assert (failure.failover, failure.temporary) == SPEC_POLICY[expect.kind], failure
    assert failure.pause is expect.pause, failure
    if expect.pause_secs is None:
        assert failure.pause_secs is None, failure
    else:
        assert failure.pause_secs == pytest.approx(expect.pause_secs), failure
    if expect.reset_at is None:
        assert failure.reset_at is None, failure
    else:
        assert failure.reset_at == pytest.approx(expect.reset_at), failure
    if expect.retry_after is not None:
        assert failure.retry_after_secs == pytest.approx(expect.retry_after), failure
    if expect.rule is not None:
        assert failure.rule == expect.rule, failure


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_classify_response(case: Case) -> None:
    headers = [(k.encode(), v.encode()) for k, v in case.headers.items()]
    failure = classify_response(case.status, headers, case.body, now=case.expect.now)
    check(failure, case.expect)
    assert failure.status == case.status
    assert len(failure.message) <= 1000


def test_message_and_error_type_are_reported() -> None:
    case = next(c for c in ALL_CASES if c.id == "glm-429-1308-usage-limit")
    failure = classify_response(case.status, [], case.body, now=NOW)
    assert failure.error_type == "1308"
    assert "重置" in failure.message
    case = next(c for c in ALL_CASES if c.id == "gemini-503-unavailable")
    failure = classify_response(case.status, [], case.body, now=NOW)
    assert failure.error_type == "UNAVAILABLE"
    assert failure.message == "The model is overloaded. Please try again later."
    html = classify_response(502, [], HTML_502, now=NOW)
    assert "502 Bad Gateway" in html.message


def test_retry_after_http_date_formats() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    for value in (format_datetime(when, usegmt=True), "Wednesday, 02-Jan-30 03:04:05 GMT"):
        failure = classify_response(
            429, [(b"retry-after", value.encode())], b"", now=when.timestamp() - 12
        )
        assert failure.pause_secs == pytest.approx(12.0), value


def test_str_headers_are_accepted_and_odd_ones_ignored() -> None:
    failure = classify_response(
        429,
        [("Retry-After", "3"), (b"x",), ("a", None)],  # type: ignore[list-item]
        b"",
        now=NOW,
    )
    assert failure.pause_secs == 3.0


# --- in-stream errors -------------------------------------------------------------------------


def _codex_event() -> object:
    return json.loads(
        json.loads((ERRORS / "codex-usage-limit-reached-stream-error-event.json").read_text())[
            "body"
        ]
    )


STREAM_CASES: list[tuple[str, Dialect, object, Expect]] = [
    (
        "anthropic-overloaded",
        Dialect.ANTHROPIC,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "anthropic-api-error-overloaded",
        Dialect.ANTHROPIC,
        {"type": "error", "error": {"type": "api_error", "message": "Overloaded"}},
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "anthropic-api-error",
        Dialect.ANTHROPIC,
        {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
    (
        "anthropic-rate-limit",
        Dialect.ANTHROPIC,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}},
        Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    ),
    (
        "responses-failed-server",
        Dialect.OPENAI_RESPONSES,
        {
            "type": "response.failed",
            "response": {
                "status": "failed",
                "error": {
                    "code": "server_error",
                    "message": "The model failed to generate a response.",
                },
            },
        },
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
    (
        "responses-failed-usage-limit",
        Dialect.OPENAI_RESPONSES,
        {
            "type": "response.failed",
            "response": {
                "error": {
                    "code": "usage_limit_reached",
                    "message": "The usage limit has been reached",
                    "resets_in_seconds": 100,
                }
            },
        },
        Expect(K.QUOTA_USED_UP, P.QUOTA, reset_at=NOW + 100, pause_secs=100.0),
    ),
    (
        "codex-error-event-with-headers",
        Dialect.OPENAI_RESPONSES,
        _codex_event(),
        Expect(K.QUOTA_USED_UP, P.QUOTA, reset_at=1777936568.0, pause_secs=1777936568.0 - NOW),
    ),
    (
        "responses-error-insufficient-quota",
        Dialect.OPENAI_RESPONSES,
        {
            "type": "error",
            "sequence_number": 2,
            "error": {
                "type": "insufficient_quota",
                "code": "insufficient_quota",
                "message": "You exceeded your current quota",
            },
        },
        Expect(K.NO_BALANCE, P.NO_BALANCE),
    ),
    (
        "responses-error-top-level-code",
        Dialect.OPENAI_RESPONSES,
        {
            "type": "error",
            "code": "rate_limit_exceeded",
            "message": "Rate limit reached. Please try again in 1.2s.",
            "param": None,
        },
        Expect(K.RATE_LIMITED, P.RATE_LIMIT, pause_secs=1.2, retry_after=1.2),
    ),
    (
        "responses-slow-down",
        Dialect.OPENAI_RESPONSES,
        {"type": "error", "code": "slow_down", "message": "Slow down"},
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "responses-server-is-overloaded",
        Dialect.OPENAI_RESPONSES,
        {
            "type": "response.failed",
            "response": {"error": {"code": "server_is_overloaded", "message": "busy"}},
        },
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "chat-server-error",
        Dialect.OPENAI_CHAT,
        {
            "error": {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
            }
        },
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
    (
        "openrouter-code-400",
        Dialect.OPENAI_CHAT,
        {"id": "gen-1", "error": {"code": 400, "message": "Token limit reached"}, "choices": []},
        Expect(K.CLIENT_ERROR, P.NONE, rule="status_4xx"),
    ),
    (
        "openrouter-code-502",
        Dialect.OPENAI_CHAT,
        {"error": {"code": 502, "message": "Provider returned error"}},
        Expect(K.SERVER, P.UNEXPLAINED, rule="status_5xx"),
    ),
    (
        "gemini-unavailable",
        Dialect.GEMINI,
        {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}},
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "gemini-internal",
        Dialect.GEMINI,
        {
            "error": {
                "code": 500,
                "message": "An internal error has occurred.",
                "status": "INTERNAL",
            }
        },
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
    (
        "gemini-array-wrapped",
        Dialect.GEMINI,
        [
            {
                "error": {
                    "code": 429,
                    "message": "Resource exhausted. Please try again later.",
                    "status": "RESOURCE_EXHAUSTED",
                }
            }
        ],
        Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    ),
    (
        "bedrock-throttling",
        Dialect.ANTHROPIC,
        {"throttlingException": {"message": "Too many requests, please wait before trying again."}},
        Expect(K.RATE_LIMITED, P.UNEXPLAINED),
    ),
    (
        "bedrock-service-unavailable",
        Dialect.ANTHROPIC,
        {"serviceUnavailableException": {"message": "Service unavailable"}},
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "bedrock-internal-server",
        Dialect.ANTHROPIC,
        {"internalServerException": {"message": "Internal error"}},
        Expect(K.SERVER, P.UNEXPLAINED),
    ),
    (
        "bedrock-validation",
        Dialect.ANTHROPIC,
        {"validationException": {"message": "Input is too long for requested model."}},
        Expect(K.CONTEXT_OVERFLOW, P.NONE, rule="context_overflow"),
    ),
    (
        "json-text-payload",
        Dialect.ANTHROPIC,
        '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
        Expect(K.OVERLOADED, P.UNEXPLAINED),
    ),
    (
        "raw-text",
        Dialect.OPENAI_CHAT,
        "upstream went away",
        Expect(K.SERVER, P.UNEXPLAINED, rule="unrecognised"),
    ),
    ("bytes", Dialect.OPENAI_CHAT, b"\xff\xfe", Expect(K.SERVER, P.UNEXPLAINED)),
    ("none", Dialect.GEMINI, None, Expect(K.SERVER, P.UNEXPLAINED, rule="unrecognised")),
    ("number", Dialect.GEMINI, 42, Expect(K.SERVER, P.UNEXPLAINED)),
    ("empty-error", Dialect.OPENAI_CHAT, {"error": {}}, Expect(K.SERVER, P.UNEXPLAINED)),
]


@pytest.mark.parametrize(
    ("name", "dialect", "payload", "expect"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES]
)
def test_classify_stream_error(
    name: str, dialect: Dialect, payload: object, expect: Expect
) -> None:
    check(classify_stream_error(dialect, payload, now=expect.now), expect)


def test_codex_event_reads_status_from_the_event() -> None:
    failure = classify_stream_error(Dialect.OPENAI_RESPONSES, _codex_event(), now=NOW)
    assert failure.status == 429
    assert failure.error_type == "usage_limit_reached"


# --- transport and fixed failures ------------------------------------------------------------


@pytest.mark.parametrize("fault", list(TransportFault))
def test_classify_transport(fault: TransportFault) -> None:
    failure = classify_transport(fault)
    assert failure.rule == f"transport_{fault.value}"
    if fault in (TransportFault.POOL_FULL, TransportFault.LOCAL_RESOURCES):
        # The gateway's own shortage: fails over, not retried there, nothing held against it,
        # and the client told to come back shortly.
        assert failure.kind is K.GATEWAY_BUSY
        assert (failure.failover, failure.temporary, failure.pause) == (True, False, P.NONE)
        assert failure.retry_after_secs == 1.0
        error = error_for_failure(failure)
        assert (error.status, error.code, error.retry_after) == (503, "gw.overloaded", 1.0)
        assert error.category == "rate_limited"
        return
    expected = K.STREAM_ENDED_EARLY if fault is TransportFault.BODY_BROKEN else K.CONNECT
    assert failure.kind is expected
    assert (failure.failover, failure.temporary) == (True, True)
    assert failure.pause is P.UNEXPLAINED


def test_fixed_failures() -> None:
    early = stream_ended_early()
    assert (early.kind, early.failover, early.temporary, early.pause) == (
        K.STREAM_ENDED_EARLY,
        True,
        True,
        P.UNEXPLAINED,
    )
    idle = idle_timeout()
    assert (idle.kind, idle.failover, idle.temporary, idle.pause) == (
        K.IDLE_TIMEOUT,
        True,
        False,
        P.UNEXPLAINED,
    )


# --- the tables themselves ---------------------------------------------------------------------


def test_policy_table_matches_spec() -> None:
    assert set(KIND_POLICY) == set(FailureKind)
    for kind, policy in KIND_POLICY.items():
        assert (policy.failover, policy.temporary) == SPEC_POLICY[kind]


def test_rule_names_are_unique_and_the_last_row_catches_all() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    last = RULES[-1]
    assert (last.codes, last.texts, last.statuses, last.needs) == (
        frozenset(),
        (),
        None,
        frozenset(),
    )


def test_every_rule_is_exercised() -> None:
    hit = set()
    for case in ALL_CASES:
        headers = [(k.encode(), v.encode()) for k, v in case.headers.items()]
        hit.add(classify_response(case.status, headers, case.body, now=case.expect.now).rule)
    for _, dialect, payload, expect in STREAM_CASES:
        hit.add(classify_stream_error(dialect, payload, now=expect.now).rule)
    assert {r.name for r in RULES} - hit == set()


def test_docs_list_every_rule_and_kind() -> None:
    doc = (ROOT / "docs" / "failures.md").read_text(encoding="utf-8")
    for rule in RULES:
        assert re.search(rf"`{re.escape(rule.name)}`", doc), rule.name
    for kind in FailureKind:
        assert f"`{kind.value}`" in doc, kind


@pytest.mark.parametrize("status", [500, 502, 503, 504, 529])
def test_listed_server_statuses_are_temporary(status: int) -> None:
    failure = classify_response(status, [], b"", now=NOW)
    assert failure.failover and failure.temporary


@pytest.mark.parametrize("status", [501, 505, 507, 511, 520, 599])
def test_other_server_statuses_fail_over_without_retry(status: int) -> None:
    # Only 500/502/503/504/529 are retried (docs/failures.md); even a body reading like a
    # server error does not make a 501 worth waiting for.
    for body in (b"", b'{"error": {"type": "api_error", "message": "internal server error"}}'):
        failure = classify_response(status, [], body, now=NOW)
        assert failure.kind is K.SERVER and failure.failover and not failure.temporary


def test_408_is_not_retried_nor_failed_over() -> None:
    failure = classify_response(408, [], b"", now=NOW)
    assert failure.kind is K.CLIENT_ERROR and not failure.failover and not failure.temporary


@pytest.mark.parametrize(
    ("now", "midnight"),
    [
        ("2025-06-15T15:06:40+00:00", "2025-06-16T07:00:00+00:00"),  # PDT, UTC-7
        ("2025-01-15T07:59:59+00:00", "2025-01-15T08:00:00+00:00"),  # PST, UTC-8
        ("2025-03-09T12:00:00+00:00", "2025-03-10T07:00:00+00:00"),  # the day DST starts
        ("2025-11-02T12:00:00+00:00", "2025-11-03T08:00:00+00:00"),  # the day DST ends
    ],
)
def test_next_pacific_midnight(now: str, midnight: str) -> None:
    assert next_pacific_midnight(_epoch(now)) == _epoch(midnight)


# --- context overflow: every provider's spelling ------------------------------------------------

OVERFLOW = Expect(K.CONTEXT_OVERFLOW, P.NONE, rule="context_overflow")

OVERFLOW_RESPONSES: list[tuple[str, int, bytes]] = [
    (
        "openai-chat-maximum-context-length",
        400,
        _j(
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens. However,"
                    " your messages resulted in 130512 tokens. Please reduce the length of the"
                    " messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            }
        ),
    ),
    (
        "openai-responses-context-window",
        400,
        _j(
            {
                "error": {
                    "message": "Your input exceeds the context window of this model. Please"
                    " adjust your input and try again.",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
            }
        ),
    ),
    (
        "anthropic-input-and-max-tokens",
        400,
        _j(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 195000 +"
                    " 8192 > 200000, decrease input length or `max_tokens` and try again",
                },
            }
        ),
    ),
    (
        "gemini-input-token-count",
        400,
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1231741) exceeds the maximum number of"
                    " tokens allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
    ),
    (
        "gemini-array-wrapped",
        400,
        b"["
        + _j(
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (40000) exceeds the maximum number of"
                    " tokens allowed (32768).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        )
        + b"]",
    ),
    (
        "mistral",
        400,
        _j(
            {
                "object": "error",
                "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model"
                " with 32768 maximum context length",
                "type": "invalid_request_message_error",
                "code": "3051",
            }
        ),
    ),
    (
        "xai",
        400,
        _j(
            {
                "code": "Client specified an invalid argument",
                "error": "This model's maximum prompt length is 131072 but the request contains"
                " 150000 tokens.",
            }
        ),
    ),
    (
        "bedrock-validation",
        400,
        _j({"message": "Input is too long for requested model."}),
    ),
    (
        "served-as-500",
        500,
        _j({"error": {"message": "too long", "code": "context_length_exceeded"}}),
    ),
]


@pytest.mark.parametrize(("name", "status", "body"), OVERFLOW_RESPONSES, ids=lambda v: str(v))
def test_context_overflow_spellings(name: str, status: int, body: bytes) -> None:
    failure = classify_response(status, [], body, now=NOW)
    check(failure, OVERFLOW)
    assert failure.failover and failure.pause is P.NONE, name


def test_context_overflow_in_a_stream() -> None:
    event = {
        "type": "response.failed",
        "response": {
            "error": {
                "code": "context_length_exceeded",
                "message": "Your input exceeds the context window of this model.",
            }
        },
    }
    check(classify_stream_error(Dialect.OPENAI_RESPONSES, event, now=NOW), OVERFLOW)
    # The Responses stream's own ``error`` event, as OpenAI sends it before any output.
    opening = {
        "type": "error",
        "sequence_number": 2,
        "error": {
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
            "message": "Your input exceeds the context window of this model. Please adjust your"
            " input and try again.",
            "param": "input",
        },
    }
    check(classify_stream_error(Dialect.OPENAI_RESPONSES, opening, now=NOW), OVERFLOW)
    # OpenRouter's wording for an endpoint's window.
    relay = {"error": {"code": 400, "message": "This endpoint's maximum context length is 32768"}}
    check(classify_stream_error(Dialect.OPENAI_CHAT, relay, now=NOW), OVERFLOW)


def test_a_token_rate_limit_is_not_a_context_overflow() -> None:
    body = _j(
        {
            "error": {
                "message": "Request too large for gpt-4o on tokens per min (TPM): Limit 30000,"
                " Requested 50000.",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }
        }
    )
    assert classify_response(429, [], body, now=NOW).kind is K.RATE_LIMITED
    # A body too large in bytes is the client's, whatever window a model has.
    too_big = _j({"type": "error", "error": {"type": "request_too_large", "message": "big"}})
    assert classify_response(413, [], too_big, now=NOW).kind is K.CLIENT_ERROR
