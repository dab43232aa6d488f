"""A request's turn on its gateway key: the key's ``max_concurrent`` permit, then its usage
limits, each waited for until the request's deadline (docs/operations.md, "Keys and
concurrency"; docs/limits-and-costs.md).

Waiting is IO, so it lives here; what the limits allow is `twserve.usage`'s (over
`twengine.limits`), and the refusal for a key still busy is `twengine.admission.key_busy`.
"""

from __future__ import annotations

from twengine.admission import key_busy
from twengine.config import Config
from twengine.slots import Permit
from twproto.errors import GatewayError
from twserve.relay_hooks import RouterHooks
from twserve.usage import Admission, UsageKeeper

__all__ = ["key_turn"]


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
) -> tuple[Permit | None, Admission] | GatewayError:
    """The key permit (None for a key without ``max_concurrent``) and the usage admission of
    request `owner`, or the error to refuse it with. `estimate` is the input tokens and the
    (provider, model) candidates a cost estimate reads; `counted` False for requests that count
    toward no limit (token counts). The permit is given back on a refusal or if the client
    leaves while waiting."""
    limit = config.client(client).max_concurrent
    permit = None
    if limit is not None:
        # A key at its max_concurrent queues, within failover.wait_secs of arrival.
        permit = await hooks.key_permit(client, owner, deadline)
        if permit is None:
            return key_busy(limit)
    if not counted:
        return permit, Admission.uncounted(client)
    try:
        admitted = await usage.admit(client, usage.estimate(*estimate), deadline=deadline)
    except BaseException:  # the client left while waiting
        if permit is not None:
            hooks.release(permit)
        raise
    if isinstance(admitted, Admission):
        return permit, admitted
    if permit is not None:
        hooks.release(permit)
    return admitted
