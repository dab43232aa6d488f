"""clients[].max_concurrent: a key's streams count until they end; excess requests queue
within failover.wait_secs, then get 429 (docs/operations.md, "Keys and concurrency")."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpcore

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twengine.slots import SlotScope
from twmock.script import MockSettings, Script

BODY = json.dumps(
    {"model": "m", "max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "x"}]}
).encode()


def _ask(url: str) -> tuple[int, bytes, dict[bytes, bytes]]:
    resp = httpcore.request(
        "POST", url + "/v1/messages", headers=[(b"x-api-key", KEY.encode())], content=BODY
    )
    return resp.status, resp.content, dict(resp.headers)


def _stack(tmp_path: Path, wait_secs: int):  # type: ignore[no-untyped-def]
    slow = MockSettings(script=Script(chunks=10, chunk_delay=0.05))
    return running_stack(
        tmp_path,
        {"a": Upstream("anthropic", slow)},
        config={
            "clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}],
            "failover": {"wait_secs": wait_secs},
        },
    )


def test_excess_requests_queue_for_the_key(tmp_path: Path) -> None:
    with _stack(tmp_path, 10) as st, ThreadPoolExecutor(3) as pool:
        results = list(pool.map(_ask, [st.url] * 3))
        rows = st.wait_rows(3)
    assert [status for status, _, _ in results] == [200, 200, 200]
    # One at a time: each 0.5 s stream waited for the ones before it to end.
    d1, d2, d3 = sorted(r["duration_ms"] for r in rows)
    assert d2 >= d1 + 300 and d3 >= d2 + 300, (d1, d2, d3)
    assert st.app.gateway.router.slots.in_flight("tester", scope=SlotScope.KEY) == 0


def test_without_waiting_the_second_request_gets_429(tmp_path: Path) -> None:
    with _stack(tmp_path, 0) as st, ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_ask, [st.url] * 2))
        rows = st.wait_rows(2)
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 429]
    (busy,) = [(b, h) for s, b, h in results if s == 429]
    assert json.loads(busy[0])["error"]["type"] == "rate_limit_error"
    assert busy[1][b"x-thinkwatch-error"] == b"rate_limited" and b"retry-after" in busy[1]
    assert sorted(r["error_code"] or "" for r in rows) == ["", "gw.key.busy"]
    assert len(st.mock("a").received) == 1  # the refused request never reached an upstream


def test_wait_secs_runs_from_arrival_not_from_the_end_of_the_key_queue(tmp_path: Path) -> None:
    # One upstream slot, every answer a 1 s stream, wait_secs 1.5. R1 (key with
    # max_concurrent 1) streams from 0 to 1 s; H (another key) waits for the slot and streams
    # from 1 to 2 s; R2 (R1's key) arrives at 0.1, waits for its key until 1 s, then for the
    # slot. Its 1.5 s run from arrival: 429 at about 1.6 s — not a fresh 1.5 s from 1 s, which
    # would outlast H and answer 200 at about 3 s.
    import threading
    import time

    slow = MockSettings(script=Script(chunks=10, chunk_delay=0.1))
    config = {
        "clients": [
            {"name": "tester", "key": KEY, "max_concurrent": 1},
            {"name": "hog", "key": "hog-key"},
        ],
        "failover": {"wait_secs": 1.5},
    }
    with running_stack(
        tmp_path, {"a": Upstream("anthropic", slow, extra={"max_concurrent": 1})}, config=config
    ) as st:
        slots = st.app.gateway.router.slots

        def ask(key: bytes) -> None:
            httpcore.request(
                "POST", st.url + "/v1/messages", headers=[(b"x-api-key", key)], content=BODY
            )

        r1 = threading.Thread(target=ask, args=(KEY.encode(),))
        r1.start()
        deadline = time.monotonic() + 5
        while slots.in_flight("a") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        hog = threading.Thread(target=ask, args=(b"hog-key",))
        hog.start()
        time.sleep(0.1)
        started = time.monotonic()
        status, _, _ = _ask(st.url)
        elapsed = time.monotonic() - started
        r1.join()
        hog.join()
    assert status == 429, elapsed
    assert elapsed < 2.2, elapsed
