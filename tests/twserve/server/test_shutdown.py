"""A graceful stop lets streams in flight finish, refuses new requests, and loses no row."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import httpcore
import pytest

from twengine.config import build_config
from twmock.script import MockSettings, Script
from twmock.serve.handler import make_handler
from twserve.app.wiring import GatewayApp
from twserve.server import listener

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_stop_drains_streams_in_flight(tmp_path: Path) -> None:
    slow = MockSettings(script=Script(chunks=20, chunk_delay=0.03))
    async with anyio.create_task_group() as tg:
        mock_port = await tg.start(
            lambda task_status: listener.serve(make_handler(slow), port=0, task_status=task_status)
        )
        config = build_config(
            {
                "version": 1,
                "clients": [{"name": "t", "key": "k"}],
                "providers": [
                    {
                        "name": "up",
                        "protocol": "anthropic",
                        "key": "x",
                        "base_url": f"http://127.0.0.1:{mock_port}",
                    }
                ],
            }
        )
        app = GatewayApp(config, tmp_path, env={}, port=0, shutdown_grace=10)
        bound = await tg.start(app.run)
        url = f"http://127.0.0.1:{bound.gateway_port}/v1/messages"
        body = json.dumps(
            {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        received = b""
        async with httpcore.AsyncConnectionPool() as pool:
            async with pool.stream(
                "POST", url, headers=[(b"x-api-key", b"k")], content=body
            ) as resp:
                async for chunk in resp.aiter_stream():
                    if not app.stopping:
                        app.request_stop()  # mid-stream
                    received += chunk
        async with httpcore.AsyncConnectionPool() as fresh:
            with pytest.raises(httpcore.ConnectError):  # the listener is closed
                await fresh.request("POST", url, headers=[(b"x-api-key", b"k")], content=body)
        with anyio.fail_after(5):
            await app.wait_stopped()
        tg.cancel_scope.cancel()
    assert resp.status == 200
    assert received.rstrip().endswith(b'data: {"type":"message_stop"}')
    with closing(sqlite3.connect(tmp_path / "requests.sqlite3")) as db:
        rows = db.execute("SELECT status, cancelled FROM requests").fetchall()
    assert rows == [(200, 0)]
