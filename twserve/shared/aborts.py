"""Aborting a request that runs on another instance (``POST /requests/{id}/abort``).

A request runs on the instance that accepted it; an abort may reach any instance's control
listener. When the id does not run there, that instance asks the others on the announcements
channel (``<prefix>db<N>:events``, the one pauses and affinity travel on,
`twserve.shared.router`): ``{"kind": "abort", "id", "reason", "reply"}``. The instance running
the request aborts it as its own control plane would (`twserve.relay.abort`), publishes its
`RequestAborted`, and writes where the request was under ``<prefix>abort:<reply>`` (kept 30 s);
an instance that is ending the request answers ``""`` (finished). The asking instance reads the
reply key until ``ANSWER_WAIT_SECS``; no answer means no instance runs the request (its control
plane then looks in the store). With Redis lost, or no other instance subscribed, it does not
wait at all.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from twproto import json_dumps, json_loads
from twserve.relay.abort import Aborts, abort_error
from twserve.shared.redis import RedisDown, RedisState

__all__ = ["ANSWER_WAIT_SECS", "SharedAborts"]

log = logging.getLogger("twserve.shared")

#: How long an instance waits for the one that runs the request to answer.
ANSWER_WAIT_SECS = 1.0
_POLL_SECS = 0.02
_REPLY_MS = 30_000


class SharedAborts:
    """Aborts asked of and answered for the other instances (see the module docs)."""

    def __init__(self, state: RedisState, aborts: Aborts, *, instance: str) -> None:
        self.state = state
        self.aborts = aborts
        self.instance = instance
        self.channel = state.channel("events")
        # Told of each request aborted here for another instance: (id, stage, reason).
        self.on_aborted: Callable[[str, str, str | None], None] | None = None

    def heard(self, note: dict[str, Any]) -> None:
        """Another instance's ``abort`` announcement (`twserve.shared.router` hands it here)."""
        request_id, token = str(note["id"]), str(note["reply"])
        reason = note.get("reason")
        reason = reason if isinstance(reason, str) else None
        stage = self.aborts.abort(request_id, abort_error(reason))
        if stage is None:
            return  # not running here
        if stage and self.on_aborted is not None:
            self.on_aborted(request_id, stage, reason)
        answer = json_dumps({"stage": stage, "from": self.instance})
        key = self.state.key("abort", token)

        async def reply(client: Any) -> None:
            await client.set(key, answer, px=_REPLY_MS)

        self.state.later(reply)

    async def abort_elsewhere(self, request_id: str, reason: str | None) -> str | None:
        """Ask the other instances to abort `request_id`: where it was (``relay``,
        ``key_wait``), ``""`` when the one running it is ending it, None when none answered."""
        state = self.state
        token = uuid.uuid4().hex
        note = json_dumps(
            {
                "kind": "abort",
                "from": self.instance,
                "id": request_id,
                "reason": reason,
                "reply": token,
            }
        )
        key = state.key("abort", token)
        try:
            listening = await state.call(lambda client: client.publish(self.channel, note))
            if int(listening) <= 1:  # this instance alone hears the channel
                return None
            with anyio.move_on_after(ANSWER_WAIT_SECS):
                while True:
                    value = await state.call(lambda client: client.get(key))
                    if value is not None:
                        return str(json_loads(value)["stage"])
                    await anyio.sleep(_POLL_SECS)
        except RedisDown:
            return None
        except (ValueError, KeyError, TypeError):
            log.info("shared state: ignored a malformed abort answer")
        return None
