"""A ConverseStream-shaped event stream for tests and benchmarks.

The events follow the ConverseStream API reference (messageStart, contentBlockDelta,
contentBlockStop, messageStop, metadata) with the ``p`` padding field Bedrock adds to each
event's JSON so that lengths do not reveal the text.
"""

from __future__ import annotations

import json

from twproto.eventstream import eventstream_event

_PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _event(event_type: str, body: dict[str, object], pad: int) -> bytes:
    body = {**body, "p": _PAD[: 1 + pad % len(_PAD)]}
    return eventstream_event(event_type, json.dumps(body, separators=(",", ":")).encode())


def converse_stream(deltas: int, *, words: str = "The quick brown fox jumps ") -> list[bytes]:
    """One framed message per event: the opening, `deltas` text deltas, the close and usage."""
    frames = [_event("messageStart", {"role": "assistant"}, 7)]
    for i in range(deltas):
        delta = {"contentBlockIndex": 0, "delta": {"text": words[: 4 + i % 20]}}
        frames.append(_event("contentBlockDelta", delta, i))
    frames.append(_event("contentBlockStop", {"contentBlockIndex": 0}, 3))
    frames.append(_event("messageStop", {"stopReason": "end_turn"}, 11))
    usage = {"inputTokens": 812, "outputTokens": deltas, "totalTokens": 812 + deltas}
    frames.append(_event("metadata", {"usage": usage, "metrics": {"latencyMs": 1830}}, 5))
    return frames
