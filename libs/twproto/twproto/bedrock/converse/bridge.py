"""The ``bedrock-converse`` upstream beside the gateway's Anthropic path.

A ``bedrock-converse`` provider is an Anthropic upstream to the rest of the gateway, as a
``bedrock-anthropic`` one is: the client's request is translated to an Anthropic Messages body
as for any Anthropic upstream, then here through the IR to Converse (`converse_request`); the
answer comes back through the IR as Anthropic's (`converse_answer_as_anthropic`, and
`ConverseStreamReframer` for a stream). One conversion path downstream serves every client
format, failover and the opening hold included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from twproto import _json
from twproto.bedrock.converse.request import encode_converse_request
from twproto.bedrock.converse.response import decode_converse_answer
from twproto.bedrock.converse.stream import converse_message_id
from twproto.bedrock.invoke import AwsAuth, signed_headers
from twproto.formats import anthropic
from twproto.formats._common import MALFORMED

__all__ = (
    "converse_answer_as_anthropic",
    "converse_body",
    "converse_count_body",
    "converse_path",
    "converse_request",
)

Header = tuple[bytes, bytes]

# What CountTokens' ``converse`` input takes of a Converse body (ConverseTokensRequest).
_COUNTED = ("messages", "system", "toolConfig", "additionalModelRequestFields")


def converse_path(model: str, *, stream: bool) -> str:
    """``/model/{id}/converse`` (or ``converse-stream``), the id percent-encoded whole."""
    return f"/model/{quote(model, safe='')}/{'converse-stream' if stream else 'converse'}"


def converse_body(anthropic_body: bytes, model: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The Anthropic Messages `anthropic_body` as a Converse body for `model`, with what could
    not be carried."""
    req = anthropic.decode_request(_json.loads(anthropic_body))
    return encode_converse_request(req, model=model)


def converse_count_body(anthropic_body: bytes, model: str) -> bytes:
    """The CountTokens body counting the Anthropic request `anthropic_body` as Converse."""
    body, _ = converse_body(anthropic_body, model)
    return _json.dumps({"input": {"converse": {k: body[k] for k in _COUNTED if k in body}}})


def converse_request(
    base_url: str,
    model: str,
    anthropic_body: bytes,
    *,
    stream: bool,
    auth: AwsAuth,
    key: str,
    headers: Sequence[Header] = (),
    now: float,
) -> tuple[str, list[Header], bytes]:
    """The URL, headers and body of the Converse (or ConverseStream) call for `model` carrying
    the Anthropic request `anthropic_body`, signed as `invoke_request` signs."""
    url = base_url.rstrip("/") + converse_path(model, stream=stream)
    body, _ = converse_body(anthropic_body, model)
    accept = b"application/vnd.amazon.eventstream" if stream else b"application/json"
    sent, data = signed_headers(
        url, _json.dumps(body), accept=accept, auth=auth, key=key, headers=headers, now=now
    )
    return url, sent, data


def converse_answer_as_anthropic(body: bytes, model: str) -> bytes:
    """A whole Converse answer as the Anthropic message it says, naming `model`. Raises
    ValueError for a body that is not a JSON object."""
    obj = _json.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("a Converse answer that is not a JSON object")
    try:
        answer = decode_converse_answer(obj, id=converse_message_id(body), model=model)
        return _json.dumps(anthropic.encode_response(answer, model=model))
    except MALFORMED as exc:
        raise ValueError(f"a Converse answer of an unexpected shape: {exc!r}") from None
