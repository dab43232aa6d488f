"""Cost on every row and attempt, through the real server with the official SDKs
(docs/limits-and-costs.md): known (hand-computed, cache-heavy), free, unknown; failed attempts
that billed tokens; the /usage view, Prometheus counters, and `twserve usage`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import CONTROL_KEY, KEY, Upstream, running_stack
from twmock.script import MockSettings, Script, Usage
from twserve.cli.main import main

pytestmark = pytest.mark.sdk

# Claude Sonnet 4.6 in the shipped table: input 3, output 15, cache read 0.3, cache write 3.75
# USD per million tokens.
CACHE_HEAVY = Script(usage=Usage(input=3, output=33, cache_read=1111, cache_write=418))
# 3×3 + 33×15 + 1111×0.3 + 418×3.75 = 9 + 495 + 333.3 + 1567.5 = 2404.8 µ$ → 2405
CACHE_HEAVY_MICROS = 2405


def _control(url: str, path: str) -> dict:  # type: ignore[type-arg]
    with httpx2.Client() as http:
        resp = http.get(url + path, headers={"authorization": f"Bearer {CONTROL_KEY}"})
        assert resp.status_code == 200, resp.text
        return resp.json()  # type: ignore[no-any-return]


def test_cache_heavy_cost_in_every_client_format(tmp_path: Path) -> None:
    upstreams = {"anth": Upstream("anthropic", MockSettings(script=CACHE_HEAVY))}
    with running_stack(tmp_path, upstreams, control=True) as st, sdk_clients(st.url) as c:
        c.anthropic.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=50,
            messages=[{"role": "user", "content": "hi"}],
        )
        c.openai.chat.completions.create(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
        )
        stream = c.openai.responses.create(model="claude-sonnet-4-6", input="hi", stream=True)
        for _ in stream:
            pass
        c.genai.models.generate_content(model="claude-sonnet-4-6", contents="hi")
        rows = st.wait_rows(4)
        usage = _control(st.control_url, "/usage?by=model&since=1h")
        metrics = httpx2.get(
            st.control_url + "/metrics", headers={"authorization": f"Bearer {CONTROL_KEY}"}
        ).text
    for row in rows:
        assert (row["cost_micros"], row["cost_state"]) == (CACHE_HEAVY_MICROS, "known"), row
        assert row["cache_read_tokens"] == 1111 and row["cache_write_tokens"] == 418
        (attempt,) = json.loads(row["routing"])["attempts"]
        assert attempt["cost_micros"] == CACHE_HEAVY_MICROS and attempt["cost_state"] == "known"
        assert attempt["usage"]["cache_read"] == 1111
    assert usage["by"] == "model"
    assert usage["total"]["cost_micros"] == 4 * CACHE_HEAVY_MICROS
    assert usage["total"]["requests"] == 4 and usage["total"]["cache_read_tokens"] == 4 * 1111
    assert usage["prices"]["package"] == "litellm"
    assert (
        'gateway_tokens_total{key="tester",kind="cache_read",model="claude-sonnet-4-6",'
        'provider="anth"} 4444.0' in metrics
    )
    assert (
        'gateway_cost_usd_total{key="tester",model="claude-sonnet-4-6",provider="anth"} '
        "0.00962" in metrics
    )


def test_unknown_price_is_null_and_free_is_zero(tmp_path: Path) -> None:
    upstreams = {
        "anth": Upstream("anthropic", MockSettings(script=CACHE_HEAVY)),
        "local": Upstream(
            "openai-chat", MockSettings(script=CACHE_HEAVY), extra={"billing": "free"}
        ),
    }
    config = {
        "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "day", "cost": 5}]}],
        "groups": [{"name": "g", "providers": ["anth", "local"]}],
        "routes": [
            {
                "name": "default",
                "rules": [
                    {"name": "free", "when": {"model": "free-*"}, "to": "local"},
                    {"name": "rest", "to": "anth"},
                ],
            }
        ],
    }
    with running_stack(tmp_path, upstreams, config=config, control=True) as st:
        with sdk_clients(st.url) as c:
            c.openai.chat.completions.create(
                model="mystery-model-7", messages=[{"role": "user", "content": "hi"}]
            )
            c.openai.chat.completions.create(
                model="free-model", messages=[{"role": "user", "content": "hi"}]
            )
        rows = st.wait_rows(2)
        by_key = _control(st.control_url, "/usage?by=provider&since=1h")
        keys = _control(st.control_url, "/keys")["keys"]
        bad = httpx2.get(
            st.control_url + "/usage?by=colour",
            headers={"authorization": f"Bearer {CONTROL_KEY}"},
        )
    unknown, free = rows
    assert unknown["cost_micros"] is None and unknown["cost_state"] == "unknown"
    assert free["cost_micros"] == 0 and free["cost_state"] == "free"
    for row, state in ((unknown, "unknown"), (free, "free")):
        (attempt,) = json.loads(row["routing"])["attempts"]
        assert attempt["cost_state"] == state
    assert by_key["total"]["unpriced_requests"] == 1 and by_key["total"]["free_requests"] == 1
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "control.request.invalid"
    # A cost-limited key can reach models no price covers: "anth" lists none, so any model may
    # be asked of it; "local" is free and never unpriced.
    assert keys[0]["unpriced_models"] == [{"provider": "anth", "model": "*"}]
    assert keys[0]["limits"][0]["used"] == 0  # unknown and free costs count 0


def test_a_failed_attempt_that_billed_tokens_carries_its_cost(tmp_path: Path) -> None:
    # The first upstream opens its stream (message_start reports the input it billed), then
    # breaks before any content; the request moves on to the second.
    broken = Script(usage=Usage(input=1000, output=0, cache_read=0), break_after=0)
    upstreams = {
        "first": Upstream("anthropic", MockSettings(script=broken)),
        "second": Upstream("anthropic", MockSettings(script=CACHE_HEAVY)),
    }
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        with c.anthropic.messages.stream(
            model="claude-sonnet-4-6",
            max_tokens=50,
            messages=[{"role": "user", "content": "hi"}],
        ) as stream:
            stream.get_final_message()
        (row,) = st.wait_rows(1)
    first, second = json.loads(row["routing"])["attempts"]
    assert first["provider"] == "first" and first["outcome"] == "failed"
    # 1000 input tokens × 3 µ$ (message_start also reports 1 output token: 15 µ$).
    assert first["usage"]["input"] == 1000
    assert first["cost_micros"] == 1000 * 3 + first["usage"]["output"] * 15
    assert second["cost_micros"] == CACHE_HEAVY_MICROS
    assert row["cost_micros"] == CACHE_HEAVY_MICROS + first["cost_micros"]
    assert row["limit_cost"] == row["cost_micros"]


def test_usage_command_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    upstreams = {"anth": Upstream("anthropic", MockSettings(script=CACHE_HEAVY))}
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        for _ in range(2):
            c.openai.chat.completions.create(
                model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
            )
        st.wait_rows(2)
    assert main(["usage", "--data-dir", str(tmp_path), "--by", "model", "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "usage by model" in out and "claude-sonnet-4-6" in out and "TOTAL" in out
    assert "0.0048" in out  # 2 × 2405 µ$
    assert main(["usage", "--data-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"][0]["key"] == "tester" and data["total"]["cost_micros"] == 4810
    assert main(["usage", "--data-dir", str(tmp_path), "--by", "colour"]) == 2


def test_every_attempt_carries_a_cost_state(tmp_path: Path) -> None:
    from twmock.script import ErrorSpec

    refused = Script(error=ErrorSpec(status=503))
    upstreams = {
        "down": Upstream("anthropic", MockSettings(script=refused)),
        "up": Upstream("anthropic", MockSettings(script=CACHE_HEAVY)),
    }
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        c.anthropic.messages.create(
            model="claude-sonnet-4-6", max_tokens=9, messages=[{"role": "user", "content": "x"}]
        )
        (row,) = st.wait_rows(1)
    down, up = json.loads(row["routing"])["attempts"]
    # A 503 bills nothing: 0, known. The answer: its own cost.
    assert (down["status"], down["cost_micros"], down["cost_state"]) == (503, 0, "known")
    assert (up["cost_micros"], up["cost_state"]) == (CACHE_HEAVY_MICROS, "known")
    assert row["cost_micros"] == CACHE_HEAVY_MICROS


def test_a_chat_stream_that_did_not_ask_for_usage_is_priced(tmp_path: Path) -> None:
    # The SDK streams without stream_options: the gateway asks the upstream for usage anyway,
    # prices the row, and the client's stream has no usage-only chunk it did not ask for.
    script = Script(text="priced without asking", usage=Usage(input=1000, output=500))
    upstreams = {"chat": Upstream("openai-chat", MockSettings(script=script))}
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        messages = [{"role": "user", "content": "hi"}]
        plain = list(
            c.openai.chat.completions.create(model="gpt-4.1", messages=messages, stream=True)
        )
        asked = list(
            c.openai.chat.completions.create(
                model="gpt-4.1",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        rows = st.wait_rows(2)
        sent = [json.loads(r.body).get("stream_options") for r in st.mock("chat").received]
    assert sent == [{"include_usage": True}] * 2
    assert all(chunk.choices for chunk in plain)  # no usage-only chunk
    assert [chunk.usage for chunk in plain] == [None] * len(plain)
    assert "".join(ch.choices[0].delta.content or "" for ch in plain) == "priced without asking"
    assert not asked[-1].choices and asked[-1].usage is not None  # asked: as it came
    assert asked[-1].usage.completion_tokens == 500
    # gpt-4.1: 2 USD in, 8 USD out per million tokens: 1000×2 + 500×8 = 6000 µ$.
    for row in rows:
        assert (row["input_tokens"], row["output_tokens"]) == (1000, 500)
        assert (row["cost_micros"], row["cost_state"]) == (6000, "known")


def test_a_stream_cancelled_before_its_usage_shows_the_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Chat stream reports usage only at its end; the client leaves after a few chunks. The
    # key's cost limit counted the request's estimate: the row, its attempt, /usage, /metrics
    # and `twserve usage` show that estimate, marked `estimated`, instead of nothing.
    slow = Script(text="word " * 200, chunks=200, chunk_delay=0.02, usage=Usage(input=9, output=9))
    upstreams = {"chat": Upstream("openai-chat", MockSettings(script=slow))}
    config = {"clients": [{"name": "tester", "key": KEY, "limits": [{"per": "day", "cost": 5}]}]}
    prompt = "a question long enough to be worth estimating " * 40
    with running_stack(tmp_path, upstreams, config=config, control=True) as st:
        with sdk_clients(st.url) as c:
            stream = c.openai.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": prompt}], stream=True
            )
            for _, _chunk in zip(range(3), stream, strict=False):
                pass
            stream.close()
        (row,) = st.wait_rows(1)
        usage = _control(st.control_url, "/usage?by=model&since=1h")["total"]
        keys = _control(st.control_url, "/keys")["keys"]
        metrics = httpx2.get(
            st.control_url + "/metrics", headers={"authorization": f"Bearer {CONTROL_KEY}"}
        ).text
    assert row["cancelled"] == 1 and row["output_tokens"] is None
    # What the limit counted is what the row shows: the input estimate at gpt-4.1's 2 µ$.
    estimate = row["input_tokens"]
    assert estimate is not None and estimate > 400
    assert row["limit_tokens"] == estimate
    assert (row["cost_micros"], row["cost_state"]) == (estimate * 2, "estimated")
    assert row["limit_cost"] == row["cost_micros"]
    (attempt,) = json.loads(row["routing"])["attempts"]
    assert (attempt["cost_micros"], attempt["cost_state"]) == (estimate * 2, "estimated")
    assert usage["estimated_requests"] == 1 and usage["cost_micros"] == estimate * 2
    assert usage["input_tokens"] == estimate and usage["unpriced_requests"] == 0
    assert keys[0]["limits"][0]["used"] == estimate * 2
    cost = 'gateway_estimated_cost_usd_total{key="tester",model="gpt-4.1",provider="chat"}'
    assert f"{cost} {estimate * 2 / 1_000_000}" in metrics
    assert 'gateway_tokens_total{key="tester",kind="input"' not in metrics  # none reported
    assert main(["usage", "--data-dir", str(tmp_path), "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["total"]
    assert (total["estimated_requests"], total["cost_micros"]) == (1, estimate * 2)
    assert main(["usage", "--data-dir", str(tmp_path), "--width", "160"]) == 0
    assert "estimated" in capsys.readouterr().out


@pytest.mark.parametrize("count", [2**63, 2**64, -5])
def test_a_token_count_no_request_has_keeps_the_gateway_serving(tmp_path: Path, count: int) -> None:
    """An upstream reporting 2**63 input tokens (past SQLite's integers) stopped the request
    store's writer, and with it the gateway; a negative count priced the request below zero.
    Counts are kept within 0 to a billion (twproto.ir.MAX_TOKEN_COUNT) wherever they are read."""
    script = Script(usage=Usage(input=count, output=5))
    upstreams = {"anth": Upstream("anthropic", MockSettings(script=script))}
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        for _ in range(2):
            answer = c.openai.chat.completions.create(
                model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.usage is not None
        rows = st.wait_rows(2)
    kept = 1_000_000_000 if count > 0 else 0
    assert answer.usage.prompt_tokens == kept
    assert [(r["status"], r["input_tokens"]) for r in rows] == [(200, kept)] * 2
    # Sonnet 4.6: 3 USD per million input tokens, 15 per million output.
    assert [r["cost_micros"] for r in rows] == [kept * 3 + 5 * 15] * 2
