"""The control plane on a real loopback listener: auth, views, dry-run against real routing, the
event stream, metrics, and ``twserve dryrun``; plus the event bus's drop accounting."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpcore
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.twserve.support.stack import CONTROL_KEY, KEY, Stack, Upstream, running_stack
from twengine.dryrun import report_from_dict
from twmock.script import MockSettings, parse_script
from twproto.sse import SSEDecoder, SSEEvent
from twserve.cli.main import build_parser
from twserve.control.plane import CONTROL_API_VERSION, mask_secret
from twserve.events import (
    Dropped,
    EventBus,
    Published,
    RequestFinished,
    RequestStarted,
    event_json,
)
from twserve.store.sqlite import RequestRow

LIMITED_KEY = "limited-client-secret-key-0987654321"
TIMEOUT = {"timeout": {"connect": 5.0, "read": 10.0, "write": 5.0, "pool": 5.0}}

BALANCED: dict[str, Any] = {
    "clients": [
        {"name": "tester", "key": KEY},
        {
            "name": "limited",
            "key": LIMITED_KEY,
            "max_concurrent": 2,
            "limits": [{"per": "hour", "requests": 100}, {"per": "minute", "tokens": 5000}],
        },
    ],
    "groups": [
        {
            "name": "lb",
            "type": "load-balance",
            "providers": [{"name": "a", "weight": 3}, {"name": "b", "weight": 1}],
        }
    ],
    "routes": [{"name": "main", "rules": [{"name": "all", "to": "lb"}]}],
    "default_route": "main",
}


def balanced_upstreams() -> dict[str, Upstream]:
    return {
        "a": Upstream("openai-chat", models=["m", "m2"]),
        "b": Upstream(
            "anthropic",
            models=["m"],
            extra={"max_concurrent": 4, "model_specs": {"m": {"context_window": 200000}}},
        ),
    }


SECRETS = (KEY, CONTROL_KEY, LIMITED_KEY, "upstream-key-a", "upstream-key-b")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path, balanced_upstreams(), config=BALANCED, control=True) as s:
        yield s


def control(
    stack: Stack,
    path: str,
    *,
    key: str | None = CONTROL_KEY,
    header: bytes = b"authorization",
    method: str = "GET",
) -> httpcore.Response:
    headers = []
    if key is not None:
        value = key.encode()
        headers.append((header, b"Bearer " + value if header == b"authorization" else value))
    return httpcore.request(method, stack.control_url + path, headers=headers, extensions=TIMEOUT)


def view(stack: Stack, path: str) -> dict[str, Any]:
    response = control(stack, path)
    assert response.status == 200, response.content
    assert (b"x-twserve-control-api", str(CONTROL_API_VERSION).encode()) in response.headers
    data = json.loads(response.content)
    assert isinstance(data, dict)
    return data


def chat(stack: Stack, text: str, *, model: str = "m", key: str = KEY) -> httpcore.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return httpcore.request(
        "POST",
        stack.url + "/v1/chat/completions",
        headers=[(b"authorization", b"Bearer " + key.encode())],
        content=json.dumps(body).encode(),
        extensions=TIMEOUT,
    )


def error_code(response: httpcore.Response) -> str:
    return str(json.loads(response.content)["error"]["code"])


def metric_samples(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = control(stack, "/metrics")
    assert response.status == 200
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# --- auth ---------------------------------------------------------------------------------------


def test_control_key_is_required(stack: Stack) -> None:
    missing = control(stack, "/status", key=None)
    assert missing.status == 401
    assert error_code(missing) == "control.auth.missing_key"
    assert (b"x-twserve-control-api", str(CONTROL_API_VERSION).encode()) in missing.headers

    wrong = control(stack, "/status", key=CONTROL_KEY + "x")
    assert wrong.status == 401
    assert error_code(wrong) == "control.auth.bad_key"
    # A gateway key is not a control key, and the check comes before the path.
    assert error_code(control(stack, "/status", key=KEY)) == "control.auth.bad_key"
    assert error_code(control(stack, "/no-such-view", key=None)) == "control.auth.missing_key"
    assert control(stack, "/metrics", key=None).status == 401
    assert control(stack, "/events", key=None).status == 401

    assert control(stack, "/status").status == 200
    assert control(stack, "/status", header=b"x-control-key").status == 200
    assert error_code(control(stack, "/no-such-view")) == "control.request.not_found"
    refused = control(stack, "/status", method="POST")
    assert refused.status == 405
    assert error_code(refused) == "control.request.method_not_allowed"


def test_control_key_does_not_open_the_gateway(stack: Stack) -> None:
    response = chat(stack, "hello", key=CONTROL_KEY)
    assert response.status == 401


# --- views --------------------------------------------------------------------------------------


def test_views_have_their_shape_and_no_secret(stack: Stack) -> None:
    assert chat(stack, "first").status == 200
    stack.wait_rows(1)
    seen = b""
    for path in ("/status", "/overview", "/providers", "/groups", "/keys", "/requests"):
        response = control(stack, path)
        assert response.status == 200, (path, response.content)
        seen += response.content
    seen += control(stack, "/dryrun?model=m").content
    seen += control(stack, "/metrics").content
    for secret in SECRETS:
        assert secret.encode() not in seen, secret

    status = view(stack, "/status")
    assert status["api_version"] == CONTROL_API_VERSION
    assert status["config"] == {"version": 1, "generation": 1}
    assert status["safe_mode"] is None
    assert status["uptime_secs"] >= 0
    assert status["store"] == {
        "backend": "sqlite",
        "path": str(stack.data_dir / "requests.sqlite3"),
        "written": 1,
        "rejected": 0,
        "commit_waits_late": 0,
    }

    overview = view(stack, "/overview")
    assert overview["requests"]["requests"] == 1
    assert overview["requests"]["ok"] == 1
    assert overview["requests"]["in_flight"] == 0
    assert overview["config"]["upstreams"] == 2
    assert overview["failover"]["failures_to_pause"] == 3
    assert overview["upstreams"]["paused"] == []

    providers = {p["name"]: p for p in view(stack, "/providers")["providers"]}
    assert set(providers) == {"a", "b"}
    assert providers["a"]["protocol"] == "openai-chat"
    assert providers["a"]["base_url"].startswith("http://127.0.0.1:")
    assert providers["a"]["has_key"] is True
    assert providers["a"]["max_concurrent"] is None
    assert [m["model"] for m in providers["a"]["models"]] == ["m", "m2"]
    assert providers["b"]["max_concurrent"] == 4
    # Each figure as routing reads it, and where it came from (set by hand, the price table).
    assert providers["b"]["models"] == [
        {
            "model": "m",
            "offered": True,
            "context_window": 200000,
            "context_window_source": "manual",
            "max_output_tokens": None,
            "max_output_tokens_source": None,
            "set_by_hand": True,
        }
    ]
    answered = providers[view(stack, "/requests")["requests"][0]["provider"]]
    assert answered["attempts"] == 1
    assert answered["in_flight"] == 0
    assert answered["paused_until"] is None

    groups = view(stack, "/groups")["groups"]
    assert groups == [
        {
            "name": "lb",
            "type": "load-balance",
            # balance_by: weights multiplies by nothing (factor 1).
            "members": [
                {"provider": "a", "weight": 3, "factor": 1.0},
                {"provider": "b", "weight": 1, "factor": 1.0},
            ],
            "selected": None,
            "balance_by": "weights",
        }
    ]

    keys = {k["name"]: k for k in view(stack, "/keys")["keys"]}
    assert keys["tester"]["key"] == "…"
    assert keys["limited"]["key"] == "…" + LIMITED_KEY[-4:]
    assert keys["limited"]["max_concurrent"] == 2
    limits = keys["limited"]["limits"]
    assert [
        {k: lim[k] for k in ("per", "measure", "amount", "cache_reads", "rolling", "used")}
        for lim in limits
    ] == [
        {
            "per": "hour",
            "measure": "requests",
            "amount": 100,
            "cache_reads": False,
            "rolling": True,
            "used": 0,
        },
        {
            "per": "minute",
            "measure": "tokens",
            "amount": 5000,
            "cache_reads": False,
            "rolling": True,
            "used": 0,
        },
    ]
    # Nothing counted yet in a rolling window: nothing to roll off.
    assert all(lim["reset"] is None and lim["reserved"] == 0 for lim in limits)


def test_requests_view_lists_rows_with_attempts(stack: Stack) -> None:
    for i in range(3):
        assert chat(stack, f"question {i}").status == 200
    stack.wait_rows(3)
    data = view(stack, "/requests?limit=2")
    assert data["limit"] == 2
    rows = data["requests"]
    assert len(rows) == 2
    assert rows[0]["ts"] >= rows[1]["ts"]
    for row in rows:
        assert row["status"] == 200
        assert row["key_name"] == "tester"
        (attempt,) = row["routing"]["attempts"]
        assert attempt["provider"] == row["provider"]
        assert attempt["outcome"] == "ok"
    assert len(view(stack, "/requests")["requests"]) == 3
    bad = control(stack, "/requests?limit=lots")
    assert bad.status == 400
    assert error_code(bad) == "control.request.invalid"


def test_dryrun_next_is_where_the_next_request_goes(stack: Stack) -> None:
    providers = []
    for i in range(8):
        report = view(stack, "/dryrun?model=m&key=tester&dialect=openai-chat&stream=0")
        assert report["request"] == {"key": "tester", "dialect": "openai-chat", "stream": False}
        assert report["group"] == "lb"
        assert report["candidates"][0]["provider"] == report["next"]
        # Asking again changes nothing.
        assert view(stack, "/dryrun?model=m&key=tester")["next"] == report["next"]
        assert chat(stack, f"conversation number {i}").status == 200
        row = stack.wait_rows(i + 1)[-1]
        assert row["provider"] == report["next"]
        providers.append(row["provider"])
    assert providers.count("a") == 6 and providers.count("b") == 2


def test_dryrun_refuses_what_it_cannot_route(stack: Stack) -> None:
    for query in ("", "?model=m&key=nobody", "?model=m&dialect=klingon", "?model=m&stream=maybe"):
        response = control(stack, "/dryrun" + query)
        assert response.status == 400, query
        assert error_code(response) == "control.request.invalid"
    unknown_model = view(stack, "/dryrun?model=not-offered")
    assert unknown_model["next"] is None
    assert {s["provider"] for s in unknown_model["skipped"]} == {"a", "b"}


# --- events -------------------------------------------------------------------------------------


def read_events(
    stack: Stack, query: str, until: str, action: Any, *, count: int = 1
) -> list[SSEEvent]:
    """Open the event stream, run `action` once it is open, and collect events until `count`
    events named `until` have arrived."""
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    headers = [(b"authorization", b"Bearer " + CONTROL_KEY.encode())]
    with httpcore.stream(
        "GET", stack.control_url + "/events" + query, headers=headers, extensions=TIMEOUT
    ) as response:
        assert response.status == 200
        assert (b"content-type", b"text/event-stream") in response.headers
        chunks = response.iter_stream()
        first = next(chunks)
        assert first.startswith(b": ")
        action()
        for chunk in chunks:
            events.extend(decoder.feed(chunk))
            if sum(e.event == until for e in events) >= count:
                break
    return events


def test_event_stream_follows_a_request(stack: Stack) -> None:
    events = read_events(stack, "", "RequestFinished", lambda: chat(stack, "watch me"))
    names = [e.event for e in events]
    assert names == ["RequestStarted", "RequestRouted", "RequestFinished"]
    started, routed, finished = (json.loads(e.data) for e in events)
    assert started["id"] == routed["id"] == finished["id"]
    assert started["type"] == "RequestStarted"
    assert started["key"] == "tester" and started["format"] == "openai-chat"
    assert routed["model"] == "m" and routed["group"] == "lb"
    assert finished["status"] == 200 and finished["attempts"] == 1
    assert finished["provider"] == routed["candidates"][0]
    ids = [int(e.id or 0) for e in events]
    assert ids == sorted(ids)
    row = stack.wait_rows(1)[-1]
    assert row["id"] == finished["id"] and row["provider"] == finished["provider"]


def test_event_stream_filters_by_type(stack: Stack) -> None:
    def two() -> None:
        chat(stack, "one")
        chat(stack, "two")

    events = read_events(stack, "?types=RequestFinished", "RequestFinished", two, count=2)
    assert [e.event for e in events] == ["RequestFinished", "RequestFinished"]
    bad = control(stack, "/events?types=Nonsense")
    assert bad.status == 400 and error_code(bad) == "control.request.invalid"


# --- failover: health events and metrics ---------------------------------------------------------


FALLBACK: dict[str, Any] = {
    "groups": [{"name": "chain", "providers": ["bad", "good"]}],
    "routes": [{"name": "main", "rules": [{"name": "all", "to": "chain"}]}],
    "default_route": "main",
    "failover": {"failures_to_pause": 1},
}


def test_failover_moves_metrics_and_publishes_health(tmp_path: Path) -> None:
    upstreams = {
        "bad": Upstream(
            "openai-chat",
            settings=MockSettings(script=parse_script({"error": {"status": 503}})),
        ),
        "good": Upstream("openai-chat"),
    }
    with running_stack(tmp_path, upstreams, config=FALLBACK, control=True) as stack:
        before = metric_samples(stack)
        assert before[("gateway_provider_fallback_total", ())] == 0
        assert before[("gateway_provider_paused", (("provider", "bad"),))] == 0

        events = read_events(stack, "", "RequestFinished", lambda: chat(stack, "fail over"))
        by_name = {e.event: json.loads(e.data) for e in events}
        assert by_name["RequestRouted"]["candidates"] == ["bad", "good"]
        health = by_name["HealthChanged"]
        assert health["upstream"] == "bad" and health["paused"] is True
        assert health["pause_secs"] > 0
        assert by_name["RequestFinished"]["provider"] == "good"
        assert by_name["RequestFinished"]["attempts"] >= 2

        after = metric_samples(stack)
        assert after[("gateway_provider_fallback_total", ())] == 1
        assert after[("gateway_provider_paused", (("provider", "bad"),))] == 1
        assert after[("gateway_provider_paused", (("provider", "good"),))] == 0
        fmt = (("format", "openai-chat"), ("provider", "good"), ("status", "200"))
        assert after[("gateway_requests_total", fmt)] == 1
        assert after[("gateway_provider_attempts_total", (("outcome", "ok"), ("provider", "good")))]
        failed = after[
            ("gateway_provider_attempts_total", (("outcome", "failed"), ("provider", "bad")))
        ]
        assert failed >= 1
        assert after[("gateway_ttfb_seconds_count", (("provider", "good"),))] == 1
        assert after[("gateway_requests_in_flight", ())] == 0
        assert not any(name.endswith("_created") for name, _ in after)

        providers = {p["name"]: p for p in view(stack, "/providers")["providers"]}
        assert providers["bad"]["pause_left_secs"] > 0
        assert providers["bad"]["pause_reason"] is not None
        assert view(stack, "/overview")["upstreams"]["paused"] == ["bad"]
        # Paused, so the dry-run puts the healthy upstream first — and so does the gateway.
        assert view(stack, "/dryrun?model=m")["next"] == "good"


def test_metrics_count_requests(stack: Stack) -> None:
    def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
        return sum(v for (name, _), v in samples.items() if name == "gateway_requests_total")

    assert total(metric_samples(stack)) == 0
    for i in range(3):
        assert chat(stack, f"count me {i}").status == 200
    assert chat(stack, "nobody offers this", model="no-such-model").status == 404
    stack.wait_rows(4)
    samples = metric_samples(stack)
    assert total(samples) == 4
    no_upstream = (("format", "openai-chat"), ("provider", "none"), ("status", "404"))
    assert samples[("gateway_requests_total", no_upstream)] == 1
    ttfb = sum(v for (name, _), v in samples.items() if name == "gateway_ttfb_seconds_count")
    assert ttfb == 3


def test_a_row_the_store_cannot_write_is_counted_and_later_rows_are_stored(stack: Stack) -> None:
    # A row SQLite cannot take (a count past 64 bits), handed to the gateway's own store as a
    # row listener would: it is set aside and counted, and the requests after it are stored.
    assert metric_samples(stack)[("gateway_store_rows_set_aside_total", ())] == 0
    odd = RequestRow(id="odd", ts=time.time(), path="/v1/messages", input_tokens=2**70)
    stack.portal.call(lambda: stack.app.store.record(odd))
    deadline = time.monotonic() + 20
    while stack.app.store.rejected < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert chat(stack, "after it").status == 200
    (row,) = stack.wait_rows(1)
    assert row["status"] == 200
    assert metric_samples(stack)[("gateway_store_rows_set_aside_total", ())] == 1
    assert view(stack, "/status")["store"]["rejected"] == 1


# --- the CLI ------------------------------------------------------------------------------------


CONFIG_FILE = """\
version: 1
clients:
  - name: me
    key: cli-test-gateway-key-0123456789
providers:
  - name: first
    base_url: http://127.0.0.1:9/v1
    models: [m]
  - name: second
    base_url: http://127.0.0.1:9/v1
    models: [m, other]
groups:
  - name: pair
    type: load-balance
    providers: [{name: first, weight: 1}, {name: second, weight: 5}]
routes:
  - name: main
    rules:
      - name: all
        to: pair
default_route: main
"""


def run_cli(args: list[str]) -> int:
    parsed = build_parser().parse_args(args)
    return int(parsed.func(parsed))


def test_cli_dryrun_prints_the_report_for_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG_FILE)
    assert run_cli(["dryrun", "--config", str(path), "--model", "m", "--key", "me"]) == 0
    out = capsys.readouterr().out
    assert "fresh routing state" in out
    assert "group pair (load-balance, balance_by weights)" in out
    assert "next: second" in out
    assert "cli-test-gateway-key" not in out

    assert run_cli(["dryrun", "--config", str(path), "--model", "other", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["next"] == "second"
    assert [s["provider"] for s in data["skipped"]] == ["first"]
    assert "fresh" in data["source"]

    assert run_cli(["dryrun", "--config", str(path), "--model", "m", "--key", "nobody"]) == 1
    assert "control.request.invalid" in capsys.readouterr().err


def test_cli_dryrun_asks_a_running_gateway(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["dryrun", "--control", stack.control_url, "--control-key", CONTROL_KEY]
    assert run_cli([*args, "--model", "m", "--key", "tester"]) == 0
    out = capsys.readouterr().out
    assert "live state" in out
    expected = view(stack, "/dryrun?model=m&key=tester")["next"]
    assert f"next: {expected}" in out

    wrong = ["dryrun", "--control", stack.control_url, "--control-key", "wrong", "--model", "m"]
    assert run_cli(wrong) == 1
    assert "control.auth.bad_key" in capsys.readouterr().err


def test_report_round_trips_through_json(stack: Stack) -> None:
    data = view(stack, "/dryrun?model=m")
    assert report_from_dict(data).to_dict() == {k: v for k, v in data.items() if k != "request"}


def test_mask_secret() -> None:
    assert mask_secret(None) is None
    assert mask_secret("short") == "…"
    assert mask_secret("sk-abcdefghijklmnop1234") == "…1234"
    assert mask_secret("${OPENAI_KEY}") == "${OPENAI_KEY}"
    assert mask_secret("sk-${A}${B}") == "…"


# --- the bus ------------------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def started(n: int) -> RequestStarted:
    return RequestStarted(id=f"r{n}", ts=0.0, path="/v1/chat/completions", key="k", format=None)


@pytest.mark.anyio
async def test_a_slow_subscriber_drops_and_is_told_how_many() -> None:
    bus = EventBus(buffer=2)
    seen: list[object] = []
    bus.listeners.append(seen.append)
    with bus.subscribe() as slow, bus.subscribe(buffer=10) as fast:
        for n in range(1, 6):
            bus.publish(started(n))  # never waits, though `slow` is full after two
        assert slow.dropped == 3 and fast.dropped == 0
        first = await slow.receive()
        second = await slow.receive()
        assert isinstance(first, Published) and first.seq == 1
        assert isinstance(second, Published) and second.seq == 2
        bus.publish(started(6))
        gap = await slow.receive()
        assert gap == Dropped(count=3, total=3)
        after = await slow.receive()
        assert isinstance(after, Published) and after.seq == 6
        got = []
        for _ in range(6):
            item = await fast.receive()
            assert isinstance(item, Published)
            got.append(item.seq)
        assert got == [1, 2, 3, 4, 5, 6]
        with anyio.move_on_after(0.05) as scope:
            await slow.receive()
        assert scope.cancelled_caught
    assert bus.subscribers == 0
    bus.publish(started(7))  # nobody listening: fine
    assert len(seen) == 7


def test_events_are_json() -> None:
    event = RequestFinished(
        id="r1",
        ts=1.5,
        model="m",
        provider="a",
        status=200,
        ttfb_ms=3,
        duration_ms=4,
        input_tokens=None,
        output_tokens=2,
        attempts=1,
    )
    data = json.loads(event_json(event))
    assert data["type"] == "RequestFinished"
    assert data["provider"] == "a" and data["input_tokens"] is None


def test_model_rows_say_where_each_figure_came_from(tmp_path: Path) -> None:
    """A figure set by hand (model_specs) is named so; one the price table knows, so too."""
    ups = {
        "t": Upstream(
            "anthropic",
            models=["claude-sonnet-4-5", "no-such-model"],
            extra={"model_specs": {"claude-sonnet-4-5": {"max_output_tokens": 1000}}},
        )
    }
    with running_stack(tmp_path, ups, control=True) as st:
        rows = {m["model"]: m for m in view(st, "/providers")["providers"][0]["models"]}
    known = rows["claude-sonnet-4-5"]
    assert (known["max_output_tokens"], known["max_output_tokens_source"]) == (1000, "manual")
    assert known["context_window"] and known["context_window_source"] == "price_table"
    unknown = rows["no-such-model"]
    assert unknown["context_window"] is None and unknown["context_window_source"] is None
