"""What an event-stream exception or error message means for routing.

AWS ends a streamed answer that fails after its 200 with one message whose ``:message-type``
is ``exception`` (a modeled error: ``:exception-type`` names it, the JSON payload carries
``{"message": ...}``) or ``error`` (an unmodeled one: ``:error-code`` and ``:error-message``
headers). Both become a `Failure` through the shared recognition table
(`twproto.failures.RULES`, docs/failures.md), which knows Bedrock's names:

* ``throttlingException`` → rate_limited (a "tokens per day" message → quota_used_up);
* ``serviceUnavailableException`` → overloaded; ``internalServerException``,
  ``modelStreamErrorException`` → server (both temporary);
* ``validationException`` → context_overflow when the message says the input is too long
  for the model, model_unavailable when it names an invalid model, else client_error;
* ``accessDeniedException`` → auth_rejected (but "You don't have access to the model" is
  model_unavailable: the account lacks that model, its credentials are fine).

The frame carries no HTTP status (the stream answered 200), so none is assumed.
"""

from __future__ import annotations

from collections.abc import Mapping

from twproto import _json
from twproto.dialect import Dialect
from twproto.eventstream.message import EventStreamMessage
from twproto.failures import MAX_BODY_BYTES, Failure, classify_stream_error

__all__ = ("classify_eventstream_message",)


def _payload(raw: bytes) -> object:
    text = raw[:MAX_BODY_BYTES].decode("utf-8", "replace")
    try:
        parsed: object = _json.loads(text)
    except ValueError:
        return {"message": text} if text else {}
    return parsed if isinstance(parsed, Mapping) else {"message": text}


def classify_eventstream_message(message: EventStreamMessage, *, now: float) -> Failure | None:
    """The failure an ``exception`` or ``error`` message reports; None for any other message.

    Never raises: a payload that is not JSON is read as the message text.
    """
    kind = message.message_type
    if kind == "exception":
        name = message.exception_type or "exception"
        body = _payload(message.payload)
        # The shape the shared classifier reads for Bedrock: {"throttlingException": {...}},
        # with "__type" for names that do not end in "Exception".
        payload: dict[str, object] = {name: body, "__type": name}
    elif kind == "error":
        code = message.header(":error-code")
        text = message.header(":error-message")
        payload = {
            "__type": code if isinstance(code, str) else "error",
            "message": text if isinstance(text, str) else "",
        }
    else:
        return None
    # Every dialect's stream-error shapes are recognised alike; the name only fills the argument.
    return classify_stream_error(Dialect.ANTHROPIC, payload, now=now)
