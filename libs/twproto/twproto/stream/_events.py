"""SSE events cut out of raw bytes without decoding them: where the last complete event ends,
and a relayed Chat stream without its usage-only chunk (`twproto.stream.translators`,
``hide_usage_chunk``). Not on the per-chunk path of a plain relay."""

from __future__ import annotations

import re

from twproto import _json

__all__ = ("last_event_end", "without_usage_only")

_LINE_END = re.compile(rb"\r\n|\r|\n")


def _events_of(data: bytes) -> list[bytes]:
    """`data` cut into its SSE events, each with the blank line that ends it (the last piece
    without one when `data` ends mid-event). Any of SSE's line ends; not on the per-chunk
    path."""
    events: list[bytes] = []
    start = line = 0
    for end in _LINE_END.finditer(data):
        if end.start() == line:  # an empty line ends the event
            events.append(data[start : end.end()])
            start = end.end()
        line = end.end()
    if start < len(data):
        events.append(data[start:])
    return events


def last_event_end(data: bytes) -> int:
    """Where the last complete event of `data` ends (0: none is complete)."""
    if 13 not in data:  # LF line ends, the usual case (13 is CR)
        at = data.rfind(b"\n\n")
        return at + 2 if at >= 0 else 0
    last = line = 0
    for end in _LINE_END.finditer(data):
        if end.start() == line:
            last = end.end()
        line = end.end()
    return last


def without_usage_only(data: bytes) -> bytes:
    """`data` without its Chat usage-only events (``"choices":[]`` and a ``usage`` object: the
    chunk ``stream_options.include_usage`` adds before ``[DONE]``)."""
    kept = [event for event in _events_of(data) if not _usage_only(event)]
    return b"".join(kept)


def _usage_only(event: bytes) -> bool:
    lines = [line for line in _LINE_END.split(event) if line.startswith(b"data:")]
    if not lines:
        return False
    payload = b"\n".join(line[5:].removeprefix(b" ") for line in lines)
    try:
        obj = _json.loads(payload)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)
