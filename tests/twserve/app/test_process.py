"""The process `twserve serve` runs in (twserve.app.process): uvloop when it is installed and the
standard loop when asked; the startup heap frozen and young objects collected less often, and
``TWSERVE_GC=default`` keeping Python's collector as it is."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import weakref
from collections.abc import Iterator

import anyio
import pytest

from twserve.app import process

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

    process.run(main)
    return seen[0]


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed on this platform")
def test_serve_runs_on_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process.backend_options({}) == {"use_uvloop": True}
    assert _loop_module_after_run(monkeypatch, None) == "uvloop"


def test_the_environment_can_ask_for_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process.backend_options({"TWSERVE_EVENT_LOOP": "asyncio"}) == {}
    assert _loop_module_after_run(monkeypatch, "asyncio") == "asyncio"


class _Node:
    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def restored() -> Iterator[None]:
    """The test process's collector as it was, whatever the test did to it."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


@pytest.mark.usefixtures("restored")
def test_settle_freezes_what_exists_and_still_collects_new_cycles() -> None:
    startup = [_Node()]
    assert _tracked(startup)
    assert process.settle_heap({}) is True
    assert gc.get_threshold()[0] == process.YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0
    assert not _tracked(startup)  # frozen: no collection walks it again
    later = _Node()
    later.other = _Node()
    later.other.other = later  # a reference cycle made after the freeze
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None


@pytest.mark.usefixtures("restored")
def test_default_leaves_the_collector_alone() -> None:
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    assert process.settle_heap({"TWSERVE_GC": "default"}) is False
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == frozen
