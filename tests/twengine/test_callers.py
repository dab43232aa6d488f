"""Who is calling, and whether they may: keys, addresses and the checks a request's head is
enough for. Pure: a request head is a plain value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from twengine import Refusal, build_config
from twengine.callers import AddressFilter, Callers, KeyRing
from twengine.config import ConfigError

Header = tuple[bytes, bytes]


@dataclass(frozen=True, slots=True)
class Head:
    method: str = "POST"
    path: str = "/v1/messages"
    query: str = ""
    headers: list[Header] = field(default_factory=list)
    client: tuple[str, int] = ("127.0.0.1", 5000)


def callers(**gateway: Any) -> Callers:
    return Callers(
        build_config(
            {
                "version": 1,
                "listen": {"gateway": gateway},
                "clients": [{"name": "tester", "key": "k-test"}],
                "providers": [{"name": "a", "base_url": "http://127.0.0.1:9", "key": "x"}],
            },
            {},
        )
    )


def test_keyring_matches_names() -> None:
    ring = KeyRing.of([("k-one", "one"), ("k-two", "two"), ("", "empty")])
    assert ring.lookup("k-two") == "two"
    assert ring.lookup("k-tw") is None
    assert ring.lookup("") is None and ring.lookup(None) is None


def test_keyring_compares_bytes_that_are_not_utf8_as_themselves() -> None:
    ring = KeyRing.of([("k-\ufffd", "replaced"), ("k-é", "accented")])
    # A presented byte that is not UTF-8 rides along as a surrogate escape: it never collapses
    # into the replacement character some configured key may hold.
    assert ring.lookup(b"k-\xff".decode("utf-8", "surrogateescape")) is None
    assert ring.lookup(b"k-\xc3\xa9".decode("utf-8", "surrogateescape")) == "accented"


def test_address_filter() -> None:
    f = AddressFilter(["10.0.0.0/8"])
    assert f.allows("10.1.2.3") and f.allows("127.0.0.1") and f.allows("::1")
    assert not f.allows("192.0.2.1") and not f.allows("garbage")
    assert f.allows("::ffff:10.0.0.5") and f.allows("fe80::1%eth0") is False
    assert AddressFilter([]).allows("192.0.2.1")


KEYED = [(b"x-api-key", b"k-test")]


@pytest.mark.parametrize(
    ("head", "status", "code"),
    [
        (Head(headers=KEYED), None, None),
        (Head(), 401, "gw.auth.missing_key"),
        (Head(headers=[(b"x-api-key", b"k-wrong")]), 401, "gw.auth.bad_key"),
        (Head(headers=KEYED, client=("192.0.2.1", 1)), 403, "gw.auth.denied_address"),
        # A page of another site.
        (Head(headers=[*KEYED, (b"origin", b"https://evil.example")]), 403, None),
        # A path the gateway does not serve, with a body to come: refused before reading it.
        (Head(path="/nope", headers=[*KEYED, (b"content-length", b"12")]), 404, None),
        # Without a body the handler answers it, and the connection is kept.
        (Head(path="/nope", headers=[*KEYED, (b"content-length", b"0")]), None, None),
        (Head(method="GET", path="/"), None, None),  # the warm-up probe: the handler answers
    ],
)
def test_what_a_head_is_enough_to_refuse(head: Head, status: int | None, code: str | None) -> None:
    err = callers(allow_from=["10.0.0.0/8"]).head_refusal(head, now=0.0)
    assert (err.status if err else None) == status
    if code is not None:
        assert err is not None and err.code == code


def test_check_names_the_route_the_client_and_the_verdict() -> None:
    checks = callers()
    route, client, verdict = checks.check(Head(headers=KEYED), now=0.0)
    assert route is not None and route.model is None and client == "tester" and verdict is None
    route, client, verdict = checks.check(
        Head(path="/v1beta/models/gem:generateContent", query="key=k-test&alt=sse"), now=0.0
    )
    assert route is not None and route.model == "gem" and client == "tester"
    _, client, verdict = checks.check(Head(), now=0.0)
    assert client is None and isinstance(verdict, Refusal)
    assert verdict.error.code == "gw.auth.missing_key"


def test_web_page_reads_nothing_for_what_sdks_send() -> None:
    checks = callers()
    assert checks.web_page(Head(headers=[(b"content-type", b"application/json")])) is None
    refused = checks.web_page(Head(headers=[(b"sec-fetch-site", b"cross-site")]))
    assert refused is not None and refused.status == 403


def test_a_disabled_key_is_refused_as_a_wrong_one() -> None:
    config = build_config(
        {
            "version": 1,
            "clients": [
                {"name": "on", "key": "k-on"},
                {"name": "off", "key": "k-off", "disabled": True},
            ],
            "default_key": "off",
            "providers": [{"name": "a", "base_url": "http://127.0.0.1:9", "key": "x"}],
        },
        {},
    )
    checks = Callers(config)
    assert checks.keys.lookup("k-on") == "on"
    assert checks.keys.lookup("k-off") is None
    assert config.client("off").disabled is True
    # A keyless request does not pass as a disabled default key either.
    assert config.client_for(None, presented=False) is None
    head = Head(headers=[(b"x-api-key", b"k-off")])
    _, client, verdict = checks.check(head, now=0.0)
    assert client is None and isinstance(verdict, Refusal) and verdict.error.status == 401


def _keys_config(**tester: object) -> Callers:
    return Callers(
        build_config(
            {
                "version": 1,
                "clients": [{"name": "tester", "key": "k-test", **tester}],
                "providers": [{"name": "a", "base_url": "http://127.0.0.1:9", "key": "x"}],
            },
            {},
        )
    )


@pytest.mark.parametrize(
    "written",
    [1_800_000_000, 1_800_000_000.0, "2027-01-15T08:00:00Z", "2027-01-15T09:00:00+01:00"],
)
def test_a_key_is_refused_from_its_expires_at_on(written: object) -> None:
    checks = _keys_config(expires_at=written)
    at = checks.config.client("tester").expires_at
    assert at is not None
    head = Head(headers=KEYED)
    assert checks.check(head, now=at - 1)[2] is None
    for now in (at, at + 3600):
        _, client, verdict = checks.check(head, now=now)
        assert client == "tester" and isinstance(verdict, Refusal)
        assert (verdict.error.status, verdict.error.code) == (401, "gw.auth.key_expired")
        assert "expired at" in verdict.error.message
    # The head is enough to refuse it: no body is read.
    refused = checks.head_refusal(head, now=at)
    assert refused is not None and refused.code == "gw.auth.key_expired"


def test_a_date_without_a_time_or_an_offset_is_utc() -> None:
    import datetime as dt

    for written in ("2027-01-15", dt.date(2027, 1, 15), dt.datetime(2027, 1, 15)):
        at = _keys_config(expires_at=written).config.client("tester").expires_at
        assert at == dt.datetime(2027, 1, 15, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize("written", ["soon", -5, True, "2027-13-01"])
def test_a_bad_time_is_a_config_problem(written: object) -> None:
    with pytest.raises(ConfigError) as refused:
        _keys_config(expires_at=written)
    assert [p.code for p in refused.value.problems] == ["config.time_invalid"]


def test_a_rotated_keys_previous_secret_opens_until_its_time() -> None:
    checks = _keys_config(previous_key="k-old", previous_key_until=1_800_000_000)
    old = Head(headers=[(b"x-api-key", b"k-old")])
    new = Head(headers=KEYED)
    assert checks.check(old, now=1_799_999_999)[1:] == ("tester", None)
    _, client, verdict = checks.check(old, now=1_800_000_000)
    assert client is None and isinstance(verdict, Refusal)
    assert verdict.error.code == "gw.auth.bad_key"  # a lapsed secret is a wrong one
    assert checks.check(new, now=1_900_000_000)[1:] == ("tester", None)


def test_a_previous_key_needs_its_time_and_counts_as_a_key() -> None:
    with pytest.raises(ConfigError) as missing:
        _keys_config(previous_key="k-old")
    assert [p.code for p in missing.value.problems] == ["config.previous_key_until_missing"]
    with pytest.raises(ConfigError) as same:
        _keys_config(previous_key="k-test", previous_key_until=1)
    assert [p.code for p in same.value.problems] == ["config.client_duplicate_key"]


def test_allowed_models_are_globs() -> None:
    config = _keys_config(allowed_models=["claude-*", "gpt-5"]).config
    client = config.client("tester")
    assert client.allows_model("claude-sonnet-4-5") and client.allows_model("gpt-5")
    assert not client.allows_model("gpt-5-mini") and not client.allows_model("Claude-x")
    assert _keys_config(allowed_models="gpt-*").config.client("tester").allowed_models == ("gpt-*",)
    assert _keys_config().config.client("tester").allows_model("anything")
    with pytest.raises(ConfigError) as blank:
        _keys_config(allowed_models=[" "])
    assert [p.code for p in blank.value.problems] == ["config.model_name_invalid"]
