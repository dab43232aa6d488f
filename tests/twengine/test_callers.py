"""Who is calling, and whether they may: keys, addresses and the checks a request's head is
enough for. Pure: a request head is a plain value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from twengine import Refusal, build_config
from twengine.callers import AddressFilter, Callers, KeyRing

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
    err = callers(allow_from=["10.0.0.0/8"]).head_refusal(head)
    assert (err.status if err else None) == status
    if code is not None:
        assert err is not None and err.code == code


def test_check_names_the_route_the_client_and_the_verdict() -> None:
    checks = callers()
    route, client, verdict = checks.check(Head(headers=KEYED))
    assert route is not None and route.model is None and client == "tester" and verdict is None
    route, client, verdict = checks.check(
        Head(path="/v1beta/models/gem:generateContent", query="key=k-test&alt=sse")
    )
    assert route is not None and route.model == "gem" and client == "tester"
    _, client, verdict = checks.check(Head())
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
    _, client, verdict = checks.check(head)
    assert client is None and isinstance(verdict, Refusal) and verdict.error.status == 401
