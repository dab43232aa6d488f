"""A request's turn on its gateway key: the key's ``max_concurrent`` permit, then its usage
limits, each waited for until the request's deadline (docs/operations.md, "Keys and
concurrency"; docs/limits-and-costs.md).

Waiting is IO, so it lives here; what the limits allow is `twserve.usage`'s (over
`twengine.limits`), and the refusal for a key still busy is `twengine.admission.key_busy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from twengine.admission import key_busy
from twengine.config import Config
from twengine.slots import Permit
from twproto.errors import GatewayError
from twserve.client_answer import RelayOutcome
from twserve.relay_hooks import RouterHooks
from twserve.store import RequestRow
from twserve.usage import Admission, UsageKeeper

__all__ = ["KeyTurn", "key_turn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyTurn:
    """A request's turn on its key: the ``max_concurrent`` permit (None for a key without one)
    and the usage admission, both settled by `end`."""

    hooks: RouterHooks
    usage: UsageKeeper
    permit: Permit | None
    admission: Admission

    def end(self, row: RequestRow, outcome: RelayOutcome, models: Mapping[str, str]) -> None:
        """Give the permit back; price the row and settle the key's limits (`models`: the model
        sent to each upstream)."""
        if self.permit is not None:
            self.hooks.release(self.permit)
        self.usage.finish(
            row,
            self.admission,
            usage=outcome.usage,
            attempts=outcome.attempts,
            attempt_usage=outcome.attempt_usage,
            models=models,
        )


async def key_turn(
    hooks: RouterHooks,
    usage: UsageKeeper,
    config: Config,
    client: str,
    owner: str,
    *,
    deadline: float,
    estimate: tuple[int, list[tuple[str, str]]],
    counted: bool,
) -> KeyTurn | GatewayError:
    """Request `owner`'s turn on its key, or the error to refuse it with. `estimate` is the
    input tokens and the (provider, model) candidates a cost estimate reads; `counted` False for
    requests that count toward no limit (token counts). The permit is given back on a refusal or
    if the client leaves while waiting."""
    limit = config.client(client).max_concurrent
    permit = None
    if limit is not None:
        # A key at its max_concurrent queues, within failover.wait_secs of arrival.
        permit = await hooks.key_permit(client, owner, deadline)
        if permit is None:
            return key_busy(limit)
    if not counted:
        return KeyTurn(
            hooks=hooks, usage=usage, permit=permit, admission=Admission.uncounted(client)
        )
    try:
        admitted = await usage.admit(client, usage.estimate(*estimate), deadline=deadline)
    except BaseException:  # the client left while waiting
        if permit is not None:
            hooks.release(permit)
        raise
    if isinstance(admitted, Admission):
        return KeyTurn(hooks=hooks, usage=usage, permit=permit, admission=admitted)
    if permit is not None:
        hooks.release(permit)
    return admitted
