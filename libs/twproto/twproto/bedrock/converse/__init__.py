"""Bedrock's Converse and ConverseStream APIs (the ``bedrock-converse`` upstream protocol).

`encode_converse_request` writes an IR request as a Converse body; `decode_converse_answer`
reads a Converse answer into the IR; `ConverseStreamDecoder` reads ConverseStream's events into
IR stream calls and `ConverseStreamReframer` writes them as the Anthropic SSE stream the
gateway's stream machinery reads (docs/bedrock.md, "The bedrock-converse upstream").
"""

from twproto.bedrock.converse.bridge import (
    converse_answer_as_anthropic,
    converse_body,
    converse_count_body,
    converse_path,
    converse_request,
)
from twproto.bedrock.converse.request import (
    CONVERSE_DEFAULT_MAX_TOKENS,
    encode_converse_request,
    is_claude_model,
)
from twproto.bedrock.converse.response import (
    CONVERSE_STOP_REASONS,
    decode_converse_answer,
    decode_converse_block,
    decode_converse_usage,
)
from twproto.bedrock.converse.stream import (
    ConverseStreamDecoder,
    ConverseStreamReframer,
    converse_message_id,
)

__all__ = (
    "CONVERSE_DEFAULT_MAX_TOKENS",
    "CONVERSE_STOP_REASONS",
    "ConverseStreamDecoder",
    "ConverseStreamReframer",
    "converse_answer_as_anthropic",
    "converse_body",
    "converse_count_body",
    "converse_message_id",
    "converse_path",
    "converse_request",
    "decode_converse_answer",
    "decode_converse_block",
    "decode_converse_usage",
    "encode_converse_request",
    "is_claude_model",
)
