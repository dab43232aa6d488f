"""The attempt machine of one request, its vocabulary and its ledger.

`actions` holds what goes in and comes out (`CandidateRef`, `AttemptSettings`, `Send` …
`FinishRequest`, `AttemptRecord`); `machine` the per-request state machine (`State`, `Input`,
`TRANSITIONS`, `AttemptMachine`); `ledger` the machine with its slot and health bookkeeping as
actions (`AttemptLedger`), which is what an IO shell drives; `retry` the backoff schedule of
retry rounds; `requests` what each attempt sends upstream, and again after a refusal
(`AttemptRequests`). Every public name of these modules is exported here: the machine's states
and inputs, its actions and the ledger's. docs/failover.md, "The attempt machine".
"""

from twengine.attempt.actions import (
    TERMINAL_ACTIONS,
    Action,
    AttemptRecord,
    AttemptSettings,
    AttemptSkipReason,
    Backoff,
    CancelAttempt,
    CandidateRef,
    Commit,
    EndStreamWithError,
    FinishRequest,
    Outcome,
    PassThroughUpstreamError,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
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
from twengine.attempt.requests import (
    AttemptRequests,
    TurnAsSent,
)
from twengine.attempt.retry import (
    HINT_FLOOR_SECS,
    JITTER,
    SCHEDULE_SECS,
    base_backoff,
    next_backoff,
)

__all__ = (
    "HINT_FLOOR_SECS",
    "JITTER",
    "SCHEDULE_SECS",
    "TERMINAL_ACTIONS",
    "TRANSITIONS",
    "AcquireSlot",
    "Action",
    "AttemptLedger",
    "AttemptMachine",
    "AttemptRecord",
    "AttemptRequests",
    "AttemptSettings",
    "AttemptSkipReason",
    "AttemptStateError",
    "Backoff",
    "CancelAttempt",
    "CancelWait",
    "CandidateRef",
    "Commit",
    "EndStreamWithError",
    "FinishRequest",
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
    "State",
    "TurnAsSent",
    "WaitForSlot",
    "attempt_view",
    "base_backoff",
    "next_backoff",
)
