"""The recognition table: `RULES`, the ordered rows whose first match decides a failure's kind."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from twproto.failures.kinds import Evidence, FailureKind

__all__ = (
    "RULES",
    "TEMPORARY_STATUSES",
    "FailureRule",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRule:
    """One row of the recognition table. Empty `codes` and `texts` match on status alone."""

    name: str
    kind: FailureKind
    codes: frozenset[str] = frozenset()
    texts: tuple[str, ...] = ()
    statuses: frozenset[int | None] | None = None  # None: any status
    needs: frozenset[Evidence] = frozenset()
    pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.texts and self.pattern is None:
            compiled = re.compile("|".join(f"(?:{t})" for t in self.texts))
            object.__setattr__(self, "pattern", compiled)


def _statuses(*ranges: range | int | None) -> frozenset[int | None]:
    out: set[int | None] = set()
    for r in ranges:
        if isinstance(r, range):
            out.update(r)
        else:
            out.add(r)
    return frozenset(out)


_4XX = range(400, 500)
_5XX = range(500, 600)
# "Unless the body names a request error": rows that overrule a 5xx (or a status-less stream
# error, or a 2xx carrying an error body) but leave 4xx to the status rows.
_NOT_4XX = _statuses(None, range(100, 400), _5XX)
_BAD_REQUEST = _statuses(400, 422, None)
# The server statuses worth retrying (docs/failures.md). Any other 5xx — 501 Not Implemented,
# 505 HTTP Version Not Supported, 507, 508, 511, a relay's own 520–527 — still fails over but is not
# retried on the same upstream: nothing says waiting will change the answer.
TEMPORARY_STATUSES = frozenset({500, 502, 503, 504, 529})
_MODEL_STATUSES = _statuses(400, 403, 404, 422, None)

K = FailureKind

RULES: tuple[FailureRule, ...] = (
    # --- resend-once kinds: specific enough to go first --------------------------------------
    FailureRule(
        name="sealed_encrypted_content",
        kind=K.SEALED_REASONING,
        codes=frozenset({"invalid_encrypted_content"}),
        texts=(r"encrypted content .{0,200}could not be (?:verified|decrypted)",),
        statuses=_BAD_REQUEST,
    ),
    FailureRule(
        name="sealed_thinking_signature",
        kind=K.SEALED_REASONING,
        texts=(
            r"invalid `?signature`? in `?thinking`? block",
            r"invalid `?data`? in `?redacted_thinking`? block",
            # Gemini's words for another API's (or a damaged) thoughtSignature.
            r"(?:corrupted|invalid) thought signature",
        ),
        statuses=_BAD_REQUEST,
    ),
    FailureRule(
        name="effort_refused",
        kind=K.EFFORT_REFUSED,
        texts=(
            r"effort level",
            r"reasoning[_. ]effort",
            r"output_config\.effort",
            r"'effort'",
            r"thinking[_ ]?level",
            r"thinking[_ ]?budget",
            r"budget_tokens",
            r"only works in thinking mode",
        ),
        statuses=_statuses(400, 422),
    ),
    # --- the request does not fit the model's context window ---------------------------------
    FailureRule(
        name="context_overflow",
        kind=K.CONTEXT_OVERFLOW,
        codes=frozenset({"context_length_exceeded"}),
        texts=(
            r"prompt is too long",  # Anthropic
            r"input length and `?max_tokens`? exceed context limit",  # Anthropic
            r"input token count.{0,40}exceeds the maximum",  # Gemini
            r"maximum context length",  # OpenAI, DeepSeek, vLLM, OpenRouter
            r"context[_ ]length[_ ]exceeded",
            r"exceeds? the context window",  # OpenAI Responses
            r"input tokens exceed the configured limit",  # OpenAI
            r"(?:input|prompt) is too long for (?:the )?requested model",  # Bedrock
            r"too many total text bytes",  # Bedrock
            r"too large for model with \d+ maximum context length",  # Mistral
            r"maximum prompt length is \d+",  # xAI
        ),
        statuses=_statuses(400, 413, 422, None, range(100, 400), _5XX),
    ),
    # --- money and quotas ---------------------------------------------------------------------
    FailureRule(
        name="no_balance",
        kind=K.NO_BALANCE,
        codes=frozenset(
            {
                "insufficient_quota",
                "insufficient_balance",
                "billing_error",
                "billing_hard_limit_reached",
                "payment_required",
                "arrearage",  # Alibaba DashScope
                "1113",  # GLM: 余额不足或无可用资源包
                "1309",  # GLM: coding-plan subscription expired
            }
        ),
        texts=(
            r"insufficient[ _-]?(?:account[ _-]?)?(?:balance|credits?|funds|quota)",
            r"credit balance is too low",
            r"requires more credits",
            r"out of credits",
            r"billing[ _]hard[ _]limit",
            r"payment required",
            r"arrearage",
            r"余额不足",
            r"欠费",
        ),
    ),
    FailureRule(
        name="gemini_daily_quota",
        kind=K.QUOTA_USED_UP,
        codes=frozenset({"resource_exhausted"}),
        needs=frozenset({Evidence.DAILY_QUOTA}),
    ),
    FailureRule(
        name="gemini_retry_delay",
        kind=K.RATE_LIMITED,
        codes=frozenset({"resource_exhausted"}),
        needs=frozenset({Evidence.RETRY_HINT}),
    ),
    FailureRule(
        # Vertex AI's 429 for a per-minute quota ("Quota exceeded for aiplatform.googleapis.com/
        # generate_content_requests_per_minute_per_project_per_base_model"): a rate, not a
        # budget used up.
        name="vertex_minute_quota",
        kind=K.RATE_LIMITED,
        texts=(r"aiplatform\.googleapis\.com/\S*per_minute",),
    ),
    FailureRule(
        name="quota_used_up",
        kind=K.QUOTA_USED_UP,
        codes=frozenset({"usage_limit_reached", "quota_exceeded", "1304", "1308"}),
        texts=(
            r"usage limit (?:has been )?reached",
            r"quota (?:has been )?(?:exceeded|exhausted|used up)",
            r"exceeded (?:your|the) (?:current |daily |weekly |monthly )?quota",
            r"out of quota",
            r"\bper day\b",
            r"\bdaily (?:quota|limit)",
            r"今日调用次数限额",
            r"使用上限",
            r"额度已用",
        ),
    ),
    FailureRule(
        name="quota_headers_full",
        kind=K.QUOTA_USED_UP,
        statuses=_statuses(429, None),
        needs=frozenset({Evidence.QUOTA_HEADERS_FULL}),
    ),
    # --- capacity -------------------------------------------------------------------------------
    FailureRule(
        name="overloaded",
        kind=K.OVERLOADED,
        codes=frozenset(
            {
                "overloaded_error",
                "server_is_overloaded",
                "slow_down",
                "unavailable",
                "service_unavailable",
                "serviceunavailableexception",
                "modelnotreadyexception",
                "1305",  # GLM: model overloaded, sent as 429
            }
        ),
        texts=(
            r"overload",
            r"over capacity",
            r"at capacity",
            r"server is busy",
            r"访问量过大",
            r"繁忙",
        ),
    ),
    FailureRule(
        name="rate_limited",
        kind=K.RATE_LIMITED,
        codes=frozenset(
            {
                "rate_limit_exceeded",
                "rate_limit_error",
                "rate_limit",
                "ratelimitexceeded",
                "rate_limit_exceeded_error",
                "too_many_requests",
                "throttlingexception",
                "throttling",
                "resource_exhausted",
                "1302",  # GLM: concurrency / rate
                "1303",  # GLM: frequency
            }
        ),
        texts=(
            r"rate[ _-]?limit",
            r"too many (?:requests|tokens)",
            r"throttl",
            r"please wait before trying again",
            r"速率限制",
            r"频率过高",
            r"并发数过高",
        ),
    ),
    # --- the upstream cannot serve this model / this account ----------------------------------
    FailureRule(
        name="model_unavailable",
        kind=K.MODEL_UNAVAILABLE,
        codes=frozenset(
            {"model_not_found", "model_not_available", "resourcenotfoundexception", "1211"}
        ),
        texts=(
            r"model\s*[`'\"]?[\w./:@-]*[`'\"]?\s*(?:is |was |has been )?(?:does not exist|doesn't"
            r" exist|not exist|not found|not available|unavailable|not supported|deprecated"
            r"|decommissioned|no longer available)",
            r"models/\S+ is not (?:found|supported)",
            r"(?:unknown|invalid|unsupported|no such) model",
            r"not a valid model",
            r"model (?:identifier|id|name) is invalid",
            r"(?:do|does|don't|doesn't) (?:not )?have access to (?:the )?model",
            r"no endpoints found",
            r"模型不存在",
        ),
        statuses=_MODEL_STATUSES,
    ),
    FailureRule(
        name="auth_rejected",
        kind=K.AUTH_REJECTED,
        codes=frozenset(
            {
                "authentication_error",
                "invalid_api_key",
                "api_key_invalid",
                "invalid_authentication",
                "permission_error",
                "permission_denied",
                "unauthenticated",
                "account_deactivated",
                "unrecognizedclientexception",
                "accessdeniedexception",
                "expiredtokenexception",
                "1000",  # GLM: authentication failed
                "1001",
                "1002",
                "1003",
                "1004",
            }
        ),
        texts=(
            r"invalid (?:x-)?api[-_ ]?key",
            r"incorrect api key",
            r"api key not valid",
            r"api key (?:is )?(?:expired|revoked|disabled)",
            r"user location is not supported",
            r"身份验证失败",
        ),
    ),
    # --- a request error named in a 5xx (or status-less) body ---------------------------------
    FailureRule(
        name="request_error_in_body",
        kind=K.CLIENT_ERROR,
        codes=frozenset(
            {
                "invalid_request_error",
                "invalid_request",
                "invalid_argument",
                "invalid_value",
                "bad_request",
                "validationexception",
                "validation_error",
                "unsupported_parameter",
                "unsupported_value",
                "request_too_large",
            }
        ),
        statuses=_NOT_4XX,
    ),
    FailureRule(
        name="server_error_in_body",
        kind=K.SERVER,
        codes=frozenset(
            {
                "server_error",
                "api_error",
                "internal",
                "internal_error",
                "internal_server_error",
                "internalserverexception",
                "internalfailure",
                "modelstreamerrorexception",
                "modelerrorexception",
                "bad_gateway",
                "deadline_exceeded",
                "timeout_error",
                "1234",  # GLM: network error
            }
        ),
        texts=(
            r"internal server error",
            r"server had an error",
            r"bad gateway",
            r"gateway time-?out",
            r"upstream (?:connect )?error",
        ),
        statuses=_NOT_4XX,
    ),
    # --- status alone -------------------------------------------------------------------------
    FailureRule(name="status_402", kind=K.NO_BALANCE, statuses=_statuses(402)),
    FailureRule(name="status_401_403", kind=K.AUTH_REJECTED, statuses=_statuses(401, 403)),
    FailureRule(name="status_404", kind=K.MODEL_UNAVAILABLE, statuses=_statuses(404)),
    FailureRule(name="status_429", kind=K.RATE_LIMITED, statuses=_statuses(429)),
    FailureRule(name="status_503_529", kind=K.OVERLOADED, statuses=_statuses(503, 529)),
    FailureRule(name="status_5xx", kind=K.SERVER, statuses=_statuses(_5XX)),
    FailureRule(name="status_4xx", kind=K.CLIENT_ERROR, statuses=_statuses(_4XX)),
    # Anything else — an in-stream error nothing above recognised, or an error body under a
    # 2xx/3xx status — is taken for an upstream fault.
    FailureRule(name="unrecognised", kind=K.SERVER),
)

del K


# --- reading the evidence -------------------------------------------------------------------
