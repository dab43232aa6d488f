"""AWS Bedrock as an upstream: the ``bedrock-anthropic`` protocol (InvokeModel and
InvokeModelWithResponseStream carrying an Anthropic Messages body).

`invoke_request` writes the request (path, body, SigV4 or bearer auth); `InvokeStreamReframer`
turns the event-stream answer back into the Anthropic SSE stream it wraps, so everything
downstream reads it as an Anthropic upstream's stream; `count_invoke_body` and `count_answer`
carry a token count through Bedrock's CountTokens (docs/bedrock.md).
"""

from twproto.bedrock.count import (
    COUNT_UNSUPPORTED_MESSAGE,
    count_answer,
    count_invoke_body,
    count_path,
    count_unsupported,
)
from twproto.bedrock.invoke import (
    BEDROCK_ANTHROPIC_VERSION,
    AwsAuth,
    bedrock_base_url,
    host_header,
    invoke_body,
    invoke_path,
    invoke_request,
    signed_headers,
)
from twproto.bedrock.reframe import (
    FAILURE_ANTHROPIC_TYPES,
    EventStreamTranslator,
    InvokeStreamReframer,
    Reframer,
    anthropic_error_event,
    pending_fault,
)

__all__ = (
    "BEDROCK_ANTHROPIC_VERSION",
    "COUNT_UNSUPPORTED_MESSAGE",
    "FAILURE_ANTHROPIC_TYPES",
    "AwsAuth",
    "EventStreamTranslator",
    "InvokeStreamReframer",
    "Reframer",
    "anthropic_error_event",
    "bedrock_base_url",
    "count_answer",
    "count_invoke_body",
    "count_path",
    "count_unsupported",
    "host_header",
    "invoke_body",
    "invoke_path",
    "invoke_request",
    "pending_fault",
    "signed_headers",
)
