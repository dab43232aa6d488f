"""`twserve serve` runs on uvloop when it is installed, and on the standard loop when asked."""

from __future__ import annotations

import asyncio
import importlib.util

import anyio
import pytest

from twserve.app import eventloop

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def _loop_module_after_run(monkeypatch: pytest.MonkeyPatch, setting: str | None) -> str:
    if setting is None:
        monkeypatch.delenv("TWSERVE_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("TWSERVE_EVENT_LOOP", setting)
    seen: list[str] = []

    async def main() -> None:
        # A real round trip through anyio on the chosen loop: a task, a sleep, a socket pair.
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 0)
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, await anyio.connect_tcp("127.0.0.1", port) as client:
            await client.send(b"ping")
        seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

    eventloop.run(main)
    return seen[0]


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed on this platform")
def test_serve_runs_on_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eventloop.backend_options({}) == {"use_uvloop": True}
    assert _loop_module_after_run(monkeypatch, None) == "uvloop"


def test_the_environment_can_ask_for_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eventloop.backend_options({"TWSERVE_EVENT_LOOP": "asyncio"}) == {}
    assert _loop_module_after_run(monkeypatch, "asyncio") == "asyncio"
