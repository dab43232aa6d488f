"""Byte-level helpers shared by the format writers: JSON styles, SSE framing, templates.

The real APIs do not all write JSON the same way, and the mock copies each:

* Anthropic and OpenAI stream events, Anthropic bodies: compact (`compact`).
* OpenAI whole answers and errors, Gemini whole answers, errors and the JSON-array stream:
  indented by two spaces (`pretty`) — byte-identical to orjson's ``OPT_INDENT_2``, checked
  against the recorded fixtures.
* Gemini SSE events: ``", "``-less but ``": "`` separated (`google_compact`), which is what
  Python's ``json.dumps(separators=(",", ": "))`` writes.

Streams are made of many events that differ only in a short text, so each writer builds a
`Template` once per answer — the event with placeholder strings where the text and the counter
go — and per event only encodes the piece of text and joins bytes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from twproto import json_dumps

__all__ = ["Template", "compact", "google_compact", "hole", "pretty", "sse", "text_json"]


def compact(obj: Any) -> bytes:
    return json_dumps(obj)


def pretty(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2)


def google_compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ": "), ensure_ascii=False).encode()


def text_json(value: str) -> bytes:
    """A JSON string literal (what goes into a template's hole)."""
    return json_dumps(value)


def sse(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


# A placeholder is a string no real value contains; private-use code points guarantee that.
def hole(name: str) -> str:
    return f"\ue000{name}\ue000"


class Template:
    """Encoded bytes with holes where `hole(name)` strings were, filled in the given order.

    The holes must appear in the encoded bytes in the order `names` lists them; a filled value
    replaces the whole quoted placeholder, so it is itself JSON (a string literal, a number).
    """

    __slots__ = ("_parts",)

    def __init__(self, encoded: bytes, names: tuple[str, ...]) -> None:
        parts: list[bytes] = []
        rest = encoded
        for name in names:
            marker = b'"' + hole(name).encode() + b'"'
            before, found, after = rest.partition(marker)
            if not found:
                raise ValueError(f"template has no hole {name!r} (or holes are out of order)")
            parts.append(before)
            rest = after
        parts.append(rest)
        self._parts = tuple(parts)

    def fill(self, *values: bytes) -> bytes:
        # Called once per streamed event: the common arities avoid building a list.
        parts = self._parts
        n = len(values)
        if n == 1:
            return parts[0] + values[0] + parts[1]
        if n == 2:
            return b"".join((parts[0], values[0], parts[1], values[1], parts[2]))
        if n == 3:
            return b"".join(
                (parts[0], values[0], parts[1], values[1], parts[2], values[2], parts[3])
            )
        out = [parts[0]]
        for value, part in zip(values, parts[1:], strict=True):
            out.append(value)
            out.append(part)
        return b"".join(out)
