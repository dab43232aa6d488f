"""Bedrock's CountTokens call (``POST /model/{modelId}/count-tokens``) for a token count.

CountTokens takes the request it counts in one of two shapes (``CountTokensInput``, a union in
bedrock-runtime's service model): ``{"input": {"invokeModel": {"body": <blob>}}}``, the
InvokeModel body — for an Anthropic model the Anthropic Messages body as `invoke_body` writes
it, base64-encoded as every blob in AWS's JSON protocols — or ``{"input": {"converse": {...}}}``
with a Converse request's ``messages``, ``system``, ``toolConfig`` and
``additionalModelRequestFields``. The answer is ``{"inputTokens": N}``, which `count_answer`
writes as the client's own token-count answer.

A model without token counting answers 400 ``ValidationException`` ("The provided model doesn't
support counting tokens."): `count_unsupported` recognises it, and the gateway then answers the
count with its local estimate (docs/bedrock.md).
"""

from __future__ import annotations

import binascii
from typing import Any
from urllib.parse import quote

from twproto import _json
from twproto.dialect import Dialect
from twproto.summary import count_tokens_body

__all__ = (
    "COUNT_UNSUPPORTED_MESSAGE",
    "count_answer",
    "count_invoke_body",
    "count_path",
    "count_unsupported",
)

#: Bedrock's message for a model that has no token counting.
COUNT_UNSUPPORTED_MESSAGE = "The provided model doesn't support counting tokens."

# InvokeModel requires an output limit on an Anthropic body; an Anthropic count request has
# none, and the count does not depend on it.
_COUNT_MAX_TOKENS = 1


def count_path(model: str) -> str:
    """``/model/{id}/count-tokens``, the id percent-encoded whole (as `invoke_path`)."""
    return f"/model/{quote(model, safe='')}/count-tokens"


def count_invoke_body(invoke: bytes) -> bytes:
    """The CountTokens body counting the InvokeModel body `invoke` (`invoke_body`'s output),
    given a ``max_tokens`` when it has none."""
    obj: dict[str, Any] = _json.loads(invoke)
    obj.setdefault("max_tokens", _COUNT_MAX_TOKENS)
    blob = binascii.b2a_base64(_json.dumps(obj), newline=False).decode("ascii")
    return _json.dumps({"input": {"invokeModel": {"body": blob}}})


def count_answer(body: bytes, dialect: Dialect) -> bytes | None:
    """CountTokens' answer `body` (``{"inputTokens": N}``) as `dialect`'s token-count answer;
    None when it is not that shape."""
    try:
        obj = _json.loads(body)
    except ValueError:
        return None
    tokens = obj.get("inputTokens") if isinstance(obj, dict) else None
    if type(tokens) is not int or tokens < 0:
        return None
    return count_tokens_body(dialect, tokens)


def count_unsupported(status: int, body: bytes) -> bool:
    """Whether an error answer of CountTokens says the model cannot count tokens."""
    if status != 400:
        return False
    try:
        obj = _json.loads(body)
    except ValueError:
        return False
    message = obj.get("message") if isinstance(obj, dict) else None
    return isinstance(message, str) and "support counting tokens" in message
