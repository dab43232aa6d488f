"""Routing's last step, candidate → destination: pure, over a built config and an env mapping."""

from __future__ import annotations

from typing import Any

import pytest

from twengine import (
    Candidate,
    CandidateRef,
    Destination,
    PriceTable,
    Transport,
    build_config,
    destination,
    destinations,
    request_destinations,
)
from twengine.catalog import ConfigCatalog, TableCatalog
from twengine.config import AnswerModel, CredentialFault, SetOverrides
from twengine.destinations import reasoning_level, transport_of
from twproto.dialect import Dialect
from twproto.ir import Effort, ReasoningLevel

BASE: dict[str, Any] = {"version": 1, "clients": [{"name": "k", "key": "k-1"}]}
URL = "http://127.0.0.1:9/v1"
WS = {"responses_transport": "websocket"}
TABLE = PriceTable.from_data(
    {"models": {"m": {"input": 1.0, "output": 2.0, "max_output_tokens": 64_000}}}
)


def config(*providers: dict[str, Any], **top: Any) -> Any:
    return build_config({**BASE, "providers": list(providers), **top}, {})


def provider(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "base_url": URL, "protocol": "anthropic", "key": "sk-" + name, **extra}


def test_the_transport_is_read_from_the_providers_own_config() -> None:
    responses = {"protocol": "openai-responses"}
    cfg = config(
        provider("ws", **responses, **WS),
        provider("ws2", **responses, http2=True, **WS),
        provider("h2", **responses, http2=True),
        provider("h1", **responses),
    )
    # The socket is for a client socket's turns only; what goes over HTTP all the same keeps
    # the provider's http2.
    ways = [transport_of(p) for p in cfg.providers]
    over_http = [transport_of(p, http=True) for p in cfg.providers]
    assert ways == [Transport.RESPONSES_SOCKET] * 2 + [Transport.HTTP2, Transport.HTTP1]
    assert over_http == [Transport.HTTP1, Transport.HTTP2, Transport.HTTP2, Transport.HTTP1]


def test_two_providers_on_one_url_keep_their_own_transport() -> None:
    # The transport comes with the candidate's provider, never from its URL: a lookup by URL
    # prefix gave both the first one's.
    cfg = config(provider("one"), provider("two", http2=True))
    usable, faults = destinations(
        cfg, [Candidate(provider="one", model="m"), Candidate(provider="two", model="m")], None, {}
    )
    assert faults == []
    assert [(d.name, d.transport, d.http_transport) for d in usable] == [
        ("one", Transport.HTTP1, Transport.HTTP1),
        ("two", Transport.HTTP2, Transport.HTTP2),
    ]


def test_a_destination_carries_its_target_rule_and_provider_settings() -> None:
    cfg = config(
        provider(
            "a",
            key="${A_KEY}",
            headers={"X-Team": "${TEAM}"},
            connect_timeout_secs=2.5,
            forward_mock_headers=True,
        )
    )
    cand = Candidate(
        provider="a",
        model="served",
        overrides=SetOverrides(max_tokens=500, reasoning=ReasoningLevel.LOW),
    )
    built = destination(cfg, cand, "a", {"A_KEY": "sk-live", "TEAM": "blue"})
    assert isinstance(built, Destination)
    target = built.target
    assert (target.dialect, target.base_url, target.key, target.model) == (
        Dialect.ANTHROPIC,
        URL,
        "sk-live",
        "served",
    )
    assert target.headers == ((b"x-team", b"blue"),)  # names lower-cased, values read at send
    assert target.forward_mock_headers
    assert (built.sticky, built.max_tokens, built.reasoning) == (True, 500, ReasoningLevel.LOW)
    assert built.connect_timeout == 2.5
    assert not built.drop_sealed and not built.show_served
    assert built.candidate() == CandidateRef(name="a", sticky=True, context_window=None)


def test_credentials_that_do_not_resolve_skip_the_candidate_in_order() -> None:
    cfg = config(
        provider("a", key="${UNSET}"),
        provider("b"),
        provider("c", key="${BAD}"),
    )
    cands = [Candidate(provider=n, model="m") for n in ("a", "b", "c")]
    usable, faults = destinations(cfg, cands, None, {"BAD": "sk-pasted\n"})
    assert [d.name for d in usable] == ["b"]
    assert [(f.provider, f.code) for f in faults] == [
        ("a", "gw.upstream.credentials_missing"),
        ("c", "gw.upstream.credentials_invalid"),
    ]
    assert all(isinstance(f, CredentialFault) and "sk-pasted" not in str(f) for f in faults)


@pytest.mark.parametrize("counting", [False, True])
def test_one_request_is_refused_only_when_every_candidate_is_skipped(counting: bool) -> None:
    cfg = config(provider("a", key="${UNSET}"), provider("b"), provider("c"))
    cands = [Candidate(provider=n, model="m") for n in ("a", "b", "c")]
    usable, faults, refused = request_destinations(cfg, cands, "c", {}, counting=counting)
    # A token count goes to the first usable upstream only: it is never retried.
    assert [d.name for d in usable] == (["b"] if counting else ["b", "c"])
    assert [f.provider for f in faults] == ["a"] and refused is None
    usable, faults, refused = request_destinations(cfg, cands[:1], None, {}, counting=counting)
    assert usable == [] and [f.provider for f in faults] == ["a"]
    assert refused is not None and refused.status == 503
    assert refused.code == "gw.upstream.credentials_missing" and "UNSET" in refused.message


@pytest.mark.parametrize(
    ("specs", "catalog", "limit", "window"),
    [
        # Nothing known: the converter's default output limit, no window.
        ({}, None, None, None),
        # model_specs, read by either catalog.
        ({"m": {"context_window": 1000, "max_output_tokens": 100}}, None, 100, 1000),
        ({"m": {"context_window": 1000, "max_output_tokens": 100}}, "table", 100, 1000),
        # The price table fills in what model_specs leave out.
        ({"m": {"context_window": 1000}}, "table", 64_000, 1000),
        ({}, "table", 64_000, None),
        ({}, "config", None, None),
    ],
)
def test_model_facts_come_from_the_catalog(
    specs: dict[str, Any], catalog: str | None, limit: int | None, window: int | None
) -> None:
    cfg = config(provider("a", model_specs=specs) if specs else provider("a"))
    facts = {"table": TableCatalog(TABLE), "config": ConfigCatalog(), None: None}[catalog]
    built = destination(cfg, Candidate(provider="a", model="m"), None, {}, facts)
    assert isinstance(built, Destination)
    assert (built.output_limit, built.context_window) == (limit, window)
    assert built.candidate().context_window == window


@pytest.mark.parametrize("shown", [AnswerModel.REQUESTED, AnswerModel.SERVED])
def test_the_answer_shows_the_model_asked_or_served(shown: AnswerModel) -> None:
    cfg = config(provider("a"), answer_model=shown.value)
    built = destination(cfg, Candidate(provider="a", model="served"), None, {})
    assert isinstance(built, Destination)
    expected = "served" if shown is AnswerModel.SERVED else "asked"
    assert built.client_model("asked") == expected


@pytest.mark.parametrize(
    ("effort", "level"),
    [
        (None, ReasoningLevel.OFF),
        (Effort.NONE, ReasoningLevel.OFF),
        (Effort.MINIMAL, ReasoningLevel.LOW),
        (Effort.LOW, ReasoningLevel.LOW),
        (Effort.MEDIUM, ReasoningLevel.MEDIUM),
        (Effort.HIGH, ReasoningLevel.HIGH),
        (Effort.XHIGH, ReasoningLevel.XHIGH),
        (Effort.MAX, ReasoningLevel.MAX),
    ],
)
def test_reasoning_level_of_an_effort(effort: Effort | None, level: ReasoningLevel) -> None:
    assert reasoning_level(effort) is level
