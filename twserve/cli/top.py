"""``twserve top``: live traffic, upstream states and key usage in the terminal (docs/console.md).

It reads a running gateway's control plane with the control key, as the console does: a thread
follows ``GET /events`` (each request as it starts, is routed, finishes, fails or is aborted;
upstream pauses), and the main loop asks ``/providers``, ``/keys`` and ``/overview`` every
``--interval`` seconds and redraws the screen with rich's `Live`. The first traffic comes from
``GET /requests`` (the newest stored rows), so the screen is not empty before the next request.

`TopState` holds what is shown and turns the events into rows; it is fed from the reader thread
and drawn from the main one, under its lock. Nothing here writes to the gateway.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from twproto import json_loads
from twproto.sse import SSEDecoder

__all__ = ["TopState", "add_commands", "cmd_top"]

# Requests kept on screen, newest first.
TRAFFIC_ROWS = 20
_EVENT_TYPES = (
    "RequestStarted,RequestRouted,RequestFinished,RequestFailed,RequestAborted,HealthChanged"
)


def _clock(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


class TopState:
    """The screen's contents: recent requests (from events and the store), the views' answers,
    and whether the event stream is connected."""

    def __init__(self, keep: int = TRAFFIC_ROWS) -> None:
        self.keep = keep
        self.lock = threading.Lock()
        self.requests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.views: dict[str, Any] = {}
        self.connected = False
        self.problem: str | None = None  # the last error reaching the control plane
        self.notes: list[str] = []  # upstream pauses and resumes, newest last

    def _row(self, request_id: str) -> dict[str, Any]:
        row = self.requests.get(request_id)
        if row is None:
            row = self.requests[request_id] = {"id": request_id, "state": "running"}
            while len(self.requests) > self.keep:
                self.requests.popitem(last=False)
        return row

    def on_event(self, name: str, data: Mapping[str, Any]) -> None:
        """One event of ``/events`` (its SSE name and JSON data)."""
        with self.lock:
            if name == "HealthChanged":
                what = "paused" if data.get("paused") else "back"
                note = f"{data.get('upstream')} {what} ({data.get('reason')})"
                self.notes = [*self.notes[-2:], f"{_clock(data.get('ts'))} {note}"]
                return
            request_id = data.get("id")
            if not isinstance(request_id, str):
                return
            if name == "RequestStarted":
                self._row(request_id).update(ts=data.get("ts"), key=data.get("key"))
                return
            if request_id not in self.requests:
                return  # started before we listened: the store's page has it, or it is gone
            row = self.requests[request_id]
            if name == "RequestRouted":
                candidates = data.get("candidates") or []
                row.update(model=data.get("model"), provider=candidates[0] if candidates else None)
            elif name == "RequestAborted":
                row["state"] = "aborting"
            elif name in ("RequestFinished", "RequestFailed"):
                self._ended(row, name == "RequestFinished", data)

    @staticmethod
    def _ended(row: dict[str, Any], ok: bool, data: Mapping[str, Any]) -> None:
        code = data.get("error_code")
        row.update(
            model=data.get("model") or row.get("model"),
            provider=data.get("provider") or row.get("provider"),
            status=data.get("status"),
            ttfb_ms=data.get("ttfb_ms"),
            duration_ms=data.get("duration_ms"),
            tokens=(data.get("input_tokens"), data.get("output_tokens")),
            error=code,
        )
        if ok:
            row["state"] = "ok"
        elif code == "gw.request.aborted":
            row["state"] = "aborted"
        else:
            row["state"] = "cancelled" if data.get("cancelled") else "failed"

    def add_stored(self, rows: list[dict[str, Any]]) -> None:
        """The newest stored rows (``GET /requests``, newest first), under what events added."""
        with self.lock:
            known = self.requests
            older = OrderedDict()
            for stored in reversed(rows):
                if stored["id"] in known:
                    continue
                ok = (stored.get("status") or 0) < 400 and not stored.get("cancelled")
                row = {"id": stored["id"], "ts": stored.get("ts"), "key": stored.get("key_name")}
                self._ended(row, ok, stored)
                older[stored["id"]] = row
            older.update(known)
            while len(older) > self.keep:
                older.popitem(last=False)
            self.requests = older

    def render(self) -> Any:
        """The screen: traffic, upstreams, keys (rich renderables)."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self.lock:
            requests = list(reversed(self.requests.values()))
            views, notes = dict(self.views), list(self.notes)
            connected, problem = self.connected, self.problem
        overview = views.get("overview") or {}
        totals = overview.get("requests") or {}
        head = Text.assemble(
            ("twserve top", "bold"),
            f"  requests {totals.get('requests', '-')}  in flight {totals.get('in_flight', '-')}"
            f"  failed {totals.get('failed', '-')}  events ",
            ("live", "green") if connected else ("disconnected", "red"),
            *([(f"  {problem}", "red")] if problem else []),
        )
        traffic = Table(title="Traffic", expand=True, title_justify="left")
        for column in ("time", "id", "key", "model", "upstream", "state", "ttfb", "ms", "tokens"):
            # The id whole (it is what POST /requests/{id}/abort takes); the state may wrap.
            traffic.add_column(column, no_wrap=column != "state", min_width=len(column))
        styles = {"ok": "green", "failed": "red", "aborted": "magenta", "running": "yellow"}
        for r in requests:
            state = r.get("state", "")
            shown = state if r.get("status") is None else f"{state} {r['status']}"
            if r.get("error"):
                shown += f" {r['error']}"
            tokens = r.get("tokens") or (None, None)
            traffic.add_row(
                _clock(r.get("ts")),
                r["id"],
                r.get("key") or "",
                r.get("model") or "",
                r.get("provider") or "",
                Text(shown, style=styles.get(state, "")),
                "" if r.get("ttfb_ms") is None else str(r["ttfb_ms"]),
                "" if r.get("duration_ms") is None else str(r["duration_ms"]),
                "" if tokens[0] is None else f"{tokens[0]}/{tokens[1] or 0}",
            )
        return Group(head, traffic, _upstreams(views, notes), _keys(views))


def _upstreams(views: Mapping[str, Any], notes: list[str]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Upstreams", expand=True, title_justify="left", caption=" · ".join(notes))
    for column in ("name", "state", "failures", "success", "slots", "first content ms"):
        table.add_column(column, no_wrap=True)
    for p in (views.get("providers") or {}).get("providers", []):
        if p.get("paused_until") is not None:
            state = Text(
                f"paused ({p.get('pause_reason')}) until {_clock(p['paused_until'])}", style="red"
            )
        else:
            state = Text("ok", style="green")
        rate = p.get("success_rate")
        limit = p.get("max_concurrent")
        table.add_row(
            p["name"],
            state,
            str(p.get("failures_in_row", 0)),
            "" if rate is None else f"{rate * 100:.0f}%",
            f"{p.get('in_flight', 0)}/{limit if limit is not None else '∞'}",
            "" if p.get("first_content_median_ms") is None else str(p["first_content_median_ms"]),
        )
    return table


def _keys(views: Mapping[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="Keys", expand=True, title_justify="left")
    for column in ("name", "in flight", "limits (used/amount, reset)", "state"):
        table.add_column(column)
    for k in (views.get("keys") or {}).get("keys", []):
        limits = []
        for lim in k.get("limits") or []:
            reset = f" {_clock(lim['reset'])}" if lim.get("reset") is not None else ""
            limits.append(
                f"{lim.get('per')} {lim.get('measure')} {lim.get('used')}/{lim.get('amount')}"
                f" ({lim.get('percent', 0)}%){reset}"
            )
        flags = [
            word
            for word, on in (("disabled", k.get("disabled")), ("expired", k.get("expired")))
            if on
        ]
        table.add_row(
            k["name"],
            str(k.get("in_flight", 0)),
            "; ".join(limits) or "-",
            " ".join(flags) or "ok",
        )
    return table


class ControlReader:
    """Blocking reads of one control plane (httpcore; the CLI's, never the gateway's)."""

    def __init__(self, base_url: str, key: str, timeout: float = 10.0) -> None:
        self.base = base_url.rstrip("/")
        self.headers = [(b"authorization", b"Bearer " + key.encode())]
        self.timeout = timeout

    def get(self, path: str) -> Any:
        import httpcore

        timeouts = {"connect": self.timeout, "read": self.timeout, "pool": self.timeout}
        response = httpcore.request(
            "GET", self.base + path, headers=self.headers, extensions={"timeout": timeouts}
        )
        data = json_loads(response.content)
        if response.status != 200:
            error = (data or {}).get("error") or {} if isinstance(data, dict) else {}
            raise ConnectionError(f"{path}: {response.status} {error.get('code')}")
        return data

    def follow(self, on_event: Callable[[str, Any], None], state: TopState) -> None:
        """Follow ``/events`` until the process ends, reconnecting after a second when cut."""
        import httpcore

        while True:
            try:
                with httpcore.stream(
                    "GET",
                    f"{self.base}/events?types={_EVENT_TYPES}",
                    headers=self.headers,
                    # The plane sends a keep-alive comment every 15 s.
                    extensions={"timeout": {"connect": self.timeout, "read": 60.0}},
                ) as response:
                    if response.status != 200:
                        raise ConnectionError(f"/events: {response.status}")
                    state.connected, state.problem = True, None
                    decoder = SSEDecoder()
                    for chunk in response.iter_stream():
                        for event in decoder.feed(chunk):
                            if event.event and event.data:
                                on_event(event.event, json_loads(event.data))
            except (httpcore.NetworkError, httpcore.TimeoutException, ConnectionError) as exc:
                state.problem = str(exc) or type(exc).__name__
            state.connected = False
            time.sleep(1.0)


def _refresh(reader: ControlReader, state: TopState) -> None:
    import httpcore

    try:
        views = {name: reader.get("/" + name) for name in ("overview", "providers", "keys")}
    except (httpcore.NetworkError, httpcore.TimeoutException, ConnectionError, ValueError) as exc:
        state.problem = str(exc) or type(exc).__name__
        return
    with state.lock:
        state.views = views


def cmd_top(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from twserve.cli.main import _config_path
    from twserve.config.files import load_config
    from twserve.control.plane import control_key_of

    path = _config_path(args)
    config = (
        load_config(path) if path.exists() and not (args.control and args.control_key) else None
    )
    url = args.control
    if not url and config is not None:
        control = config.listen.control
        url = f"http://{control.bind}:{control.port}"
    key = args.control_key or os.environ.get("TWSERVE_CONTROL_KEY")
    if not key and config is not None:
        key = control_key_of(config)
    if not url or not key:
        print(
            "name the control plane: --control URL and --control-key (or $TWSERVE_CONTROL_KEY), "
            "or a config file that has them",
            file=sys.stderr,
        )
        return 2
    reader, state = ControlReader(url, key), TopState()
    try:
        state.add_stored(reader.get(f"/requests?limit={TRAFFIC_ROWS}")["requests"])
    except Exception as exc:
        state.problem = str(exc) or type(exc).__name__
    _refresh(reader, state)
    if args.once:
        Console().print(state.render())
        return 0 if state.problem is None else 1
    threading.Thread(target=reader.follow, args=(state.on_event, state), daemon=True).start()
    next_views = time.monotonic() + args.interval
    try:
        with Live(state.render(), refresh_per_second=4, screen=args.screen) as live:
            while True:
                time.sleep(0.25)
                if time.monotonic() >= next_views:
                    _refresh(reader, state)
                    next_views = time.monotonic() + args.interval
                live.update(state.render())
    except KeyboardInterrupt:
        return 0


def add_commands(sub: Any) -> None:
    """Add ``top`` to the CLI's subcommands."""
    p = sub.add_parser("top", help="live traffic, upstream states and key usage (control plane)")
    p.add_argument("--control", metavar="URL", help="the control plane (default: the config's)")
    p.add_argument(
        "--control-key", help="control key (default: $TWSERVE_CONTROL_KEY, else the config's)"
    )
    p.add_argument("--config", help="config file (default: $TWSERVE_HOME/config.yaml)")
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between view reads (default 2)"
    )
    p.add_argument("--once", action="store_true", help="print the screen once and exit")
    p.add_argument("--screen", action="store_true", help="use the terminal's alternate screen")
    p.set_defaults(func=cmd_top)
