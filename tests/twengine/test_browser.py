"""twengine.browser: which requests give a web page away, and what the config lets through."""

from __future__ import annotations

import pytest

from twengine.browser import browser_refusal, host_name, is_json_type
from twengine.config import GatewayListen

OPEN = GatewayListen()


def refusal(
    listen: GatewayListen = OPEN,
    *,
    method: str = "POST",
    origin: bytes | None = None,
    fetch_site: bytes | None = None,
    content_type: bytes | None = b"application/json",
    host: bytes | None = b"127.0.0.1:8788",
) -> str | None:
    err = browser_refusal(
        listen,
        method=method,
        origin=origin,
        fetch_site=fetch_site,
        content_type=content_type,
        host=host,
    )
    return None if err is None else f"{err.status} {err.code}"


def test_what_sdks_and_command_line_tools_send_passes() -> None:
    assert refusal() is None
    assert refusal(content_type=None) is None  # curl --data-binary without a type still reads JSON
    assert refusal(content_type=b"application/json; charset=utf-8") is None
    assert refusal(content_type=b"Application/JSON") is None
    assert refusal(method="GET", content_type=None) is None
    assert refusal(fetch_site=b"none") is None  # typed into the address bar
    assert refusal(origin=None, fetch_site=b"same-origin") is None


@pytest.mark.parametrize(
    "origin", [b"https://evil.example", b"http://127.0.0.1:3000", b"null", b"http://localhost"]
)
def test_any_origin_is_refused_by_default(origin: bytes) -> None:
    assert refusal(origin=origin) == "403 gw.request.foreign_origin"
    assert refusal(method="GET", origin=origin, content_type=None) == (
        "403 gw.request.foreign_origin"
    )


@pytest.mark.parametrize("site", [b"cross-site", b"same-site", b"Cross-Site"])
def test_another_pages_fetch_without_an_origin_is_refused(site: bytes) -> None:
    assert refusal(method="GET", fetch_site=site, content_type=None) == (
        "403 gw.request.foreign_origin"
    )


def test_listed_origins_pass_as_the_browser_writes_them() -> None:
    listen = GatewayListen(allow_origins=("https://app.example.com",))
    assert refusal(listen, origin=b"https://app.example.com") is None
    assert refusal(listen, origin=b"HTTPS://APP.EXAMPLE.COM") is None
    assert refusal(listen, origin=b"https://app.example.com:444") == "403 gw.request.foreign_origin"
    assert refusal(listen, origin=b"https://evil.example") == "403 gw.request.foreign_origin"
    # A listed origin's page says cross-site too: the Origin decides.
    assert refusal(listen, origin=b"https://app.example.com", fetch_site=b"cross-site") is None
    anyone = GatewayListen(allow_origins=("*",))
    assert refusal(anyone, origin=b"https://evil.example") is None
    assert refusal(anyone, fetch_site=b"cross-site") is None


@pytest.mark.parametrize(
    "content_type",
    [
        b"text/plain",
        b"text/plain;charset=UTF-8",
        b"application/x-www-form-urlencoded",
        b"multipart/form-data; boundary=x",
        b"application/octet-stream",
        b"",
    ],
)
def test_a_post_body_that_is_not_json_is_refused(content_type: bytes) -> None:
    assert refusal(content_type=content_type) == "415 gw.request.unsupported_media_type"
    # A page's form and text types are the danger; even an allowed origin sends JSON.
    anyone = GatewayListen(allow_origins=("*",))
    assert refusal(anyone, content_type=content_type) == "415 gw.request.unsupported_media_type"


def test_hosts_are_checked_only_when_listed() -> None:
    assert refusal(host=b"rebound.attacker.example") is None
    listen = GatewayListen(allow_hosts=("gateway.local", "127.0.0.1", "::1"))
    assert refusal(listen, host=b"gateway.local") is None
    assert refusal(listen, host=b"Gateway.Local:8788") is None
    assert refusal(listen, host=b"127.0.0.1:8788") is None
    assert refusal(listen, host=b"[::1]:8788") is None
    assert refusal(listen, host=b"rebound.attacker.example:8788") == (
        "403 gw.request.unexpected_host"
    )
    assert refusal(listen, host=None) == "403 gw.request.unexpected_host"


def test_header_value_helpers() -> None:
    assert host_name(b"[2001:db8::1]:443") == "2001:db8::1"
    assert host_name(b"2001:db8::1") == "2001:db8::1"
    assert host_name(b"Example.COM") == "example.com"
    assert is_json_type(b"application/vnd.api+json")
    assert not is_json_type(b"text/json+plain")
