"""Which conversations must leave their sealed reasoning out, upstream by upstream
(docs/operations.md).

Reasoning items (Anthropic thinking signatures, Responses ``encrypted_content``) are sealed for
the account that produced them. Once a conversation has moved to another account, that upstream
refuses them (``sealed_reasoning``) and the request is resent without them. Every later turn
would be refused the same way — the history keeps those items — so the conversation is marked
for that upstream and its later requests there leave them out up front.

A mark lasts `SEALED_MARK_TTL_SECS` after it was last used (a conversation idle that long has
moved on) and at most `MAX_SEALED_MARKS` are kept, the least recently used going first, so the
store stays bounded whatever the traffic. Time is an argument; nothing here reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ("MAX_SEALED_MARKS", "SEALED_MARK_TTL_SECS", "SealedReasoning")

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

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, conversation: str, upstream: str, *, now: float) -> None:
        """`upstream` refused the conversation's sealed reasoning: leave it out from now on."""
        key = (conversation, upstream)
        self._marks[key] = now + self._ttl
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
