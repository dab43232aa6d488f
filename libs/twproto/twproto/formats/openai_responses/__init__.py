"""OpenAI Responses (``POST /v1/responses``, Codex's wire) ⇄ IR.

Theory of operation
-------------------

Requests: ``instructions`` is `Request.system`; ``input`` items become messages. Consecutive
items that belong to one speaker are one IR message: ``reasoning``, assistant ``message`` and
``function_call``/``custom_tool_call`` items make an assistant message; ``function_call_output``
items and user messages a user message; ``system``/``developer`` messages (Codex's system prompt)
are `Role.SYSTEM` messages in place. Tools keep their kind: ``function``, ``custom`` (free-form,
with its grammar), functions inside a ``namespace`` (each tool remembers its namespace), and
hosted tools (``web_search``, ``tool_search``…) as `ToolKind.BUILTIN`, which other formats drop.

Encoding from another format: the request is stateless (``store: false`` unless the client said
otherwise) and, when reasoning is on, asks for ``include: ["reasoning.encrypted_content"]`` so the
reasoning can be replayed on the next turn, and for a reasoning summary so the client sees the
reasoning text. Function tools get ``strict: false`` unless the source said, so schemas that
are not strict-compatible are accepted. Reasoning parts are replayed as reasoning items only
when they carry a seal (encrypted content, or another format's signature standing in for it).

Answers and streams: output items are numbered by ``output_index``; the decoder gives each
reasoning item, text content part and tool call its own IR index. A custom tool call's input
streams as raw text; the decoder wraps it as the JSON ``{"input": …}`` the IR uses, escaping
each piece on its own (JSON string escaping is per character). The encoder writes the full
event sequence the SDK's accumulator checks (``output_item.added`` → deltas → ``*.done`` →
``output_item.done``, ``sequence_number`` on every event, stable item ids derived from the
response id and the output index), and ends with ``response.completed`` — or
``response.incomplete`` for a length or content-filter stop — carrying every output item and the
usage. A custom call's input is delivered in one piece when the call ends (it arrives as JSON
from other formats). Errors are ``response.failed``.
"""

from __future__ import annotations

from twproto.formats.openai_responses.request import DIALECT, decode_request, encode_request
from twproto.formats.openai_responses.response import (
    decode_response,
    decode_usage,
    encode_response,
    encode_usage,
)
from twproto.formats.openai_responses.state import (
    NOT_FOUND_CODE,
    SocketMemory,
    closing_response,
    expand_body,
    input_items,
    is_warm_up,
    load_items,
    not_found_body,
    previous_id,
    record_items,
    response_items,
    warm_up,
)
from twproto.formats.openai_responses.stream import (
    WATCH,
    StreamDecoder,
    StreamEncoder,
    new_stream_decoder,
    new_stream_encoder,
)

__all__ = (
    "DIALECT",
    "NOT_FOUND_CODE",
    "WATCH",
    "SocketMemory",
    "StreamDecoder",
    "StreamEncoder",
    "closing_response",
    "decode_request",
    "decode_response",
    "decode_usage",
    "encode_request",
    "encode_response",
    "encode_usage",
    "expand_body",
    "input_items",
    "is_warm_up",
    "load_items",
    "new_stream_decoder",
    "new_stream_encoder",
    "not_found_body",
    "previous_id",
    "record_items",
    "response_items",
    "warm_up",
)
