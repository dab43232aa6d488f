"""The four API formats ("dialects") a client may speak and an upstream may serve."""

from __future__ import annotations

from enum import StrEnum

__all__ = ("Dialect",)


class Dialect(StrEnum):
    ANTHROPIC = "anthropic"
    OPENAI_CHAT = "openai-chat"
    OPENAI_RESPONSES = "openai-responses"
    GEMINI = "gemini"
