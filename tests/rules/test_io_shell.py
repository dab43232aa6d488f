"""twserve is the IO shell: no format-specific knowledge lives in it.

Header names, paths, query parameters and stream event names of the four APIs belong to
twproto; twserve only carries out what twproto and twengine return. This test greps twserve's
sources (the mock upstream aside: it plays the providers, so it must speak their wire format,
and it is moving to its own package) for the tell-tale strings, in code and comments alike.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.layout import PACKAGE_DIRS, ROOT

SHELL = PACKAGE_DIRS["twserve"]
EXEMPT = (SHELL / "mock",)

# Strings that only code knowing a particular API would write.
WIRE_FACTS = (
    # headers
    "anthropic-version",
    "anthropic-beta",
    "x-api-key",
    "x-goog-api-key",
    "x-stainless",
    "openai-organization",
    # paths and query parameters
    "/v1/messages",
    "/chat/completions",
    "/v1/responses",
    "/v1beta",
    ":generateContent",
    ":streamGenerateContent",
    ":countTokens",
    "alt=sse",
    # stream events and fields
    "message_start",
    "message_stop",
    "content_block_delta",
    "response.created",
    "response.completed",
    "[DONE]",
    "finishReason",
    "finish_reason",
)
# Names that contain a wire fact without being one: OpenTelemetry's GenAI span attribute for
# the stop reason (twserve/observe/traces.py), which the IR's reason fills in every format.
NOT_WIRE = ("gen_ai.response.finish_reasons",)


def _shell_sources() -> list[Path]:
    return sorted(p for p in SHELL.rglob("*.py") if not any(p.is_relative_to(e) for e in EXEMPT))


def test_the_shell_has_sources() -> None:
    assert {"relay/loop.py", "gateway/handler.py", "upstream/client.py"} <= {
        p.relative_to(SHELL).as_posix() for p in _shell_sources()
    }


@pytest.mark.parametrize("path", _shell_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_wire_facts_in_the_shell(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for name in NOT_WIRE:
        text = text.replace(name, " " * len(name))  # line numbers unchanged
    found = [
        f"{fact!r} on line {text.count(chr(10), 0, text.index(fact)) + 1}"
        for fact in WIRE_FACTS
        if fact in text
    ]
    assert not found, f"{path.relative_to(ROOT)} knows a format's wire: {', '.join(found)}"


# Each concern of the request path lives in a module of its own (caller checks, credentials,
# key turns, reasoning memories, body copies, slot bookkeeping); these two only sequence them.
LINE_BUDGET = {"relay/loop.py": 300, "gateway/handler.py": 300}


@pytest.mark.parametrize("name", sorted(LINE_BUDGET))
def test_the_request_path_stays_small(name: str) -> None:
    lines = (SHELL / name).read_text(encoding="utf-8").count("\n")
    budget = LINE_BUDGET[name]
    assert lines <= budget, f"twserve/{name} has {lines} lines; split what is not its concern"


# What an attempt needs travels with it: its destination (twengine.destinations) names the
# provider and its transport, and a socket turn's upstream sockets ride on its request. Ambient
# state, or a provider found again by matching a URL against the configured base URLs (the first
# match won, whatever the second provider on that URL was set to), hides who decided.
AMBIENT = re.compile(
    r"\bContextVar\b|\bcontextvars\b|startswith\([^)\n]*base_url|base_url\S*\.startswith"
)


@pytest.mark.parametrize("path", _shell_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_ambient_route_and_no_provider_found_again_by_url(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [
        f"{m.group(0)!r} on line {text.count(chr(10), 0, m.start()) + 1}"
        for m in AMBIENT.finditer(text)
    ]
    assert not found, f"{path.relative_to(ROOT)}: {', '.join(found)}"
