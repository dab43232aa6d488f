"""State shared by several gateway instances through Redis (``state.redis_url``).

Without ``state.redis_url`` nothing here runs: key limits, upstream slots, pauses, affinity,
load-balance turns and health stay in-process (twengine's objects, driven by
twserve.usage.keeper and twserve.relay.holds). With it:

* `redis_state.RedisState` — the connection, a short timeout on every call, the fall-back to
  in-process state when Redis is lost, the background retry and the events around both;
* `shared_limits.SharedLimits` — key limits checked and reserved atomically by Lua scripts;
* `shared_slots.SharedSlots` — upstream slots exact across instances: Lua-leased, renewed, expiring;
* `shared_router.SharedRouter` — pauses and conversation affinity, kept in keys with a TTL and
  announced on a pub/sub channel;
* `turns.SharedTurns` — load-balance turns (smooth weighted round-robin) taken in one Lua script
  per pick;
* `health.SharedHealth` — failure runs counted atomically, success rates and first-content samples
  written in the background and read back periodically;
* `memory.SharedMemory` — the effort memory and sealed-reasoning marks, kept in keys with their
  expiry and announced on the same channel;
* `sharing.Sharing` — all of the above for one instance, wired to its gateway by twserve.app.wiring.

docs/deployment.md ("Several instances: Redis") says what is shared and how exactly.
"""
