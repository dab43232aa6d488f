"""Named provider error shapes: bodies and headers copied from real captures.

``error: "glm-1308"`` makes the mock answer exactly what that provider sends — status, headers
and body bytes — whatever API format the request used, because relays and compatible endpoints
do exactly that (a GLM key behind an Anthropic-compatible URL still answers GLM's body). Most
bodies are the recorded ones from tests/data/fixtures/errors/ with the model, request ids and
reset times filled in; the table is data so adding a provider is adding a row.

Placeholders in bodies and header values: ``{model}``, ``{request_id}``, ``{resets_in}``
(seconds), ``{resets_at}`` (epoch seconds), ``{reset_iso}`` (UTC, ISO 8601), ``{reset_cn}``
(``YYYY-MM-DD HH:MM:SS`` in China time, as GLM writes it), ``{retry_delay}`` (Gemini's
``"5s"`` form), ``{retry_secs}`` and ``{retry_ms}`` (the retry delay in whole seconds and in
milliseconds, as Azure OpenAI writes it).

A few names stand for one situation rather than one provider (`BY_FORMAT`): ``error:
"context-overflow"`` answers the request's own format's "the prompt does not fit the context
window" error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from twmock.answer import ErrorReply, Ids, error_headers
from twmock.formats._wire import pretty
from twmock.script import ErrorSpec
from twproto import json_dumps, json_loads
from twproto.dialect import Dialect

__all__ = ["BY_FORMAT", "SHAPES", "Shape", "known_shape", "named_error", "shape_for"]

_JSON = "application/json"
_GOOGLE_JSON = "application/json; charset=UTF-8"


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    status: int
    body: str
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()
    note: str = ""


def _anthropic(kind: str, message: str) -> str:
    error = {"type": kind, "message": message}
    return (
        json_dumps({"type": "error", "error": error}).decode()[:-1]
        + ',"request_id":"{request_id}"}'
    )


_ANTHROPIC_RETRY = (("x-should-retry", "true"),)
_ANTHROPIC_LIMITS = (
    ("x-should-retry", "true"),
    ("anthropic-ratelimit-requests-limit", "4000"),
    ("anthropic-ratelimit-requests-remaining", "3999"),
    ("anthropic-ratelimit-requests-reset", "{reset_iso}"),
    ("anthropic-ratelimit-input-tokens-limit", "200000"),
    ("anthropic-ratelimit-input-tokens-remaining", "0"),
    ("anthropic-ratelimit-input-tokens-reset", "{reset_iso}"),
    ("anthropic-ratelimit-output-tokens-limit", "80000"),
    ("anthropic-ratelimit-output-tokens-remaining", "80000"),
    ("anthropic-ratelimit-output-tokens-reset", "{reset_iso}"),
)
_CODEX_HEADERS = (
    ("x-codex-active-limit", "codex"),
    ("x-codex-plan-type", "free"),
    ("x-codex-primary-used-percent", "100"),
    ("x-codex-secondary-used-percent", "0"),
    ("x-codex-primary-window-minutes", "10080"),
    ("x-codex-primary-over-secondary-limit-percent", "0"),
    ("x-codex-secondary-window-minutes", "0"),
    ("x-codex-primary-reset-after-seconds", "{resets_in}"),
    ("x-codex-secondary-reset-after-seconds", "0"),
    ("x-codex-primary-reset-at", "{resets_at}"),
    ("x-codex-secondary-reset-at", ""),
    ("x-codex-credits-has-credits", "False"),
    ("x-codex-credits-balance", ""),
    ("x-codex-credits-unlimited", "False"),
)


def _google(code: int, message: str, status: str, details: list[Any] | None = None) -> str:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return pretty({"error": error}).decode() + "\n"


_GOOGLE_HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}
_SCHEMA_MESSAGE = (
    'Invalid JSON payload received. Unknown name "additionalProperties" at '
    "'tools[0].function_declarations[0].parameters': Cannot find field."
)

SHAPES: dict[str, Shape] = {
    # Anthropic
    "anthropic-overloaded": Shape(
        status=529,
        body=_anthropic("overloaded_error", "Overloaded"),
        headers=_ANTHROPIC_RETRY,
    ),
    "anthropic-rate-limit": Shape(
        status=429,
        body=_anthropic(
            "rate_limit_error",
            "This request would exceed your organization's rate limit of 80,000 input tokens "
            "per minute (model: {model}). For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits. You can see the response headers for "
            "current usage. Please reduce the prompt length or the maximum tokens requested, or "
            "try again later.",
        ),
        headers=_ANTHROPIC_LIMITS,
    ),
    "anthropic-prompt-too-long": Shape(
        status=400,
        body=_anthropic(
            "invalid_request_error", "prompt is too long: 205429 tokens > 200000 maximum"
        ),
    ),
    "anthropic-invalid-signature": Shape(
        status=400,
        body=_anthropic(
            "invalid_request_error", "messages.1.content.0: Invalid `signature` in `thinking` block"
        ),
    ),
    "anthropic-effort-unsupported": Shape(
        status=400,
        body=_anthropic(
            "invalid_request_error",
            "This model does not support effort level 'xhigh'. Supported levels: high, low, "
            "max, medium.",
        ),
    ),
    "anthropic-auth": Shape(
        status=401, body=_anthropic("authentication_error", "invalid x-api-key")
    ),
    "anthropic-credit-balance": Shape(
        status=400,
        body=_anthropic(
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
            "Billing to upgrade or purchase credits.",
        ),
    ),
    "anthropic-model-missing": Shape(
        status=404, body=_anthropic("not_found_error", "model: {model}")
    ),
    # OpenAI (bodies pretty or compact as recorded)
    "openai-rate-limit": Shape(
        status=429,
        body='{"error":{"message":"Request too large for {model} in organization '
        "org-XXXXXXXXXXXXXXXXXXXXXXXX on tokens per min (TPM): Limit 30000, Requested 30601. "
        "The input or output tokens must be reduced in order to run successfully. Visit "
        'https://platform.openai.com/account/rate-limits to learn more.","type":"tokens",'
        '"param":null,"code":"rate_limit_exceeded"}}',
    ),
    "openai-insufficient-quota": Shape(
        status=429,
        body='{\n  "error": {\n    "message": "You exceeded your current quota, please check '
        "your plan and billing details. For more information on this error, read the docs: "
        'https://platform.openai.com/docs/guides/error-codes/api-errors.",\n    "type": '
        '"insufficient_quota",\n    "param": null,\n    "code": "insufficient_quota"\n  }\n}',
    ),
    "openai-context-length": Shape(
        status=400,
        body='{\n  "error": {\n    "message": "Input tokens exceed the configured limit of '
        "272000 tokens. Your messages resulted in 3148588 tokens. Please reduce the length of "
        'the messages.",\n    "type": "invalid_request_error",\n    "param": "messages",\n    '
        '"code": "context_length_exceeded"\n  }\n}\n',
    ),
    # The Responses API's wording for the same code.
    "openai-responses-context-length": Shape(
        status=400,
        body='{\n  "error": {\n    "message": "Your input exceeds the context window of this '
        'model. Please adjust your input and try again.",\n    "type": '
        '"invalid_request_error",\n    "param": "input",\n    "code": '
        '"context_length_exceeded"\n  }\n}',
    ),
    "openai-invalid-encrypted-content": Shape(
        status=400,
        body='{\n  "error": {\n    "message": "The encrypted content gAAA...c90= could not be '
        'verified.",\n    "type": "invalid_request_error",\n    "param": null,\n    "code": '
        '"invalid_encrypted_content"\n  }\n}',
    ),
    "openai-unsupported-effort": Shape(
        status=400,
        body='{"error":{"message":"Unsupported value: \'reasoning_effort\' does not support '
        "'none' with this model. Supported values are: 'minimal', 'low', 'medium', and "
        '\'high\'.","type":"invalid_request_error"}}',
    ),
    "openai-auth": Shape(
        status=401,
        body='{\n  "error": {\n    "message": "Incorrect API key provided: sk-proj-****abcd. '
        'You can find your API key at https://platform.openai.com/account/api-keys.",\n    '
        '"type": "invalid_request_error",\n    "param": null,\n    "code": "invalid_api_key"\n'
        "  }\n}\n",
    ),
    "openai-model-missing": Shape(
        status=404,
        body='{"error":{"message":"The model `{model}` does not exist or you do not have access '
        'to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}',
    ),
    "openai-server-error": Shape(
        status=500,
        body='{\n  "error": {\n    "message": "The server had an error processing your request. '
        "Sorry about that! You can retry your request, or contact us through our help center "
        "at help.openai.com if you keep seeing this error. (Please include the request ID "
        '{request_id} in your email.)",\n    "type": "server_error",\n    "param": null,\n    '
        '"code": null\n  }\n}',
    ),
    # Codex (ChatGPT plan usage limit)
    "codex-usage-limit": Shape(
        status=429,
        body='{"error":{"type":"usage_limit_reached","message":"The usage limit has been '
        'reached","plan_type":"free","resets_at":{resets_at},"resets_in_seconds":{resets_in}}}',
        headers=_CODEX_HEADERS,
    ),
    # DeepSeek
    "deepseek-insufficient-balance": Shape(
        status=402,
        body='{"error":{"message":"Insufficient Balance","type":"unknown_error","param":null,'
        '"code":"invalid_request_error"}}',
    ),
    # GLM (Zhipu / Z.ai), all sent as HTTP 429
    "glm-1113": Shape(
        status=429,
        body='{"error":{"code":"1113","message":"余额不足或无可用资源包,请充值。"}}',
        note="insufficient balance",
    ),
    "glm-1302": Shape(
        status=429,
        body='{"error":{"code":"1302","message":"您的账户已达到速率限制，请您控制请求频率"},'
        '"request_id":"{request_id}"}',
        note="rate limit",
    ),
    "glm-1303": Shape(
        status=429,
        body='{"error":{"code":"1303","message":"您当前使用该 API 的频率过高,请降低频率,'
        '或联系客服增加限额"}}',
        note="frequency",
    ),
    "glm-1304": Shape(
        status=429,
        body='{"error":{"code":"1304","message":"该 API 已达今日调用次数限额,如有更多需求,'
        '请联系客服购买"}}',
        note="daily limit",
    ),
    "glm-1305": Shape(
        status=429,
        body='{"error":{"code":"1305","message":"该模型当前访问量过大，请您稍后再试"},'
        '"request_id":"{request_id}"}',
        note="model overloaded",
    ),
    "glm-1308": Shape(
        status=429,
        body='{"error":{"code":"1308","message":"已达到 5 小时的使用上限。您的限额将在 '
        '{reset_cn} 重置。"}}',
        note="usage limit with reset time (China time)",
    ),
    # Gemini
    "gemini-rate-limit": Shape(
        status=429,
        content_type=_GOOGLE_JSON,
        body=_google(
            429,
            "You exceeded your current quota, please check your plan and billing details. For "
            "more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, "
            "head to: https://ai.dev/rate-limit. \n* Quota exceeded for metric: "
            "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count, "
            "limit: 250000, model: {model}\nPlease retry in {retry_delay}.",
            "RESOURCE_EXHAUSTED",
            [
                _GOOGLE_HELP,
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_input_token_count",
                            "quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier",
                            "quotaDimensions": {"location": "global", "model": "{model}"},
                            "quotaValue": "250000",
                        }
                    ],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": "{retry_delay}",
                },
            ],
        ),
        note="RetryInfo retryDelay from error.retry_after (default 5s)",
    ),
    "gemini-quota-daily": Shape(
        status=429,
        content_type=_GOOGLE_JSON,
        body=_google(
            429,
            "You exceeded your current quota, please check your plan and billing details. For "
            "more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, "
            "head to: https://ai.dev/rate-limit. ",
            "RESOURCE_EXHAUSTED",
            [_GOOGLE_HELP],
        ),
        note="no RetryInfo",
    ),
    "gemini-unavailable": Shape(
        status=503,
        content_type=_GOOGLE_JSON,
        body=_google(503, "The model is overloaded. Please try again later.", "UNAVAILABLE"),
    ),
    "gemini-context-length": Shape(
        status=400,
        content_type=_GOOGLE_JSON,
        body=_google(
            400,
            "The input token count (1231741) exceeds the maximum number of tokens allowed "
            "(1048576).",
            "INVALID_ARGUMENT",
        ),
    ),
    "gemini-invalid-argument": Shape(
        status=400,
        content_type=_GOOGLE_JSON,
        body=_google(
            400,
            _SCHEMA_MESSAGE,
            "INVALID_ARGUMENT",
            [
                {
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [
                        {
                            "field": "tools[0].function_declarations[0].parameters",
                            "description": _SCHEMA_MESSAGE,
                        }
                    ],
                }
            ],
        ),
    ),
    "gemini-missing-thought-signature": Shape(
        status=400,
        content_type=_GOOGLE_JSON,
        body='{"error":{"code":400,"message":"Function call is missing a thought_signature in '
        "functionCall parts. This is required for tools to work correctly, and missing "
        "thought_signature may lead to degraded model performance. Additional data, function "
        "call `default_api:Task` , position 2. Please refer to "
        'https://ai.google.dev/gemini-api/docs/thought-signatures for more details.",'
        '"status":"INVALID_ARGUMENT"}}',
    ),
    "gemini-corrupted-thought-signature": Shape(
        status=400,
        content_type=_GOOGLE_JSON,
        body='{\n  "error": {\n    "code": 400,\n    "message": "Corrupted thought signature.",'
        '\n    "status": "INVALID_ARGUMENT"\n  }\n}\n',
    ),
    "gemini-array-429": Shape(
        status=429,
        content_type=_GOOGLE_JSON,
        body='[{\n  "error": {\n    "code": 429,\n    "message": "Resource exhausted. Please try '
        "again later. Please refer to "
        "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more "
        'details.",\n    "errors": [\n      {\n        "message": "Resource exhausted. Please '
        "try again later. Please refer to "
        "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more "
        'details.",\n        "domain": "global",\n        "reason": "rateLimitExceeded"\n'
        '      }\n    ],\n    "status": "RESOURCE_EXHAUSTED"\n  }\n}\n]',
        note="Code Assist / Vertex array-wrapped form",
    ),
    # Relays
    "openrouter-rate-limited": Shape(
        status=429,
        body='{"error":{"code":429,"message":"Provider returned error","metadata":{'
        '"provider_name":"Google","raw":"{model} is temporarily rate-limited upstream. Please '
        "retry shortly, or add your own key to accumulate your rate limits: "
        'https://openrouter.ai/settings/integrations"}},"user_id":"user_mock"}',
    ),
    "cloudflare-502": Shape(
        status=502,
        content_type="text/html",
        body="<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>"
        "502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n</body>\r\n"
        "</html>\r\n",
        note="an HTML page, as a CDN in front of an API writes it",
    ),
    # Azure OpenAI (twmock.serve.cloud)
    "azure-rate-limit": Shape(
        status=429,
        body='{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation '
        "under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your "
        "current OpenAI S0 pricing tier. Please retry after {retry_secs} seconds. Please "
        "contact Azure support service if you would like to further increase the default rate "
        'limit."}}',
        headers=(("retry-after-ms", "{retry_ms}"), ("x-ratelimit-remaining-tokens", "0")),
    ),
    "azure-content-filter": Shape(
        status=400,
        body='{"error":{"message":"The response was filtered due to the prompt triggering Azure '
        "OpenAI's content management policy. Please modify your prompt and retry. To learn "
        "more about our content filtering policies please read our documentation: "
        'https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt",'
        '"code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation",'
        '"content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":'
        '{"filtered":false,"detected":false},"self_harm":{"filtered":false,"severity":"safe"},'
        '"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":true,'
        '"severity":"medium"}}}}}',
    ),
    "azure-unauthorized": Shape(
        status=401,
        body='{"error":{"code":"401","message":"Access denied due to invalid subscription key or '
        "wrong API endpoint. Make sure to provide a valid key for an active subscription and "
        'use a correct regional API endpoint for your resource."}}',
    ),
    "azure-token-unauthorized": Shape(
        status=401,
        body='{"error":{"code":"401","message":"Unauthorized. Access token is missing, invalid, '
        'audience is incorrect (https://cognitiveservices.azure.com), or have expired."}}',
    ),
    # Vertex AI (twmock.serve.cloud)
    "vertex-unauthenticated": Shape(
        status=401,
        body=_google(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "UNAUTHENTICATED",
        ),
        content_type=_GOOGLE_JSON,
    ),
    "vertex-missing-credential": Shape(
        status=401,
        body=_google(
            401,
            "Request is missing required authentication credential. Expected OAuth 2 access "
            "token, login cookie or other valid authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "UNAUTHENTICATED",
        ),
        content_type=_GOOGLE_JSON,
    ),
    "vertex-quota": Shape(
        status=429,
        body=_google(
            429,
            "Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_minute_"
            "per_project_per_base_model with base model: {model}. Please submit a quota increase "
            "request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.",
            "RESOURCE_EXHAUSTED",
        ),
        content_type=_GOOGLE_JSON,
    ),
}

_CHINA = timezone(timedelta(hours=8))


def _fill(template: str, values: dict[str, str]) -> str:
    if "{" not in template:
        return template
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _error_object(body: bytes, status: int) -> dict[str, Any]:
    """The error object an in-stream event repeats; a non-JSON body gets a generic one."""
    try:
        parsed = json_loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return dict(parsed["error"])
    return {"type": "server_error" if status >= 500 else "error", "message": f"HTTP {status}"}


# A situation's shape in each request format.
BY_FORMAT: dict[str, dict[Dialect, str]] = {
    "context-overflow": {
        Dialect.ANTHROPIC: "anthropic-prompt-too-long",
        Dialect.OPENAI_CHAT: "openai-context-length",
        Dialect.OPENAI_RESPONSES: "openai-responses-context-length",
        Dialect.GEMINI: "gemini-context-length",
    },
}


def known_shape(name: str) -> bool:
    """Whether `name` is a shape or a situation of `BY_FORMAT`."""
    return name in SHAPES or name in BY_FORMAT


def shape_for(name: str, dialect: Dialect) -> str:
    """The shape `name` stands for in a request of format `dialect`."""
    by_format = BY_FORMAT.get(name)
    return by_format[dialect] if by_format is not None else name


def named_error(name: str, spec: ErrorSpec, *, model: str, ids: Ids, now: int) -> ErrorReply:
    """The reply for shape `name`; raises KeyError for an unknown name."""
    shape = SHAPES[name]
    resets_in = spec.resets_in if spec.resets_in is not None else 3600.0
    reset = datetime.fromtimestamp(now + resets_in, UTC)
    retry = spec.retry_after if spec.retry_after is not None else 5.0
    values = {
        "model": model,
        "request_id": ids.request_id(),
        "resets_in": str(math.ceil(resets_in)),
        "resets_at": str(now + math.ceil(resets_in)),
        "reset_iso": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reset_cn": reset.astimezone(_CHINA).strftime("%Y-%m-%d %H:%M:%S"),
        "retry_delay": f"{math.ceil(retry)}s",
        "retry_secs": str(math.ceil(retry)),
        "retry_ms": str(round(retry * 1000)),
    }
    body = _fill(shape.body, values).encode()
    if spec.message is not None:
        body = _replace_message(body, spec.message)
    status = spec.status if spec.status is not None else shape.status
    headers = (
        (b"content-type", shape.content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), _fill(v, values).encode()) for k, v in shape.headers),
        *error_headers(spec, retry_header=not name.startswith(("gemini-", "vertex-"))),
    )
    return ErrorReply(status=status, headers=headers, body=body, error=_error_object(body, status))


def _replace_message(body: bytes, message: str) -> bytes:
    """The shape's body with its error message replaced (``error.message`` in the script)."""
    try:
        parsed = json_loads(body)
    except ValueError:
        return message.encode()
    target = parsed[0] if isinstance(parsed, list) and parsed else parsed
    if isinstance(target, dict) and isinstance(target.get("error"), dict):
        target["error"]["message"] = message
    return json_dumps(parsed)
