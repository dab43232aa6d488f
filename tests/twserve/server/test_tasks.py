"""Tasks without a task group (twserve.server.base): plain asyncio tasks that are cancelled,
waited for and fail as a task group's would, on a real event loop."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import anyio
import pytest

from twserve.server.base import TaskSet

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _closing(scope: anyio.CancelScope, done: list[str]) -> Coroutine[Any, Any, None]:
    """A task that waits under `scope` until cancelled, then closes (shielded) for 50 ms."""

    async def task() -> None:
        with scope:
            try:
                await anyio.sleep(30)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.05)  # as an upstream request's close
                    done.append("closed")

    return task()


async def test_a_cancelled_task_finishes_its_shielded_close() -> None:
    tasks, done, scope = TaskSet(lambda _exc: None), [], anyio.CancelScope()
    tasks.start(_closing(scope, done), scope)
    await anyio.sleep(0.01)
    with anyio.fail_after(5):
        await tasks.join(cancel=True)
    assert done == ["closed"] and tasks.running == 0 and tasks.failure is None


async def test_a_scope_cancelled_before_its_task_runs_cancels_the_task() -> None:
    tasks, done, scope = TaskSet(lambda _exc: None), [], anyio.CancelScope()
    tasks.start(_closing(scope, done), scope)
    with anyio.fail_after(5):
        await tasks.join(cancel=True)  # before the task's first step
    assert done == ["closed"] and tasks.running == 0


async def test_join_without_cancel_waits_for_a_task_to_end_on_its_own() -> None:
    tasks, done, scope = TaskSet(lambda _exc: None), [], anyio.CancelScope()

    async def task() -> None:
        with scope:
            await anyio.sleep(0.05)
            done.append("ended")

    tasks.start(task(), scope)
    await tasks.join(cancel=False)
    assert done == ["ended"] and not scope.cancel_called


async def test_an_owner_cancelled_while_it_waits_cancels_its_tasks_and_waits_for_them() -> None:
    tasks, done, scope = TaskSet(lambda _exc: None), [], anyio.CancelScope()
    tasks.start(_closing(scope, done), scope)
    with anyio.move_on_after(0.02) as waited:
        await tasks.join(cancel=False)
    assert waited.cancelled_caught and done == ["closed"] and tasks.running == 0


async def test_a_block_that_raises_cancels_the_tasks_and_the_error_goes_on() -> None:
    tasks, done, scope = TaskSet(lambda _exc: None), [], anyio.CancelScope()
    with pytest.raises(KeyError):
        async with tasks:
            tasks.start(_closing(scope, done), scope)
            await anyio.sleep(0.01)
            raise KeyError("the owner's own error")
    assert done == ["closed"] and tasks.running == 0


async def test_a_block_ends_by_cancelling_what_cancel_at_end_says() -> None:
    done: list[str] = []
    scope = anyio.CancelScope()
    tasks = TaskSet(lambda _exc: None, cancel_at_end=lambda: True)
    async with tasks:
        tasks.start(_closing(scope, done), scope)
        await anyio.sleep(0.01)
    assert done == ["closed"]


async def test_a_task_s_bug_is_kept_handed_on_and_raised_at_the_block_s_end() -> None:
    failed: list[str] = []
    tasks = TaskSet(lambda exc: failed.append(str(exc)))

    async def buggy() -> None:
        raise RuntimeError("a bug in the task")

    async def quiet() -> None:
        await anyio.sleep(0)

    with pytest.raises(RuntimeError, match="a bug in the task"):
        async with tasks:
            tasks.start(quiet(), anyio.CancelScope())
            tasks.start(buggy(), anyio.CancelScope())
    assert failed == ["a bug in the task"] and tasks.running == 0


async def test_a_bug_comes_before_the_owner_s_cancellation() -> None:
    tasks = TaskSet(lambda _exc: None)

    async def buggy() -> None:
        raise RuntimeError("a bug in the task")

    with anyio.CancelScope() as owner:
        with pytest.raises(RuntimeError) as raised:
            async with tasks:
                tasks.start(buggy(), anyio.CancelScope())
                owner.cancel()
                await anyio.sleep(1)
    assert raised.value.__cause__ is not None  # raised from the owner's cancellation


async def test_a_task_cancelled_from_its_scope_is_no_failure() -> None:
    tasks, scope = TaskSet(lambda _exc: None), anyio.CancelScope()

    async def task() -> None:
        with scope:
            await anyio.sleep(30)

    tasks.start(task(), scope)
    await anyio.sleep(0.01)
    await tasks.join(cancel=True)
    assert tasks.failure is None and tasks.running == 0
