"""Fuzz target: what an upstream HTTP/1.1 connection makes of arbitrary answer bytes
(twserve/upstream/h1_connection.py), and properties of a well-formed answer cut into arbitrary
reads.

The connection is driven as the event loop drives it (``data_received``, ``eof_received``) over
a transport that only records; no loop runs, because nothing here has to wait. Run as a script,
the target goes to atheris when it is installed::

    python -m tests.fuzz.test_fuzz_upstream_h1 [atheris/libFuzzer options]
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.test_fuzz_parsers import fuzz_main, split
from twserve.upstream.h1_connection import MAX_HEAD_BYTES, PAUSE_BYTES, H1Connection


class _Transport:
    """What the connection calls on its transport, recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.aborted

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.aborted = True


def started_connection() -> tuple[H1Connection, _Transport]:
    """A connection whose request went out (to a recording transport), reading its answer."""
    conn = H1Connection(None, ("http", "upstream", 80))  # type: ignore[arg-type]
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.start(b"POST / HTTP/1.1\r\nhost: upstream\r\ncontent-length: 0\r\n\r\n")
    return conn, transport


def answer_target(pieces: list[bytes], eof: bool) -> dict[str, Any]:
    """Feed `pieces` (then the end of file, with `eof`); what the reader would see. Never
    raises: every answer ends as a head with its body, or as a failure."""
    conn, transport = started_connection()
    body: list[bytes] = []
    for piece in filter(None, pieces):  # (a transport never hands on an empty read)
        if transport.aborted:
            break
        conn.data_received(piece)
        assert conn._unread <= PAUSE_BYTES + len(piece)  # bounded by one read past the mark
        body.append(conn.take())
    if eof and not transport.aborted:
        conn.eof_received()
        conn.connection_lost(None)
        body.append(conn.take())
    if conn.head is None:
        assert b"".join(body) == b""  # no body before a head
        assert not conn.done
    else:
        status, headers = conn.head
        assert 200 <= status <= 999
        assert all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in headers)
    if eof:
        # The end of file settles every answer: ended, or failed.
        assert conn.done or conn.failure is not None
    assert not (conn.done and conn.failure is not None)
    return {"head": conn.head, "body": b"".join(body), "done": conn.done, "failed": conn.failure}


_CHUNKS = st.lists(st.binary(min_size=1, max_size=300), max_size=12)
_SPLITS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


def _chunked(chunks: list[bytes]) -> bytes:
    frames = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks)
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + frames + b"0\r\n\r\n"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000), points=_SPLITS, eof=st.booleans())
def test_arbitrary_answer_bytes_end_as_an_answer_or_a_failure(
    data: bytes, points: list[int], eof: bool
) -> None:
    answer_target(split(data, points), eof)


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from(
        [
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
        ]
    ),
    data=st.binary(max_size=400),
    points=_SPLITS,
    eof=st.booleans(),
)
def test_arbitrary_bytes_after_a_plausible_head(
    prefix: bytes, data: bytes, points: list[int], eof: bool
) -> None:
    answer_target(split(prefix + data, points), eof)


@settings(max_examples=200, deadline=None)
@given(chunks=_CHUNKS, points=_SPLITS)
def test_a_chunked_answer_in_any_reads_is_its_body_and_reusable(
    chunks: list[bytes], points: list[int]
) -> None:
    seen = answer_target(split(_chunked(chunks), points), eof=False)
    assert seen["head"] == (200, [(b"transfer-encoding", b"chunked")])
    assert (seen["body"], seen["done"], seen["failed"]) == (b"".join(chunks), True, None)


@settings(max_examples=200, deadline=None)
@given(chunks=_CHUNKS, points=_SPLITS, verdicts=st.lists(st.booleans(), max_size=40))
def test_a_sink_and_the_reader_between_them_see_the_body_once_in_order(
    chunks: list[bytes], points: list[int], verdicts: list[bool]
) -> None:
    conn, _ = started_connection()
    pieces = [p for p in split(_chunked(chunks), points) if p]
    got: list[bytes] = []
    says = iter(verdicts)

    def sink(data: bytes) -> bool:
        taken = next(says, True)
        if taken:
            got.append(data)
        return taken

    for i, piece in enumerate(pieces):
        conn.data_received(piece)
        if conn.head is not None and conn.sink is None and not conn.done:
            got.append(conn.take())
            conn.sink = sink  # as H1Answer.divert does
        elif i % 2:
            got.append(conn.take())  # the reader takes what the sink left, now and then
    got.append(conn.take())
    assert b"".join(got) == b"".join(chunks)
    assert conn.done and conn.failure is None and conn.next_cycle()


def test_a_head_past_the_bound_fails_however_it_is_read() -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"x-filler: " + b"f" * MAX_HEAD_BYTES + b"\r\n\r\n"
    seen = answer_target(split(head, [7, 1000, 50_000]), eof=False)
    assert seen["head"] is None and seen["failed"] == "the response head is too large"


def _atheris_one_input(data: bytes) -> None:  # pragma: no cover - run by atheris only
    import atheris  # type: ignore[import-not-found]

    fdp = atheris.FuzzedDataProvider(data)
    points = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    eof = fdp.ConsumeBool()
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    answer_target(split(rest, points), eof)


def main() -> None:  # pragma: no cover - manual use
    fuzz_main(__file__, _atheris_one_input)


if __name__ == "__main__":
    main()
