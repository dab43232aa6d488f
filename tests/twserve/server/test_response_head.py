"""The response head: framing headers through h11, the other lines checked and written by
twserve/server/h1_output.py (`split_head`), with exactly h11's verdict on what may be sent."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twserve.server import base, listener
from twserve.server.base import Request, Responder
from twserve.server.h1_output import split_head

LIMITS = base.ServerLimits(
    max_header_bytes=8 * 1024,
    max_body_bytes=64 * 1024,
    head_timeout=0.5,
    body_timeout=0.5,
    keepalive_timeout=2.0,
)

# Names and values drawn from what is legal and from what is not (separators, controls, CR,
# LF, NUL, spaces at either end, obs-text), so both of h11's verdicts come up often.
_NAME = st.one_of(
    st.sampled_from([b"content-type", b"x-request-id", b"Content-Length", b"connection"]),
    st.binary(min_size=0, max_size=6).map(lambda b: b.translate(_FOLD)),
)
_VALUE = st.one_of(
    st.sampled_from([b"text/event-stream", b"12", b"close", b"a b\tc", b""]),
    st.binary(min_size=0, max_size=8).map(lambda b: b.translate(_FOLD)),
)
# Fold random bytes onto a small alphabet of interesting ones.
_ALPHABET = b"aZ0-:; \t\r\n\x00\x7f\xe9,"
_FOLD = bytes(_ALPHABET[i % len(_ALPHABET)] for i in range(256))


def _h11_refuses(headers: list[tuple[bytes, bytes]]) -> bool:
    try:
        h11.Response(status_code=200, headers=headers)
    except h11.LocalProtocolError:
        return True
    return False


def _head_of(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The head a server connection writes for `headers`, as `Responder.start` does."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    framing, lines = split_head(headers)
    data = conn.send(h11.Response(status_code=200, headers=framing))
    assert data is not None
    return data[:-2] + lines + b"\r\n" if lines else data


def _read_head(data: bytes) -> h11.Response:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[(b"host", b"x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    event = client.next_event()
    assert isinstance(event, h11.Response)
    return event


@given(st.lists(st.tuples(_NAME, _VALUE), max_size=5))
def test_a_head_is_split_only_when_h11_would_send_every_header(
    headers: list[tuple[bytes, bytes]],
) -> None:
    framing, lines = split_head(headers)
    if _h11_refuses(headers):
        # h11 refuses it, as it did the whole head: the lines did not pass, or the framing
        # headers h11 is given are what it refuses.
        assert (framing, lines) == (headers, b"") or _h11_refuses(framing)
        return
    assert not _h11_refuses(framing)
    framing_names = {b"transfer-encoding", b"content-length", b"connection"}
    assert framing == [h for h in headers if h[0].lower() in framing_names]
    sent = _read_head(_head_of(headers))
    # The client reads every other header as it was given, in its order.
    others = [(name.lower(), value) for name, value in headers if name.lower() not in framing_names]
    assert [h for h in sent.headers if h[0] not in framing_names] == others


def test_a_header_that_would_split_the_head_is_refused_as_before() -> None:
    injected = [(b"content-type", b"text/plain\r\nset-cookie: x=1")]
    assert split_head(injected) == (injected, b"")
    with pytest.raises(h11.LocalProtocolError):
        h11.Response(status_code=200, headers=injected)
    assert split_head([(b"x-a: b", b"v")]) == ([(b"x-a: b", b"v")], b"")


class _Heads:
    async def __call__(self, request: Request, responder: Responder) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"x-request-id", b"r-1")]
        if request.path == "/sized":
            await responder.start(200, [*headers, (b"content-length", b"2")])
            await responder.send(b"ok")
        else:
            await responder.start(200, headers)
            await responder.send(b"data: 1\n\n")
        await responder.end()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with anyio.create_task_group() as tg:
        found = await tg.start(
            lambda task_status: listener.serve(
                _Heads(), port=0, limits=LIMITS, task_status=task_status
            )
        )
        yield found
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chunked_and_sized_answers_keep_their_headers_and_framing(port: int) -> None:
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        client = h11.Connection(h11.CLIENT)
        for path in ("/stream", "/sized"):
            request = h11.Request(method="GET", target=path, headers=[(b"host", b"x")])
            await sock.send(client.send(request) + client.send(h11.EndOfMessage()))
            events: list[object] = []
            while not events or type(events[-1]) is not h11.EndOfMessage:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await sock.receive())
                else:
                    events.append(event)
            head = events[0]
            assert isinstance(head, h11.Response) and head.status_code == 200
            names = dict(head.headers)
            assert names[b"content-type"] == b"text/event-stream"
            assert names[b"x-request-id"] == b"r-1"
            body = b"".join(e.data for e in events if isinstance(e, h11.Data))
            if path == "/sized":
                assert names[b"content-length"] == b"2" and body == b"ok"
                assert b"transfer-encoding" not in names
            else:
                assert names[b"transfer-encoding"] == b"chunked" and body == b"data: 1\n\n"
            client.start_next_cycle()  # one keep-alive connection served both
