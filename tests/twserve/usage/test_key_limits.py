"""clients[].limits through the real server (docs/limits-and-costs.md): rolling and calendar
windows per measure, the 429 each SDK sees (and does not retry), racing requests, restart
rebuild."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpcore
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twmock.script import MockSettings, Script, Usage

pytestmark = pytest.mark.sdk

UTC = dt.UTC
# Wednesday 2026-12-02 10:00:00 UTC.
T0 = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC).timestamp()
MIDNIGHT = dt.datetime(2026, 12, 3, tzinfo=UTC).timestamp()


class FakeWall:
    """A wall clock the test moves; read from the gateway's thread."""

    def __init__(self, start: float) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, secs: float) -> None:
        with self._lock:
            self.now += secs


FIXED = Script(usage=Usage(input=100, output=20))


def _stack(
    tmp_path: Path,
    limits: list[dict[str, Any]],
    *,
    wall: FakeWall,
    wait_secs: float = 0,
    script: Script = FIXED,
    extra: dict[str, Any] | None = None,
):  # type: ignore[no-untyped-def]
    return running_stack(
        tmp_path,
        {
            "anth": Upstream("anthropic", MockSettings(script=script)),
        },
        config={
            "clients": [{"name": "tester", "key": KEY, "limits": limits}],
            "failover": {"wait_secs": wait_secs},
            **(extra or {}),
        },
        wall=wall,
        tz=UTC,
        control=True,
    )


def _raw(url: str, path: str = "/v1/chat/completions", model: str = "claude-sonnet-4-5"):  # type: ignore[no-untyped-def]
    body = {"model": model, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    resp = httpcore.request(
        "POST",
        url + path,
        headers=[(b"authorization", b"Bearer " + KEY.encode())],
        content=json.dumps(body).encode(),
    )
    return resp.status, json.loads(resp.content), {k: v for k, v in resp.headers}


def test_minute_requests_refused_with_the_exact_retry_time(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "minute", "requests": 2}], wall=wall) as st:
        assert _raw(st.url)[0] == 200
        st.wait_rows(1)  # booked when it ended: before the clock moves
        wall.advance(15)
        assert _raw(st.url)[0] == 200
        st.wait_rows(2)
        wall.advance(10)
        status, body, headers = _raw(st.url)
        rows = st.wait_rows(3)
    assert status == 429
    # The first request rolls off 60 s after it was counted: 35 s from now.
    assert headers[b"retry-after"] == b"35" and headers[b"retry-after-ms"] == b"35000"
    assert b"x-should-retry" not in headers
    err = body["error"]
    assert err["code"] == "gw.key_limit.requests_rolling" and err["type"] == "rate_limit_error"
    assert "'tester'" in err["message"] and "2 requests per minute" in err["message"]
    assert "used 2 requests" in err["message"] and "retry in 35.000 s" in err["message"]
    assert [r["counted"] for r in rows] == [1, 1, 0]


def test_minute_wait_within_wait_secs_then_pass(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "minute", "requests": 1}], wall=wall, wait_secs=30) as st:
        assert _raw(st.url)[0] == 200
        st.wait_rows(1)
        wall.advance(50)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_raw, st.url)
            time.sleep(0.6)
            assert not waiting.done()  # holding for the window to roll
            wall.advance(10)
            status, _, _ = waiting.result(timeout=10)
        rows = st.wait_rows(2)
    assert status == 200 and len(rows) == 2


def test_rolling_wait_longer_than_wait_secs_is_refused_at_once(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "hour", "tokens": 120}], wall=wall, wait_secs=30) as st:
        assert _raw(st.url)[0] == 200  # 100 in + 20 out = 120 tokens
        st.wait_rows(1)
        started = time.monotonic()
        status, body, headers = _raw(st.url)
    assert status == 429 and time.monotonic() - started < 5
    assert body["error"]["code"] == "gw.key_limit.tokens_rolling"
    assert headers[b"retry-after"] == b"3600"


def test_hour_refusal_is_not_slept_through_by_the_sdks(tmp_path: Path) -> None:
    """A rolling hour's refusal says Retry-After: 3600. With x-should-retry: false beside it
    the SDKs with their default retries raise at once: the Anthropic SDK would otherwise sleep
    the whole hour, the OpenAI SDK retry twice on its own backoff."""
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "hour", "requests": 1}], wall=wall) as st:
        assert _raw(st.url)[0] == 200
        st.wait_rows(1)
        errors: list[BaseException] = []

        def calls() -> None:
            with httpx2.Client(timeout=10) as http:
                client = anthropic.Anthropic(base_url=st.url, api_key=KEY, http_client=http)
                oa = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, http_client=http)
                for call in (
                    lambda: client.messages.create(
                        model="gpt-5", max_tokens=9, messages=[{"role": "user", "content": "hi"}]
                    ),
                    lambda: oa.chat.completions.create(
                        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
                    ),
                ):
                    try:
                        call()
                    except (anthropic.RateLimitError, openai.RateLimitError) as exc:
                        errors.append(exc)

        started = time.monotonic()
        # A thread, so that an SDK sleeping for the hour fails the test instead of hanging it.
        caller = threading.Thread(target=calls, daemon=True)
        caller.start()
        caller.join(timeout=30)
        assert not caller.is_alive(), "an SDK is sleeping through Retry-After"
        rows = st.wait_rows(3)
    assert time.monotonic() - started < 30
    assert len(errors) == 2
    for exc in errors:
        headers = exc.response.headers  # type: ignore[attr-defined]
        assert headers["retry-after"] == "3600" and headers["x-should-retry"] == "false"
    # One row per call: neither SDK retried.
    assert [r["error_code"] for r in rows] == [None, *["gw.key_limit.requests_rolling"] * 2]


def _period_error_checks(message: str) -> None:
    assert "'tester'" in message and "per day" in message
    assert "resets at 2026-12-03T00:00:00+00:00" in message


def test_day_limit_refusal_in_each_client_format_is_not_retried(tmp_path: Path) -> None:
    """The SDKs with their default retries on: a calendar refusal carries x-should-retry:
    false, so each call reaches the gateway exactly once."""
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "day", "requests": 1}], wall=wall) as st:
        assert _raw(st.url)[0] == 200
        st.wait_rows(1)
        with httpx2.Client(timeout=10) as http:
            client = anthropic.Anthropic(base_url=st.url, api_key=KEY, http_client=http)
            with pytest.raises(anthropic.RateLimitError) as a_err:
                client.messages.create(
                    model="gpt-5",
                    max_tokens=9,
                    messages=[{"role": "user", "content": "hi"}],
                )
            oa = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, http_client=http)
            with pytest.raises(openai.RateLimitError) as chat_err:
                oa.chat.completions.create(
                    model="gpt-5", messages=[{"role": "user", "content": "hi"}]
                )
            with pytest.raises(openai.RateLimitError) as resp_err:
                oa.responses.create(model="gpt-5", input="hi")
        # google-genai retries nothing unless retry_options are given (and then retries any
        # 429 by status, whatever the headers say): its default is what is checked here.
        gem = genai.Client(api_key=KEY, http_options=gtypes.HttpOptions(base_url=st.url))
        with pytest.raises(genai_errors.ClientError) as g_err:
            gem.models.generate_content(model="gpt-5", contents="hi")
        gem.close()
        rows = st.wait_rows(5)
    # One row per call: no SDK retried.
    assert len(rows) == 5
    assert [r["error_code"] for r in rows[1:]] == ["gw.key_limit.period"] * 4
    retry = str(int(MIDNIGHT - T0))
    a = a_err.value
    assert a.response.headers["x-should-retry"] == "false"
    assert a.response.headers["retry-after"] == retry
    assert a.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    _period_error_checks(a.body["error"]["message"])  # type: ignore[index]
    for e in (chat_err.value, resp_err.value):
        assert e.code == "insufficient_quota" and e.type == "insufficient_quota"
        assert e.response.headers["x-should-retry"] == "false"
        assert e.response.headers["retry-after"] == retry
        _period_error_checks(e.message)
    g = g_err.value
    assert g.code == 429 and g.status == "RESOURCE_EXHAUSTED"
    _period_error_checks(g.message or "")


def test_day_cost_limit_counts_priced_usage(tmp_path: Path) -> None:
    # Sonnet 4.5: 100×3 + 20×15 = 600 µ$ a request; a $0.01 day limit lets 16 through
    # (16 × 600 = 9600, and the 17th's estimate of ~3 µ$ for 1 input token still fits: the
    # refusal comes once the spend itself has reached the limit).
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "day", "cost": 0.01}], wall=wall) as st:
        statuses = []
        for i in range(18):
            statuses.append(_raw(st.url)[0])
            st.wait_rows(i + 1)
        rows = st.wait_rows(18)
        with httpx2.Client() as http:
            keys = http.get(
                st.control_url + "/keys",
                headers={"authorization": "Bearer control-key-for-tests-0123456789"},
            ).json()
    ok = statuses.count(200)
    assert statuses == [200] * ok + [429] * (18 - ok)
    assert all(r["cost_micros"] == 600 and r["cost_state"] == "known" for r in rows[:ok])
    # Admitted while the spend plus its input estimate fitted under 10 000 µ$.
    assert ok == 17 and 600 * 16 < 10_000 < 600 * 17
    (lim,) = keys["keys"][0]["limits"]
    assert lim["used"] == 600 * ok and lim["reset"] == MIDNIGHT and lim["percent"] > 100


@pytest.mark.parametrize("per", ["day", "minute"])
def test_racing_requests_never_pass_the_limit(tmp_path: Path, per: str) -> None:
    wall = FakeWall(T0)
    slow = Script(usage=Usage(input=10, output=5), chunks=4, chunk_delay=0.05)
    with _stack(tmp_path, [{"per": per, "requests": 5}], wall=wall, script=slow) as st:
        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(lambda _: _raw(st.url)[0], range(20)))
        rows = st.wait_rows(20)
    assert results.count(200) == 5 and results.count(429) == 15
    assert sum(r["counted"] for r in rows) == 5


def test_restart_rebuilds_day_usage_from_the_store(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    limits = [{"per": "day", "tokens": 240}, {"per": "week", "requests": 100}]
    with _stack(tmp_path, limits, wall=wall) as st:
        assert _raw(st.url)[0] == 200
        st.wait_rows(1)
        assert _raw(st.url)[0] == 200  # 2 × 120 tokens
        st.wait_rows(2)
        st.app.request_stop()
    wall.advance(3600)
    with _stack(tmp_path, limits, wall=wall) as st:
        status, body, _ = _raw(st.url)
        st.wait_rows(1)  # this instance's first row (the store counts what it wrote)
        view = st.app.usage.key_view("tester")
    assert status == 429 and body["error"]["code"] == "insufficient_quota"
    assert "used 240 tokens" in body["error"]["message"]
    assert [v["used"] for v in view] == [240, 2]
    # The next day the day limit starts over; the week keeps counting.
    wall.advance(MIDNIGHT - wall())
    with _stack(tmp_path, limits, wall=wall) as st:
        assert _raw(st.url)[0] == 200
        assert len(st.wait_rows(1)) == 4
        assert [v["used"] for v in st.app.usage.key_view("tester")] == [120, 3]


def test_request_that_reached_no_upstream_counts_nothing(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    config = {
        "providers": [
            {
                "name": "gone",
                "base_url": "http://127.0.0.1:9/v1",
                "key": "k",
                "protocol": "anthropic",
            }
        ],
        "failover": {"wait_secs": 0},
    }
    with running_stack(
        tmp_path,
        {},
        config={
            "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "day", "requests": 1}]}]
        }
        | config,
        wall=wall,
        tz=UTC,
    ) as st:
        first = _raw(st.url)[0]
        second = _raw(st.url)[0]
        rows = st.wait_rows(2)
        view = st.app.usage.key_view("tester")
    assert first >= 500 and second >= 500  # both tried; neither was refused by the limit
    assert [r["counted"] for r in rows] == [0, 0] and view[0]["used"] == 0


def test_alerts_at_80_and_100_percent(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    with _stack(tmp_path, [{"per": "day", "requests": 5}], wall=wall) as st:
        seen: list[Any] = []
        st.app.events.listeners.append(
            lambda e: seen.append(e) if type(e).__name__ == "KeyLimitAlert" else None
        )
        for i in range(6):
            _raw(st.url)
            st.wait_rows(i + 1)
    assert [(a.percent, a.used, a.per, a.measure) for a in seen] == [
        (80, 4, "day", "requests"),
        (100, 5, "day", "requests"),
    ]
    assert seen[0].reset == MIDNIGHT and seen[0].key == "tester"


@pytest.mark.parametrize(
    ("per", "measure", "amount", "first_reset"),
    [
        # One request: 1 request, 3000 + 200 = 3200 tokens, 3000×3 + 200×15 = 12 000 µ$
        # (Sonnet 4.6).
        ("minute", "cost", 0.012, T0 + 60),
        ("hour", "requests", 1, T0 + 3600),
        ("day", "tokens", 3200, MIDNIGHT),
        ("week", "cost", 0.012, dt.datetime(2026, 12, 7, tzinfo=UTC).timestamp()),
        ("month", "tokens", 3200, dt.datetime(2027, 1, 1, tzinfo=UTC).timestamp()),
    ],
)
def test_each_period_and_measure(
    tmp_path: Path, per: str, measure: str, amount: float, first_reset: float
) -> None:
    wall = FakeWall(T0)
    script = Script(usage=Usage(input=3000, output=200))
    with _stack(tmp_path, [{"per": per, measure: amount}], wall=wall, script=script) as st:
        assert _raw(st.url, model="claude-sonnet-4-6")[0] == 200
        st.wait_rows(1)
        status, body, headers = _raw(st.url, model="claude-sonnet-4-6")
        # Just before the window frees: still refused; at the reset: through.
        wall.advance(first_reset - T0 - 1)
        assert _raw(st.url, model="claude-sonnet-4-6")[0] == 429
        wall.advance(1)
        assert _raw(st.url, model="claude-sonnet-4-6")[0] == 200
        rows = st.wait_rows(4)
    assert status == 429
    assert headers[b"retry-after"] == str(int(first_reset - T0)).encode()
    rolling = per in ("minute", "hour")
    assert body["error"]["code"] == (
        f"gw.key_limit.{measure}_rolling" if rolling else "insufficient_quota"
    )
    # Refused until the reset: not worth a retry past the minute (MAX_RETRY_SLEEP_SECS).
    assert (b"x-should-retry" in headers) is (per != "minute")
    assert [r["counted"] for r in rows] == [1, 0, 0, 1]
    assert rows[0]["limit_cost"] == 12_000 and rows[0]["limit_tokens"] == 3200


def test_a_reload_that_adds_a_limit_counts_what_is_stored(tmp_path: Path) -> None:
    """Limits added by editing the config file start from the day's stored rows, not from 0."""
    from tests.twserve.support.live import KEY as LIVE_KEY
    from tests.twserve.support.live import config_yaml, live_gateway, wait_for

    def ask(url: str) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        return httpcore.request(
            "POST",
            url + "/v1/chat/completions",
            headers=[(b"authorization", b"Bearer " + LIVE_KEY.encode())],
            content=json.dumps(body).encode(),
        ).status

    with live_gateway(tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c)) as live:
        assert [ask(live.url) for _ in range(3)] == [200, 200, 200]
        wait_for(lambda: live.app.store.written >= 3)
        text = live.path.read_text().replace(
            f"    key: {LIVE_KEY}\n",
            f"    key: {LIVE_KEY}\n    limits: [{{per: day, requests: 3}}]\n",
        )
        assert text != live.path.read_text()
        live.write(text)
        wait_for(lambda: live.events_of("ConfigReloaded"))
        assert ask(live.url) == 429
        assert live.app.usage.key_view("tester")[0]["used"] == 3
