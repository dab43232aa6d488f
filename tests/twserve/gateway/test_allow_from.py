"""listen.gateway.allow_from is checked before the key; loopback is always allowed."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from twengine.config import build_config
from twserve.gateway.handler import Gateway
from twserve.server.base import Headers, Request
from twserve.store.sqlite import RequestStore
from twserve.upstream.client import UpstreamClient


class Captured:
    def __init__(self) -> None:
        self.status = 0
        self.headers: Headers = []
        self.body = b""
        self.started = False

    async def start(self, status: int, headers: Headers) -> None:
        self.status, self.headers, self.started = status, headers, True

    async def send(self, data: bytes) -> None:
        self.body += data

    async def end(self) -> None:
        pass

    async def abort(self) -> None:
        pass


def _ask(gateway: Gateway, address: str, key: bytes) -> Captured:
    out = Captured()
    request = Request(
        method="POST",
        target=b"/v1/chat/completions",
        path="/v1/chat/completions",
        query="",
        headers=[(b"authorization", b"Bearer " + key)],
        body=b"not json",
        client=(address, 40000),
    )
    anyio.run(gateway.handle, request, out)
    return out


def test_address_is_checked_before_the_key(tmp_path: Path) -> None:
    config = build_config(
        {
            "version": 1,
            "listen": {"gateway": {"allow_from": ["10.0.0.0/8"]}},
            "clients": [{"name": "c", "key": "good"}],
        }
    )
    store = RequestStore(tmp_path / "r.sqlite3")
    gateway = Gateway(config, store=store, upstream=UpstreamClient(), env={})
    try:
        denied = _ask(gateway, "192.0.2.7", b"good")
        assert denied.status == 403
        assert json.loads(denied.body)["error"]["code"] == "gw.auth.denied_address"
        assert (b"x-thinkwatch-error", b"denied") in denied.headers
        # an allowed network and loopback reach the key check, then the body check
        assert _ask(gateway, "10.1.2.3", b"bad").status == 401
        assert _ask(gateway, "127.0.0.1", b"bad").status == 401
        assert _ask(gateway, "10.1.2.3", b"good").status == 400
    finally:
        store.close_db()
