"""What each upstream gets of a request's reasoning (docs/operations.md, "What goes upstream").

Two memories of the process change what a request sends before it goes and learn from how it went:
the effort levels upstreams accepted in place of refused ones (`twserve.relay.efforts`), and the
conversations whose sealed reasoning an upstream refused (`twengine.sealed`). `Reasoning.prepare`
applies both to a request's destinations; `Reasoning.settle` records what its attempts showed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from twengine.attempt import ResendReason
from twengine.destinations import Destination
from twengine.sealed import SealedReasoning
from twproto.dialect import Dialect
from twserve.relay.client import RelayOutcome
from twserve.relay.efforts import Efforts

__all__ = ["Reasoning", "ReasoningPlan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningPlan:
    """One request's destinations as `Reasoning.prepare` left them, with what `settle` needs."""

    destinations: list[Destination]
    # Per upstream: ``{asked, sent, reason}`` of its reasoning level, for the request row.
    efforts: dict[str, dict[str, Any]]
    body: dict[str, Any]
    dialect: Dialect
    conversation: str | None
    counting: bool


class Reasoning:
    """The effort memory and the sealed-reasoning memory, applied to the gateway's requests."""

    def __init__(self, efforts: Efforts, clock: Callable[[], float]) -> None:
        self.efforts = efforts
        self.sealed = SealedReasoning()
        self.clock = clock

    def prepare(
        self,
        destinations: list[Destination],
        body: dict[str, Any],
        dialect: Dialect,
        conversation: str | None,
        *,
        counting: bool,
    ) -> ReasoningPlan:
        """Remembered levels put in up front (a token count sends no level), and sealed
        reasoning left out for the upstreams that refused this conversation's before."""
        efforts: dict[str, dict[str, Any]] = {}
        if not counting:
            destinations, efforts = self.efforts.apply(destinations, body, dialect)
        if conversation is not None:
            now = self.clock()
            destinations = [
                replace(d, drop_sealed=True)
                if self.sealed.leave_out(conversation, d.name, now=now)
                else d
                for d in destinations
            ]
        return ReasoningPlan(
            destinations=destinations,
            efforts=efforts,
            body=body,
            dialect=dialect,
            conversation=conversation,
            counting=counting,
        )

    def settle(self, plan: ReasoningPlan, outcome: RelayOutcome, *, finished: bool) -> None:
        """Remember the level a resend succeeded with (a request that ran to its end), and the
        upstreams that refused the conversation's sealed reasoning."""
        if finished and not plan.counting:
            self.efforts.remember(outcome, plan.destinations, plan.efforts, plan.body, plan.dialect)
        if plan.conversation is not None:
            for a in outcome.attempts:
                if a.resend is ResendReason.SEALED_REASONING:
                    self.sealed.mark(plan.conversation, a.provider, now=self.clock())
