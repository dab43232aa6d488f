"""Dry-run reports: where a request would go now, and the figures behind the choice.

Theory of operation
-------------------
`twengine.router.Router.dryrun` plans a request exactly as `Router.plan` would at the same
``now`` — the same turn decision, sticky upstream, pauses, full slots and strategy — except
that the load-balance step is a ``peek``: nothing moves, so asking never changes the answer.
The report it returns is a plain value made of this module's dataclasses; `DryRunReport.next`
is the upstream the next real request with the same facts will be sent to first.

The report carries what an operator needs to see why: the route and rule that decided, the
group and its ``balance_by``, and per candidate, in the order they would be asked, its weight,
median time to first content, success rate, balance factor, effective weight, pause and slot
use. `DryRunReport.to_dict` gives the control plane's JSON, and `report_from_dict` reads it back
(the CLI asking a running gateway); `format_text` the CLI's table (``twserve dryrun --model M
[--key K]``).

Times in a report are on the gateway's monotonic clock (`DryRunReport.now` says where that
clock stood); a pause is also given as the seconds left, which mean the same to anyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ("DryRunCandidate", "DryRunReport", "DryRunSkip", "format_text", "report_from_dict")


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunSkip:
    """A member left out before any attempt: the model it was asked for, and why."""

    provider: str
    model: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"provider": self.provider, "model": self.model, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunCandidate:
    """One candidate as it would be asked.

    `first_content_ms` is the median of its recent first-content times (None: no samples);
    `success_rate` None means too few recent attempts to tell. `balance_factor` and
    `effective_weight` are set for a ``load-balance`` group only. `paused_until` is on the
    gateway's monotonic clock. `max_concurrent` None means no limit. `sticky`: the
    conversation stays there; `paused` / `full`: it sits out of balancing now.
    """

    provider: str
    model: str
    weight: int = 1
    first_content_ms: int | None = None
    first_content_samples: int = 0
    success_rate: float | None = None
    attempts: int = 0
    balance_factor: float | None = None
    effective_weight: float | None = None
    paused_until: float | None = None
    pause_reason: str | None = None
    in_flight: int = 0
    max_concurrent: int | None = None
    sticky: bool = False
    paused: bool = False
    full: bool = False

    def pause_left_secs(self, now: float) -> float | None:
        """Seconds of pause left at `now` (None: not paused)."""
        if self.paused_until is None:
            return None
        return max(0.0, self.paused_until - now)

    def to_dict(self, now: float) -> dict[str, Any]:
        """The JSON form; `now` is the report's clock, to give the pause's seconds left."""
        left = self.pause_left_secs(now)
        return {
            "provider": self.provider,
            "model": self.model,
            "weight": self.weight,
            "first_content_ms": self.first_content_ms,
            "first_content_samples": self.first_content_samples,
            "success_rate": self.success_rate,
            "attempts": self.attempts,
            "balance_factor": self.balance_factor,
            "effective_weight": self.effective_weight,
            "paused_until": self.paused_until,
            "pause_left_secs": None if left is None else round(left, 3),
            "pause_reason": self.pause_reason,
            "in_flight": self.in_flight,
            "max_concurrent": self.max_concurrent,
            "sticky": self.sticky,
            "paused": self.paused,
            "full": self.full,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunReport:
    """Where a request would go now (docs/balancing.md, "Dry-run").

    `model` is the model asked for. `route` and `rule` are None when no route applies or no
    rule decided; `target` is the deciding target's kind (None for a denial). `group`,
    `group_type` and `balance_by` are set when the target is a group. `held`: the decision is
    the one made at the conversation turn's start. `lead` is the member the load-balancer
    would give this request's turn to. `candidates` are in the order they would be asked;
    `next` is the first of them — exactly the upstream a real request would be sent to — and
    `waits` says it has no free slot, so the request would wait for one.
    """

    now: float
    model: str
    route: str | None = None
    rule: str | None = None
    target: str | None = None
    group: str | None = None
    group_type: str | None = None
    balance_by: str | None = None
    denied: bool = False
    deny_message: str | None = None
    held: bool = False
    sticky: str | None = None
    lead: str | None = None
    candidates: tuple[DryRunCandidate, ...] = ()
    skipped: tuple[DryRunSkip, ...] = ()
    next: str | None = None
    waits: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON form served by the control plane."""
        return {
            "model": self.model,
            "route": self.route,
            "rule": self.rule,
            "target": self.target,
            "group": self.group,
            "group_type": self.group_type,
            "balance_by": self.balance_by,
            "denied": self.denied,
            "deny_message": self.deny_message,
            "held": self.held,
            "sticky": self.sticky,
            "lead": self.lead,
            "next": self.next,
            "waits": self.waits,
            "candidates": [c.to_dict(self.now) for c in self.candidates],
            "skipped": [s.to_dict() for s in self.skipped],
            "now": self.now,
        }


def report_from_dict(data: Mapping[str, Any]) -> DryRunReport:
    """A `DryRunReport` back from its JSON form (`DryRunReport.to_dict`); fields the form adds
    (``pause_left_secs``) or does not know are left out."""
    candidates = []
    for c in data.get("candidates") or ():
        fields = {k: v for k, v in c.items() if k in DryRunCandidate.__dataclass_fields__}
        candidates.append(DryRunCandidate(**fields))
    skipped = tuple(
        DryRunSkip(provider=s["provider"], model=s["model"], reason=s["reason"])
        for s in data.get("skipped") or ()
    )
    top = {
        k: v
        for k, v in data.items()
        if k in DryRunReport.__dataclass_fields__ and k not in ("candidates", "skipped")
    }
    return DryRunReport(**top, candidates=tuple(candidates), skipped=skipped)


_COLUMNS = ("#", "upstream", "model", "weight", "factor", "effective", "first", "success", "slots")


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _state(candidate: DryRunCandidate, now: float) -> str:
    notes: list[str] = []
    if candidate.sticky:
        notes.append("sticky")
    left = candidate.pause_left_secs(now)
    if left is not None:
        reason = f", {candidate.pause_reason}" if candidate.pause_reason else ""
        notes.append(f"paused {left:.0f} s{reason}")
    if candidate.full:
        notes.append("full")
    return "; ".join(notes)


def _row(index: int, c: DryRunCandidate, now: float) -> list[str]:
    limit = "-" if c.max_concurrent is None else str(c.max_concurrent)
    first = "-" if c.first_content_ms is None else f"{c.first_content_ms} ms"
    success = "-" if c.success_rate is None else f"{c.success_rate:.0%}"
    return [
        str(index),
        c.provider,
        c.model,
        str(c.weight),
        _number(c.balance_factor),
        _number(c.effective_weight),
        first,
        success,
        f"{c.in_flight}/{limit}",
        _state(c, now),
    ]


def format_text(report: DryRunReport) -> str:
    """The report as the CLI prints it: a summary, then one line per candidate in order."""
    where = [f"route {report.route or '(none)'}", f"rule {report.rule or '(none)'}"]
    if report.group is not None:
        where.append(f"group {report.group} ({report.group_type}, balance_by {report.balance_by})")
    elif report.target is not None:
        where.append(f"target {report.target}")
    lines = [f"model {report.model}: " + ", ".join(where)]
    if report.held:
        lines.append("decision held from the start of the conversation's turn")
    if report.denied:
        lines.append(f"denied: {report.deny_message or 'by rule'}")
        return "\n".join(lines) + "\n"
    if report.next is None:
        lines.append("next: none (no upstream offers this model)")
    else:
        why = []
        if report.sticky == report.next:
            why.append("the conversation stays there")
        elif report.lead == report.next:
            why.append("its turn in the load balance")
        if report.waits:
            why.append("no free slot: the request would wait")
        lines.append(f"next: {report.next}" + (f" ({'; '.join(why)})" if why else ""))
    if report.candidates:
        table = [[*_COLUMNS, ""]] + [
            _row(i, c, report.now) for i, c in enumerate(report.candidates, 1)
        ]
        widths = [max(len(row[k]) for row in table) for k in range(len(_COLUMNS))]
        lines.append("")
        for row in table:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    for skip in report.skipped:
        lines.append(f"skipped {skip.provider}: {skip.reason} ({skip.model})")
    return "\n".join(lines) + "\n"
