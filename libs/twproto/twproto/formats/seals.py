"""Whose reasoning seal is this? What the shape of a seal says about the API that made it.

Theory of operation
-------------------

A reasoning seal (an Anthropic thinking ``signature``, a Gemini ``thoughtSignature``, a
Responses ``encrypted_content``) only means something to the API that made it; another API
refuses it: Gemini with 400 "Corrupted thought signature.", Anthropic with 400 "Invalid
`signature` in `thinking` block". The IR keeps seals opaque and carries them across formats on
purpose: an Anthropic signature handed to a Codex client as ``encrypted_content`` comes back
and goes to Anthropic again, which accepts it. So a seal can only be left out up front when its
shape names its maker for certain. Two shapes do:

* OpenAI's ``encrypted_content`` is a Fernet token: URL-safe base64 of the version byte 0x80
  and a big-endian timestamp in seconds, so it always opens with ``gAAAAA`` (until 2106).
  Neither Anthropic's signatures nor Gemini's (standard base64 of protobuf bytes, first byte
  0x12 or 0x0a: ``E…`` or ``C…``) can open that way.
* Gemini's documented placeholder ``skip_thought_signature_validator`` (it stands for a
  function call's missing signature) is Gemini's alone and is not a signature at all.

Anthropic's and Gemini's real signatures have no shape that tells them apart (both are
standard base64 of protobuf bytes; recorded Gemini signatures open with ``E`` too), so they
travel on; a refusal is answered by the resend without seals (docs/conversion.md, "Reasoning
in foreign histories").
"""

from __future__ import annotations

import enum
import re

from twproto.dialect import Dialect

__all__ = ("GEMINI_PLACEHOLDER", "SealMaker", "seal_maker", "welcome_seal")

#: Google's documented placeholder for a function call whose real signature is unknown.
GEMINI_PLACEHOLDER = "skip_thought_signature_validator"

# A Fernet token: 0x80, then a 64-bit timestamp whose top 32 bits are zero before 2106, then
# the IV, ciphertext and HMAC, in URL-safe base64.
_FERNET = re.compile(r"gAAAAA[A-Za-z0-9_-]+={0,2}")


class SealMaker(enum.Enum):
    """The API a seal's shape names for certain."""

    OPENAI = "openai"  # a Responses encrypted_content (Fernet token)
    GEMINI_PLACEHOLDER = "gemini_placeholder"  # skip_thought_signature_validator
    UNKNOWN = "unknown"  # Anthropic's, Gemini's, or another's: the shape does not say


def seal_maker(seal: str) -> SealMaker:
    """The maker `seal`'s shape names (`SealMaker.UNKNOWN` when it names none)."""
    if seal == GEMINI_PLACEHOLDER:
        return SealMaker.GEMINI_PLACEHOLDER
    if seal.startswith("gAAAAA") and _FERNET.fullmatch(seal) is not None:
        return SealMaker.OPENAI
    return SealMaker.UNKNOWN


# What each target refuses, and the name the drop is recorded under (`Dropped`).
_REFUSED_BY_ANTHROPIC = {
    SealMaker.OPENAI: "reasoning.signature (OpenAI encrypted_content)",
    SealMaker.GEMINI_PLACEHOLDER: "reasoning.signature (Gemini placeholder)",
}
_REFUSED_BY_GEMINI = {
    SealMaker.OPENAI: "reasoning.signature (OpenAI encrypted_content)",
}
_REFUSED = {Dialect.ANTHROPIC: _REFUSED_BY_ANTHROPIC, Dialect.GEMINI: _REFUSED_BY_GEMINI}


def welcome_seal(seal: str, target: Dialect) -> str | None:
    """None when an upstream of format `target` may be sent `seal`; otherwise the name its drop
    is recorded under (``reasoning.signature (…)``)."""
    refused = _REFUSED.get(target)
    return None if refused is None else refused.get(seal_maker(seal))
