from __future__ import annotations

from twserve.gateway.auth import AddressFilter, KeyRing, strip_key_param


def test_key_param_is_stripped() -> None:
    assert strip_key_param("alt=sse&key=secret") == "alt=sse"
    assert strip_key_param("alt=sse") == "alt=sse"


def test_keyring_matches_names() -> None:
    ring = KeyRing.of([("k-one", "one"), ("k-two", "two"), ("", "empty")])
    assert ring.lookup("k-two") == "two"
    assert ring.lookup("k-tw") is None
    assert ring.lookup("") is None and ring.lookup(None) is None


def test_address_filter() -> None:
    f = AddressFilter(["10.0.0.0/8"])
    assert f.allows("10.1.2.3") and f.allows("127.0.0.1") and f.allows("::1")
    assert not f.allows("192.0.2.1") and not f.allows("garbage")
    assert f.allows("::ffff:10.0.0.5")
    assert AddressFilter([]).allows("192.0.2.1")
