"""The attempt machine of one request, its vocabulary and its ledger.

`actions` holds what goes in and comes out (`CandidateRef`, `AttemptSettings`, `Send` …
`Finish`, `AttemptRecord`); `machine` the per-request state machine (`State`, `Input`,
`TRANSITIONS`, `AttemptMachine`); `ledger` the machine with its slot and health bookkeeping as
actions (`AttemptLedger`), which is what an IO shell drives; `retry` the backoff schedule of
retry rounds; `requests` what each attempt sends upstream, and again after a refusal
(`twengine.attempt.requests.AttemptRequests`). docs/failover.md, "The attempt machine".
"""

from twengine.attempt.actions import (
    TERMINAL_ACTIONS,
    Action,
    AttemptRecord,
    AttemptSettings,
    Backoff,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    Finish,
    Outcome,
    PassThroughUpstreamError,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
    SkipReason,
    WaitForSlot,
)
from twengine.attempt.ledger import (
    AcquireSlot,
    AttemptLedger,
    CancelWait,
    LedgerAction,
    RecordFailure,
    RecordSuccess,
    ReleaseSlot,
    attempt_view,
)
from twengine.attempt.machine import (
    TRANSITIONS,
    AttemptMachine,
    AttemptStateError,
    Input,
    State,
)

__all__ = (
    "TERMINAL_ACTIONS",
    "TRANSITIONS",
    "AcquireSlot",
    "Action",
    "AttemptLedger",
    "AttemptMachine",
    "AttemptRecord",
    "AttemptSettings",
    "AttemptStateError",
    "Backoff",
    "CancelAttempt",
    "CancelWait",
    "CandidateRef",
    "Commit",
    "EndStreamWithError",
    "Finish",
    "Input",
    "LedgerAction",
    "Outcome",
    "PassThroughUpstreamError",
    "RecordFailure",
    "RecordSuccess",
    "ReleaseSlot",
    "Resend",
    "ResendReason",
    "RespondError",
    "Send",
    "SendKeepAlive",
    "SkipReason",
    "State",
    "WaitForSlot",
    "attempt_view",
)
