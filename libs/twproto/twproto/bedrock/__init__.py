"""AWS Bedrock as an upstream: the ``bedrock-anthropic`` protocol (InvokeModel and
InvokeModelWithResponseStream carrying an Anthropic Messages body).

`invoke_request` writes the request (path, body, SigV4 or bearer auth); `InvokeStreamReframer`
turns the event-stream answer back into the Anthropic SSE stream it wraps, so everything
downstream reads it as an Anthropic upstream's stream (docs/bedrock.md).
"""

from twproto.bedrock.invoke import (
    BEDROCK_ANTHROPIC_VERSION,
    AwsAuth,
    bedrock_base_url,
    host_header,
    invoke_body,
    invoke_path,
    invoke_request,
)
from twproto.bedrock.reframe import EventStreamTranslator, InvokeStreamReframer

__all__ = (
    "BEDROCK_ANTHROPIC_VERSION",
    "AwsAuth",
    "EventStreamTranslator",
    "InvokeStreamReframer",
    "bedrock_base_url",
    "host_header",
    "invoke_body",
    "invoke_path",
    "invoke_request",
)
