"""The JSON codec used across twproto.

One place to call so the codec can be swapped; orjson is used because the stream path parses and
writes a JSON object per chunk and orjson does both several times faster than the stdlib.

`dumps` writes every value `loads` can return and everything built from such values. orjson
alone does not: it refuses integers beyond 64 bits and nesting deeper than 254 levels, while
JSON has neither bound, `loads` reads 1024 levels, and a converter meets both in what a peer
sent (an integer beyond 64 bits, which `loads` reads as a float and a converter may take back
as an integer; a sum of token counts near the top of the range; a deeply nested tool schema).
Those values take `_write_wide`, which writes them exactly, at any depth (and text with a
lone surrogate, which orjson refuses and the standard library's reader produces, with U+FFFD).
"""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError

# The integers orjson writes itself: from the least signed to the largest unsigned 64-bit one.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text; raises `JSONDecodeError` (a `ValueError`) on bad input."""
    return orjson.loads(data)


def dumps(obj: Any) -> bytes:
    """Serialise compactly to UTF-8 bytes (no spaces, non-ASCII kept as is)."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        # Rare (see the module notes): the fast path stays free of any check.
        return _write_wide(obj)


def _write_wide(obj: Any) -> bytes:
    """`obj` as orjson writes it, with integers of any size and nesting of any depth.

    Iterative, so depth costs no stack. Containers are taken apart here and every other value
    goes to orjson one by one, which writes it as `dumps` would, or raises as `dumps` would for
    what is not JSON (a key that is not text, a set). Text with a lone surrogate, which orjson
    refuses, is written with U+FFFD in its place.
    """
    out: list[bytes] = []
    # Work to do, last first: a value to write, or the bytes to write when its turn comes.
    todo: list[Any] = [obj]
    while todo:
        item = todo.pop()
        if item.__class__ is _Raw:
            out.append(item.data)
        elif isinstance(item, dict):
            todo.append(_CLOSE_OBJECT)
            for n, (key, value) in enumerate(reversed(item.items())):
                if not isinstance(key, str):
                    raise orjson.JSONEncodeError(f"dict key must be str, not {type(key).__name__}")
                todo.append(value)
                sep = b"" if n == len(item) - 1 else b","
                todo.append(_Raw(sep + orjson.dumps(_without_lone_surrogates(key)) + b":"))
            todo.append(_OPEN_OBJECT)
        elif isinstance(item, list | tuple):
            todo.append(_CLOSE_ARRAY)
            for n, value in enumerate(reversed(item)):
                todo.append(value)
                if n != len(item) - 1:
                    todo.append(_COMMA)
            todo.append(_OPEN_ARRAY)
        elif isinstance(item, int) and not isinstance(item, bool):
            wide = not _INT_MIN <= item <= _INT_MAX
            out.append(int.__repr__(item).encode("ascii") if wide else orjson.dumps(item))
        elif isinstance(item, str):
            out.append(orjson.dumps(_without_lone_surrogates(item)))
        else:
            out.append(orjson.dumps(item))
    return b"".join(out)


def _without_lone_surrogates(text: str) -> str:
    """`text` with each surrogate that pairs with none as U+FFFD: UTF-8 cannot carry one, and
    a value parsed by the standard library's JSON reader (``"\\ud800"``) may hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class _Raw:
    """Bytes `_write_wide` writes as they are."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


_OPEN_OBJECT, _CLOSE_OBJECT = _Raw(b"{"), _Raw(b"}")
_OPEN_ARRAY, _CLOSE_ARRAY, _COMMA = _Raw(b"["), _Raw(b"]"), _Raw(b",")
