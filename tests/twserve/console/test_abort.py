"""``POST /requests/{id}/abort`` against a running gateway: the official SDKs stream through it,
the control plane aborts them mid-stream, and each SDK sees the error its format has for it —
while the upstream is not paused, counts no failure and loses no success rate.

One gateway for the module, a slow mock of each format (a stream that takes seconds); every test
waits for its own request's first content (or its start) before it aborts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import anyio
import httpcore
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.twserve.conftest import FORMATS, KEY, MODELS, StreamReportedError
from tests.twserve.support.live import wait_for
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.events import Event

TEXT = "slow words " * 120  # with chunk_size 4 and 30 ms a chunk: about ten seconds
SLOW = Script(text=TEXT, chunk_size=4, chunk_delay=0.03)


@pytest.fixture(scope="module")
def st(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ups = {fmt: Upstream(fmt, MockSettings(script=SLOW), models=[MODELS[fmt]]) for fmt in FORMATS}
    # A key that holds one request at a time, for the abort of a request waiting its turn.
    clients = [
        {"name": "tester", "key": KEY},
        {"name": "single", "key": "single-key-0123456789", "max_concurrent": 1},
    ]
    config = {"clients": clients, "failover": {"wait_secs": 30}}
    with running_stack(
        tmp_path_factory.mktemp("abort"), ups, control=True, config=config
    ) as running:
        yield running


@pytest.fixture
def events(st: Stack) -> Iterator[list[Event]]:
    seen: list[Event] = []
    st.app.events.listeners.append(seen.append)
    yield seen
    st.app.events.listeners.remove(seen.append)


def control(st: Stack, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    resp = httpcore.request(
        method,
        st.control_url + path,
        headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
        content=b"" if body is None else json.dumps(body).encode(),
        extensions={"timeout": {"connect": 5.0, "read": 10.0, "write": 5.0, "pool": 5.0}},
    )
    return resp.status, json.loads(resp.content)


def started_id(events: list[Event], key: str = "tester") -> str:
    """The id of the one request `events` saw start for `key`."""
    wait_for(lambda: any(type(e).__name__ == "RequestStarted" for e in events), timeout=10)
    ids = [e.id for e in events if type(e).__name__ == "RequestStarted" and e.key == key]
    assert len(ids) == 1, ids
    return ids[0]


def stored(st: Stack, rid: str) -> list[dict[str, Any]]:
    """The stored row of `rid`, once it is written."""
    rows: list[dict[str, Any]] = []

    def read() -> bool:
        rows[:] = control(st, "GET", f"/requests?id={rid}")[1]["requests"]
        return bool(rows)

    wait_for(read, timeout=10)
    return rows


def named(events: list[Event], name: str) -> list[Any]:
    return [e for e in list(events) if type(e).__name__ == name]


class Streamer:
    """One SDK call in a thread: `content` is set at its first text, `error` holds what it
    raised (None when it ended without one)."""

    def __init__(self, call: Callable[[Callable[[], None]], None]) -> None:
        self.content = threading.Event()
        self.error: BaseException | None = None
        self.ended = False
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[Callable[[], None]], None]) -> None:
        try:
            call(self.content.set)
        except BaseException as exc:
            self.error = exc
        self.ended = True

    def join(self) -> BaseException | None:
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the client's stream did not end"
        return self.error


def _stream(fmt: str, url: str, http: httpx2.Client, key: str = KEY) -> Callable[..., None]:
    """A streamed call through `fmt`'s SDK that calls `seen()` at each piece of text."""
    model = MODELS[fmt]
    if fmt == "anthropic":
        client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, http_client=http)

        def call(seen: Callable[[], None]) -> None:
            with client.messages.create(
                model=model,
                max_tokens=2000,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            ) as events:
                for event in events:
                    if event.type == "content_block_delta":
                        seen()

        return call
    if fmt in ("openai-chat", "openai-responses"):
        oai = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, http_client=http)
        if fmt == "openai-chat":

            def chat(seen: Callable[[], None]) -> None:
                for chunk in oai.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], stream=True
                ):
                    if chunk.choices and chunk.choices[0].delta.content:
                        seen()

            return chat

        def responses(seen: Callable[[], None]) -> None:
            for event in oai.responses.create(model=model, input="hi", stream=True):
                if event.type == "response.output_text.delta":
                    seen()
                if event.type == "response.failed":
                    error = event.response.error
                    raise StreamReportedError(error.message if error else "failed")

        return responses
    gemini = genai.Client(
        api_key=key,
        http_options=gtypes.HttpOptions(
            base_url=url,
            retry_options=gtypes.HttpRetryOptions(attempts=1),
            httpx_client=http,
        ),
    )

    def gen(seen: Callable[[], None]) -> None:
        for chunk in gemini.models.generate_content_stream(model=model, contents="hi"):
            if chunk.text:
                seen()

    return gen


ERRORS: dict[str, type[BaseException] | tuple[type[BaseException], ...]] = {
    "anthropic": anthropic.APIError,
    "openai-chat": openai.APIError,
    "openai-responses": StreamReportedError,
    "gemini": genai_errors.APIError,
}


def _upstream(st: Stack, name: str) -> dict[str, Any]:
    _, body = control(st, "GET", "/providers")
    return next(p for p in body["providers"] if p["name"] == name)


@pytest.mark.sdk
@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_sdk_stream_aborted_mid_stream_raises(
    st: Stack, events: list[Event], fmt: str, http2: bool
) -> None:
    with httpx2.Client(http1=not http2, http2=http2, timeout=15.0) as http:
        streamer = Streamer(_stream(fmt, st.url, http))
        rid = started_id(events)
        assert streamer.content.wait(10), "no content before the abort"
        served = named(events, "RequestRouted")[0].candidates[0]
        before = _upstream(st, served)
        status, body = control(st, "POST", f"/requests/{rid}/abort", {"reason": "test"})
        assert (status, body) == (200, {"id": rid, "aborted": True, "stage": "relay"})
        error = streamer.join()
    assert isinstance(error, ERRORS[fmt]), repr(error)
    assert "aborted" in str(error)
    # The row: cancelled with the abort's code and the usage so far; one RequestFailed for it.
    wait_for(lambda: named(events, "RequestFailed"))
    (failed,) = named(events, "RequestFailed")
    assert (failed.id, failed.error_code, failed.cancelled) == (rid, "gw.request.aborted", True)
    (aborted,) = named(events, "RequestAborted")
    assert (aborted.id, aborted.stage, aborted.reason) == (rid, "relay", "test")
    (row,) = stored(st, rid)
    assert row["error_code"] == "gw.request.aborted" and row["cancelled"]
    assert row["provider"] == served and row["status"] == 200
    assert [a["outcome"] for a in row["routing"]["attempts"]] == ["cancelled"]
    # Not the upstream's fault: no failure in a row, no pause, no attempt booked against it.
    after = _upstream(st, served)
    assert after["failures_in_row"] == 0 and after["paused_until"] is None
    assert after["attempts"] == before["attempts"]
    assert after["success_rate"] == before["success_rate"]
    assert after["in_flight"] == 0
    # A finished request cannot be aborted again; an id never seen is unknown.
    status, body = control(st, "POST", f"/requests/{rid}/abort")
    assert (status, body["error"]["code"]) == (409, "control.abort.finished")


def test_an_unknown_id_is_404_and_only_post_aborts(st: Stack) -> None:
    status, body = control(st, "POST", "/requests/nosuchrequest/abort")
    assert (status, body["error"]["code"]) == (404, "control.abort.unknown_request")
    status, body = control(st, "GET", "/requests/nosuchrequest/abort")
    assert (status, body["error"]["code"]) == (405, "control.request.method_not_allowed")
    status, body = control(st, "POST", "/requests/x/abort", {"why": "?"})
    assert (status, body["error"]["code"]) == (400, "control.request.invalid")


@pytest.mark.sdk
def test_an_answer_not_started_gets_an_http_error_the_sdk_does_not_retry(
    st: Stack, events: list[Event]
) -> None:
    """A whole (not streamed) answer aborted while the upstream is still writing it: the
    client's HTTP error, 503 with x-should-retry: false, so the SDK (retries on) raises at once
    and the upstream sees the request once."""
    mock = st.mock("openai-chat")
    received = len(mock.received)
    client = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=2, timeout=15)

    def call(seen: Callable[[], None]) -> None:
        client.chat.completions.create(
            model=MODELS["openai-chat"], messages=[{"role": "user", "content": "hi"}]
        )

    streamer = Streamer(call)
    rid = started_id(events)
    wait_for(lambda: len(mock.received) > received)
    status, _ = control(st, "POST", f"/requests/{rid}/abort")
    assert status == 200
    error = streamer.join()
    client.close()
    assert isinstance(error, openai.APIStatusError), repr(error)
    assert error.status_code == 503
    assert error.response.headers["x-should-retry"] == "false"
    assert error.body["code"] == "gw.request.aborted"  # type: ignore[index]
    assert len(mock.received) == received + 1
    wait_for(lambda: named(events, "RequestFailed"))
    assert named(events, "RequestFailed")[0].status == 503


@pytest.mark.sdk
def test_a_request_waiting_for_its_key_is_aborted_there(st: Stack, events: list[Event]) -> None:
    """The key holds one request at a time: the second waits for its turn, and an abort ends
    that wait with the error (its stream's head may be out already: keep-alive)."""
    key = "single-key-0123456789"
    with httpx2.Client(timeout=15.0) as http:
        first = Streamer(_stream("anthropic", st.url, http, key))
        assert first.content.wait(10)
        second = Streamer(_stream("anthropic", st.url, http, key))
        wait_for(lambda: len(named(events, "RequestStarted")) == 2)
        rid = named(events, "RequestStarted")[1].id
        status, body = control(st, "POST", f"/requests/{rid}/abort")
        assert (status, body["stage"]) == (200, "key_wait")
        error = second.join()
        assert isinstance(error, anthropic.APIError) and "aborted" in str(error)
        assert not first.ended  # the first one streams on
        first_id = named(events, "RequestStarted")[0].id
        assert control(st, "POST", f"/requests/{first_id}/abort")[0] == 200
        assert isinstance(first.join(), anthropic.APIError)
    # No entry is left behind for requests that ended.
    wait_for(lambda: len(st.app.gateway.aborts) == 0)


@pytest.mark.sdk
def test_a_responses_websocket_turn_is_aborted_and_the_socket_carries_on(
    st: Stack, events: list[Event]
) -> None:
    """A turn on the client's Responses WebSocket (the openai SDK's ``responses.connect()``):
    the abort fails that turn (``response.failed``), and the next turn on the same socket
    streams."""
    turns: list[list[str]] = []
    messages: list[str] = []
    content = [threading.Event(), threading.Event()]

    async def turns_on_one_socket() -> None:
        oai = openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
        async with oai.responses.connect() as conn:
            for number in range(2):
                model = MODELS["openai-responses"]
                await conn.send({"type": "response.create", "model": model, "input": "hi"})
                kinds: list[str] = []
                while True:
                    event = await conn.recv()
                    kinds.append(event.type)
                    if event.type == "response.output_text.delta":
                        content[number].set()
                    if event.type == "response.failed":
                        error = event.response.error
                        messages.append(error.message if error else "")
                    if event.type in ("response.completed", "response.failed", "error"):
                        break
                turns.append(kinds)
        await oai.close()

    def run(seen: Callable[[], None]) -> None:
        anyio.run(turns_on_one_socket)

    streamer = Streamer(run)
    for number in range(2):
        if not content[number].wait(10):
            raise AssertionError(f"turn {number} streamed nothing: {streamer.error!r} {turns}")
        rid = [e.id for e in named(events, "RequestStarted")][number]
        status, body = control(st, "POST", f"/requests/{rid}/abort")
        assert (status, body["stage"]) == (200, "relay")
    assert streamer.join() is None
    assert [kinds[-1] for kinds in turns] == ["response.failed", "response.failed"]
    assert all("aborted" in m for m in messages)
