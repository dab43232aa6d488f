"""The log's writer: a bounded queue and one thread, so that a slow log never stops the loop.

Theory of operation
-------------------
A process whose stderr is a pipe nobody reads (a supervisor that stopped reading, a container
runtime that is stuck) blocks at its next write once the pipe's buffer is full. Written from
the event loop, that write would stop every request. `LineWriter` is the root logger's handler
instead: `LineWriter.put` (and ``emit``, for the logging module's records) appends the item to
a queue and returns; a thread of its own formats the items and writes them, blocking there
alone when the stream does not take them.

After each write the thread lets lines gather for `GATHER_SECS` before it takes the next ones
(as the request store's writer does with its rows). A thread that waits on the queue is woken
by every `put`, a system call and a hand-over of the interpreter's lock on the loop's side for
each line; one that sleeps is not, so under steady traffic one wake-up serves a window's lines.
A line reaches the stream at most that much later; `flush` and `close` wait for it as before.

The queue is bounded by ``observability.log_queue_lines``: an item that finds it full is
dropped and counted (`LineWriter.dropped`, shown in ``GET /status`` under ``log``). Once the
stream takes lines again, the thread writes one line saying how many were dropped. `close`
(at stop, and by the logging module at exit) writes what is queued, waiting at most
`CLOSE_WAIT_SECS` for a stream that does not move.

An item is a `logging.LogRecord` (formatted by the handler's formatter on the thread) or an
`Access` line captured as a cheap tuple on the loop and formatted on the thread
(twserve.observe.logs.ObservationLog).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TextIO

__all__ = ("CLOSE_WAIT_SECS", "GATHER_SECS", "Access", "LineWriter")

# How long `close` waits for the queued lines to be written to a stream that does not move.
CLOSE_WAIT_SECS = 5.0
# Lines written to the stream in one call at most (the queue is drained in batches).
_BATCH = 256
# After a write, how long the thread lets lines gather before it takes them (module docs).
GATHER_SECS = 0.02


class Access(NamedTuple):
    """An access line as the loop captures it: when, at which level, and the finished row
    (not changed after it is recorded). `render` turns it into the line, on the thread."""

    created: float
    level: int
    row: Any
    render: Callable[[float, int, Any], str]


class _Flush(NamedTuple):
    done: threading.Event


_STOP = object()


class LineWriter(logging.Handler):
    """A logging handler writing lines to `stream` from a thread of its own (module docs)."""

    def __init__(self, stream: TextIO, bound: int) -> None:
        super().__init__()
        self.stream = stream
        self.bound = bound
        self.dropped = 0  # counted by the producers; the thread only reads it
        self.written = 0
        self.lost = 0  # lines the stream refused (closed, broken): counted by the thread
        self._reported = 0
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="twserve-log", daemon=True)
        self._thread.start()

    # -- the producers' side (any thread; the event loop's above all) ------------------------

    def put(self, item: object) -> None:
        """Queue `item`, or drop and count it when `bound` items wait already."""
        if self._queue.qsize() >= self.bound or self._closed:
            self.dropped += 1
            return
        self._queue.put(item)

    def emit(self, record: logging.LogRecord) -> None:
        self.put(record)

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock is taken: the queue is the only thing shared.
        if not self.filter(record):
            return False
        self.put(record)
        return True

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float = CLOSE_WAIT_SECS) -> None:
        """Wait until what was queued before this call is written (at most `timeout`)."""
        if self._closed or not self._thread.is_alive():
            return
        marker = _Flush(threading.Event())
        self._queue.put(marker)
        marker.done.wait(timeout)

    def close(self) -> None:
        """Write what is queued and stop the thread (at most `CLOSE_WAIT_SECS` of waiting)."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join(CLOSE_WAIT_SECS)
        super().close()

    def status(self) -> dict[str, int]:
        """What ``GET /status`` shows under ``log``."""
        return {
            "queue_lines": self.bound,
            "queued": self.queued,
            "written": self.written,
            "dropped": self.dropped,
            "lost": self.lost,
        }

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            batch: list[str] = []
            markers: list[_Flush] = []
            stop = False
            while True:
                if item is _STOP:
                    stop = True
                elif isinstance(item, _Flush):
                    markers.append(item)
                else:
                    line = self._line(item)
                    if line is not None:
                        batch.append(line)
                if stop or len(batch) >= _BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
            missed = self.dropped - self._reported
            if missed > 0:
                self._reported += missed
                self._write([self._notice(missed)])
            for marker in markers:
                marker.done.set()
            if stop:
                return
            if batch:
                time.sleep(GATHER_SECS)  # let the next lines gather (module docs)

    def _line(self, item: object) -> str | None:
        try:
            if isinstance(item, Access):
                return item.render(item.created, item.level, item.row)
            if isinstance(item, logging.LogRecord):
                return self.format(item)
        except Exception:  # a record that cannot be formatted is not worth the thread
            return None
        return None

    def _write(self, lines: list[str]) -> None:
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: the lines are lost
            self.lost += len(lines)
            return
        self.written += len(lines)

    def _notice(self, missed: int) -> str:
        record = logging.LogRecord(
            "twserve.log",
            logging.WARNING,
            __file__,
            0,
            "%d log lines dropped: the log's stream did not take them fast enough",
            (missed,),
            None,
        )
        record.fields = {"event": "log_lines_dropped", "dropped": missed, "total": self.dropped}
        return self.format(record)
