"""Where API keys travel: the gateway key found in a request, and taken out of its query."""

from __future__ import annotations

import pytest

from twproto.keys import find_key, strip_key_param


@pytest.mark.parametrize(
    ("query", "kept"),
    [
        ("alt=sse&key=secret", "alt=sse"),
        ("alt=sse", "alt=sse"),
        ("key=secret", ""),
        ("%6Bey=secret&alt=sse", "alt=sse"),  # the name spelt with an escape is the key too
        ("k%65y=a&keys=b&x=%20y", "keys=b&x=%20y"),  # the rest is kept exactly as written
        ("&&key=&a=1&", "a=1"),
    ],
)
def test_the_key_parameter_is_stripped(query: str, kept: str) -> None:
    assert strip_key_param(query) == kept


def test_what_is_stripped_is_what_find_key_reads() -> None:
    query = "alt=sse&%6Bey=secret"
    assert find_key([], query) == "secret"
    assert find_key([], strip_key_param(query)) is None
