"""``GET /metrics`` after real traffic: the histograms, the counters by key, code, upstream and
reason, the upstream, key-limit and store gauges and the process metrics, with label values
from bounded sets only; and the Grafana dashboard in docs/grafana/twserve.json, every PromQL
expression of which must name series this gateway exports (scraped here, after traffic)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpcore
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.twserve.conftest import KEY, http
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, parse_script

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docs" / "grafana" / "twserve.json"
OBSERVABILITY = ROOT / "docs" / "observability.md"
STRANGE_MODEL = "client-made-up-model-7f3a"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    upstreams = {
        "bad": Upstream(
            "openai-chat", MockSettings(script=parse_script({"error": {"status": 503}}))
        ),
        "good": Upstream("anthropic", extra={"max_concurrent": 4}),
        # Its first answer fails; a request routed to it alone is retried (round 1).
        "flaky": Upstream(
            "openai-chat", MockSettings(script=parse_script({"fail_first": 1, "error": 503}))
        ),
    }
    config = {
        "clients": [
            {"name": "tester", "key": KEY, "limits": [{"per": "day", "requests": 100}]},
        ],
        "groups": [{"name": "chain", "type": "fallback", "providers": ["bad", "good"]}],
        "routes": [
            {
                "name": "main",
                "rules": [
                    {"name": "solo", "when": {"model": "solo"}, "to": "flaky"},
                    {"name": "all", "to": "chain"},
                ],
            }
        ],
        "default_route": "main",
        "failover": {"failures_to_pause": 100},
    }
    with running_stack(
        tmp_path_factory.mktemp("prom"), upstreams, config=config, control=True
    ) as stack:
        chat = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
        for model in ("claude-sonnet-4-5", "claude-sonnet-4-5", "m", STRANGE_MODEL, "solo"):
            chat.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        messages = anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0, timeout=10)
        with messages.messages.stream(
            model="claude-haiku-4-5", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert stream.get_final_text()
        refused = http(
            stack.url + "/v1/chat/completions",
            body=b'{"model": "m", "messages": "not a list"}',
            headers=(("authorization", f"Bearer {KEY}"),),
        )
        assert refused.status == 400
        stack.wait_rows(7)
        response = httpcore.request(
            "GET",
            stack.control_url + "/metrics",
            headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
        )
        assert response.status == 200
        yield stack, response.content.decode()


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


def test_histograms_by_format_upstream_and_outcome(scraped: tuple[Stack, str]) -> None:
    _, text = scraped
    s = samples(text)
    ok = labels(format="openai-chat", upstream="good", outcome="ok")
    assert s[("gateway_request_duration_seconds_count", ok)] == 4
    assert s[("gateway_time_to_first_content_seconds_count", ok)] == 4
    solo = labels(format="openai-chat", upstream="flaky", outcome="ok")
    assert s[("gateway_request_duration_seconds_count", solo)] == 1
    streamed = labels(format="anthropic", upstream="good", outcome="ok")
    assert s[("gateway_request_duration_seconds_count", streamed)] == 1
    refused = labels(format="openai-chat", upstream="none", outcome="refused")
    assert s[("gateway_request_duration_seconds_count", refused)] == 1
    # Buckets as documented, cumulative, ending at +Inf.
    buckets = [
        (dict(k[1])["le"], v)
        for k, v in s.items()
        if k[0] == "gateway_request_duration_seconds_bucket" and ("outcome", "ok") in k[1]
        if ("format", "openai-chat") in k[1] and ("upstream", "good") in k[1]
    ]
    assert [le for le, _ in buckets][-1] == "+Inf" and buckets[-1][1] == 4
    assert "0.1" in [le for le, _ in buckets] and "600.0" in [le for le, _ in buckets]


def test_requests_refusals_attempts_and_failovers(scraped: tuple[Stack, str]) -> None:
    _, text = scraped
    s = samples(text)
    assert s[("gateway_key_requests_total", labels(key="tester", outcome="ok"))] == 6
    assert s[("gateway_key_requests_total", labels(key="tester", outcome="refused"))] == 1
    codes = {dict(k[1])["code"] for k in s if k[0] == "gateway_refusals_total"}
    assert len(codes) == 1 and codes.pop().startswith("gw.")
    # Every request routed to the chain tried bad (503) first and failed over to good.
    failed = labels(upstream="bad", reason="overloaded")
    assert s[("gateway_upstream_attempt_failures_total", failed)] == 5
    assert s[("gateway_upstream_failovers_total", failed)] == 5
    assert s[("gateway_provider_fallback_total", ())] == 5
    # The request for flaky alone: its first attempt failed, the retry round answered.
    flaky = labels(upstream="flaky", reason="overloaded")
    assert s[("gateway_upstream_attempt_failures_total", flaky)] == 1
    assert ("gateway_upstream_failovers_total", flaky) not in s
    assert s[("gateway_provider_retry_total", labels(provider="flaky"))] == 1


def test_upstream_key_store_and_process_gauges(scraped: tuple[Stack, str]) -> None:
    _, text = scraped
    s = samples(text)
    assert s[("gateway_upstream_failures_in_row", labels(provider="bad"))] == 5
    assert s[("gateway_upstream_failures_in_row", labels(provider="good"))] == 0
    assert s[("gateway_upstream_success_rate", labels(provider="bad"))] == 0
    assert s[("gateway_upstream_success_rate", labels(provider="good"))] == 1
    assert s[("gateway_upstream_slot_limit", labels(provider="good"))] == 4
    assert ("gateway_upstream_slot_limit", labels(provider="bad")) not in s  # no limit
    assert s[("gateway_upstream_slots_in_use", labels(provider="good"))] == 0
    assert s[("gateway_upstream_queue_length", labels(provider="good"))] == 0
    limit = labels(key="tester", per="day", measure="requests")
    assert s[("gateway_key_limit_amount", limit)] == 100
    assert s[("gateway_key_limit_used", limit)] == 6  # the refused request is not counted
    assert s[("gateway_key_limit_used_ratio", limit)] == pytest.approx(0.06)
    assert s[("gateway_store_queue_depth", ())] == 0
    assert s[("gateway_store_write_seconds_count", ())] >= 1
    assert s[("gateway_store_rows_written_total", ())] >= 4
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert s[(name, ())] > 0


def test_label_values_come_from_bounded_sets(scraped: tuple[Stack, str]) -> None:
    stack, text = scraped
    assert STRANGE_MODEL not in text
    s = samples(text)
    names = {p.name for p in stack.app.config.providers} | {"none"}
    keys = {c.name for c in stack.app.config.clients} | {"none"}
    outcomes = {"ok", "local", "refused", "error", "cancelled"}
    for (name, pairs), _ in s.items():
        found = dict(pairs)
        if "upstream" in found:
            assert found["upstream"] in names, (name, found)
        if "provider" in found:
            assert found["provider"] in names, (name, found)
        if "key" in found:
            assert found["key"] in keys, (name, found)
        if "outcome" in found and name.startswith(
            ("gateway_request_", "gateway_time_", "gateway_key_")
        ):
            assert found["outcome"] in outcomes, (name, found)


# --- the dashboard ---------------------------------------------------------------------------

# PromQL words that are not series: aggregation modifiers and set operators.
_KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    ]
)
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: every identifier outside strings, label
    matchers, ranges and grouping lists that is not a function call or a keyword."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for found in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[found.end() :].lstrip().startswith("("):
            continue  # a function
        if found.group().lower() not in _KEYWORDS:
            names.add(found.group())
    return names


def test_metric_names_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, upstream) (rate(a_bucket{x=~"b|c", y="z"}[5m])))'
        " / ignoring(code) group_left sum without (le) (b_total offset 1h) and on(key) c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names("time() - process_start_time_seconds") == {"process_start_time_seconds"}


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    return exprs


def test_dashboard_names_only_series_the_gateway_exports(scraped: tuple[Stack, str]) -> None:
    _, text = scraped
    exported = {name for name, _ in samples(text)}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = _expressions(dashboard)
    assert len(exprs) >= 30
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)
        used |= names
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["query"]["query"])
            assert found is not None and found.group(1) in exported
    # Every family the issue asks for is on the dashboard.
    for family in (
        "gateway_request_duration_seconds_bucket",
        "gateway_time_to_first_content_seconds_bucket",
        "gateway_key_requests_total",
        "gateway_refusals_total",
        "gateway_upstream_attempt_failures_total",
        "gateway_upstream_failovers_total",
        "gateway_provider_retry_total",
        "gateway_provider_paused",
        "gateway_upstream_failures_in_row",
        "gateway_upstream_success_rate",
        "gateway_upstream_slots_in_use",
        "gateway_upstream_queue_length",
        "gateway_key_limit_used_ratio",
        "gateway_store_queue_depth",
        "gateway_store_write_seconds_bucket",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert family in used, family
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_exported_family_is_documented(scraped: tuple[Stack, str]) -> None:
    _, text = scraped
    doc = OBSERVABILITY.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `((?:gateway|process)_\w+)`", doc, flags=re.M))
    families = {family.name for family in text_string_to_metric_families(text)}
    # The parser names a counter's family without its _total.
    exposed = {
        name if not any(f"{name}_total" in line for line in text.splitlines()) else f"{name}_total"
        for name in families
    }
    wanted = {n for n in exposed if not n.startswith("python_")}
    assert wanted - documented == set(), "exported but not in docs/observability.md"
    assert documented - wanted == set(), "documented but not exported"
