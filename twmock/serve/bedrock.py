"""The mock's Bedrock endpoint: InvokeModel, InvokeModelWithResponseStream and CountTokens.

``POST /model/{modelId}/invoke`` and ``…/invoke-with-response-stream`` (after an optional
profile segment) carry an Anthropic Messages body without ``model`` and ``stream``
(``anthropic_version: bedrock-2023-05-31``). The mock checks the request's authentication,
plans it as the Anthropic request it wraps — so every script knob (errors, ``fail_first``,
stream errors, cuts, stalls) plays the same — and writes the answer as Bedrock frames it
(`twmock.formats.bedrock`).

``POST /model/{modelId}/count-tokens`` is CountTokens: ``{"input": {"invokeModel": {"body":
<base64 of the InvokeModel body>}}}``, planned as the Anthropic token count it wraps and
answered ``{"inputTokens": N}``. As on Bedrock, only Anthropic models count: any other model id
is refused with the 400 ``ValidationException`` "The provided model doesn't support counting
tokens.".

``POST /model/{modelId}/converse`` and ``…/converse-stream`` are Converse and ConverseStream
(`twmock.formats.converse`): the conversation is checked as Bedrock checks it (it starts with a
user message, roles alternate, tool blocks need a ``toolConfig``), then planned as the
Anthropic request it amounts to. CountTokens takes ``input.converse`` the same way.

Authentication, as `MockSettings` configures it (neither set: any request is served):

* ``aws_credentials``: SigV4 with those credentials in ``aws_region``, verified by
  `twproto.sigv4.verify_request` against the mock's clock; a refusal is AWS's own 403 (the
  exception in ``x-amzn-ErrorType``, its message in the body);
* ``bedrock_api_key``: ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass, replace
from urllib.parse import unquote

from twmock.formats._wire import compact
from twmock.formats.converse import anthropic_request
from twmock.plan import Chunk, End, Head, Plan, RequestInfo
from twmock.script import MockSettings
from twproto import json_dumps, json_loads
from twproto.bedrock import COUNT_UNSUPPORTED_MESSAGE
from twproto.sigv4 import SIGV4_REFUSALS, SignatureCheck, verify_request

__all__ = [
    "BedrockCall",
    "as_anthropic",
    "as_anthropic_count",
    "as_converse",
    "bedrock_call",
    "bedrock_refusal",
    "validation_plan",
]

_AGAIN = "please reformat your input and try again."
_PATH = re.compile(
    r"/model/(?P<model>[^/]+)/"
    r"(?P<action>invoke|invoke-with-response-stream|count-tokens|converse|converse-stream)"
)


@dataclass(frozen=True, slots=True)
class BedrockCall:
    model: str
    stream: bool
    count: bool = False
    converse: bool = False


def bedrock_call(method: str, path: str) -> BedrockCall | None:
    """The InvokeModel call `path` (profile segment removed) names, or None."""
    found = _PATH.fullmatch(path)
    if method != "POST" or found is None:
        return None
    action = found["action"]
    stream = action in ("invoke-with-response-stream", "converse-stream")
    return BedrockCall(
        model=unquote(found["model"]),
        stream=stream,
        count=action == "count-tokens",
        converse=action.startswith("converse"),
    )


def _refuse(name: str, message: str) -> Plan:
    body = compact({"message": message})
    headers = (
        (b"content-type", b"application/json"),
        (
            b"x-amzn-errortype",
            f"{name}:http://internal.amazon.com/coral/com.amazon.coral.service/".encode(),
        ),
        (b"content-length", str(len(body)).encode()),
    )
    return Plan(steps=(Head(status=403, headers=headers), Chunk(data=body), End()), outcome="auth")


def bedrock_refusal(
    settings: MockSettings,
    target: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    body: bytes,
    now: float,
) -> Plan | None:
    """The 403 that refuses this request's authentication, or None when it passes."""
    auth = next((v for k, v in headers if k == b"authorization"), None)
    if settings.bedrock_api_key is not None and auth is not None and auth.startswith(b"Bearer "):
        if auth[7:].decode("latin-1") == settings.bedrock_api_key:
            return None
        return _refuse(*SIGV4_REFUSALS[SignatureCheck.UNKNOWN_KEY])
    if settings.aws_credentials is None:
        if settings.bedrock_api_key is None:
            return None
        return _refuse(*SIGV4_REFUSALS[SignatureCheck.MISSING])
    host = next((v for k, v in headers if k == b"host"), b"localhost").decode("latin-1")
    url = f"http://{host}{target.decode('latin-1')}"
    check = verify_request(
        "POST",
        url,
        list(headers),
        body,
        region=settings.aws_region,
        credentials=settings.aws_credentials,
        now=now,
    )
    if check is SignatureCheck.VALID:
        return None
    return _refuse(*SIGV4_REFUSALS[check])


def as_anthropic(info: RequestInfo, call: BedrockCall) -> RequestInfo | str:
    """`info` as the Anthropic Messages request it wraps, or the validation message Bedrock
    answers a body that is not one."""
    try:
        body = json_loads(info.body)
    except ValueError:
        return "Malformed input request, " + _AGAIN
    if not isinstance(body, dict):
        return "Malformed input request, " + _AGAIN
    if body.pop("anthropic_version", None) is None:
        return f"Malformed input request: #: required key [anthropic_version] not found, {_AGAIN}"
    for extraneous in ("model", "stream"):
        if extraneous in body:
            return (
                f"Malformed input request: #: extraneous key [{extraneous}] is not permitted, "
                + _AGAIN
            )
    body.pop("anthropic_beta", None)
    body["model"] = call.model
    if call.stream:
        body["stream"] = True
    return replace(info, path="/v1/messages", query="", body=json_dumps(body))


def as_anthropic_count(info: RequestInfo, call: BedrockCall) -> RequestInfo | str:
    """A CountTokens request as the Anthropic token count it wraps, or Bedrock's validation
    message for one it refuses."""
    if "anthropic." not in call.model:
        return COUNT_UNSUPPORTED_MESSAGE
    try:
        body = json_loads(info.body)
        if "converse" in body["input"]:
            return _converse_count(info, call, body["input"]["converse"])
        invoke = body["input"]["invokeModel"]["body"]
        inner = binascii.a2b_base64(invoke, strict_mode=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        return "Malformed input request, " + _AGAIN
    wrapped = as_anthropic(replace(info, body=inner), BedrockCall(model=call.model, stream=False))
    if isinstance(wrapped, str):
        return wrapped
    counted = json_loads(wrapped.body)
    counted.pop("max_tokens", None)  # InvokeModel's; the Anthropic count takes none
    return replace(wrapped, path="/v1/messages/count_tokens", body=json_dumps(counted))


def _converse_count(info: RequestInfo, call: BedrockCall, converse: object) -> RequestInfo | str:
    wrapped = anthropic_request(json_dumps(converse), call.model, stream=False)
    if isinstance(wrapped, str):
        return wrapped
    wrapped.pop("max_tokens", None)
    return replace(info, path="/v1/messages/count_tokens", query="", body=json_dumps(wrapped))


def as_converse(info: RequestInfo, call: BedrockCall) -> RequestInfo | str:
    """A Converse request as the Anthropic Messages request it amounts to, or the validation
    message Bedrock answers it with."""
    wrapped = anthropic_request(info.body, call.model, stream=call.stream)
    if isinstance(wrapped, str):
        return wrapped
    return replace(info, path="/v1/messages", query="", body=json_dumps(wrapped))


def validation_plan(message: str) -> Plan:
    """Bedrock's 400 for a body it cannot read."""
    body = compact({"message": message})
    headers = (
        (b"content-type", b"application/json"),
        (
            b"x-amzn-errortype",
            b"ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/",
        ),
        (b"content-length", str(len(body)).encode()),
    )
    return Plan(
        steps=(Head(status=400, headers=headers), Chunk(data=body), End()), outcome="bad_request"
    )
