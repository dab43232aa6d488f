"""What each attempt sends upstream: the client's request written for its destination, and
written again after a refusal the attempt machine answers with a `Resend`.

The client's body is parsed once, by admission (`twengine.admission.Routed.body`); that dict is
read here, never changed, for every upstream. `AttemptRequests.build` translates it once per
upstream (`twproto.translate_request`; a same-format request goes out as the client's own
bytes) and keeps the translation for the next attempt there, builds the `UpstreamRequest`, and
for a streamed call the opening hold that reads its answer (`twproto.UpstreamStream`).

A `Resend` names why the upstream refused (`ResendReason`), and `rewrite` decides what the
next request there leaves out (docs/operations.md, "What goes upstream"):

* ``sealed_reasoning``: the reasoning items sealed for another account;
* ``effort_refused``: the effort level — resent with the level the refusal's message accepts
  (`twproto.level_after_refusal`), or without one;
* ``prefill_refused``: a resumed answer's trailing assistant message, asked for with an
  instruction instead (docs/failover.md, "Resuming a broken stream").

A rewrite holds for the rest of the request; a continuation is always written afresh.

A client Responses socket's turn that names an earlier response (``previous_response_id``)
reaches the gateway expanded: the kept conversation in front of its new input
(docs/conversion.md, "Responses state"). `TurnAsSent` is the same turn as the client sent it;
an attempt over an upstream's own socket that holds that response is built from it
(``build(..., as_sent=...)``; the shell knows which socket holds what), every other attempt
from the expanded body. Both translations are kept, each for its own next attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twengine.attempt.actions import ResendReason
from twengine.destinations import Destination, reasoning_level
from twproto import (
    ClientCall,
    TranslatedRequest,
    UpstreamRequest,
    UpstreamStream,
    json_loads,
    translate_request,
    upstream_request,
)
from twproto.effort import level_after_refusal, parse_effort, requested_effort
from twproto.ir import Effort, ReasoningLevel
from twproto.stream import ResumableStream
from twproto.translate import DEFAULT_MAX_TOKENS

__all__ = ("AttemptRequests", "TurnAsSent")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnAsSent:
    """A Responses turn as its client sent it: `body` (its bytes) and `parsed` (the same
    object) carry only the new input and ``previous_response_id`` `previous`, which the
    gateway expanded for every upstream that does not hold that response itself."""

    body: bytes
    parsed: dict[str, Any]
    previous: str


class AttemptRequests:
    """Each attempt's upstream request: the client's body translated once per upstream (again
    after a `rewrite` for a resend), the request built for it, and for a stream its opening.

    `body` is the client's bytes and `parsed` the same body as admission parsed it (None:
    parsed here, once, when first needed). `resume`: a stream is read so that another upstream
    may continue it (`twproto.ResumableStream`)."""

    __slots__ = (
        "_as_sent",
        "_parsed",
        "body",
        "call",
        "dropped",
        "effort_after",
        "model",
        "resume",
        "rewrites",
        "translated",
    )

    def __init__(
        self,
        call: ClientCall,
        body: bytes,
        model: str,
        parsed: dict[str, Any] | None = None,
        resume: bool = False,
    ) -> None:
        self.resume = resume
        self.call = call
        self.body = body
        self._parsed = parsed
        self.model = model
        self.translated: dict[str, TranslatedRequest] = {}
        self._as_sent: dict[str, TranslatedRequest] = {}  # the same, from a `TurnAsSent`
        self.rewrites: dict[str, ResendReason] = {}
        # The level a refused effort is resent with, per upstream (None: without an effort).
        self.effort_after: dict[str, Effort | None] = {}
        self.dropped: tuple[str, ...] = ()  # what the latest translation could not carry

    def _body(self) -> dict[str, Any] | None:
        """The client's body as a dict (None: not a JSON object, which translation refuses)."""
        if self._parsed is None:
            try:
                obj = json_loads(self.body)
            except ValueError:
                return None
            if not isinstance(obj, dict):
                return None
            self._parsed = obj
        return self._parsed

    def rewrite(self, dest: Destination, reason: ResendReason, refusal: str) -> str | None:
        """The next request to `dest` leaves out what it refused: sealed reasoning, or an effort
        level — resent with the level the refusal's message accepts (`refusal`), or without
        one. Returns that level's name for an effort refusal."""
        self.rewrites[dest.name] = reason
        self.translated.pop(dest.name, None)
        self._as_sent.pop(dest.name, None)
        if reason is not ResendReason.EFFORT_REFUSED:
            return None
        level = level_after_refusal(self._asked_effort(dest), refusal)
        self.effort_after[dest.name] = level
        return reasoning_level(level).value

    def resent_levels(self) -> dict[str, str]:
        """The level each upstream's refused effort was resent with (``off``: without one), by
        upstream name, as the request row and `twengine.reasoning.ReasoningMemory.settle` take
        them."""
        return {name: reasoning_level(level).value for name, level in self.effort_after.items()}

    def _asked_effort(self, dest: Destination) -> Effort | None:
        """The effort level sent to `dest`: its rule's, else the client's own."""
        if dest.reasoning is not None:
            return parse_effort(dest.reasoning.value)
        obj = self._body()
        return requested_effort(obj, self.call.dialect) if obj is not None else None

    def _reasoning_for(self, dest: Destination) -> ReasoningLevel | None:
        if self.rewrites.get(dest.name) is not ResendReason.EFFORT_REFUSED:
            return dest.reasoning
        # Resent with the level the refusal accepts (docs/operations.md), or without an effort.
        return reasoning_level(self.effort_after.get(dest.name))

    def build(
        self,
        dest: Destination,
        continuing: ResumableStream | None = None,
        *,
        now: float,
        as_sent: TurnAsSent | None = None,
    ) -> tuple[UpstreamRequest, UpstreamStream | None]:
        """The request for `dest`, and for a streamed call the opening that reads its answer
        (`now`: the wall clock, seconds since the epoch, for a converted answer's ``created``);
        `continuing`: the answer that broke off, which `dest` is asked to continue; `as_sent`:
        the turn as the client sent it, written instead of the expanded body (an upstream that
        holds the response it continues)."""
        call = self.call
        cache = self.translated if as_sent is None else self._as_sent
        translated = cache.get(dest.name)
        if translated is None or continuing is not None:
            rewrite = self.rewrites.get(dest.name)
            translated = translate_request(
                self.body if as_sent is None else as_sent.body,
                call.dialect,
                dest.target.dialect,
                model=dest.target.model,
                stream=call.stream,
                max_tokens=dest.max_tokens,
                default_max_tokens=dest.output_limit or DEFAULT_MAX_TOKENS,
                reasoning=self._reasoning_for(dest),
                drop_sealed_reasoning=rewrite is ResendReason.SEALED_REASONING or dest.drop_sealed,
                continuation=continuing.text if continuing is not None else None,
                prefill=rewrite is not ResendReason.PREFILL_REFUSED,
                parsed=self._body() if as_sent is None else as_sent.parsed,
            )
            cache[dest.name] = translated
            self.dropped = translated.dropped
        request = upstream_request(
            dest.target, call, translated.body, now=now, fields=translated.fields
        )
        if not call.stream:
            return request, None
        client_model = dest.client_model(self.model)
        opening = UpstreamStream(
            dest.target.dialect,
            call.dialect,
            client_model=client_model,
            upstream_sse=request.sse,
            client_sse=call.sse,
            tool_names=translated.tool_names,
            created=int(now),
            # Same format but another model name upstream (an alias): rename it in the answer.
            relay_unchanged=dest.target.model == client_model,
            resumable=self.resume,
            continuing=continuing,
            # A Chat client that did not ask for usage gets no usage-only chunk.
            hide_usage_chunk=translated.hide_usage_chunk,
            eventstream=request.eventstream,
            converse=request.converse,
            max_event_bytes=dest.max_answer_bytes,
        )
        return request, opening
