"""Admission without sockets: every refusal, the local answers, and the seam for more checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from twengine import admission
from twengine.admission import (
    AdmissionRequest,
    LocalAnswer,
    Refusal,
    Routed,
    admit,
    check_caller,
    key_busy,
)
from twengine.config import Config, build_config
from twengine.model_listing import answer_models, listed_models
from twengine.router import Router
from twengine.rules import RequestFacts
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.paths import Operation, PathRoute, match_path


def config(**sections: Any) -> Config:
    data: dict[str, Any] = {
        "version": 1,
        "providers": [
            {
                "name": "a",
                "base_url": "https://a.example",
                "protocol": "openai-chat",
                "models": ["m"],
            },
            {
                "name": "b",
                "base_url": "https://b.example",
                "protocol": "anthropic",
                "models": ["m"],
            },
        ],
        **sections,
    }
    return build_config(data)


def request(body: object, *, path: str = "/v1/messages", **kw: Any) -> AdmissionRequest:
    route = match_path("POST", path)
    assert route is not None and route.dialect is not None
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return AdmissionRequest(route=route, dialect=route.dialect, body=raw, client="tester", **kw)


def run(req: AdmissionRequest, cfg: Config | None = None, **kw: Any) -> Any:
    cfg = cfg or config()
    return admit(req, router=Router(cfg), config=cfg, now=0.0, **kw)


GOOD = {
    "model": "m",
    "max_tokens": 5,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def code(result: object) -> str:
    assert isinstance(result, Refusal), result
    return f"{result.error.status} {result.error.code}"


def test_a_body_that_is_not_a_json_object_is_refused() -> None:
    for body in (b"", b"not json", b"[1]", b'"x"'):
        assert code(run(request(body))) == "400 gw.request.bad_json"


def test_a_request_naming_no_model_is_refused_with_what_was_read() -> None:
    result = run(request({"messages": []}))
    assert code(result) == "400 gw.request.bad_json"
    assert result.error.message == "the request names no model"


def test_an_admitted_request_carries_its_plan_and_row_view() -> None:
    result = run(request(GOOD, headers=[(b"x-claude-code-session-id", b"s1")]))
    assert isinstance(result, Routed)
    assert (result.model, result.stream) == ("m", True)
    assert [c.provider for c in result.candidates] == ["a", "b"]
    assert result.view.model == "m" and result.view.stream is True
    assert result.view.routing is not None and result.view.routing["skipped"] == []


def test_a_body_already_parsed_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(data: bytes) -> Any:
        raise AssertionError("parsed again")

    monkeypatch.setattr(admission, "json_loads", refuse)
    result = run(request(GOOD, parsed=dict(GOOD)))
    assert isinstance(result, Routed) and result.body == GOOD and result.model == "m"


def test_gemini_takes_model_and_stream_from_the_path() -> None:
    path = "/v1beta/models/m:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    result = run(request(body, path=path))
    assert isinstance(result, Routed) and (result.model, result.stream) == ("m", True)


def test_a_denying_rule_refuses_with_its_message() -> None:
    routes = [{"name": "default", "rules": [{"name": "no", "deny": "not today"}]}]
    result = run(request(GOOD), config(routes=routes))
    assert code(result) == "403 gw.rule.denied" and result.error.message == "not today"
    assert result.view.routing is not None and result.view.routing["rule"] == "no"


def test_a_token_count_goes_to_one_upstream_of_the_clients_format() -> None:
    result = run(request(GOOD, path="/v1/messages/count_tokens"))
    assert isinstance(result, Routed) and [c.provider for c in result.candidates] == ["b"]


def test_a_token_count_without_such_an_upstream_is_answered_here() -> None:
    body = {"model": "m", "input": "hello there, how are you?"}
    result = run(request(body, path="/v1/responses"))
    assert isinstance(result, Routed)  # a generation: any format will do
    count = AdmissionRequest(
        route=PathRoute(operation=Operation.COUNT_TOKENS, dialect=Dialect.GEMINI, model="m"),
        dialect=Dialect.GEMINI,
        body=json.dumps({"contents": [{"parts": [{"text": "hello"}]}]}).encode(),
        client="tester",
    )
    local = run(count)
    assert isinstance(local, LocalAnswer)
    assert (b"x-thinkwatch-local", b"1") in local.headers
    assert json.loads(local.body) == {"totalTokens": local.input_tokens} and local.input_tokens > 0


def test_an_extra_check_refuses_before_routing() -> None:
    seen: list[RequestFacts] = []
    busy = GatewayError(status=429, category=ErrorCategory.RATE_LIMITED, code="gw.x", message="x")

    def limit(facts: RequestFacts, now: float) -> GatewayError | None:
        seen.append(facts)
        return busy if facts.client == "tester" else None

    cfg = config()
    router = Router(cfg)
    result = admit(request(GOOD), router=router, config=cfg, now=0.0, checks=[limit])
    assert isinstance(result, Refusal) and result.error is busy
    assert result.view.model == "m" and result.view.routing is None  # routing never ran
    assert seen[0].model == "m" and seen[0].stream is True
    assert isinstance(admit(request(GOOD), router=router, config=cfg, now=0.0), Routed)


def caller(**kw: Any) -> object:
    fields: dict[str, Any] = {
        "method": "POST",
        "path": "/v1/messages",
        "route": match_path("POST", "/v1/messages"),
        "address_allowed": True,
        "client": "tester",
        "key_presented": True,
    }
    fields.update(kw)
    return check_caller(**fields)


def test_the_callers_checks_in_order() -> None:
    assert caller() is None
    assert code(caller(address_allowed=False, client=None)) == "403 gw.auth.denied_address"
    assert code(caller(route=None, client=None)) == "404 gw.request.not_found"
    assert code(caller(client=None)) == "401 gw.auth.bad_key"
    assert code(caller(client=None, key_presented=False)) == "401 gw.auth.missing_key"
    probe = caller(method="GET", path="/", route=None, client=None)
    assert isinstance(probe, LocalAnswer) and probe.body == b""
    health = caller(method="GET", path="/healthz", route=match_path("GET", "/healthz"), client=None)
    assert isinstance(health, LocalAnswer) and health.body == b"ok"


def test_a_web_pages_request_is_refused_after_the_path_before_the_key() -> None:
    page = GatewayError(
        status=403, category=ErrorCategory.DENIED, code="gw.request.foreign_origin", message="x"
    )
    assert code(caller(browser=page)) == "403 gw.request.foreign_origin"
    assert code(caller(browser=page, client=None)) == "403 gw.request.foreign_origin"
    assert code(caller(browser=page, address_allowed=False)) == "403 gw.auth.denied_address"
    assert code(caller(browser=page, route=None)) == "404 gw.request.not_found"
    health = caller(
        method="GET", path="/healthz", route=match_path("GET", "/healthz"), browser=page
    )
    assert isinstance(health, LocalAnswer)  # probes from anywhere still see the gateway up


def test_key_busy() -> None:
    err = key_busy(3)
    assert (err.status, err.code, err.retry_after) == (429, "gw.key.busy", 1.0)


def test_model_listing() -> None:
    cfg = config(aliases={"fast": ["m"]})
    assert [i.id for i in listed_models(cfg)] == ["m", "fast"]
    listing = answer_models(cfg, PathRoute(operation=Operation.LIST_MODELS), Dialect.OPENAI_CHAT)
    assert isinstance(listing, LocalAnswer)
    assert [m["id"] for m in json.loads(listing.body)["data"]] == ["m", "fast"]
    missing = answer_models(
        cfg, PathRoute(operation=Operation.GET_MODEL, model="nope"), Dialect.ANTHROPIC
    )
    assert code(missing) == "404 gw.request.not_found"


def test_a_model_name_past_the_limit_is_refused_before_routing() -> None:
    cfg = config(listen={"gateway": {"max_model_name_chars": 20}})
    ok = run(request({**GOOD, "model": "m"}), cfg)
    assert isinstance(ok, Routed)
    refused = run(request({**GOOD, "model": "n" * 21}), cfg)
    assert isinstance(refused, Refusal)
    assert (refused.error.status, refused.error.code) == (400, "gw.request.model_name_too_long")
    assert refused.error.message == "the model name is 21 characters long; at most 20 are accepted"
    # What the row records: the name cut at the limit; no routing was done for it.
    assert refused.view.model == "n" * 20 + "…" and refused.view.routing is None
    gemini = run(request({"contents": []}, path=f"/v1beta/models/{'g' * 30}:generateContent"), cfg)
    assert isinstance(gemini, Refusal) and gemini.error.code == "gw.request.model_name_too_long"


def test_the_default_model_name_limit_is_256() -> None:
    routed = run(request({**GOOD, "model": "m" * 256}))
    assert isinstance(routed, Refusal) and routed.error.code == "gw.no_upstream"  # a name, unknown
    refused = run(request({**GOOD, "model": "m" * 257}))
    assert isinstance(refused, Refusal) and refused.error.code == "gw.request.model_name_too_long"
