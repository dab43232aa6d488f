"""Effort memory: the reasoning level an upstream accepted in place of the one it refused.

When an upstream refuses a reasoning effort level, the request is resent once with a level it
accepts (docs/operations.md). After that resend succeeds the choice is remembered per
(upstream, model, client format, level asked) for `EFFORT_MEMORY_TTL_SECS` (7 days), so later
requests send the accepted level up front instead of paying for a refusal each time.

An entry belongs to the upstream as it was when the choice was made: its `identity` is a digest
of the upstream's address, protocol and key (`upstream_identity`; the key itself is never
stored). When the upstream is removed from the config, or its address, key or protocol changes,
its entries are dropped (`keep_only`): another endpoint may accept other levels.

The store is pure: time is an argument, and twserve persists it as ``effort-memory.json`` in the
data directory through `to_json` / `from_json`. A file that does not parse, or entries of the
wrong shape, are skipped, never fatal — the memory is an optimisation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = (
    "EFFORT_MEMORY_TTL_SECS",
    "EffortChoice",
    "EffortKey",
    "EffortMemory",
    "upstream_identity",
)

EFFORT_MEMORY_TTL_SECS = 7 * 24 * 3600.0
_VERSION = 1


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
