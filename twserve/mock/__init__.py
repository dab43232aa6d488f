"""A fake upstream speaking Anthropic Messages, OpenAI Chat and Responses, and Gemini.

Scriptable per instance and per request (`Script`, the ``x-mock-script`` header): answer text,
chunk count and pacing, reasoning, parallel tool calls, usage, HTTP errors in each provider's
own shape, in-stream errors, broken, silent and reset connections, and which requests fail.
Planning (`plan`) is pure; `MockHandler` carries plans out over any twserve transport.
See docs/mock-upstream.md.
"""

from twserve.mock.app import (
    MockHandler,
    MockServer,
    Received,
    carry_out,
    make_handler,
    run_mock,
    serve_mock,
)
from twserve.mock.cli import add_mock_arguments, settings_from_args
from twserve.mock.plan import (
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
from twserve.mock.script import (
    ErrorSpec,
    MockSettings,
    Script,
    ScriptError,
    SilenceMode,
    Usage,
    parse_script,
)
from twserve.mock.shapes import SHAPES

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
