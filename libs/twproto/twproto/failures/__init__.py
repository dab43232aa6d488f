"""Failure classification: what an upstream's error means for routing.

Theory of operation
-------------------

An upstream refuses a request in one of three ways: an HTTP error response (status, headers,
body), an error event inside a stream that had already answered 200, or a transport fault before
any response. Each becomes a `Failure`, which says

* what happened (`FailureKind`),
* whether the request moves to the next upstream (`failover`),
* whether it is worth trying the same upstream again after a backoff (`temporary`),
* how the upstream is paused (`PauseRule`, resolved to durations by the engine's config), and
* the times the upstream itself named: an explicit pause (``Retry-After`` and friends, or the
  time left until a quota resets), the reset time, and a retry hint.

Classification is a pure function of its inputs (``now`` is an argument) and never raises on any
input: bodies are read defensively — at most 64 KiB, which may be non-JSON, HTML, truncated or
nested in an array (Gemini's streaming endpoint wraps errors in ``[...]``).

The recognising is data, not code. `RULES` is an ordered table of small rows; the first row that
matches decides the kind. A row matches on

* *codes*: the error's identifiers — ``type``, ``code``, ``status``, ``reason``, an AWS
  exception name — lowercased and compared exactly;
* *texts*: regular expressions searched in the lowercased message (plus a relay's
  ``metadata.raw`` and the offending ``param``), or in the whole body when it is not JSON;
* *statuses*: the HTTP statuses the row applies to (``None`` in the set stands for an in-stream
  error that carries no status);
* *needs*: `Evidence` computed from headers and body that must be present (a retry delay, a
  daily-quota violation, usage headers showing a full window).

Rows that read the body come before rows that read only the status, because the body outranks
the status: a 429 saying "insufficient balance" is no_balance, and a 500 naming an invalid request
is the client's error. docs/failures.md lists every row; a test keeps the two in step.

What each kind does next (`KIND_POLICY`) is a second table, so policy and recognition change
independently.

The modules follow that order: `twproto.failures.kinds` (the `Failure` and its kinds, and
`KIND_POLICY`), `twproto.failures.rules` (`RULES`), `twproto.failures.evidence` (reading
bodies, headers and the times they name) and `twproto.failures.classify` (the three entry
points). Every name is exported here.
"""

from __future__ import annotations

from twproto.failures.classify import (
    classify_response,
    classify_stream_error,
    classify_transport,
    idle_timeout,
    stream_ended_early,
)
from twproto.failures.evidence import next_pacific_midnight
from twproto.failures.kinds import (
    KIND_POLICY,
    MAX_BODY_BYTES,
    Evidence,
    Failure,
    FailureKind,
    KindPolicy,
    PauseRule,
    TransportFault,
)
from twproto.failures.rules import RULES, TEMPORARY_STATUSES, FailureRule

__all__ = (
    "KIND_POLICY",
    "MAX_BODY_BYTES",
    "RULES",
    "TEMPORARY_STATUSES",
    "Evidence",
    "Failure",
    "FailureKind",
    "FailureRule",
    "KindPolicy",
    "PauseRule",
    "TransportFault",
    "classify_response",
    "classify_stream_error",
    "classify_transport",
    "idle_timeout",
    "next_pacific_midnight",
    "stream_ended_early",
)
