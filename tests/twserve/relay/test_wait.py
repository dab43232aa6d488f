"""The relay's inbox (twserve.relay.wait): bounded, in order, a full inbox holds its senders
back, closing it turns them away, and a cancel scope cuts a wait short."""

from __future__ import annotations

import anyio
import pytest

from twserve.relay.wait import Inbox

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_items_come_out_in_order_and_a_full_inbox_says_so() -> None:
    inbox: Inbox[int] = Inbox(2)
    inbox.send_nowait(1)
    await inbox.send(2)
    with pytest.raises(anyio.WouldBlock):
        inbox.send_nowait(3)
    assert [inbox.receive_nowait(), inbox.receive_nowait()] == [1, 2]
    with pytest.raises(anyio.WouldBlock):
        inbox.receive_nowait()


async def test_a_receiver_waits_for_the_next_item() -> None:
    inbox: Inbox[str] = Inbox(4)
    got: list[str] = []

    async def take() -> None:
        got.append(await inbox.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(take)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        inbox.send_nowait("head")
    assert got == ["head"]


async def test_a_sender_waits_for_room_and_closing_turns_it_away() -> None:
    inbox: Inbox[int] = Inbox(1)
    inbox.send_nowait(1)
    sent: list[int] = []
    refused: list[type[BaseException]] = []

    async def put(n: int) -> None:
        try:
            await inbox.send(n)
            sent.append(n)
        except anyio.BrokenResourceError as exc:
            refused.append(type(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(put, 2)
        tg.start_soon(put, 3)
        await anyio.wait_all_tasks_blocked()
        assert sent == []  # both wait: the inbox is full
        assert inbox.receive_nowait() == 1  # room for one
        await anyio.wait_all_tasks_blocked()
        assert sent == [2]
        inbox.close()
    assert refused == [anyio.BrokenResourceError]
    with pytest.raises(anyio.BrokenResourceError):
        inbox.send_nowait(4)
    with pytest.raises(anyio.EndOfStream):
        await inbox.receive()


async def test_a_sender_that_gives_up_waiting_leaves_the_room_to_the_next() -> None:
    inbox: Inbox[int] = Inbox(1)
    inbox.send_nowait(1)
    sent: list[int] = []

    async def put(n: int) -> None:
        await inbox.send(n)
        sent.append(n)

    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as first:
            first.start_soon(put, 2)  # waits first
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(put, 3)  # waits second
            await anyio.wait_all_tasks_blocked()
            first.cancel_scope.cancel()  # the first gives up
        assert inbox.receive_nowait() == 1
        await anyio.wait_all_tasks_blocked()
    assert sent == [3]
    assert inbox.receive_nowait() == 3


async def test_close_ends_a_receive_that_waits() -> None:
    inbox: Inbox[int] = Inbox(2)
    ended = False

    async def receive() -> None:
        nonlocal ended
        with pytest.raises(anyio.EndOfStream):
            await inbox.receive()
        ended = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await anyio.sleep(0.01)
        inbox.close()
    assert ended
