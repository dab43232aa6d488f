"""A request's shared admission in one round trip: its key limit, its turn, its slot leases.

Before it runs, a request may ask three things of Redis, each a script on keys of its own: the
key limit's check and reservation (`twserve.shared.limits.ADMIT`), its load-balance group's turn
(`twserve.shared.turns.SWRR_STEP`) and a lease of each upstream with ``max_concurrent`` where
this instance holds none spare (`twserve.shared.slots.ACQUIRE`). On one server (or the master
Sentinel names) `ADMISSION` runs them as one script, in that order: one round trip for all
three. Routing is done before it, here, since it is pure; only which member leads (the turn)
and the leases come from Redis, and the set of candidates, hence the leases wanted, does not
depend on the turn (it orders them).

The limit goes first and gates the rest: a request the limit refuses, or holds waiting for a
rolling window, takes no turn (a turn spent on a request that does not run would skew the
group's weights for the ones that do) and no lease (which would only have to be given back); it
runs the whole script again when it looks again. A request with no limit to check in Redis (a
key without limits, a token count, limits counted in-process while Redis is lost) takes its
turn and leases alone (`Ride.run`): one round trip still, none when it needs neither.

On a Redis Cluster the three lie on different hash slots, which no one script may reach, and
the Cluster client pipelines no scripts: there they go one after another, the limit first, then
the turn, then the leases — up to three round trips (docs/deployment.md). A hash tag common to
all of them would put every key of the deployment on one node, which a Cluster is there to
avoid. So `ADMISSION` is a single-server script, the one script whose keys lie in several slots:
each of its parts keeps its own keys in one slot, and it is never sent to a Cluster (both are
checked on every call the tests make, tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from twengine.router import RoutePlan
from twserve.shared.limits import ADMIT
from twserve.shared.redis import RedisDown, RedisState
from twserve.shared.slots import ACQUIRE, SharedSlots
from twserve.shared.turns import SWRR_STEP, SharedTurns

__all__ = ["ADMISSION", "PARTS", "Part", "Ride", "SharedAdmissions", "chain_args"]

#: The scripts `ADMISSION` chains, by the name a call gives each part.
PARTS = {"admit": ADMIT, "step": SWRR_STEP, "acquire": ACQUIRE}

# KEYS: the parts' keys, in order. ARGV[1]: how many parts; then per part its name, its key
# count and its argument count; then the parts' arguments, in order. Returns each part's answer,
# up to the first `admit` that did not admit (the parts after it are not run).
_RUN = """
local n = tonumber(ARGV[1])
local out = {}
local k, a = 0, 1 + 3 * n
for i = 1, n do
  local name, nk, na = ARGV[3 * i - 1], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do args[j] = ARGV[a + j] end
  k, a = k + nk, a + na
  local answer = PARTS[name](keys, args)
  out[i] = answer
  if name == 'admit' and answer[1] ~= 'admitted' then return out end
end
return out
"""


def _chain(parts: dict[str, str]) -> str:
    # Each part is its script as it stands, as a function of its own KEYS and ARGV.
    functions = "".join(
        f"local function {name}_part(KEYS, ARGV)\n{text}\nend\n" for name, text in parts.items()
    )
    table = ", ".join(f"{name} = {name}_part" for name in parts)
    return functions + f"local PARTS = {{{table}}}\n" + _RUN


#: The limit, the turn and the leases in one script (module docs); one server only.
ADMISSION = _chain(PARTS)


@dataclass(frozen=True, slots=True)
class Part:
    """One call of a script `ADMISSION` chains: its name in `PARTS`, keys and arguments."""

    name: str
    keys: list[str]
    args: Sequence[str | int | float]


def chain_args(parts: Sequence[Part]) -> tuple[list[str], list[str | int | float]]:
    """`ADMISSION`'s KEYS and ARGV for `parts`, in order."""
    keys: list[str] = []
    args: list[str | int | float] = [len(parts)]
    for part in parts:
        args += [part.name, len(part.keys), len(part.args)]
    for part in parts:
        keys += part.keys
        args += part.args
    return keys, args


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SharedAdmissions:
    """Makes each request's `Ride` (module docs)."""

    def __init__(self, state: RedisState, turns: SharedTurns, slots: SharedSlots) -> None:
        self.state = state
        self.turns = turns
        self.slots = slots
        self._chain = state.script(ADMISSION)
        # One script for all on one server; a Cluster takes them one after another.
        self.one_trip = state.target.kind != "cluster"

    def ride(self, plan: RoutePlan | None, names: Collection[str], owner: str) -> Ride:
        """What request `owner` takes beside its limit: `plan`'s turn (None: no turn, as for a
        token count) and a lease of each of `names` (its candidates) that needs one."""
        return Ride(self, plan, names, owner)

    async def run(self, parts: Sequence[Part]) -> list[list[object]]:
        """`ADMISSION`'s answer for `parts`: one round trip."""
        keys, args = chain_args(parts)

        async def call(client: Redis) -> list[list[object]]:
            return list(await self._chain(keys=keys, args=args, client=client))

        return await self.state.call(call)


class Ride:
    """One request's turn and slot leases, taken with its limit check (`with_limit`) or on their
    own (`run`); `plan` has the deployment's turn once `done`."""

    def __init__(
        self,
        admissions: SharedAdmissions,
        plan: RoutePlan | None,
        names: Collection[str],
        owner: str,
    ) -> None:
        self.admissions = admissions
        self.plan = plan
        self.names = list(names)
        self.owner = owner
        self.done = False
        self.one_trip = admissions.one_trip
        self._stepped = False
        self._need: list[str] = []

    def parts(self) -> list[Part]:
        """The turn's and the leases' parts, as they stand now (leases set aside meanwhile)."""
        out = []
        step = self.admissions.turns.step(self.plan) if self.plan is not None else None
        self._stepped = step is not None
        if step is not None:
            out.append(Part("step", *step))
        slots = self.admissions.slots
        self._need = slots.claim(self.names, self.owner)
        calls = slots.acquire_calls({name: 1 for name in self._need})
        out += [Part("acquire", keys, args) for keys, args in calls]
        return out

    def _took(self, answers: Sequence[object]) -> None:
        found = list(answers)
        if self._stepped:
            assert self.plan is not None
            self.plan = self.admissions.turns.took(self.plan, found.pop(0))  # type: ignore[arg-type]
        self.admissions.slots.took(self._need, found)  # type: ignore[arg-type]
        self.done = True

    async def with_limit(self, keys: list[str], args: Sequence[str | int | float]) -> list[object]:
        """`ADMIT`'s answer for `keys` and `args`, run in one script with the turn and the
        leases, which are taken only when it admits; `RedisDown` as from any call."""
        answers = await self.admissions.run([Part("admit", keys, args), *self.parts()])
        verdict = list(answers[0])
        if _text(verdict[0]) == "admitted":
            self._took(answers[1:])
        else:
            # Not admitted (yet): nothing was taken; the leases set aside are not needed.
            self.admissions.slots.changed(self.owner)
        return verdict

    async def run(self) -> None:
        """Take the turn and the leases on their own, unless taken with the limit already:
        one round trip on one server; a Cluster's calls one after another. Redis lost or
        failing: the local pick stands and this instance counts its slots alone."""
        if self.done:
            return
        self.done = True
        admissions = self.admissions
        turns = admissions.turns
        if not admissions.state.up:
            if self.plan is not None and turns.step(self.plan) is not None:
                turns.missed()
            return
        if not self.one_trip:
            if self.plan is not None:
                self.plan = await turns.take_plan(self.plan)
            await admissions.slots.ready(self.names, self.owner)
            return
        parts = self.parts()
        if not parts:
            return
        try:
            answers = await admissions.run(parts)
        except RedisDown:
            if self._stepped:
                turns.missed()
            return
        self._took(answers)
