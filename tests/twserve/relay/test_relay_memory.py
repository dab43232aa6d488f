"""The relay over an in-memory upstream: no sockets, real attempt ledger, real router state.

`MemoryUpstream` plays scripted answers; `Collected` is a responder that keeps what the client
would have received. These cover the relay's verbs one by one — relaying, failing over on each
kind of failure, the opening hold, breaks after content, idle timeouts, slot waits, a client
that leaves — and check after each that every slot was given back and every upstream request
closed.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from twengine.attempt import AttemptLedger, AttemptSettings
from twengine.config import build_config
from twengine.destinations import Destination
from twengine.router import Router
from twproto.dialect import Dialect
from twproto.failures import TransportFault
from twproto.paths import Operation
from twproto.upstream_request import ClientCall, UpstreamRequest, UpstreamTarget
from twserve.relay.abort import Running
from twserve.relay.client import ClientAnswer
from twserve.relay.feed import AttemptFeed
from twserve.relay.holds import RouterHooks, SlotHolds
from twserve.relay.loop import RelayOutcome, RelayRequest, relay
from twserve.server.base import ClientGone
from twserve.upstream.memory import MemoryAnswer, MemoryUpstream

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
STREAM = (FIXTURES / "streams" / "anthropic-text.sse").read_bytes()
ERROR_EVENT = (FIXTURES / "streams" / "anthropic-error-overloaded-docs.sse").read_bytes()
OVERLOADED = json.loads((FIXTURES / "errors" / "anthropic-529-overloaded.json").read_text())
WHOLE = (FIXTURES / "whole" / "anthropic-text.json").read_bytes()
SSE = ((b"content-type", b"text/event-stream"),)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Collected:
    """A responder that keeps what the client would have received.

    With `gone_after`, the client leaves after that many writes: as twserve.server.http1 does, the
    handler's scope is cancelled and the write fails. `gone_on` leaves at the first write that
    contains those bytes; `gone_at_end` at the answer's end, once its last bytes were written.
    """

    def __init__(
        self,
        *,
        gone_after: int | None = None,
        gone_on: bytes | None = None,
        gone_at_end: bool = False,
    ) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.ended = False
        self.gone_after = gone_after
        self.gone_on = gone_on
        self.gone_at_end = gone_at_end
        self.scope: anyio.CancelScope | None = None

    @property
    def started(self) -> bool:
        return self.status is not None

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.headers = status, headers

    async def send(self, data: bytes) -> None:
        if (self.gone_after is not None and len(self.parts) >= self.gone_after) or (
            self.gone_on is not None and self.gone_on in data
        ):
            assert self.scope is not None
            self.scope.cancel()
            raise ClientGone("the client left")
        self.parts.append(data)

    async def end(self) -> None:
        if self.gone_at_end:
            # As twserve.server.http1 does when the client's close is seen just before the end goes
            # out: the handler's scope is cancelled, and the end's write stops at its checkpoint.
            assert self.scope is not None
            self.scope.cancel()
            await anyio.lowlevel.checkpoint()
        self.ended = True

    async def abort(self) -> None:
        self.ended = True


def _split(data: bytes, size: int = 97) -> tuple[bytes, ...]:
    return tuple(data[i : i + size] for i in range(0, len(data), size))


def _body(payload: Any) -> tuple[bytes, ...]:
    return (json.dumps(payload["body"]).encode(),)


class Setup:
    def __init__(self, providers: dict[str, dict[str, Any]], **settings: Any) -> None:
        config = build_config(
            {
                "version": 1,
                "providers": [
                    {"name": n, "base_url": f"https://{n}.example/v1", "protocol": "anthropic", **f}
                    for n, f in providers.items()
                ],
            }
        )
        self.router = Router(config)
        self.hooks = RouterHooks(self.router)
        self.settings = AttemptSettings(**settings)
        self.names = list(providers)

    def destinations(self, dialect: Dialect = Dialect.ANTHROPIC) -> list[Destination]:
        return [
            Destination(
                name=n,
                target=UpstreamTarget(
                    dialect=dialect, base_url=f"https://{n}.example", key=f"key-{n}", model="m"
                ),
            )
            for n in self.names
        ]

    async def run(
        self,
        up: MemoryUpstream,
        responder: Collected,
        *,
        client: Dialect = Dialect.ANTHROPIC,
        stream: bool = True,
        body: dict[str, Any] | None = None,
    ) -> RelayOutcome:
        payload = body or {
            "model": "m",
            "max_tokens": 100,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }
        req = RelayRequest(
            call=ClientCall(
                dialect=client,
                operation=Operation.GENERATE,
                stream=stream,
                headers=[(b"anthropic-beta", b"x"), (b"x-api-key", b"gateway-key")],
            ),
            body=json.dumps(payload).encode(),
            model="m",
            running=Running("req-1"),
        )
        out = RelayOutcome()
        with anyio.fail_after(10), anyio.CancelScope() as responder.scope:
            await relay(
                up,
                self.hooks,
                self.destinations(),
                req,
                responder,
                settings=self.settings,
                rng=lambda: 0.5,
                out=out,
            )
        return out

    def assert_all_given_back(self, up: MemoryUpstream) -> None:
        slots = self.router.slots
        assert [slots.in_flight(n) for n in self.names] == [0] * len(self.names)
        assert slots.waiting() == []
        assert up.open_now == 0


def by_host(**answers: MemoryAnswer) -> MemoryUpstream:
    def script(request: UpstreamRequest) -> MemoryAnswer:
        host = request.url.split("//", 1)[1].split(".", 1)[0]
        return answers[host]

    return MemoryUpstream(script)


async def test_a_stream_is_relayed_unchanged() -> None:
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=_split(STREAM)))
    client = Collected()
    out = await setup.run(up, client)
    assert (client.status, client.body, client.ended) == (200, STREAM, True)
    assert (out.status, out.provider, out.error_code) == (200, "a", None)
    assert out.usage is not None and out.ttfb_ms is not None
    assert [a.outcome.value for a in out.attempts] == ["ok"]
    sent = up.requests[0]
    assert sent.url == "https://a.example/v1/messages"
    headers = dict(sent.headers)
    assert headers[b"x-api-key"] == b"key-a"  # the provider's key, never the client's
    assert headers[b"anthropic-beta"] == b"x"  # same format: protocol headers go along
    assert headers[b"anthropic-version"] == b"2023-06-01"
    setup.assert_all_given_back(up)


async def test_a_relayed_request_is_freed_as_it_ends() -> None:
    """Nothing of a request forms a reference cycle: its objects go the moment it ends, not at
    the cycle collector's next pass (which would walk them again and again on a busy gateway)."""
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=_split(STREAM)))
    client = Collected()
    gc.collect()
    gc.disable()
    try:
        out = await setup.run(up, client)
        kinds = (AttemptLedger, AttemptFeed, ClientAnswer, SlotHolds)
        left = [type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds)]
    finally:
        gc.enable()
    assert (client.status, client.body, out.provider) == (200, STREAM, "a")
    assert left == []


async def test_an_error_response_fails_over_and_is_counted() -> None:
    setup = Setup({"a": {}, "b": {}})
    up = by_host(
        a=MemoryAnswer(status=OVERLOADED["status"], chunks=_body(OVERLOADED)),
        b=MemoryAnswer(headers=SSE, chunks=_split(STREAM)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert (client.status, client.body) == (200, STREAM)
    assert [(a.provider, a.outcome.value) for a in out.attempts] == [("a", "failed"), ("b", "ok")]
    assert out.attempts[0].error == "overloaded"
    assert setup.router.health.snapshot("a", 0.0).failures_in_row == 1
    setup.assert_all_given_back(up)


async def test_an_error_event_before_content_fails_over_unseen() -> None:
    setup = Setup({"a": {}, "b": {}})
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=_split(ERROR_EVENT, 13)),
        b=MemoryAnswer(headers=SSE, chunks=_split(STREAM, 5)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert client.body == STREAM  # nothing of the failed opening reached the client
    assert [a.outcome.value for a in out.attempts] == ["failed", "ok"]
    setup.assert_all_given_back(up)


async def test_an_unreachable_upstream_fails_over() -> None:
    setup = Setup({"a": {}, "b": {}})
    up = by_host(
        a=MemoryAnswer(unreachable=TransportFault.CONNECT_REFUSED),
        b=MemoryAnswer(headers=SSE, chunks=(STREAM,)),
    )
    out = await setup.run(up, Collected())
    assert [a.error for a in out.attempts] == ["connect", None]
    setup.assert_all_given_back(up)


async def test_a_break_after_content_ends_the_stream_with_an_error_event() -> None:
    setup = Setup({"a": {}, "b": {}})
    half = STREAM[: len(STREAM) // 2]
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=_split(half), gap=0.001, breaks=True),
        b=MemoryAnswer(headers=SSE, chunks=(STREAM,)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert client.status == 200 and client.body.startswith(half)
    assert b"event: error" in client.body[len(half) :]
    assert (out.status, out.provider, out.error_code) == (
        200,
        "a",
        "gw.upstream.broken_after_content",
    )
    assert len(up.requests) == 1  # no failover after content
    setup.assert_all_given_back(up)


async def test_a_silent_upstream_times_out_and_is_closed() -> None:
    setup = Setup({"a": {}, "b": {}}, idle_timeout_secs=0.2)
    up = by_host(
        a=MemoryAnswer(headers=SSE, stalls=True),
        b=MemoryAnswer(headers=SSE, chunks=(STREAM,)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert client.body == STREAM
    assert [a.error for a in out.attempts] == ["idle_timeout", None]
    setup.assert_all_given_back(up)


async def test_a_whole_answer_is_converted_for_a_chat_client() -> None:
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(chunks=_split(WHOLE)))
    client = Collected()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    out = await setup.run(up, client, client=Dialect.OPENAI_CHAT, stream=False, body=body)
    answer = json.loads(client.body)
    assert answer["object"] == "chat.completion" and answer["model"] == "m"
    assert answer["choices"][0]["message"]["content"]
    assert out.usage is not None and out.provider == "a"
    sent = up.requests[0]
    assert b"anthropic-beta" not in dict(sent.headers)  # another format: none of the client's
    setup.assert_all_given_back(up)


async def test_a_full_upstream_is_waited_for_and_handed_on() -> None:
    setup = Setup({"a": {"max_concurrent": 1}}, wait_secs=5)
    held = setup.router.slots.try_acquire("a", owner="someone-else")
    assert held is not None
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=(STREAM,)))
    client = Collected()

    async def free_soon() -> None:
        await anyio.sleep(0.1)
        setup.hooks.release(held)

    async with anyio.create_task_group() as tg:
        tg.start_soon(free_soon)
        out = await setup.run(up, client)
    assert client.body == STREAM
    assert out.attempts[-1].queued_ms >= 50
    setup.assert_all_given_back(up)


async def test_a_busy_upstream_past_the_deadline_is_a_429() -> None:
    setup = Setup({"a": {"max_concurrent": 1}}, wait_secs=0.2)
    held = setup.router.slots.try_acquire("a", owner="someone-else")
    assert held is not None
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=(STREAM,)))
    client = Collected()
    out = await setup.run(up, client, stream=False)
    assert (client.status, out.error_code) == (429, "gw.busy_all")
    assert up.requests == []
    setup.hooks.release(held)
    setup.assert_all_given_back(up)


async def test_a_client_that_leaves_gives_everything_back() -> None:
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=_split(STREAM, 20), gap=0.002))
    client = Collected(gone_after=3)
    out = await setup.run(up, client)
    assert out.cancelled and out.provider == "a"
    assert [a.outcome.value for a in out.attempts] == ["cancelled"]
    assert setup.router.health.snapshot("a", 0.0).failures_in_row == 0  # not the upstream's fault
    setup.assert_all_given_back(up)


async def test_a_client_that_leaves_as_the_end_is_written_had_the_whole_answer() -> None:
    # The final event went out; the client is seen gone while the stream's end is written.
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=_split(STREAM)))
    client = Collected(gone_at_end=True)
    out = await setup.run(up, client)
    assert client.body == STREAM and not client.ended
    assert (out.delivered, out.cancelled, out.status, out.provider) == (True, False, 200, "a")
    assert [a.outcome.value for a in out.attempts] == ["ok"]
    assert out.usage is not None
    setup.assert_all_given_back(up)


async def test_a_final_event_whose_write_was_cut_short_was_not_delivered() -> None:
    # The translator saw the final event, but the write carrying it failed: the client does not
    # have the whole answer.
    setup = Setup({"a": {}})
    up = by_host(a=MemoryAnswer(headers=SSE, chunks=_split(STREAM, 40), gap=0.002))
    client = Collected(gone_on=b"message_stop")
    out = await setup.run(up, client)
    assert b"message_stop" not in client.body
    assert (out.delivered, out.cancelled) == (False, True)
    assert [a.outcome.value for a in out.attempts] == ["cancelled"]
    setup.assert_all_given_back(up)


async def test_a_silent_upstream_is_sampled_at_its_whole_idle_wait() -> None:
    # url-test and `balance_by: latency` rank by these samples: one that hangs must count as
    # slow, not stay unmeasured (and so favoured) until it is paused.
    setup = Setup({"a": {}, "b": {}}, idle_timeout_secs=0.2)
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=(), stalls=True),
        b=MemoryAnswer(headers=SSE, chunks=_split(STREAM)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert client.body == STREAM
    assert [(a.provider, a.error) for a in out.attempts] == [("a", "idle_timeout"), ("b", None)]
    health = setup.router.health
    assert health.sample_count("a") == 1
    silent = health.first_content_median("a")
    assert silent is not None and 0.2 <= silent < 1.0
    fast = health.first_content_median("b")
    assert fast is not None and fast < silent
    setup.assert_all_given_back(up)


async def test_a_bug_in_a_reader_fails_the_request_and_gives_everything_back() -> None:
    setup = Setup({"a": {}})

    def script(request: UpstreamRequest) -> MemoryAnswer:
        raise RuntimeError("a bug where the reader opens the upstream request")

    up = MemoryUpstream(script)
    with pytest.raises(RuntimeError, match="a bug where the reader"):
        await setup.run(up, Collected())
    setup.assert_all_given_back(up)


async def test_a_paused_stream_keeps_none_of_the_chunks_it_has_passed_on() -> None:
    """While an upstream pauses (a model thinking, seconds between tokens), the relay holds no
    chunk it has handed on: not the reader's last one, not the loop's last item, not the
    opening's raw bytes once the translator reports the usage. Only the test's own objects
    (the script, what the client got, the scripted upstream's paused generator) refer to them."""
    setup = Setup({"a": {}})
    chunks = _split(STREAM)
    answer = MemoryAnswer(headers=SSE, chunks=chunks, stalls=True)
    up = by_host(a=answer)
    client = Collected()
    held: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(setup.run, up, client)
        with anyio.fail_after(5):
            while client.body != STREAM:
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)  # the reader and the loop are back at their waits
        ours = {id(chunks), id(client.parts)}
        for chunk in chunks:
            for holder in gc.get_referrers(chunk):
                if id(holder) in ours or type(holder).__name__ == "async_generator":
                    continue
                held.append(type(holder).__name__)
        assert client.scope is not None
        client.scope.cancel()
    assert held == []
