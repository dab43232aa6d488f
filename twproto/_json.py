"""The JSON codec used across twproto.

One place to call so the codec can be swapped; orjson is used because the stream path parses and
writes a JSON object per chunk and orjson does both several times faster than the stdlib.
"""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text; raises `JSONDecodeError` (a `ValueError`) on bad input."""
    return orjson.loads(data)


def dumps(obj: Any) -> bytes:
    """Serialise compactly to UTF-8 bytes (no spaces, non-ASCII kept as is)."""
    return orjson.dumps(obj)
