"""Hot-path benchmark of the tasks started by the thousand (twserve.server.base): a request's
reader in an anyio task group against the same in a `TaskSet`, µs per task from start to join
on the asyncio backend (uvloop when installed, as the gateway runs), and the Python heap a
parked task holds in each (tracemalloc, 2,000 tasks at once).

    pytest benchmarks/hot/bench_tasks.py --benchmark-enable -p no:cacheprovider
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from twserve.server.base import TaskSet

TASKS = 2000


def _backend_options() -> dict[str, Any]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


async def _step() -> None:
    await anyio.lowlevel.checkpoint()


async def _in_task_groups() -> None:
    for _ in range(TASKS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_step)


async def _in_task_sets() -> None:
    for _ in range(TASKS):
        scope = anyio.CancelScope()
        async with TaskSet(lambda _exc: None) as tasks:
            tasks.start(_under(scope), scope)


async def _under(scope: anyio.CancelScope) -> None:
    with scope:
        await _step()


def _run(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="asyncio", backend_options=_backend_options())


def _per_task(benchmark: Any) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_task"] = stats.stats.mean / TASKS * 1e6


@pytest.mark.parametrize("kind", ["anyio_task_group", "task_set"])
def test_start_to_join(benchmark: Any, kind: str) -> None:
    main = _in_task_groups if kind == "anyio_task_group" else _in_task_sets
    benchmark.pedantic(_run, args=(main,), rounds=5, iterations=1)
    _per_task(benchmark)


def _parked_heap(kind: str) -> float:
    """Bytes of Python heap per task while `TASKS` tasks wait, each under its own scope."""
    measured: list[float] = []

    async def main() -> None:
        release = anyio.Event()

        async def parked(scope: anyio.CancelScope) -> None:
            with scope:
                await release.wait()

        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        if kind == "anyio_task_group":
            async with anyio.create_task_group() as tg:
                for _ in range(TASKS):
                    tg.start_soon(parked, anyio.CancelScope())
                await anyio.sleep(0.05)
                measured.append((tracemalloc.get_traced_memory()[0] - before) / TASKS)
                release.set()
        else:
            async with TaskSet(lambda _exc: None) as tasks:
                for _ in range(TASKS):
                    scope = anyio.CancelScope()
                    tasks.start(parked(scope), scope)
                await anyio.sleep(0.05)
                measured.append((tracemalloc.get_traced_memory()[0] - before) / TASKS)
                release.set()
        tracemalloc.stop()

    _run(main)
    return measured[0]


def test_heap_per_parked_task() -> None:
    group, task_set = _parked_heap("anyio_task_group"), _parked_heap("task_set")
    print(f"\nheap per parked task: anyio task group {group:.0f} B, TaskSet {task_set:.0f} B")
    assert task_set < group  # the point of TaskSet; the figures are in docs/benchmarks.md
