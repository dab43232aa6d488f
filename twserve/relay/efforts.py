"""Reasoning levels upstreams accepted in place of refused ones, and what a request's row says
of them (docs/operations.md, "What goes upstream").

`Efforts` holds the process's `twengine.effort_memory.EffortMemory`: `apply` puts remembered
levels into a request's destinations up front and returns each one's effort view for the row;
`remember` keeps the level a resend succeeded with. The app loads and persists the memory
(effort-memory.json) through `changed`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from twengine.attempt import Outcome, ResendReason
from twengine.config import Config
from twengine.config.credentials import CredentialFault, resolve_credentials
from twengine.destinations import Destination
from twengine.effort_memory import EffortKey, EffortMemory, upstream_identity
from twproto.dialect import Dialect
from twproto.effort import requested_effort, sets_only_budget
from twproto.ir import ReasoningLevel
from twserve.relay.client import RelayOutcome

__all__ = ["Efforts"]


class Efforts:
    """The effort memory of the process, for the gateway's requests."""

    def __init__(
        self,
        config: Callable[[], Config],
        env: Mapping[str, str],
        wall: Callable[[], float],
    ) -> None:
        self.config = config
        self.env = env
        self.wall = wall
        self.memory = EffortMemory()
        self.changed: Callable[[], None] | None = None

    def _identities(self) -> dict[str, str]:
        out = {}
        for p in self.config().providers:
            creds = resolve_credentials(p, self.env)
            key = creds.key if not isinstance(creds, CredentialFault) else (p.key or "")
            out[p.name] = upstream_identity(p.base_url, p.protocol.value, key)
        return out

    def use(self, memory: EffortMemory) -> None:
        """Take `memory`, dropping the choices of upstreams removed or changed (address, key,
        protocol) since they were made."""
        self.memory = memory
        if memory.keep_only(self._identities()):
            self._changed()

    def _changed(self) -> None:
        if self.changed is not None:
            self.changed()

    def apply(
        self, candidates: list[Destination], body: dict[str, Any], dialect: Dialect
    ) -> tuple[list[Destination], dict[str, dict[str, Any]]]:
        """Candidates with remembered levels put in up front, and each one's effort view
        (``{asked, sent, reason: rule|remembered}``) for the request row."""
        client_level = None if sets_only_budget(body, dialect) else requested_effort(body, dialect)
        out: list[Destination] = []
        efforts: dict[str, dict[str, Any]] = {}
        for cand in candidates:
            asked = (
                cand.reasoning.value
                if cand.reasoning is not None
                else (client_level.value if client_level else None)
            )
            sent: ReasoningLevel | None = None
            if asked is not None and asked != "off":
                key = EffortKey(
                    upstream=cand.name,
                    model=cand.target.model,
                    client_format=dialect.value,
                    level=asked,
                )
                identity = upstream_identity(
                    cand.target.base_url, cand.target.dialect.value, cand.target.key
                )
                found = self.memory.recall(key, now=self.wall(), identity=identity)
                # A hand-edited file may hold anything: only a level this gateway sends counts.
                if found is not None and found in set(ReasoningLevel):
                    sent = ReasoningLevel(found)
            if sent is not None:
                cand = replace(cand, reasoning=sent)
                efforts[cand.name] = {"asked": asked, "sent": sent.value, "reason": "remembered"}
            elif cand.reasoning is not None:
                efforts[cand.name] = {
                    "asked": asked,
                    "sent": cand.reasoning.value,
                    "reason": "rule",
                }
            elif asked is not None:
                # Unchanged (no view on the row) unless the upstream refuses it.
                efforts[cand.name] = {"asked": asked, "sent": asked, "reason": None}
            out.append(cand)
        return out, efforts

    def remember(
        self,
        outcome: RelayOutcome,
        candidates: list[Destination],
        efforts: dict[str, dict[str, Any]],
        body: dict[str, Any],
        dialect: Dialect,
    ) -> None:
        """After a resend with an accepted level succeeded, remember that level."""
        ok = {
            a.provider
            for a in outcome.attempts
            if a.outcome is Outcome.OK and a.resend is ResendReason.EFFORT_REFUSED
        }
        client_level = requested_effort(body, dialect)
        changed = False
        for cand in candidates:
            sent = outcome.effort_resent.get(cand.name)
            if sent is None or cand.name not in ok:
                continue
            asked = efforts.get(cand.name, {}).get("asked") or (
                cand.reasoning.value if cand.reasoning is not None else None
            )
            asked = asked or (client_level.value if client_level else None)
            if asked is None:
                continue
            key = EffortKey(
                upstream=cand.name,
                model=cand.target.model,
                client_format=dialect.value,
                level=asked,
            )
            identity = upstream_identity(
                cand.target.base_url, cand.target.dialect.value, cand.target.key
            )
            changed |= self.memory.remember(key, sent, now=self.wall(), identity=identity)
        if changed:
            self._changed()
