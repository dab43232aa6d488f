"""Conversations, turns and prompt-cache affinity.

Theory of operation
-------------------
*Identity.* A conversation is named by the client's session id (the first of
`SESSION_HEADERS` present, else the Responses ``prompt_cache_key``) together with a fingerprint
of how the conversation began: a SHA-256 over a canonical text of the system prompt and the
first user message (`fingerprint`). The pair keeps apart the sub-conversations one agent session
runs (Claude Code's sub-agents share the session header but start differently); a client that
sends no session id is recognised by the fingerprint alone. The caller extracts the texts from
the request; the same conversation yields the same texts on every turn, since earlier messages
are replayed unchanged.

*Turns.* A turn runs from a user message to the next one; tool results belong to the turn that
asked for them. Whether a request starts a turn follows from the last message the client sent
(`is_new_turn`). The routing decision made at a turn's start (rule, group, rewrites — opaque
here) holds for the turn's later requests (`turn_decision`), unless the input has grown close to
the smallest context window among the candidates: at `CONTEXT_FILL` (90%) of it the decision is
made again, so a rule that sends long inputs elsewhere gets its chance mid-turn.

*Stickiness.* The next request goes first to the upstream that last answered the conversation,
including one that took over after a failover (`sticky_upstream`):

* within a turn, always — the turn's requests share a growing prompt prefix;
* across turns only while that upstream's last answer read or wrote at least
  `CACHE_MIN_TOKENS` (1024) cached tokens less than `CACHE_TTL_SECS` (5 minutes) ago: that is
  when its prompt cache is still likely warm, and a miss elsewhere would cost more than the
  balance gained by moving;
* never to a paused upstream or one that is not among this request's candidates (another group,
  a rule that now routes elsewhere).

*Memory.* State is kept per conversation in a bounded LRU (`max_conversations`); a conversation
not seen for `ttl_secs` is forgotten. Nothing here reads a clock: every call takes ``now``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

__all__ = (
    "CACHE_MIN_TOKENS",
    "CACHE_TTL_SECS",
    "CONTEXT_FILL",
    "SESSION_HEADERS",
    "Affinity",
    "ConversationView",
    "MessageKind",
    "conversation_key",
    "fingerprint",
    "is_new_turn",
    "near_context_limit",
    "session_id",
)

# Header names that carry a client's session id, in the order they are consulted.
SESSION_HEADERS = (
    "x-claude-code-session-id",
    "session_id",
    "session-id",
    "conversation_id",
    "x-session-id",
    "thread-id",
)
# The names as a header's name may come (text or latin-1 bytes), lower-cased: `session_id`
# decodes only the headers it looks for.
_SESSION_NAMES = frozenset(SESSION_HEADERS) | {name.encode("latin-1") for name in SESSION_HEADERS}

CACHE_MIN_TOKENS = 1024
CACHE_TTL_SECS = 300.0
CONTEXT_FILL = 0.9

D = TypeVar("D")


class MessageKind(StrEnum):
    """What the last message of a request is, as far as turns are concerned."""

    USER = "user"  # a user message with something other than tool results
    TOOL_RESULT = "tool_result"  # a user message (or tool message) carrying only tool results
    ASSISTANT = "assistant"  # an assistant prefill
    SYSTEM = "system"  # a system/developer message inside the messages


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def session_id(
    headers: Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]],
    *,
    prompt_cache_key: str | None = None,
) -> str | None:
    """The client's session id: the first non-empty `SESSION_HEADERS` entry, else the
    Responses ``prompt_cache_key``. Header names compare case-insensitively."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key not in _SESSION_NAMES:
            continue  # most headers: nothing to decode
        key = _text(key)
        text = _text(value).strip()
        if text and key not in found:
            found[key] = text
    for name in SESSION_HEADERS:
        if name in found:
            return found[name]
    return prompt_cache_key or None


def fingerprint(system: str, first_user: str) -> str:
    """A stable digest of a conversation's beginning: its system prompt and first user message.

    The caller passes each as canonical text (parts joined in order, no volatile fields).
    Lengths are part of the digested text so that moving characters between the two fields
    changes the fingerprint.
    """
    canonical = f"system:{len(system)}:{system}\nuser:{len(first_user)}:{first_user}"
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def conversation_key(session: str | None, print_: str | None) -> str | None:
    """The conversation's key from a session id and a fingerprint (either may be missing)."""
    if session and print_:
        return f"s:{session}|f:{print_}"
    if session:
        return f"s:{session}"
    if print_:
        return f"f:{print_}"
    return None


def is_new_turn(last: MessageKind | str | None) -> bool:
    """Whether a request whose last message is of kind `last` starts a new turn.

    Tool results continue the turn that called the tools, and so does a system message that an
    agent appends mid-turn. A user message starts a turn; an assistant prefill follows one. No
    message at all is a turn of its own.
    """
    if last is None:
        return True
    return MessageKind(last) not in (MessageKind.TOOL_RESULT, MessageKind.SYSTEM)


def near_context_limit(
    input_tokens: int | None, context_windows: Iterable[int | None], *, fill: float = CONTEXT_FILL
) -> bool:
    """Whether the input reaches `fill` of the smallest known context window."""
    windows = [window for window in context_windows if window]
    if input_tokens is None or not windows:
        return False
    return input_tokens >= fill * min(windows)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationView(Generic[D]):
    """What is remembered of one conversation (for views and tests)."""

    key: str
    upstream: str | None
    decision: D | None
    turn_started_at: float | None
    answered_at: float | None
    cached_tokens: int
    seen_at: float


class _Conversation(Generic[D]):
    __slots__ = (
        "answered_at",
        "cached_tokens",
        "decision",
        "seen_at",
        "turn_started_at",
        "upstream",
    )

    def __init__(self, now: float) -> None:
        self.upstream: str | None = None
        self.decision: D | None = None
        self.turn_started_at: float | None = None
        self.answered_at: float | None = None
        self.cached_tokens = 0
        self.seen_at = now


class Affinity(Generic[D]):
    """Per-conversation memory: last upstream, the turn's decision, last cache use.

    `D` is the type of the routing decision the caller stores per turn.
    """

    __slots__ = (
        "_conversations",
        "cache_min_tokens",
        "cache_ttl_secs",
        "context_fill",
        "max_conversations",
        "ttl_secs",
    )

    def __init__(
        self,
        *,
        max_conversations: int = 10_000,
        ttl_secs: float = 3600.0,
        cache_min_tokens: int = CACHE_MIN_TOKENS,
        cache_ttl_secs: float = CACHE_TTL_SECS,
        context_fill: float = CONTEXT_FILL,
    ) -> None:
        if max_conversations < 1 or ttl_secs <= 0:
            raise ValueError("need max_conversations >= 1 and ttl_secs > 0")
        self.max_conversations = max_conversations
        self.ttl_secs = ttl_secs
        self.cache_min_tokens = cache_min_tokens
        self.cache_ttl_secs = cache_ttl_secs
        self.context_fill = context_fill
        self._conversations: OrderedDict[str, _Conversation[D]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._conversations)

    def _get(self, key: str, now: float) -> _Conversation[D] | None:
        conv = self._conversations.get(key)
        if conv is None:
            return None
        if now - conv.seen_at >= self.ttl_secs:
            del self._conversations[key]
            return None
        return conv

    def _touch(self, key: str, now: float) -> _Conversation[D]:
        conv = self._get(key, now)
        if conv is None:
            conv = self._conversations[key] = _Conversation(now)
            while len(self._conversations) > self.max_conversations:
                self._conversations.popitem(last=False)
        else:
            self._conversations.move_to_end(key)
            conv.seen_at = now
        return conv

    def get(self, key: str, now: float) -> ConversationView[D] | None:
        """What is remembered of conversation `key` (None: nothing, or forgotten)."""
        conv = self._get(key, now)
        if conv is None:
            return None
        return ConversationView(
            key=key,
            upstream=conv.upstream,
            decision=conv.decision,
            turn_started_at=conv.turn_started_at,
            answered_at=conv.answered_at,
            cached_tokens=conv.cached_tokens,
            seen_at=conv.seen_at,
        )

    def turn_decision(
        self,
        key: str,
        now: float,
        *,
        new_turn: bool,
        input_tokens: int | None = None,
        context_windows: Iterable[int | None] = (),
    ) -> D | None:
        """The decision to reuse for this request, or None to decide afresh (then call
        `begin_turn`): at a new turn, for an unknown conversation, or near the context limit."""
        if new_turn:
            return None
        conv = self._get(key, now)
        if conv is None or conv.decision is None:
            return None
        if near_context_limit(input_tokens, context_windows, fill=self.context_fill):
            return None
        return conv.decision

    def begin_turn(self, key: str, now: float, decision: D) -> None:
        """Remember the routing decision made at a turn's start (or remade within it)."""
        conv = self._touch(key, now)
        conv.decision = decision
        conv.turn_started_at = now

    def record_answer(self, key: str, now: float, *, upstream: str, cached_tokens: int) -> None:
        """The conversation got an answer from `upstream`, which read or wrote `cached_tokens`
        (cache reads plus cache writes) of prompt cache."""
        conv = self._touch(key, now)
        conv.upstream = upstream
        conv.answered_at = now
        conv.cached_tokens = max(0, cached_tokens)

    def sticky_upstream(
        self,
        key: str,
        now: float,
        candidates: Collection[str],
        paused: Collection[str],
        *,
        new_turn: bool,
    ) -> str | None:
        """The upstream this request should go to first, or None to choose freely."""
        return self.stickiness(key, now, candidates, paused, new_turn=new_turn)[0]

    def stickiness(
        self,
        key: str,
        now: float,
        candidates: Collection[str],
        paused: Collection[str],
        *,
        new_turn: bool,
    ) -> tuple[str | None, str | None, str | None]:
        """`sticky_upstream` with its reasons: the upstream to go to first (or None), the
        upstream that last answered the conversation (None: none yet), and why it is kept or
        not — ``same_turn``, ``cache_warm`` (kept); ``cache_cold``, ``paused``,
        ``not_a_candidate`` (not kept); None for a conversation with no upstream yet."""
        conv = self._get(key, now)
        if conv is None or conv.upstream is None:
            return None, None, None
        upstream = conv.upstream
        if upstream not in candidates:
            return None, upstream, "not_a_candidate"
        if upstream in paused:
            return None, upstream, "paused"
        if not new_turn:
            return upstream, upstream, "same_turn"
        if (
            conv.answered_at is not None
            and conv.cached_tokens >= self.cache_min_tokens
            and now - conv.answered_at < self.cache_ttl_secs
        ):
            return upstream, upstream, "cache_warm"
        return None, upstream, "cache_cold"

    def forget(self, key: str) -> None:
        self._conversations.pop(key, None)

    def prune(self, now: float) -> int:
        """Forget conversations idle for `ttl_secs`; returns how many went."""
        stale = [k for k, c in self._conversations.items() if now - c.seen_at >= self.ttl_secs]
        for key in stale:
            del self._conversations[key]
        return len(stale)
