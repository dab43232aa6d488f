"""Background upkeep of usage accounting and the request store.

* At startup, and whenever a reload changed some key's limits, the limits' totals are rebuilt
  from the stored rows (`UsageKeeper.rebuild`): day, week and month usage survive a restart.
* When the machine's time zone changes (and no zone was pinned), calendar periods move: the
  totals are rebuilt on the new calendar.
* Every hour (and once at startup) rows older than ``retention.row_days`` and stored bodies
  older than ``retention.body_days`` are deleted.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import anyio

from twengine.config import Config
from twserve.store.responses import ResponseRecords
from twserve.store.sqlite import Store
from twserve.usage.keeper import UsageKeeper, local_tz

__all__ = ["PRUNE_EVERY_SECS", "Maintenance"]

log = logging.getLogger("twserve.app.maintenance")

PRUNE_EVERY_SECS = 3600.0
CHECK_EVERY_SECS = 1.0
DAY = 86_400.0


def _tz_signature(tz: dt.tzinfo, at: float) -> tuple[str | None, dt.timedelta | None]:
    moment = dt.datetime.fromtimestamp(at, tz)
    return moment.tzname(), moment.utcoffset()


class Maintenance:
    def __init__(
        self,
        usage: UsageKeeper,
        store: Store,
        config: Callable[[], Config],
        *,
        pinned_tz: dt.tzinfo | None = None,
    ) -> None:
        self.usage = usage
        self.store = store
        self.config = config
        self.pinned_tz = pinned_tz
        self.pruned = (0, 0)
        # Stored Responses conversations (twserve.store.responses): expired ones go here too.
        self.responses: ResponseRecords | None = None

    async def rebuild(self) -> int:
        """Rebuild the limits' totals from the store now. A store that cannot be read is
        logged and tried again later (`UsageKeeper.rebuild_due`)."""
        self.usage.store = self.store
        self.usage.rebuild_needed = True
        try:
            booked = await self.usage.rebuild_now()
        except Exception as exc:
            log.warning("key limits not rebuilt, the request store cannot be read: %s", exc)
            return 0
        if booked:
            log.info("key limits: %d stored requests counted in the current windows", booked)
        return booked

    async def prune(self) -> tuple[int, int]:
        """Apply `retention`: delete old rows and old bodies; returns how many of each."""
        retention = self.config().retention
        now = self.usage.wall()
        self.pruned = await self.store.prune(
            before_rows=now - retention.row_days * DAY,
            before_bodies=now - retention.body_days * DAY,
        )
        if any(self.pruned):
            log.info("retention: deleted %d rows and %d bodies", *self.pruned)
        if self.responses is not None:
            try:
                await self.responses.prune(now)
            except Exception as exc:
                log.warning("retention: expired Responses records not deleted: %s", exc)
        return self.pruned

    def _tz_moved(self) -> bool:
        if self.pinned_tz is not None:
            return False
        now = self.usage.wall()
        current = local_tz()
        if _tz_signature(current, now) == _tz_signature(self.usage.tz, now):
            return False
        log.info("the local time zone changed: calendar limits move to it")
        self.usage.set_tz(current)
        return True

    async def run(self) -> None:
        next_prune = 0.0
        clock = self.usage.clock
        while True:
            if self._tz_moved() or self.usage.rebuild_due():
                await self.rebuild()
            if clock() >= next_prune:
                next_prune = clock() + PRUNE_EVERY_SECS
                try:
                    await self.prune()
                except Exception:  # a locked or damaged file must not stop the gateway
                    log.exception("retention clean-up failed")
            await anyio.sleep(CHECK_EVERY_SECS)
