"""A fake upstream speaking Anthropic Messages, OpenAI Chat and Responses, and Gemini.

Scriptable per instance and per request (`Script`, the ``x-mock-script`` header): answer text,
chunk count and pacing, reasoning, parallel tool calls, usage, HTTP errors in each provider's
own shape, in-stream errors, broken, silent and reset connections, and which requests fail.
The package is split like the gateway it tests. Everything that decides what to answer is pure
and imports no IO, clock or randomness (tests/rules/test_boundaries.py checks it): `script` (what a
script says), `answer` (the answer before any format), `formats/` (the writers: `anthropic`,
`openai_chat`, `openai_responses`, `gemini`), `shapes` (named provider errors) and `plan`
(request in, steps out). The IO is all in `serve/`: `handler` (`MockHandler` keeps the counters,
draws the random numbers, reads the clock and plays plans over a twserve transport), `server`,
the WebSocket endpoints, and `cli` (command-line options and script files). See
docs/mock-upstream.md.
"""

from twmock.plan import (
    Break,
    Chunk,
    End,
    Head,
    Plan,
    RequestInfo,
    ResetBeforeHead,
    Silence,
    Step,
    plan,
)
from twmock.script import (
    ErrorSpec,
    MockSettings,
    Script,
    ScriptError,
    SilenceMode,
    Usage,
    parse_script,
)
from twmock.serve.cli import add_mock_arguments, settings_from_args
from twmock.serve.handler import MockHandler, Received, carry_out, make_handler
from twmock.serve.server import MockServer, run_mock, serve_mock
from twmock.shapes import SHAPES

__all__ = [
    "SHAPES",
    "Break",
    "Chunk",
    "End",
    "ErrorSpec",
    "Head",
    "MockHandler",
    "MockServer",
    "MockSettings",
    "Plan",
    "Received",
    "RequestInfo",
    "ResetBeforeHead",
    "Script",
    "ScriptError",
    "Silence",
    "SilenceMode",
    "Step",
    "Usage",
    "add_mock_arguments",
    "carry_out",
    "make_handler",
    "parse_script",
    "plan",
    "run_mock",
    "serve_mock",
    "settings_from_args",
]
