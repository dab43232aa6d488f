"""The connection to Redis that instances share state through, and life without it.

Every Redis call goes through `RedisState.call`, which gives it `timeout` seconds. A call that
fails or runs out of time marks Redis *lost*: the caller gets `RedisDown` and uses its
in-process state instead, and so does every later caller at once, without trying Redis again,
until the background task (`run`) has reached it. While lost, `run` pings every `retry_secs`;
the first answer marks Redis *back* and requests use Redis again (the announcements channel
resubscribes and reads back what it missed: `shared_router`). Both changes are told to `listeners`
(the app publishes them as `SharedStateChanged` events).

*Where Redis is* (``state.redis_url``, `parse_url`): one server (``redis://``, ``rediss://``), a
master found through Sentinel (``redis+sentinel://``: the client asks the sentinels for the
master's address on every new connection, so after a failover the reconnect reaches the promoted
replica), or a Redis Cluster (``redis+cluster://``: the client routes each command to the node
holding its key's slot, which is why every script keeps its keys under one hash tag,
docs/deployment.md).

Work that need not hold up a request (settling a reservation, announcing a pause) is queued
with `later` and done by `run` in order; a bounded queue, so a slow Redis drops jobs (counted in
`dropped`) rather than holding memory.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from twserve.shared.down import RedisDown

__all__ = [
    "RedisDown",
    "RedisState",
    "RedisTarget",
    "ScriptCall",
    "describe_url",
    "parse_url",
    "run_scripts",
]

log = logging.getLogger("twserve.shared")

T = TypeVar("T")
Job = Callable[[Redis], Awaitable[Any]]

# Jobs waiting for Redis at most; more are dropped (and counted).
JOB_QUEUE = 10_000


SENTINEL_PORT = 26379
REDIS_PORT = 6379


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTarget:
    """Where Redis is, from ``state.redis_url`` (`parse_url`)."""

    kind: Literal["server", "sentinel", "cluster"]
    # Sentinel: the sentinels; cluster: the nodes to learn the cluster from.
    nodes: tuple[tuple[str, int], ...] = ()
    master: str | None = None  # Sentinel: the master's name as the sentinels know it
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


_HOST = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>\d{1,5}))?"
)


def _hosts(netloc: str, default_port: int) -> tuple[tuple[str, int], ...]:
    out = []
    for item in netloc.split(","):
        found = _HOST.fullmatch(item.strip())
        if found is None:
            raise ValueError(f"{item.strip()!r} is not host[:port]")
        port = found["port"]
        out.append((found["v6"] or found["name"], int(port) if port else default_port))
    return tuple(out)


def parse_url(url: str) -> RedisTarget:
    """`url` as a `RedisTarget`; ValueError says what is wrong (twengine's config check
    refuses the same URLs first, with ``config.url_invalid``)."""
    scheme, _, rest = url.strip().partition("://")
    if scheme in ("redis", "rediss"):
        return RedisTarget(kind="server")
    if scheme not in ("redis+sentinel", "redis+cluster"):
        raise ValueError(f"unknown scheme {scheme!r}")
    rest, _, query = rest.partition("?")
    auth, at, hosts = rest.rpartition("@")
    if not at:
        auth, hosts = "", rest
    netloc, _, path = hosts.partition("/")
    user, colon, password = auth.partition(":")
    username = unquote(user) if user and colon else None
    secret = unquote(password if colon else user) if auth else None
    options = parse_qs(query)
    sentinel_password = options.get("sentinel_password", [None])[0]
    parts = [p for p in path.split("/") if p]
    if scheme == "redis+sentinel":
        if not parts:
            raise ValueError("the master's name is missing (…/<master>/<db>)")
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError("the path must be /<master> or /<master>/<database number>")
        return RedisTarget(
            kind="sentinel",
            nodes=_hosts(netloc, SENTINEL_PORT),
            master=unquote(parts[0]),
            db=int(parts[1]) if len(parts) == 2 else 0,
            username=username,
            password=secret,
            sentinel_password=sentinel_password,
        )
    if parts not in ([], ["0"]):
        raise ValueError("a Redis Cluster has database 0 only")
    return RedisTarget(
        kind="cluster", nodes=_hosts(netloc, REDIS_PORT), username=username, password=secret
    )


def describe_url(url: str) -> str:
    """`url` without its user and password (or any query), for logs and events."""
    scheme, _, rest = url.partition("://")
    if scheme in ("redis+sentinel", "redis+cluster"):
        rest = rest.partition("?")[0]
        return f"{scheme}://{rest.rpartition('@')[2]}"
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
        self.target = parse_url(redis_url)
        self._sentinel: Sentinel | None = None
        self._scripts: list[str] = []
        self.client: Redis = self._client(redis_url)
        # The database the URL names (``/1``; 0 without one), which the keys live in.
        self.db = self.target.db
        if self.target.kind == "server":
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

    def _client(self, url: str) -> Redis:
        timeout, target = self.timeout, self.target
        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            # One more try on a fresh connection: a pooled one may be stale after a restart.
            "retry": AsyncRetry(NoBackoff(), 1),
        }
        if target.kind == "server":
            return Redis.from_url(url, health_check_interval=0, **common)
        if target.kind == "sentinel":
            assert target.master is not None
            sentinel = self._sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
                list(target.nodes),
                sentinel_kwargs={
                    "socket_timeout": timeout,
                    "socket_connect_timeout": timeout,
                    "password": target.sentinel_password,
                },
                username=target.username,
                password=target.password,
                db=target.db,
                **common,
            )
            # Every new connection asks the sentinels where the master is (and a connection
            # to a server that is no longer the master is closed), so the reconnect after a
            # loss (`connect`) reaches the promoted replica.
            return cast(Redis, sentinel.master_for(target.master, health_check_interval=0))
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            username=target.username,
            password=target.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # Redirections (MOVED/ASK) and a node's failure are followed once, within the
            # call's timeout; a Cluster that cannot answer counts as Redis lost.
            retry=AsyncRetry(NoBackoff(), 1),
        )
        # RedisCluster has the commands this package uses (scripts, pipelines without a
        # transaction, SCAN over every primary, pub/sub) under the same names and signatures;
        # the tests run every shared part on a real Cluster.
        return cast(Redis, cluster)

    def script(self, text: str) -> AsyncScript:
        """`text` registered as a Lua script, and loaded at every (re)connect (`connect`): a
        server new to the gateway — restarted, a promoted replica, every Cluster master — then
        has it before requests call it, instead of each of them failing NOSCRIPT at once."""
        self._scripts.append(text)
        return self.client.register_script(text)

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
                # Connections pooled before a loss lead to the old server: start afresh. (A
                # Cluster client finds the nodes again itself.)
                if self.target.kind != "cluster":
                    await self.client.connection_pool.disconnect()
                await self.client.ping()
                for text in self._scripts:  # on a Cluster: on every master
                    await self.client.script_load(text)
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
            if self._sentinel is not None:
                # The master's client does not own its pool (the sentinels' pool), nor the
                # connections to the sentinels: close both.
                await self.client.connection_pool.disconnect()
                for sentinel in self._sentinel.sentinels:
                    await sentinel.aclose()


# A script with the keys and arguments of one call of it.
ScriptCall = tuple[AsyncScript, list[str], list[Any]]


async def run_scripts(client: Redis, calls: list[ScriptCall]) -> list[Any]:
    """Each call's result, in order: pipelined in one round trip on one server; on a Redis
    Cluster, whose client pipelines no scripts, one call after another, each to its keys' node."""
    if isinstance(client, RedisCluster):
        return [await script(keys=keys, args=args, client=client) for script, keys, args in calls]
    async with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        return list(await pipe.execute())
