"""twengine: the gateway's decisions, pure — time, random draws and ids are arguments.

Config (YAML text → a validated `Config`), routing rules and groups, smooth weighted round robin,
health samples and pauses, slot accounting, prices and cost, key limit accounting,
conversation affinity, the retry schedule, the per-request `AttemptMachine` that returns
actions for an IO shell to carry out, dry runs, and every message code. Nothing here reads a
clock, sleeps, opens a socket or logs (docs/library.md).

The API is tiered, as anyio's is. Here, at the top, is what a proxy calls: `build_config`,
the `Router` and its `RoutePlan`, `admit`, the destinations of a plan, the attempt machine
with its actions and the ledger over it, what each attempt sends (`AttemptRequests`), key
limits, prices and the dry-run report. Each vocabulary has a public door of its own, which
exports every public name of the modules behind it: `twengine.config` (every config section,
its validation and credentials), `twengine.attempt` (the machine's states, inputs, actions and
the retry schedule), and the top-level modules (`twengine.rules`, `twengine.health`,
`twengine.slots`, `twengine.limits`, `twengine.codes`, …). docs/library.md, "What is where",
lists them.
"""

from twengine.admission import (
    AdmissionRequest,
    LocalAnswer,
    Refusal,
    Routed,
    admit,
    check_caller,
)
from twengine.attempt import (
    AcquireSlot,
    AttemptLedger,
    AttemptMachine,
    AttemptRecord,
    AttemptRequests,
    AttemptSettings,
    AttemptStateError,
    Backoff,
    CancelAttempt,
    CancelWait,
    CandidateRef,
    Commit,
    EndStreamWithError,
    FinishRequest,
    Outcome,
    PassThroughUpstreamError,
    RecordFailure,
    RecordSuccess,
    ReleaseSlot,
    Resend,
    ResendReason,
    RespondError,
    Send,
    SendKeepAlive,
    WaitForSlot,
)
from twengine.config import (
    Config,
    ConfigError,
    CredentialFault,
    Problem,
    build_config,
    resolve_template,
)
from twengine.destinations import (
    Destination,
    Transport,
    destination,
    destinations,
    request_destinations,
)
from twengine.dryrun import (
    DryRunReport,
)
from twengine.limits import (
    KeyLimits,
)
from twengine.pricing import (
    PriceTable,
    cost_of,
)
from twengine.reasoning import (
    ReasoningMemory,
)
from twengine.router import (
    RoutePlan,
    Router,
)
from twengine.rules import (
    Candidate,
    RequestFacts,
)

__all__ = (
    "AcquireSlot",
    "AdmissionRequest",
    "AttemptLedger",
    "AttemptMachine",
    "AttemptRecord",
    "AttemptRequests",
    "AttemptSettings",
    "AttemptStateError",
    "Backoff",
    "CancelAttempt",
    "CancelWait",
    "Candidate",
    "CandidateRef",
    "Commit",
    "Config",
    "ConfigError",
    "CredentialFault",
    "Destination",
    "DryRunReport",
    "EndStreamWithError",
    "FinishRequest",
    "KeyLimits",
    "LocalAnswer",
    "Outcome",
    "PassThroughUpstreamError",
    "PriceTable",
    "Problem",
    "ReasoningMemory",
    "RecordFailure",
    "RecordSuccess",
    "Refusal",
    "ReleaseSlot",
    "RequestFacts",
    "Resend",
    "ResendReason",
    "RespondError",
    "RoutePlan",
    "Routed",
    "Router",
    "Send",
    "SendKeepAlive",
    "Transport",
    "WaitForSlot",
    "admit",
    "build_config",
    "check_caller",
    "cost_of",
    "destination",
    "destinations",
    "request_destinations",
    "resolve_template",
)
