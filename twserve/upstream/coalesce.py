"""Join the pieces an async byte stream can give at once, so the relay writes once per read.

Used where twserve/upstream/client.py reads an httpcore answer (the HTTP/2 pools; the HTTP/1.1 pool
in twserve/upstream/h1_pool.py joins what one read brought itself).

An upstream that streams writes each SSE event as its own chunk of HTTP/1.1 chunked framing.
When several arrive in one socket read, httpcore (through h11) still hands them over one by
one, and the relay would write each to the client with its own ``send()`` system call: on a
fast upstream that is one call per event where one per read would do, and system calls are the
largest single cost of the stream path (docs/benchmarks.md).

`coalesced(source)` takes the next piece, then asks `source` for more as long as it can answer
*without waiting*: it starts the next ``__anext__`` by hand and looks at what it does. If it
finishes at once, the piece was already buffered and joins the batch. If it suspends (it has
to wait for the network), the batch goes out first and the started step is resumed, within
the same task, when the caller asks for the next piece. Nothing is held back while waiting, so
the time to first byte and the pacing of a slow stream are unchanged; only pieces that were
ready together are written together.

The suspended step is driven by `_resume`, which hands whatever it awaits to the running task
and passes back what the task sends or throws (a cancellation included): the same thing
``await`` does, started one step late. If the caller stops reading while a step is suspended,
the step is unwound with an exception thrown into it, so the source's own clean-up (httpcore
closes the connection) runs.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any

__all__ = ["coalesced"]


class _Abandoned(Exception):
    """Thrown into a suspended step when the caller stops reading."""


@types.coroutine
def _resume(
    step: Coroutine[Any, Any, bytes], awaiting: Any, throw: BaseException | None = None
) -> Generator[Any, Any, bytes]:
    """Go on with `step`, which suspended awaiting `awaiting`, as if it had been awaited."""
    if throw is not None:
        try:
            awaiting = step.throw(throw)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
    while True:
        try:
            sent = yield awaiting
        except BaseException as exc:  # cancellation, or the task being closed
            try:
                awaiting = step.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        else:
            try:
                awaiting = step.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


async def coalesced(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The pieces of `source`, those available together joined into one (module docs)."""
    pending: tuple[Coroutine[Any, Any, bytes], Any] | None = None
    try:
        while True:
            try:
                if pending is None:
                    piece = await source.__anext__()
                else:
                    step, awaiting = pending
                    pending = None
                    piece = await _resume(step, awaiting)
            except StopAsyncIteration:
                return
            parts = [piece]
            failure: BaseException | None = None
            ended = False
            while True:
                step = source.__anext__()  # type: ignore[assignment]
                try:
                    awaiting = step.send(None)
                except StopIteration as done:  # it was ready: take it and look again
                    parts.append(done.value)
                    continue
                except StopAsyncIteration:
                    ended = True
                except Exception as exc:  # after what was ready, not instead of it
                    failure = exc
                else:
                    pending = (step, awaiting)
                break
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            if failure is not None:
                raise failure
            if ended:
                return
    finally:
        if pending is not None:
            step, awaiting = pending
            try:
                await _resume(step, awaiting, throw=_Abandoned())
            except (_Abandoned, StopAsyncIteration):
                pass
