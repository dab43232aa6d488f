"""Loopback ports for tests that need one nobody answers on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole block: bound but never listening.
    A port freed at once instead may be handed to the next server the test starts (the mock of
    another upstream), which then answers where a refusal was meant."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        yield port
