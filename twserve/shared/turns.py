"""Load-balance turns taken by the whole deployment: smooth weighted round-robin in Redis.

Each ``load-balance`` group's current weights live in one hash,
``<prefix>{swrr:<group>}:current`` (the braces are a Redis Cluster hash tag; the script touches
only this key in any case). A request's plan is made by the router as on one instance; when the
group has more than one member taking part, `SWRR_STEP` runs on that hash — the step of
`twengine.balance.swrr_step`, in Lua, on the same integer milli-weights
(`twengine.balance.milli_weights`), ties to the member declared first — and the plan takes its
pick instead of the local one (`SharedTurns.took`, `Router.take_shared_turn`). A request takes
its step once its key limit admits it, in the limit check's round trip on one server
(twserve.shared.admission; `SharedTurns.step` gives the script's keys and arguments), or on its
own (`take_plan`); none for a group with a single member taking part (a step over one
participant changes nothing), none for token counts (they take no turn). A sticky request is
counted in the same script with its upstream forced, refused beyond ``max_lead`` as on one
instance.

The hash also holds ``=sig``, the group's configured members and weights: a hash written under
another membership is started afresh, as one router's reload does. It expires a day after the
last pick.

Redis lost (or a call failing): the local pick stands. The local balancer carries on from the
current weights of the last shared pick, so the sequence stays smooth per instance; once Redis
is back, picks are shared again from the weights Redis holds.
"""

from __future__ import annotations

from redis.asyncio import Redis

from twengine.balance import milli_weights
from twengine.router import RoutePlan, Router
from twproto import json_dumps
from twserve.shared.redis import RedisDown, RedisState

__all__ = ["SWRR_STEP", "SharedTurns"]


# An idle group's current weights are forgotten after this long.
TURNS_TTL_MS = 86_400_000

#: KEYS: the group's hash. ARGV: the membership signature, the forced member ('' for a pick),
#: max_lead, the hash's lifetime in ms, then per member in declared order: name, milli-weight,
#: '1' if it takes part. Returns {winner, 1 if the step was taken (0: a forced step refused by
#: max_lead), the new current weights as name, value, ...}.
SWRR_STEP = """
local sig, forced, max_lead = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cur = {}
if redis.call('HGET', KEYS[1], '=sig') == sig then
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do cur[flat[i]] = tonumber(flat[i + 1]) end
end
local names, weights, taking, seen = {}, {}, {}, {}
for i = 5, #ARGV, 3 do
  local name = ARGV[i]
  names[#names + 1] = name
  weights[name] = tonumber(ARGV[i + 1])
  if ARGV[i + 2] == '1' then taking[#taking + 1] = name; seen[name] = true end
end
if #taking == 0 then
  for _, name in ipairs(names) do taking[#taking + 1] = name; seen[name] = true end
end
if forced ~= '' and not seen[forced] then taking[#taking + 1] = forced end
local new = {}
for _, name in ipairs(names) do new[name] = cur[name] or 0 end
local total, best = 0, nil
for _, name in ipairs(taking) do
  new[name] = new[name] + weights[name]
  total = total + weights[name]
  if best == nil or new[name] > new[best] then best = name end
end
local winner = best
if forced ~= '' then winner = forced end
new[winner] = new[winner] - total
local taken = 1
if forced ~= '' and new[winner] < -max_lead * total then
  taken = 0
  new = {}
  for _, name in ipairs(names) do new[name] = cur[name] or 0 end
end
local out, args = {winner, taken}, {'=sig', sig}
for _, name in ipairs(names) do
  local value = string.format('%d', new[name])
  out[#out + 1] = name
  out[#out + 1] = value
  args[#args + 1] = name
  args[#args + 1] = value
end
if taken == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(args))
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return out
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SharedTurns:
    """The deployment's turns for this instance's plans (see the module docs)."""

    def __init__(self, state: RedisState, router: Router) -> None:
        self.state = state
        self.router = router
        self._step = state.script(SWRR_STEP)
        # Picks taken in Redis and picks left to the local balancer (Redis away, a failed call).
        self.shared = 0
        self.local = 0

    def key(self, group: str) -> str:
        return self.state.key("{swrr:" + group + "}", "current")

    async def take_plan(self, plan: RoutePlan) -> RoutePlan:
        """`plan` with its turn taken in Redis (a round trip of its own), when it takes one."""
        step = self.step(plan)
        if step is None:
            return plan
        if not self.state.up:
            self.local += 1
            return plan
        keys, args = step

        async def run(client: Redis) -> list[bytes]:
            found: list[bytes] = await self._step(keys=keys, args=args, client=client)
            return found

        try:
            found = await self.state.call(run)
        except RedisDown:
            self.local += 1
            return plan
        return self.took(plan, found)

    def step(self, plan: RoutePlan) -> tuple[list[str], list[str | int | float]] | None:
        """`SWRR_STEP`'s keys and arguments for `plan`'s turn; None when it takes none here
        (no load-balance group, or one participant: the step would change nothing)."""
        balance, group = plan.balance, plan.decision.group
        if balance is None or group is None:
            return None
        forced = balance.lead if balance.sticky else None
        taking = {m.provider for m in balance.members if m.taking_part}
        if len(taking | ({forced} if forced else set())) <= 1:
            return None
        config = self.router.config
        rr = self.router.balancer(group)
        members = config.group(group).members
        sig = json_dumps([[m.provider, m.weight] for m in members]).decode()
        weights = milli_weights([(m.provider, m.effective_weight) for m in balance.members])
        max_lead = rr.max_lead if rr is not None else 100.0
        args: list[str | int | float] = [sig, forced or "", max_lead, TURNS_TTL_MS]
        for (name, weight), member in zip(weights, balance.members, strict=True):
            args += [name, weight, "1" if member.taking_part else "0"]
        return [self.key(group)], args

    def took(self, plan: RoutePlan, found: list[bytes]) -> RoutePlan:
        """`plan` with the turn `SWRR_STEP` answered `found` for."""
        self.shared += 1
        assert plan.balance is not None
        forced = plan.balance.lead if plan.balance.sticky else None
        winner, taken = _text(found[0]), int(found[1])
        current = {_text(found[i]): int(found[i + 1]) for i in range(2, len(found), 2)}
        return self.router.take_shared_turn(
            plan, current, lead=winner, counted=bool(taken) if forced else None
        )

    def missed(self) -> None:
        """A turn this instance's balancer took alone (Redis lost or failing)."""
        self.local += 1
