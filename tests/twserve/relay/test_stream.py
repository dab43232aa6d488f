"""One owner for a committed stream (twserve.relay.stream): the mode table pair by pair, and
through the relay, that each of the three write paths carries the chunks it should.

The table tests drive `AttemptStream` without an event loop: its responder never waits, so each
coroutine runs to its end in one step (`run`). The path tests run the relay, over the in-memory
upstream (whose answers refuse the sink, as HTTP/2 does) and over a real HTTP/1.1 connection to
the mock upstream on loopback, and look at who wrote each piece: the request's loop (path 1),
the attempt's reader (path 2), or the upstream connection's read callback (path 3, `send_now`).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import itertools
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.twserve.relay.test_relay_memory import SSE, Setup, by_host
from twengine.attempt import AttemptSettings
from twengine.config import build_config
from twengine.router import Router
from twmock import run_mock
from twmock.script import MockSettings, Script
from twproto.dialect import Dialect
from twproto.paths import Operation
from twproto.stream import StreamTranslator, new_stream_translator
from twproto.upstream_request import ClientCall, UpstreamRequest, UpstreamTarget
from twserve.relay.abort import Running
from twserve.relay.holds import RouterHooks
from twserve.relay.loop import RelayOutcome, RelayRequest, relay
from twserve.relay.reader import Attempt, Destination
from twserve.relay.stream import (
    READER_WRITES,
    TRANSITIONS,
    AttemptStream,
    StreamInput,
    StreamStateError,
    WriteMode,
)
from twserve.server.base import ClientGone
from twserve.upstream.client import UpstreamClient
from twserve.upstream.memory import MemoryAnswer

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
STREAM = (FIXTURES / "streams" / "anthropic-text.sse").read_bytes()
EVENTS = [event + b"\n\n" for event in STREAM.split(b"\n\n") if event]

Q, D, V, C = WriteMode.QUEUED, WriteMode.DIRECT, WriteMode.DIVERTED, WriteMode.CLOSED


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` to its end without an event loop (nothing here waits)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the coroutine waited")


class Client:
    """A responder that keeps each write with the way it came: ``send`` (awaited, from the loop
    or the reader) or ``send_now`` (the read callback's). `ready` says what `ready()` answers;
    `gone` makes the next ``send`` fail as a client that left."""

    started = True

    def __init__(self) -> None:
        self.writes: list[tuple[str, bytes]] = []
        self.is_ready = True
        self.gone = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    async def send(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone("the client left")
        self.writes.append(("send", data))

    def ready(self) -> bool:
        return self.is_ready

    def send_now(self, data: bytes) -> None:
        self.writes.append(("send_now", data))

    async def end(self) -> None:
        pass

    async def abort(self) -> None:
        pass


class Answer:
    """An upstream answer whose connection takes the sink (`takes`) or refuses it."""

    def __init__(self, takes: bool) -> None:
        self.takes = takes
        self.offers = 0
        self.sink: Callable[[bytes], bool] | None = None

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        self.offers += 1
        if self.takes:
            self.sink = sink
        return self.takes


def translator() -> StreamTranslator:
    return new_stream_translator(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m")


def stream_in(mode: WriteMode, *, queued: int = 0) -> tuple[AttemptStream, Client]:
    """A stream brought to `mode` by the inputs that lead there: a QUEUED one with `queued`
    chunks in the inbox, any other committed and translated first."""
    client = Client()
    stream = AttemptStream(client, clock=lambda: 7.0)
    if mode is Q:
        for _ in range(queued):
            stream.queue()
        return stream, client
    stream.hold(translator(), EVENTS[0])
    run(stream.commit())
    assert stream.mode is D
    if mode is V:
        stream.divert(Answer(takes=True))
    elif mode is C:
        stream.close()
    assert stream.mode is mode
    return stream, client


def drive(stream: AttemptStream, event: StreamInput) -> None:
    """Give `stream` the input `event`, as the relay does."""
    match event:
        case StreamInput.COMMIT:
            run(stream.commit())
        case StreamInput.TAKE:
            if stream.translator is None:
                stream.take_held()
            else:
                run(stream.take(EVENTS[1], 1.0))
        case StreamInput.DIVERT:
            stream.divert(Answer(takes=True))
        case StreamInput.CLOSE:
            stream.close()


def state(stream: AttemptStream) -> tuple[Any, ...]:
    return (stream.mode, stream.queued, stream.committed, stream.pending, stream.reported_at)


# -- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "event"), list(itertools.product(WriteMode, StreamInput)), ids=lambda v: v.value
)
def test_every_pair_of_the_table(mode: WriteMode, event: StreamInput) -> None:
    stream, client = stream_in(mode, queued=1)
    before = state(stream), list(client.writes)
    allowed = TRANSITIONS.get((mode, event))
    if allowed is None:
        with pytest.raises(StreamStateError, match=f"{event.value} is not valid"):
            drive(stream, event)
        assert (state(stream), client.writes) == before  # nothing changed, nothing written
    else:
        drive(stream, event)
        assert stream.mode in allowed


def test_the_table_has_the_pairs_the_essay_lists() -> None:
    assert dict(TRANSITIONS) == {
        (Q, StreamInput.COMMIT): {Q, D},
        (Q, StreamInput.TAKE): {Q, D},
        (D, StreamInput.DIVERT): {D, V},
        (C, StreamInput.COMMIT): {C},
        **{(mode, StreamInput.CLOSE): {C} for mode in WriteMode},
    }
    assert {D, V} == READER_WRITES


def test_a_commit_with_nothing_queued_hands_the_stream_to_the_reader() -> None:
    stream, client = stream_in(Q)
    stream.hold(translator(), b"held")
    run(stream.commit())
    assert (stream.mode, stream.pending, client.writes) == (D, b"", [("send", b"held")])


def test_a_commit_with_chunks_queued_keeps_the_loop_writing_until_the_last() -> None:
    stream, client = stream_in(Q, queued=2)
    stream.hold(translator(), b"held")
    run(stream.commit())
    assert stream.mode is Q
    assert run(stream.take(EVENTS[1], 1.0)) is True
    assert (stream.mode, stream.queued, stream.reported_at) == (Q, 1, 1.0)
    assert run(stream.take(EVENTS[2], 2.0)) is True
    assert (stream.mode, stream.queued, stream.reported_at) == (D, 0, 2.0)
    assert client.writes == [("send", b"held"), ("send", EVENTS[1]), ("send", EVENTS[2])]


def test_a_chunk_queued_meanwhile_keeps_the_loop_writing() -> None:
    # While the loop writes a queued chunk, the reader queues the next: after the write the
    # stream stays with the loop (one writer at a time).
    stream, client = stream_in(Q, queued=1)
    stream.hold(translator(), b"")
    run(stream.commit())
    sending = Client.send

    async def send_while_reading(self: Client, data: bytes) -> None:
        stream.queue()
        await sending(self, data)

    client.send = send_while_reading.__get__(client)  # type: ignore[method-assign]
    run(stream.take(EVENTS[1], 1.0))
    assert (stream.mode, stream.queued) == (Q, 1)


def test_chunks_before_the_commit_stay_with_the_loop() -> None:
    stream, _ = stream_in(Q, queued=2)
    stream.take_held()  # the opening hold has it
    stream.hold(translator(), b"held")
    run(stream.take(EVENTS[1], 1.0))  # first content came, the commit not yet
    assert (stream.mode, stream.queued, stream.committed) == (Q, 0, False)


def test_a_whole_answer_is_never_written_by_the_reader() -> None:
    stream, client = stream_in(Q)
    run(stream.commit())  # no translator: a whole answer
    assert (stream.mode, stream.committed, client.writes) == (Q, True, [])


def test_the_reader_offers_the_sink_after_its_first_write() -> None:
    stream, client = stream_in(D)
    answer = Answer(takes=True)
    run(stream.write(EVENTS[1], answer))
    assert (stream.mode, answer.offers, answer.sink) == (V, 1, stream.sink)
    run(stream.write(EVENTS[2], answer))  # what the sink left: written, not offered again
    assert (stream.mode, answer.offers) == (V, 1)
    assert client.writes[1:] == [("send", EVENTS[1]), ("send", EVENTS[2])]
    assert stream.content_at == 7.0


def test_a_connection_that_refuses_the_sink_is_asked_again_after_the_next_write() -> None:
    stream, client = stream_in(D)
    answer = Answer(takes=False)
    run(stream.write(EVENTS[1], answer))
    run(stream.write(EVENTS[2], answer))
    assert (stream.mode, answer.offers) == (D, 2)
    assert client.writes[1:] == [("send", EVENTS[1]), ("send", EVENTS[2])]


def test_the_sink_writes_in_the_callback_and_the_loop_hears_of_it_once() -> None:
    stream, client = stream_in(V)
    assert stream.sink(EVENTS[1]) is True
    assert client.writes[-1] == ("send_now", EVENTS[1])
    assert stream.unreported() == 7.0
    assert stream.unreported() is None  # heard already


def test_the_sink_declines_what_it_cannot_write_now() -> None:
    stream, client = stream_in(V)
    written = list(client.writes)
    client.is_ready = False  # the client is behind
    assert stream.sink(EVENTS[1]) is False
    client.is_ready = True
    stream.writing = True  # the reader's write is under way
    assert stream.sink(EVENTS[1]) is False
    stream.writing = False
    stream.close()
    assert stream.sink(EVENTS[1]) is False
    assert client.writes == written
    assert stream.translator is not None and stream.translator.usage is None  # fed nothing


def test_a_closed_stream_reports_nothing_and_still_writes_what_a_commit_held() -> None:
    stream, client = stream_in(Q)
    stream.hold(translator(), b"held")
    stream.close()  # the answer broke off as it came: a resume moves on
    run(stream.commit())
    assert (stream.mode, client.writes) == (C, [("send", b"held")])
    stream.content_at = 9.0
    assert stream.unreported() is None


def test_a_write_cut_short_has_not_delivered_the_answer() -> None:
    stream, client = stream_in(D)
    client.gone = True
    with pytest.raises(ClientGone):
        run(stream.write(STREAM, Answer(takes=False)))
    assert stream.translator is not None and stream.translator.finished
    assert (stream.writing, stream.delivered()) == (True, False)
    stream.writing = False
    assert stream.delivered()


def test_an_input_that_strays_from_the_table_is_a_bug_of_the_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(TRANSITIONS, (Q, StreamInput.COMMIT), frozenset({Q}))  # type: ignore[arg-type]
    stream, _ = stream_in(Q)
    stream.hold(translator(), b"")
    with pytest.raises(RuntimeError, match="queued --commit--> direct"):
        run(stream.commit())


# -- who writes what ---------------------------------------------------------------------------

TWSERVE = Path(__file__).resolve().parents[3] / "twserve"


def attribute_writes(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    """Every ``<base>.<name> = …`` (plain, augmented or annotated) in `tree`: its base as
    written, the attribute, the line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets: list[ast.expr] = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            parts = target.elts if isinstance(target, ast.Tuple) else [target]
            for part in parts:
                if isinstance(part, ast.Attribute):
                    yield ast.unparse(part.value), part.attr, node.lineno


def modules() -> Iterator[tuple[str, ast.AST]]:
    for path in sorted(TWSERVE.rglob("*.py")):
        yield path.relative_to(TWSERVE).as_posix(), ast.parse(path.read_text(), str(path))


def test_only_the_stream_writes_its_mode_and_fields() -> None:
    # What the three paths share is written by `AttemptStream` alone: elsewhere nothing sets
    # one of its fields (a class's own attribute of the same name, on `self`, is its own).
    fields = set(AttemptStream.__slots__)
    strays = [
        f"{name}:{line} {base}.{attr}"
        for name, tree in modules()
        if name != "relay/stream.py"
        for base, attr, line in attribute_writes(tree)
        if attr in fields and base != "self"
    ]
    assert strays == []
    assert "mode" in fields and "queued" in fields  # the check looks at the real names


def test_the_attempt_record_is_written_in_the_feed_alone() -> None:
    # `Attempt` is built and written in twserve/relay/feed.py; the relay names it `live` or
    # `attempt` wherever it is handed one.
    fields = {f.name for f in dataclasses.fields(Attempt)}
    strays = []
    for name, tree in modules():
        if name == "relay/feed.py":
            continue
        strays += [
            f"{name}:{line} {base}.{attr}"
            for base, attr, line in attribute_writes(tree)
            if base in {"live", "attempt"} and attr in fields
        ]
        strays += [
            f"{name}:{node.lineno} Attempt(...)"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "Attempt"
        ]
    assert strays == []
    feed = ast.parse((TWSERVE / "relay" / "feed.py").read_text())
    assert {attr for base, attr, _ in attribute_writes(feed) if base == "live"} >= {"status"}


# -- the paths, through the relay ------------------------------------------------------------


class Writers(Client):
    """`Client`, also noting whether each awaited write ran in the request's loop (the relay's
    own task) or elsewhere (an attempt's reader)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: asyncio.Task[Any] | None = None
        self.by: list[str] = []
        self.status: int | None = None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status

    async def send(self, data: bytes) -> None:
        await super().send(data)
        self.by.append("loop" if asyncio.current_task() is self.loop else "reader")

    def send_now(self, data: bytes) -> None:
        super().send_now(data)
        self.by.append("callback")

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.writes)


async def relayed(up: Any, dests: list[Destination], client: Writers, router: Router) -> None:
    req = RelayRequest(
        call=ClientCall(dialect=Dialect.ANTHROPIC, operation=Operation.GENERATE, stream=True),
        body=json.dumps(
            {
                "model": "m",
                "max_tokens": 100,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode(),
        model="m",
        running=Running("req-1"),
    )
    client.loop = asyncio.current_task()
    out = RelayOutcome()
    with anyio.fail_after(20):
        await relay(
            up,
            RouterHooks(router),
            dests,
            req,
            client,
            settings=AttemptSettings(),
            rng=lambda: 0.5,
            out=out,
        )
    assert (out.status, out.provider, out.cancelled) == (200, dests[0].name, False)


def ordered(by: list[str]) -> list[str]:
    """`by` with repeats run together: the order in which the paths took over."""
    return [name for name, _ in itertools.groupby(by)]


@pytest.mark.anyio
async def test_chunks_apart_are_written_by_the_reader_once_committed() -> None:
    # Each chunk arrives after the loop took the one before: after the commit (the held bytes,
    # by the loop) nothing is queued, so the reader writes every later chunk itself. The memory
    # upstream refuses the sink, as HTTP/2 does: no write from a callback.
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=tuple(EVENTS), gap=0.01))
    client = Writers()
    await relayed(up, setup.destinations(), client, setup.router)
    assert client.body == STREAM
    assert ordered(client.by) == ["loop", "reader"]
    assert client.by.count("loop") == 1  # the commit's held bytes


class Burst:
    """An upstream that sends its answer's first `burst` pieces back to back, then each of the
    rest after a pause; its answers refuse the sink (as HTTP/2's do)."""

    status = 200

    def __init__(self, pieces: list[bytes], burst: int) -> None:
        self.pieces, self.burst = pieces, burst
        self.headers = list(SSE)

    @asynccontextmanager
    async def open(self, request: UpstreamRequest, **_: Any) -> AsyncIterator[Burst]:
        yield self

    async def chunks(self) -> AsyncIterator[bytes]:
        for i, piece in enumerate(self.pieces):
            if i >= self.burst:
                await anyio.sleep(0.01)
            yield piece

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        return False


@pytest.mark.anyio
async def test_chunks_queued_at_the_commit_are_written_by_the_loop_before_the_reader() -> None:
    # Chunks back to back fill the inbox before the loop commits: those already queued go out
    # through the loop, in order, and only then, with nothing queued, does the reader write.
    # The loop never writes again after that.
    setup = Setup({"a": {}})
    small = [STREAM[i : i + 40] for i in range(0, len(STREAM), 40)]  # first content: ~17th
    client = Writers()
    await relayed(Burst(small, burst=30), setup.destinations(), client, setup.router)
    assert client.body == STREAM
    assert ordered(client.by) == ["loop", "reader"]
    assert client.by.count("loop") > 1  # the held bytes, and chunks queued at the commit
    assert client.by.count("reader") > 1  # the chunks after the pause


# The mock's answer in 60 small events, 3 ms apart: about one event per read.
PACED = Script(chunks=60, chunk_size=4, chunk_delay=0.003)


def mock_destination(url: str) -> Destination:
    target = UpstreamTarget(dialect=Dialect.ANTHROPIC, base_url=url, key="k", model="m")
    return Destination(name="up", target=target)


def router_for(url: str) -> Router:
    providers = [{"name": "up", "base_url": url, "protocol": "anthropic"}]
    return Router(build_config({"version": 1, "providers": providers}))


async def direct_body(client: UpstreamClient, url: str) -> bytes:
    body = json.dumps(
        {
            "model": "m",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"x-api-key", b"k")]
    request = UpstreamRequest(
        method="POST", url=url + "/v1/messages", headers=headers, body=body, sse=True
    )
    async with client.open(request) as answer:
        return b"".join([piece async for piece in answer.chunks()])


@pytest.mark.anyio
async def test_an_http1_stream_is_written_from_the_read_callback(frozen_mock_clock: None) -> None:
    # Paced events over a real HTTP/1.1 connection: after the commit and the reader's first
    # write, the connection's read callback writes what each read brings (path 3).
    settings = MockSettings(script=PACED, seed=23)
    up = UpstreamClient()
    try:
        async with run_mock(settings) as mock, run_mock(settings) as twin:
            client = Writers()
            await relayed(up, [mock_destination(mock.url)], client, router_for(mock.url))
            expected = await direct_body(up, twin.url)
    finally:
        await up.aclose()
    assert client.body == expected
    assert ordered(client.by)[:2] == ["loop", "reader"]
    assert client.by.count("callback") > 30  # most of the 60 events


@pytest.mark.anyio
async def test_what_the_callback_cannot_write_now_the_reader_writes_in_order(
    frozen_mock_clock: None,
) -> None:
    # A client that is behind every other time the callback asks: those reads are left for the
    # reader, and the client still gets the upstream's stream byte for byte.
    settings = MockSettings(script=PACED, seed=23)
    up = UpstreamClient()
    asked = itertools.count()
    try:
        async with run_mock(settings) as mock, run_mock(settings) as twin:
            client = Writers()
            client.ready = lambda: next(asked) % 2 == 0  # type: ignore[method-assign]
            await relayed(up, [mock_destination(mock.url)], client, router_for(mock.url))
            expected = await direct_body(up, twin.url)
    finally:
        await up.aclose()
    assert client.body == expected
    after = client.by[client.by.index("callback") :]
    assert after.count("callback") > 10 and after.count("reader") > 10
