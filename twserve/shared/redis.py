"""The connection to Redis that instances share state through, and life without it.

Every Redis call goes through `RedisState.call`, which gives it `timeout` seconds. A call that
fails or runs out of time marks Redis *lost*: the caller gets `RedisDown` and uses its
in-process state instead, and so does every later caller at once, without trying Redis again,
until the background task (`run`) has reached it. While lost, `run` pings every `retry_secs`;
the first answer marks Redis *back* and requests use Redis again (the announcements channel
resubscribes and reads back what it missed: `shared_router`). Both changes are told to `listeners`
(the app publishes them as `SharedStateChanged` events).

Work that need not hold up a request (settling a reservation, announcing a pause) is queued
with `later` and done by `run` in order; a bounded queue, so a slow Redis drops jobs (counted in
`dropped`) rather than holding memory.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from twserve.shared.down import RedisDown

__all__ = ["RedisDown", "RedisState", "describe_url"]

log = logging.getLogger("twserve.shared")

T = TypeVar("T")
Job = Callable[[Redis], Awaitable[Any]]

# Jobs waiting for Redis at most; more are dropped (and counted).
JOB_QUEUE = 10_000


def describe_url(url: str) -> str:
    """`url` without its user and password, for logs and events."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class RedisState:
    """The Redis connection of one instance (see the module docs)."""

    def __init__(
        self,
        redis_url: str,
        *,
        timeout: float = 1.0,
        retry_secs: float = 1.0,
        prefix: str = "twserve:",
    ) -> None:
        self.redis_url = redis_url
        self.where = describe_url(redis_url)
        self.timeout = timeout
        self.retry_secs = retry_secs
        self.prefix = prefix
        self.client: Redis = Redis.from_url(
            redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One more try on a fresh connection: a pooled one may be stale after a restart.
            retry=Retry(NoBackoff(), 1),
            health_check_interval=0,
        )
        # The database the URL names (``/1``; 0 without one), which the keys live in.
        self.db = int(self.client.connection_pool.connection_kwargs.get("db") or 0)
        # False until the first answer: requests before it use the in-process state.
        self.up = False
        self.dropped = 0
        self.listeners: list[Callable[[bool, str], None]] = []
        send, receive = anyio.create_memory_object_stream[Job](JOB_QUEUE)
        self._jobs: MemoryObjectSendStream[Job] = send
        self._queue: MemoryObjectReceiveStream[Job] = receive
        self._lost_event: anyio.Event | None = None
        self._announced = False

    def key(self, *parts: str) -> str:
        """A key name under the prefix."""
        return self.prefix + ":".join(parts)

    def channel(self, name: str) -> str:
        """A pub/sub channel's name: under the prefix and the database number, since channels,
        unlike keys, are one namespace for every database of a server. Two deployments on one
        Redis, told apart by their database (``/0``, ``/1``), thus never hear each other."""
        return f"{self.prefix}db{self.db}:{name}"

    async def call(self, fn: Callable[[Redis], Awaitable[T]]) -> T:
        """`fn`'s result, within `timeout`; `RedisDown` when Redis is lost or fails now."""
        if not self.up:
            raise RedisDown(f"Redis at {self.where} is not reachable")
        try:
            with anyio.fail_after(self.timeout):
                return await fn(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            self.lost(exc)
            raise RedisDown(str(exc)) from exc

    def later(self, job: Job) -> None:
        """Run `job` on Redis in the background, in order; skipped while Redis is lost."""
        if not self.up:
            return
        try:
            self._jobs.send_nowait(job)
        except anyio.WouldBlock:
            self.dropped += 1

    def lost(self, exc: BaseException) -> None:
        """Redis failed: use the in-process state until `run` reaches it again."""
        if not self.up:
            return
        self.up = False
        detail = f"Redis at {self.where} failed ({type(exc).__name__}: {exc})"
        log.warning("shared state: %s; each instance keeps its own state until it is back", detail)
        self._tell(False, detail)
        if self._lost_event is not None:
            self._lost_event.set()

    def _tell(self, up: bool, detail: str) -> None:
        for listener in self.listeners:
            try:
                listener(up, detail)
            except Exception:
                log.exception("shared state listener failed")

    async def connect(self) -> bool:
        """Try Redis once (at startup); True when it answered."""
        try:
            with anyio.fail_after(self.timeout):
                # Connections pooled before a loss lead to the old server: start afresh.
                await self.client.connection_pool.disconnect()
                await self.client.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            if not self._announced:
                detail = f"Redis at {self.where} is not reachable ({type(exc).__name__}: {exc})"
                log.warning("shared state: %s; using in-process state until it is", detail)
                self._announced = True  # the warning is told once; the back event follows
                self._tell(False, detail)
            return False
        first = not self._announced
        self._announced = True
        self.up = True
        if first:
            log.info("shared state: using Redis at %s", self.where)
        else:
            log.warning(
                "shared state: Redis at %s is back; shared state is in use again", self.where
            )
            self._tell(True, f"Redis at {self.where} is back")
        return True

    async def run(self) -> None:
        """Do the queued jobs, and reconnect whenever Redis is lost; until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._work)
            while True:
                if not self.up and not await self.connect():
                    await anyio.sleep(self.retry_secs)
                    continue
                self._lost_event = anyio.Event()
                if self.up:
                    await self._lost_event.wait()

    async def _work(self) -> None:
        async for job in self._queue:
            if not self.up:
                continue
            try:
                with anyio.fail_after(self.timeout):
                    await job(self.client)
            except (RedisError, OSError, TimeoutError) as exc:
                self.lost(exc)

    async def aclose(self) -> None:
        self.up = False
        self._jobs.close()
        self._queue.close()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
            await self.client.aclose()
