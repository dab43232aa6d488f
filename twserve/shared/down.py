"""`RedisDown`, in a module of its own so that code which only catches it imports no Redis
client: the `redis` package is an optional extra (``pip install 'twserve[redis]'``), loaded only
when ``state.redis_url`` is set."""

from __future__ import annotations

__all__ = ["RedisDown"]


class RedisDown(Exception):
    """Redis did not answer in time, or it is lost: use the in-process state."""
