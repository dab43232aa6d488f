"""Pauses and conversation affinity shared by every instance.

*Pauses.* A pause that starts on one instance (a failure's pause rule, or an operator's) is
written to ``<prefix>pause:<upstream>`` with the pause's end as its expiry — never shortening a
longer pause already there unless an operator set it — and announced on the channel
``<prefix>db<N>:events`` (`RedisState.channel`: channels are shared by every database of a
server, keys are not). A pause that ends early (a success, an operator's resume) deletes the key and
is announced too; one that runs out needs nothing, its key expires with it. The other instances
take what they hear into their own `twengine.health.Health` (`Health.pause`/`Health.resume` with
the reason the deciding instance gave), so a pause shows in their ``HealthChanged`` events and
views as well. Failure runs, success rates and first-content samples are shared by
twserve.shared.health, whose pauses travel this way too.

*Affinity.* When a conversation gets its answer, the upstream and the prompt cache it used are
written to ``<prefix>conv:<conversation>`` for the conversation TTL and announced; the other
instances record them in their own `twengine.affinity.Affinity`, so the conversation's next
request stays on that upstream whichever instance it reaches. The routing decision held for the
rest of a turn stays per instance.

On (re)connecting, an instance subscribes first, then reads the pause keys and the conversation
keys (`resync`, and whatever else is in `resyncs`: the reasoning memories of
twserve.shared.memory), so nothing said in between is missed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

from twengine.health import HealthReason, PauseChanged
from twproto import json_dumps, json_loads
from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisState

__all__ = ["SET_PAUSE", "SharedRouter", "get_each"]

log = logging.getLogger("twserve.shared")

# Conversations read back on (re)connecting, at most.
RESYNC_CONVERSATIONS = 10_000

#: KEYS: the pause key. ARGV: the announcement (JSON with `until`, wall seconds, and `reason`),
#: its lifetime in ms, the channel. A longer pause stays unless this one is an operator's.
SET_PAUSE = """
local new = cjson.decode(ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur and new['reason'] ~= 'manual' then
  local old = cjson.decode(cur)
  if tonumber(old['until']) >= tonumber(new['until']) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""


class SharedRouter:
    """Announces this instance's pauses and answers, and takes the others' (module docs)."""

    def __init__(
        self,
        state: RedisState,
        hooks: RouterHooks,
        *,
        instance: str,
        conversation_ttl_secs: float = 3600.0,
        wall: Callable[[], float],
        clock: Callable[[], float],
    ) -> None:
        self.state = state
        self.hooks = hooks
        self.instance = instance
        self.conversation_ttl_secs = conversation_ttl_secs
        self.wall = wall
        self.clock = clock
        self.channel = state.channel("events")
        self._adopting = False
        # Announcements of other kinds, by kind (``abort``: twserve.shared.aborts).
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        # More to read back after (re)subscribing (twserve.shared.memory: efforts, sealed marks).
        self.resyncs: list[Callable[[Redis], Awaitable[None]]] = []
        self._set_pause = state.script(SET_PAUSE)
        hooks.listeners.append(self.pause_changed)
        hooks.answer_listeners.append(self.answered)

    def pause_key(self, upstream: str) -> str:
        return self.state.key("pause", upstream)

    def conv_key(self, conversation: str) -> str:
        return self.state.key("conv", conversation)

    # -- what this instance tells -----------------------------------------------------------

    def pause_changed(self, change: PauseChanged) -> None:
        """A `RouterHooks` listener: announce a pause decided here, or its early end."""
        if self._adopting:
            return
        name = change.upstream
        if change.paused and change.until is not None:
            until = self.wall() + (change.until - self.clock())
            note = {
                "kind": "pause",
                "from": self.instance,
                "upstream": name,
                "until": until,
                "reason": change.reason.value,
            }
            text = json_dumps(note).decode()
            life_ms = max(1, int((until - self.wall()) * 1000))

            async def pause(client: Redis) -> None:
                await self._set_pause(
                    keys=[self.pause_key(name)], args=[text, life_ms, self.channel], client=client
                )

            self.state.later(pause)
        elif not change.paused and change.reason is not HealthReason.EXPIRED:
            note = {
                "kind": "resume",
                "from": self.instance,
                "upstream": name,
                "reason": change.reason.value,
            }

            async def resume(client: Redis) -> None:
                await client.delete(self.pause_key(name))
                await client.publish(self.channel, json_dumps(note))

            self.state.later(resume)

    def answered(self, conversation: str, upstream: str, cached: int) -> None:
        """A `RouterHooks` answer listener: the conversation's upstream, for every instance."""
        note = {
            "kind": "conv",
            "from": self.instance,
            "conversation": conversation,
            "upstream": upstream,
            "cached": cached,
        }
        text = json_dumps(note)
        ttl_ms = max(1, int(self.conversation_ttl_secs * 1000))

        async def tell(client: Redis) -> None:
            await client.set(self.conv_key(conversation), text, px=ttl_ms)
            await client.publish(self.channel, text)

        self.state.later(tell)

    # -- what the others tell ---------------------------------------------------------------

    def heard(self, data: bytes | str) -> None:
        """One announcement from the channel (or read back by `resync`)."""
        try:
            note = json_loads(data)
        except ValueError:
            return
        if not isinstance(note, dict) or note.get("from") == self.instance:
            return
        try:
            self._take(note)
        except (KeyError, TypeError, ValueError):
            log.info("shared state: ignored a malformed announcement")

    def _take(self, note: dict[str, Any]) -> None:
        kind = note["kind"]
        router = self.hooks.router
        handler = self.handlers.get(kind)
        if handler is not None:
            handler(note)
            return
        if kind == "conv":
            if router.config.has_provider(str(note["upstream"])):
                router.record_answer(
                    str(note["conversation"]),
                    str(note["upstream"]),
                    cached_tokens=int(note["cached"]),
                    now=self.clock(),
                )
            return
        name = str(note["upstream"])
        if not router.config.has_provider(name):
            return
        now = self.clock()
        health = router.health
        if kind == "pause":
            until = now + (float(note["until"]) - self.wall())
            current = health.paused_until(name)
            if until <= now or (
                health.is_paused(name, now) and current is not None and current >= until
            ):
                return
            changes = health.pause(name, now, until, HealthReason(note["reason"]))
        elif kind == "resume":
            changes = health.resume(name, now, HealthReason(note["reason"]))
        else:
            return
        self._adopting = True
        try:
            self.hooks.publish(changes)
        finally:
            self._adopting = False

    async def resync(self, client: Redis) -> None:
        """Read the pauses in force and the conversations remembered (after subscribing).

        The keys are read with one GET each in a pipeline, not MGET: on a Redis Cluster they
        lie in different slots (a pipeline sends each node its own), and the SCAN for the
        conversation keys runs on every primary (the Cluster client's `scan_iter`)."""
        names = [p.name for p in self.hooks.router.config.providers]
        if names:
            for value in await get_each(client, [self.pause_key(n) for n in names]):
                if value is not None:
                    self.heard(value)
        keys: list[bytes] = []
        async for key in client.scan_iter(match=self.conv_key("*"), count=1000):
            keys.append(key)
            if len(keys) >= RESYNC_CONVERSATIONS:
                break
        for start in range(0, len(keys), 500):
            for value in await get_each(client, keys[start : start + 500]):
                if value is not None:
                    self.heard(value)
        for more in self.resyncs:
            await more(client)

    async def listen(self) -> None:
        """Take the others' announcements while Redis answers; until cancelled."""
        state = self.state
        while True:
            if not state.up:
                await anyio.sleep(state.retry_secs / 4)
                continue
            pubsub = state.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                with anyio.fail_after(max(state.timeout * 10, 5.0)):
                    await self.resync(state.client)
                while state.up:
                    message = await pubsub.get_message(timeout=state.retry_secs)
                    if message is not None and message.get("type") == "message":
                        self.heard(message["data"])
            except (RedisError, OSError, TimeoutError) as exc:
                state.lost(exc)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(state.timeout):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]


async def get_each(client: Redis, keys: list[str] | list[bytes]) -> list[Any]:
    """The values of `keys` (None where absent), in one round trip per node."""
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.get(key)
        return list(await pipe.execute())
