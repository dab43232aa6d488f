"""What each upstream gets of a request's reasoning, and the two memories that change it
(docs/operations.md, "What goes upstream").

Two memories of the process change what a request sends before it goes, and learn from how it
went. `ReasoningMemory.prepare` applies both to a request's destinations (`twengine.destinations`);
`ReasoningMemory.settle` records what its attempts showed (their `AttemptRecord`s and the level each
refused effort was resent with). Both are pure: time is an argument, and what is kept across
restarts goes through `EffortMemory.to_json` / `from_json` (twserve keeps the file).

*The effort memory.* When an upstream refuses a reasoning effort level, the request is resent
once with a level it accepts (`twengine.attempt.requests`). After that resend succeeds the
choice is remembered per (upstream, model, client format, level asked) for
`EFFORT_MEMORY_TTL_SECS` (7 days), so later requests send the accepted level up front
(`Efforts.apply`) instead of paying for a refusal each time. An entry belongs to the upstream as
it was when the choice was made: its `identity` is a digest of the upstream's address, protocol
and key (`upstream_identity`; the key itself is never stored). When the upstream is removed from
the config, or its address, key or protocol changes, its entries are dropped (`Efforts.use`,
`EffortMemory.keep_only`): another endpoint may accept other levels. A file that does not
parse, or entries of the wrong shape, are skipped, never fatal — the memory is an optimisation.

*The sealed-reasoning memory.* Reasoning items (Anthropic thinking signatures, Responses
``encrypted_content``) are sealed for the account that produced them. Once a conversation has
moved to another account, that upstream refuses them (``sealed_reasoning``) and the request is
resent without them. Every later turn would be refused the same way — the history keeps those
items — so the conversation is marked for that upstream (`SealedReasoning`) and its later
requests there leave them out up front. A mark lasts `SEALED_MARK_TTL_SECS` after it was last
used (a conversation idle that long has moved on) and at most `MAX_SEALED_MARKS` are kept, the
least recently used going first, so the store stays bounded whatever the traffic.

*Shared.* Both memories tell their listeners what they learned (`Efforts.learned`,
`SealedReasoning.listeners`) and take what another instance learned (`EffortMemory.take`,
`SealedReasoning.take`); twserve.shared.memory carries both through Redis.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from twengine.attempt.actions import AttemptRecord, Outcome, ResendReason
from twengine.config.credentials import CredentialFault, resolve_credentials
from twengine.config.model import Config
from twengine.destinations import Destination
from twproto import Dialect
from twproto.effort import requested_effort, sets_only_budget
from twproto.ir import ReasoningLevel

__all__ = (
    "EFFORT_MEMORY_TTL_SECS",
    "MAX_SEALED_MARKS",
    "SEALED_MARK_TTL_SECS",
    "EffortChoice",
    "EffortKey",
    "EffortMemory",
    "Efforts",
    "ReasoningMemory",
    "ReasoningPlan",
    "SealedReasoning",
    "upstream_identities",
    "upstream_identity",
)

EFFORT_MEMORY_TTL_SECS = 7 * 24 * 3600.0
_VERSION = 1


# --- the effort memory --------------------------------------------------------------------------


def upstream_identity(base_url: str, protocol: str, key: str) -> str:
    """A digest of what makes an upstream the same endpoint; the key is not recoverable."""
    raw = "\0".join((base_url.rstrip("/"), protocol, key)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class EffortKey:
    """What a choice is remembered for: `level` asked of `model` at `upstream`, by a client of
    `client_format`."""

    upstream: str
    model: str
    client_format: str
    level: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EffortChoice:
    """The level sent instead (``off``: without an effort), until `expires_at`."""

    sent: str
    expires_at: float
    identity: str


class EffortMemory:
    """The remembered choices (see the module docstring)."""

    def __init__(self, entries: Mapping[EffortKey, EffortChoice] | None = None) -> None:
        self._entries: dict[EffortKey, EffortChoice] = dict(entries or {})

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, key: EffortKey, *, now: float, identity: str) -> str | None:
        """The level to send instead of `key.level`, or None (nothing remembered, expired, or
        remembered for another identity of the upstream)."""
        choice = self._entries.get(key)
        if choice is None:
            return None
        if choice.expires_at <= now or choice.identity != identity:
            del self._entries[key]
            return None
        return choice.sent

    def remember(self, key: EffortKey, sent: str, *, now: float, identity: str) -> bool:
        """Remember `sent` for `key` for `EFFORT_MEMORY_TTL_SECS`; whether anything changed (so
        the caller knows to persist)."""
        choice = EffortChoice(sent=sent, expires_at=now + EFFORT_MEMORY_TTL_SECS, identity=identity)
        before = self._entries.get(key)
        self._entries[key] = choice
        return before is None or before.sent != sent or before.identity != identity

    def get(self, key: EffortKey) -> EffortChoice | None:
        """The choice kept for `key` (expired or not), or None."""
        return self._entries.get(key)

    def items(self) -> list[tuple[EffortKey, EffortChoice]]:
        """Every choice kept, with its key."""
        return list(self._entries.items())

    def take(self, key: EffortKey, choice: EffortChoice, *, now: float) -> bool:
        """Adopt `choice`, made elsewhere (another instance sharing the memory), unless it has
        expired or the one kept is the same or lasts longer; whether anything changed."""
        before = self._entries.get(key)
        if choice.expires_at <= now or before == choice:
            return False
        if before is not None and before.expires_at > choice.expires_at:
            return False
        self._entries[key] = choice
        return True

    def keep_only(self, identities: Mapping[str, str]) -> bool:
        """Drop entries of upstreams not in `identities` (name → identity) or whose identity
        changed; whether any was dropped."""
        stale = [
            key
            for key, choice in self._entries.items()
            if identities.get(key.upstream) != choice.identity
        ]
        for key in stale:
            del self._entries[key]
        return bool(stale)

    def expire(self, now: float) -> bool:
        """Drop expired entries; whether any was dropped."""
        old = [key for key, choice in self._entries.items() if choice.expires_at <= now]
        for key in old:
            del self._entries[key]
        return bool(old)

    def to_json(self) -> dict[str, Any]:
        """The memory as JSON-ready data, for ``effort-memory.json``."""
        return {
            "version": _VERSION,
            "entries": [
                {
                    "upstream": key.upstream,
                    "model": key.model,
                    "client_format": key.client_format,
                    "level": key.level,
                    "sent": choice.sent,
                    "expires_at": choice.expires_at,
                    "identity": choice.identity,
                }
                for key, choice in sorted(
                    self._entries.items(),
                    key=lambda kv: (kv[0].upstream, kv[0].model, kv[0].client_format, kv[0].level),
                )
            ],
        }

    @classmethod
    def from_json(cls, data: object, *, now: float) -> EffortMemory:
        """A memory from `to_json` data; malformed and expired entries are skipped."""
        entries: dict[EffortKey, EffortChoice] = {}
        items = data.get("entries") if isinstance(data, Mapping) else None
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, Mapping):
                continue
            texts = [item.get(f) for f in ("upstream", "model", "client_format", "level", "sent")]
            identity, expires = item.get("identity"), item.get("expires_at")
            if not all(isinstance(t, str) and t for t in texts) or not isinstance(identity, str):
                continue
            if isinstance(expires, bool) or not isinstance(expires, int | float):
                continue
            if expires <= now:
                continue
            upstream, model, client_format, level, sent = (str(t) for t in texts)
            key = EffortKey(
                upstream=upstream, model=model, client_format=client_format, level=level
            )
            entries[key] = EffortChoice(sent=sent, expires_at=float(expires), identity=identity)
        return cls(entries)


# --- the sealed-reasoning memory ------------------------------------------------------------------


SEALED_MARK_TTL_SECS = 24 * 3600.0
MAX_SEALED_MARKS = 100_000


class SealedReasoning:
    """Marks of (conversation, upstream) pairs whose sealed reasoning is left out."""

    def __init__(
        self, *, ttl_secs: float = SEALED_MARK_TTL_SECS, max_marks: int = MAX_SEALED_MARKS
    ) -> None:
        self._ttl = ttl_secs
        self._max = max_marks
        self._marks: OrderedDict[tuple[str, str], float] = OrderedDict()
        # Told (conversation, upstream, lifetime in seconds) of every mark made here, to share.
        self.listeners: list[Callable[[str, str, float], None]] = []

    @property
    def ttl_secs(self) -> float:
        return self._ttl

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, conversation: str, upstream: str, *, now: float) -> None:
        """`upstream` refused the conversation's sealed reasoning: leave it out from now on."""
        self._put((conversation, upstream), now + self._ttl)
        for listener in self.listeners:
            listener(conversation, upstream, self._ttl)

    def take(self, conversation: str, upstream: str, *, now: float, until: float) -> bool:
        """Adopt a mark made elsewhere (another instance), lasting until `until` on this
        clock; whether it was new or longer than the one kept."""
        key = (conversation, upstream)
        current = self._marks.get(key)
        if until <= now or (current is not None and current >= until):
            return False
        self._put(key, until)
        return True

    def _put(self, key: tuple[str, str], until: float) -> None:
        self._marks[key] = until
        self._marks.move_to_end(key)
        while len(self._marks) > self._max:
            self._marks.popitem(last=False)

    def leave_out(self, conversation: str, upstream: str, *, now: float) -> bool:
        """Whether requests of `conversation` to `upstream` go without sealed reasoning."""
        key = (conversation, upstream)
        until = self._marks.get(key)
        if until is None:
            return False
        if until <= now:
            del self._marks[key]
            return False
        self._marks[key] = now + self._ttl
        self._marks.move_to_end(key)
        return True


# --- the memories applied to a request ---------------------------------------------------------


def upstream_identities(config: Config, env: Mapping[str, str]) -> dict[str, str]:
    """Each configured upstream's `upstream_identity` (name → identity), its key read from
    `env` (the configured text where it does not resolve)."""
    out = {}
    for p in config.providers:
        creds = resolve_credentials(p, env)
        key = creds.key if not isinstance(creds, CredentialFault) else (p.key or "")
        out[p.name] = upstream_identity(p.base_url, p.protocol.value, key)
    return out


# The levels this gateway sends: a remembered level must be one of them.
_LEVELS = frozenset(ReasoningLevel)


def _identity(dest: Destination) -> str:
    target = dest.target
    return upstream_identity(target.base_url, target.dialect.value, target.key)


class Efforts:
    """The effort memory, for a request's destinations: `apply` puts remembered levels in up
    front and returns each one's effort view for the request row; `remember` keeps the level a
    resend succeeded with. Both say when the memory changed, for the caller to persist."""

    __slots__ = ("learned", "memory")

    def __init__(self, memory: EffortMemory | None = None) -> None:
        self.memory = memory if memory is not None else EffortMemory()
        # Told every choice `remember` made or changed, to share (other instances).
        self.learned: list[Callable[[EffortKey, EffortChoice], None]] = []

    def use(self, memory: EffortMemory, identities: Mapping[str, str]) -> bool:
        """Take `memory`, dropping the choices of upstreams removed or changed (address, key,
        protocol) since they were made (`identities`: `upstream_identities` of the config in
        force); whether any was dropped."""
        self.memory = memory
        return memory.keep_only(identities)

    def apply(
        self,
        destinations: Sequence[Destination],
        body: Mapping[str, Any],
        dialect: Dialect,
        *,
        now: float,
    ) -> tuple[list[Destination], dict[str, dict[str, Any]]]:
        """`destinations` with remembered levels put in up front (`now`: the wall clock, which
        the entries' expiry is on), and each one's effort view (``{asked, sent, reason:
        rule|remembered}``) for the request row."""
        client_level = None if sets_only_budget(body, dialect) else requested_effort(body, dialect)
        out: list[Destination] = []
        efforts: dict[str, dict[str, Any]] = {}
        for dest in destinations:
            asked = (
                dest.reasoning.value
                if dest.reasoning is not None
                else (client_level.value if client_level else None)
            )
            sent: ReasoningLevel | None = None
            if asked is not None and asked != "off":
                key = EffortKey(
                    upstream=dest.name,
                    model=dest.target.model,
                    client_format=dialect.value,
                    level=asked,
                )
                found = self.memory.recall(key, now=now, identity=_identity(dest))
                # A hand-edited file may hold anything: only a level this gateway sends counts.
                if found is not None and found in _LEVELS:
                    sent = ReasoningLevel(found)
            if sent is not None:
                dest = replace(dest, reasoning=sent)
                efforts[dest.name] = {"asked": asked, "sent": sent.value, "reason": "remembered"}
            elif dest.reasoning is not None:
                efforts[dest.name] = {
                    "asked": asked,
                    "sent": dest.reasoning.value,
                    "reason": "rule",
                }
            elif asked is not None:
                # Unchanged (no view on the row) unless the upstream refuses it.
                efforts[dest.name] = {"asked": asked, "sent": asked, "reason": None}
            out.append(dest)
        return out, efforts

    def remember(
        self,
        attempts: Sequence[AttemptRecord],
        resent: Mapping[str, str],
        destinations: Sequence[Destination],
        efforts: Mapping[str, Mapping[str, Any]],
        body: Mapping[str, Any],
        dialect: Dialect,
        *,
        now: float,
    ) -> bool:
        """After a resend with an accepted level succeeded, remember that level: `attempts` are
        the request's records, `resent` the level each upstream's refused effort was resent
        with (``off``: without one), `efforts` the views `apply` gave. Whether the memory
        changed."""
        ok = {
            a.provider
            for a in attempts
            if a.outcome is Outcome.OK and a.resend is ResendReason.EFFORT_REFUSED
        }
        if not ok:
            return False
        client_level = requested_effort(body, dialect)
        changed = False
        for dest in destinations:
            sent = resent.get(dest.name)
            if sent is None or dest.name not in ok:
                continue
            asked = efforts.get(dest.name, {}).get("asked") or (
                dest.reasoning.value if dest.reasoning is not None else None
            )
            asked = asked or (client_level.value if client_level else None)
            if asked is None:
                continue
            key = EffortKey(
                upstream=dest.name,
                model=dest.target.model,
                client_format=dialect.value,
                level=asked,
            )
            if self.memory.remember(key, sent, now=now, identity=_identity(dest)):
                changed = True
                choice = self.memory.get(key)
                if choice is not None:
                    for listener in self.learned:
                        listener(key, choice)
        return changed


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningPlan:
    """One request's destinations as `ReasoningMemory.prepare` left them, with what `settle`
    needs."""

    destinations: list[Destination]
    # Per upstream: ``{asked, sent, reason}`` of its reasoning level, for the request row.
    efforts: dict[str, dict[str, Any]]
    body: Mapping[str, Any]
    dialect: Dialect
    conversation: str | None
    counting: bool


class ReasoningMemory:
    """The effort memory and the sealed-reasoning memory, applied to a gateway's requests."""

    __slots__ = ("efforts", "sealed")

    def __init__(
        self, efforts: Efforts | None = None, sealed: SealedReasoning | None = None
    ) -> None:
        self.efforts = efforts if efforts is not None else Efforts()
        self.sealed = sealed if sealed is not None else SealedReasoning()

    def use(self, memory: EffortMemory, config: Config, env: Mapping[str, str]) -> bool:
        """Take the effort memory `memory` (as kept across restarts), dropping the choices of
        upstreams `config` no longer has or whose address, key or protocol changed since (keys
        read from `env`); whether any was dropped (for the caller to persist)."""
        return self.efforts.use(memory, upstream_identities(config, env))

    def prepare(
        self,
        destinations: Sequence[Destination],
        body: Mapping[str, Any],
        dialect: Dialect,
        conversation: str | None,
        *,
        counting: bool,
        now: float,
        wall: float,
    ) -> ReasoningPlan:
        """Remembered levels put in up front (a token count sends no level), and sealed
        reasoning left out for the upstreams that refused this conversation's before. `now` is
        the clock the sealed marks are on; `wall` the wall clock of the effort memory."""
        efforts: dict[str, dict[str, Any]] = {}
        chosen = list(destinations)
        if not counting:
            chosen, efforts = self.efforts.apply(chosen, body, dialect, now=wall)
        if conversation is not None:
            chosen = [
                replace(d, drop_sealed=True)
                if self.sealed.leave_out(conversation, d.name, now=now)
                else d
                for d in chosen
            ]
        return ReasoningPlan(
            destinations=chosen,
            efforts=efforts,
            body=body,
            dialect=dialect,
            conversation=conversation,
            counting=counting,
        )

    def settle(
        self,
        plan: ReasoningPlan,
        attempts: Sequence[AttemptRecord],
        resent: Mapping[str, str],
        *,
        finished: bool,
        now: float,
        wall: float,
    ) -> bool:
        """Remember the level a resend succeeded with (a request that ran to its end,
        `finished`), and the upstreams that refused the conversation's sealed reasoning:
        `attempts` are the request's records, `resent` the level each refused effort was resent
        with. Whether the effort memory changed (for the caller to persist)."""
        changed = False
        if finished and not plan.counting:
            changed = self.efforts.remember(
                attempts,
                resent,
                plan.destinations,
                plan.efforts,
                plan.body,
                plan.dialect,
                now=wall,
            )
        if plan.conversation is not None:
            for a in attempts:
                if a.resend is ResendReason.SEALED_REASONING:
                    self.sealed.mark(plan.conversation, a.provider, now=now)
        return changed
