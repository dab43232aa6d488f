"""The effort memory and the sealed-reasoning marks shared by every instance.

Both memories are twengine's (`twengine.reasoning`); this module tells the other instances what
this one learned and takes what they learned, through the same channel and read-back as pauses
and affinity (`twserve.shared.router`).

*Efforts.* A level an upstream accepted after refusing the one asked
(`Efforts.learned`) is written to ``<prefix>effort:<upstream>:<model>:<format>:<level>`` (each
part percent-encoded, so a ``:`` in a model name cannot make two keys one) with the entry's own
expiry — 7 days after it was learned — and announced. The others adopt it
(`EffortMemory.take`) and save it in their own ``effort-memory.json``, so their very next request
with that level sends the accepted one up front. An entry carries the identity (a digest of
address, protocol and key) of the upstream it was learned on: an instance whose upstream of that
name differs keeps it but never uses it, as with its own file.

*Sealed-reasoning marks.* A conversation whose sealed reasoning an upstream refused
(`SealedReasoning.listeners`) is written to ``<prefix>sealed:<conversation>:<upstream>`` for
the mark's lifetime (24 hours) and announced; the others mark it too, so the conversation's next
turn leaves the sealed items out whichever instance it reaches. A mark's lifetime is renewed by
use on each instance on its own; the key in Redis lasts from the last refusal.

On (re)connecting, each instance reads the keys back (after subscribing), and writes the
efforts it holds that Redis does not (learned while Redis was away, or from its file at start):
``SET NX``, never replacing what another instance wrote, and announces those it wrote. While
Redis is away each instance learns alone: efforts in its file, marks in its memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from redis.asyncio import Redis

from twengine.reasoning import EffortChoice, EffortKey, ReasoningMemory
from twproto import json_dumps
from twserve.shared.redis import RedisState
from twserve.shared.router import RESYNC_CONVERSATIONS, SharedRouter, get_each

__all__ = ["SharedMemory"]

# Keys per MGET when reading back.
_BATCH = 500


def _part(text: str) -> str:
    return quote(text, safe="")


class SharedMemory:
    """Announces this instance's efforts and sealed marks, and takes the others' (module docs)."""

    def __init__(
        self,
        state: RedisState,
        router: SharedRouter,
        reasoning: ReasoningMemory,
        *,
        instance: str,
        wall: Callable[[], float],
        clock: Callable[[], float],
        on_efforts_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.state = state
        self.reasoning = reasoning
        self.instance = instance
        self.wall = wall
        self.clock = clock
        self.on_efforts_changed = on_efforts_changed
        self.router = router
        self.channel = router.channel
        reasoning.efforts.learned.append(self.learned)
        reasoning.sealed.listeners.append(self.marked)
        router.handlers["effort"] = self.take_effort
        router.handlers["sealed"] = self.take_sealed
        router.resyncs.append(self.resync)

    def effort_key(self, key: EffortKey) -> str:
        parts = (key.upstream, key.model, key.client_format, key.level)
        return self.state.key("effort", *(_part(p) for p in parts))

    def sealed_key(self, conversation: str, upstream: str) -> str:
        return self.state.key("sealed", _part(conversation), _part(upstream))

    # -- what this instance tells -----------------------------------------------------------

    def _effort_note(self, key: EffortKey, choice: EffortChoice) -> dict[str, Any]:
        return {
            "kind": "effort",
            "from": self.instance,
            "upstream": key.upstream,
            "model": key.model,
            "client_format": key.client_format,
            "level": key.level,
            "sent": choice.sent,
            "expires_at": choice.expires_at,
            "identity": choice.identity,
        }

    def learned(self, key: EffortKey, choice: EffortChoice) -> None:
        """An `Efforts.learned` listener: keep the choice in Redis and announce it."""
        life_ms = int((choice.expires_at - self.wall()) * 1000)
        if life_ms <= 0:
            return
        text = json_dumps(self._effort_note(key, choice))
        name = self.effort_key(key)

        async def tell(client: Redis) -> None:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(name, text, px=life_ms)
                pipe.publish(self.channel, text)
                await pipe.execute()

        self.state.later(tell)

    def marked(self, conversation: str, upstream: str, ttl_secs: float) -> None:
        """A `SealedReasoning` listener: keep the mark in Redis and announce it."""
        note = {
            "kind": "sealed",
            "from": self.instance,
            "conversation": conversation,
            "upstream": upstream,
            "until": self.wall() + ttl_secs,
        }
        text = json_dumps(note)
        name = self.sealed_key(conversation, upstream)
        life_ms = max(1, int(ttl_secs * 1000))

        async def tell(client: Redis) -> None:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(name, text, px=life_ms)
                pipe.publish(self.channel, text)
                await pipe.execute()

        self.state.later(tell)

    # -- what the others tell ---------------------------------------------------------------

    def take_effort(self, note: dict[str, Any]) -> None:
        """An ``effort`` announcement (or a key read back): adopt the choice and save it."""
        key = EffortKey(
            upstream=str(note["upstream"]),
            model=str(note["model"]),
            client_format=str(note["client_format"]),
            level=str(note["level"]),
        )
        choice = EffortChoice(
            sent=str(note["sent"]),
            expires_at=float(note["expires_at"]),
            identity=str(note["identity"]),
        )
        if self.reasoning.efforts.memory.take(key, choice, now=self.wall()):
            self.on_efforts_changed()

    def take_sealed(self, note: dict[str, Any]) -> None:
        """A ``sealed`` announcement (or a key read back): mark the conversation here too."""
        now = self.clock()
        until = now + (float(note["until"]) - self.wall())
        self.reasoning.sealed.take(
            str(note["conversation"]), str(note["upstream"]), now=now, until=until
        )

    async def _read_back(
        self, client: Redis, pattern: str, heard: Callable[[bytes | str], None]
    ) -> None:
        keys: list[bytes] = []
        async for key in client.scan_iter(match=pattern, count=1000):
            keys.append(key)
            if len(keys) >= RESYNC_CONVERSATIONS:
                break
        for start in range(0, len(keys), _BATCH):
            for value in await get_each(client, keys[start : start + _BATCH]):
                if value is not None:
                    heard(value)

    async def resync(self, client: Redis) -> None:
        """Read the efforts and marks kept in Redis; write the efforts only this one holds."""
        await self._read_back(client, self.state.key("effort", "*"), self.router.heard)
        await self._read_back(client, self.state.key("sealed", "*"), self.router.heard)
        now = self.wall()
        mine = [(k, c) for k, c in self.reasoning.efforts.memory.items() if c.expires_at > now]
        for start in range(0, len(mine), _BATCH):
            notes = [json_dumps(self._effort_note(k, c)) for k, c in mine[start : start + _BATCH]]
            async with client.pipeline(transaction=False) as pipe:
                for (key, choice), note in zip(mine[start : start + _BATCH], notes, strict=True):
                    life_ms = int((choice.expires_at - now) * 1000)
                    pipe.set(self.effort_key(key), note, px=life_ms, nx=True)
                written = await pipe.execute()
            # Announced too: the others may have read back before these were written.
            new = [note for note, done in zip(notes, written, strict=True) if done]
            if new:
                async with client.pipeline(transaction=False) as pipe:
                    for note in new:
                        pipe.publish(self.channel, note)
                    await pipe.execute()
