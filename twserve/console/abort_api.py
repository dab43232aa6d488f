"""``POST /requests/{id}/abort``: abort a running request from the control plane.

The id is the row's, the one its client got in ``x-request-id``. A request running on this
instance is aborted where it is (`twserve.relay.abort`): its client gets ``gw.request.aborted``
in its own format, the abort counts against no upstream, its row is written with
``cancelled`` and the usage so far, and `RequestAborted` is published on ``/events``.

An id that is not running here is looked up in the request store: a stored (or just finished)
request is 409 ``control.abort.finished``, any other id 404 ``control.abort.unknown_request``.
With several instances, the abort must go to the control listener of the instance that serves
the request (docs/console.md, "Aborting a request").
"""

from __future__ import annotations

import re
from typing import Any

from twproto import json_loads
from twserve.events import EventBus, RequestAborted
from twserve.gateway.handler import Gateway
from twserve.relay.abort import abort_error
from twserve.server.base import Request
from twserve.store.listing import RequestFilter
from twserve.store.sqlite import Store, StoreReadError

__all__ = ["ABORT_PATH", "MAX_REASON_CHARS", "RequestAborter"]

ABORT_PATH = re.compile(r"^/requests/([^/]{1,128})/abort$")

#: The longest `reason` an abort may carry (it goes into the client's error message).
MAX_REASON_CHARS = 200


def _error(status: int, code: str, message: str) -> tuple[int, Any]:
    return status, {"error": {"code": code, "message": message}}


class RequestAborter:
    """The abort endpoint over the gateway's running requests and the store."""

    def __init__(self, gateway: Gateway, store: Store, events: EventBus) -> None:
        self.gateway, self.store, self.events = gateway, store, events
        # A request is finished once its row is written (the store may take a moment more).
        aborts = gateway.aborts
        gateway.row_listeners.append(lambda row: aborts.ended(row.id))

    async def handle(self, request: Request) -> tuple[int, Any] | None:
        """The answer for an abort path, None for any other path."""
        match = ABORT_PATH.match(request.path)
        if match is None:
            return None
        if request.method != "POST":
            return _error(
                405,
                "control.request.method_not_allowed",
                f"{request.path} answers POST, not {request.method}",
            )
        reason = self._reason(request.body)
        if isinstance(reason, tuple):
            return reason
        request_id = match[1]
        aborts = self.gateway.aborts
        stage = aborts.abort(request_id, abort_error(reason))
        if stage:
            self.events.publish(
                RequestAborted(id=request_id, ts=self.gateway.wall(), stage=stage, reason=reason)
            )
            return 200, {"id": request_id, "aborted": True, "stage": stage}
        if stage == "" or aborts.finished_lately(request_id):
            return self._finished(request_id)
        try:
            rows = await self.store.page(RequestFilter(limit=1, find=request_id))
        except StoreReadError as exc:
            return _error(503, "control.store_unavailable", str(exc))
        if any(row.get("id") == request_id for row in rows):
            return self._finished(request_id)
        return _error(
            404, "control.abort.unknown_request", f"no request {request_id!r} runs or ran here"
        )

    @staticmethod
    def _finished(request_id: str) -> tuple[int, Any]:
        return _error(
            409, "control.abort.finished", f"request {request_id!r} has finished (or is ending)"
        )

    @staticmethod
    def _reason(body: bytes) -> str | tuple[int, Any] | None:
        if not body.strip():
            return None
        try:
            parsed = json_loads(body)
        except ValueError:
            return _error(400, "control.request.bad_json", "the body is not valid JSON")
        if not isinstance(parsed, dict) or set(parsed) - {"reason"}:
            return _error(400, "control.request.invalid", 'the body is {} or {"reason": "<text>"}')
        reason = parsed.get("reason")
        if reason is None:
            return None
        if not isinstance(reason, str) or not reason.isprintable():
            return _error(400, "control.request.invalid", "reason must be printable text")
        if len(reason) > MAX_REASON_CHARS:
            return _error(
                400, "control.request.invalid", f"reason is over {MAX_REASON_CHARS} characters"
            )
        return reason or None
