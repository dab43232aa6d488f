"""What an HTTP/2 connection keeps of each stream, and of the client's frames as they come.

The connection (twserve/server/http2.py) drives h2 and runs the handlers; the bookkeeping it
does per stream is here, as plain records with no IO of their own:

* `H2Stream`: one stream's request as it arrives (its headers, its body bounded by
  `ServerLimits.max_body_bytes` and drawn from the server's `BodyBudget` as it arrives, given
  back however the stream ends), whether it is answered, reset or running, and its waits for
  room in the send windows (`H2Stream.wait_window`): each wait bounded by the write timeout,
  all of one answer's waits together by `Http2Limits.max_blocked_secs`, so a window opened a
  byte at a time buys no more time than one left shut.
* `ResetCount`: the streams the client reset lately. A reset stream no longer counts against
  the concurrent-stream limit, so opening and resetting streams at once ("rapid reset") would
  start handlers without bound; past `Http2Limits.max_resets` within
  `Http2Limits.reset_window_secs` the connection is ended.
* `FrameGuard`: the frame headers of the incoming bytes, walked ahead of h2, which checks a
  frame's length only once the whole frame has arrived: a header claiming 16 MB would
  otherwise be buffered up to that size before it is refused. Here it is refused at its header.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio

from twproto.paths import split_target
from twserve.server.base import BodyBudget, Headers, Request

__all__ = ["FrameGuard", "H2Stream", "ResetCount"]


class H2Stream:
    """One request stream of an HTTP/2 connection."""

    __slots__ = (
        "blocked",
        "body",
        "ended",
        "gone",
        "headers",
        "id",
        "opened",
        "rejected",
        "reserved",
        "running",
        "scope",
        "size",
        "window",
    )

    def __init__(self, stream_id: int, headers: Headers, now: float) -> None:
        self.id = stream_id
        self.headers = headers
        self.opened = now
        self.body: list[bytes] = []
        self.size = 0
        self.reserved = 0  # bytes of the body budget its body holds
        self.ended = False  # the client has sent all of its request
        self.rejected = False  # answered by the transport; further DATA is only acknowledged
        self.gone = False  # reset by either side: nothing more is written
        self.running = False  # a task answers it (and forgets it when done)
        self.scope = anyio.CancelScope()
        self.window = anyio.Event()  # set when more may be sent on this stream
        self.blocked = 0.0  # seconds its answer has waited for a window, in all

    def take(self, data: bytes, *, max_body: int, budget: BodyBudget) -> int:
        """Add a piece of the body: 0, or the status that refuses the request (413 past
        `max_body`, 503 when the budget cannot hold it)."""
        self.size += len(data)
        if self.size > max_body:
            return 413
        # Counted as they arrive, like HTTP/1.1's: a length announced and never sent holds
        # nothing back from anyone else.
        if not budget.reserve(len(data)):
            return 503
        self.reserved += len(data)
        self.body.append(bytes(data))
        return 0

    def release(self, budget: BodyBudget) -> None:
        """Give back what the body holds of the budget."""
        budget.release(self.reserved)
        self.reserved = 0

    def path(self) -> str | None:
        """The request's path, for the transport's own error answers."""
        return split_target(dict(self.headers).get(b":path", b""))[0] or None

    def request(self, peer: tuple[str, int]) -> Request | None:
        """The request as a handler sees it; None without a ``:path``."""
        pseudo = {k: v for k, v in self.headers if k.startswith(b":")}
        headers = [(k, v) for k, v in self.headers if not k.startswith(b":")]
        target = pseudo.get(b":path")
        if not target:
            return None
        authority = pseudo.get(b":authority")
        if authority and not any(k == b"host" for k, _ in headers):
            headers.insert(0, (b"host", authority))
        path, query = split_target(target)
        return Request(
            method=pseudo.get(b":method", b"GET").decode("ascii", "replace"),
            target=target,
            path=path,
            query=query,
            headers=headers,
            body=b"".join(self.body),
            client=peer,
            http_version="2",
        )

    async def wait_window(
        self, window: Callable[[H2Stream], int], *, write_timeout: float, max_blocked: float
    ) -> int:
        """Wait for WINDOW_UPDATE until `window` (the room to send on this stream) is more than
        none: at most `write_timeout`, and no longer than what is left of `max_blocked` for
        this answer's waits in all. The room, or 0 when the wait ran out."""
        left = max_blocked - self.blocked
        began = anyio.current_time()
        try:
            with anyio.move_on_after(min(write_timeout, max(0.0, left))):
                while True:
                    self.window = anyio.Event()
                    await self.window.wait()
                    room = window(self)
                    if room > 0:
                        return room
        finally:
            self.blocked += anyio.current_time() - began
        return 0


class ResetCount:
    """When the client last reset streams, within a sliding window."""

    __slots__ = ("limit", "times", "window_secs")

    def __init__(self, limit: int, window_secs: float) -> None:
        self.limit = limit
        self.window_secs = window_secs
        self.times: deque[float] = deque()

    def add(self, now: float) -> None:
        times = self.times
        times.append(now)
        while times and times[0] < now - self.window_secs:
            times.popleft()

    def too_many(self) -> bool:
        return len(self.times) > self.limit


class FrameGuard:
    """Refuses a frame whose header claims more than `max_size`, as soon as its header is in."""

    __slots__ = ("head", "max_size", "skip")

    def __init__(self, max_size: int, skip: int) -> None:
        self.max_size = max_size
        self.skip = skip  # bytes to pass before the next frame header (the preface, a payload)
        self.head = b""  # a frame header cut by a read

    def passes(self, data: bytes) -> bool:
        i, end = 0, len(data)
        while i < end:
            if self.skip:
                step = min(self.skip, end - i)
                self.skip -= step
                i += step
                continue
            need = 9 - len(self.head)
            self.head += data[i : i + need]
            i += need
            if len(self.head) == 9:
                length = int.from_bytes(self.head[:3], "big")
                if length > self.max_size:
                    return False
                self.skip = length
                self.head = b""
        return True
