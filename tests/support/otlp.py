"""A real OTLP/HTTP traces receiver on loopback: it decodes the protobuf
``ExportTraceServiceRequest`` the SDK's exporter POSTs to ``/v1/traces`` and keeps the spans.

The message classes come from ``opentelemetry-proto`` (installed with the OTLP/HTTP exporter);
the server is the standard library's, on a thread of its own, as a collector is a process of
its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "ReceivedSpan", "otlp_receiver"]

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, which) if which else None


@dataclass
class ReceivedSpan:
    """One span as the receiver decoded it (ids as lower-case hex)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    start_ns: int
    end_ns: int
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.posts: list[tuple[str, str]] = []  # (path, content type) of every export
        self._lock = threading.Lock()
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=KINDS[span.kind],
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes})
                                for e in span.events
                            ],
                            status_code=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            resource=resource,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def wait_spans(self, count: int, timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans received, once at least `count` have come (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.02)
        with self._lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            receiver.posts.append((self.path, self.headers.get("content-type") or ""))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
