"""OpenTelemetry traces: a span per request, a child span per upstream attempt.

Theory of operation
-------------------
This module is imported only when traces are on (`twserve.observe.otel_env.traces_wanted`:
the config's ``observability.traces`` section, or the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables), so a
gateway without them never imports opentelemetry and its handler pays one ``is None`` test per
request.

`Tracing` owns the SDK's `TracerProvider` with a `BatchSpanProcessor` feeding the OTLP/HTTP
exporter: ending a span appends it to the processor's queue, and the processor's own thread
exports, so the event loop never waits for the collector. A full queue drops spans (the SDK
counts them); the request does not notice.

Per request the relay calls `Tracing.begin` (twserve.relay.loop, through its hooks), which
starts the request's span (kind SERVER) at the request's arrival, the client's W3C
``traceparent`` continued; then `RequestTrace.attempt` as each attempt's upstream request is
built (twserve.relay.reader) — the attempt's span (kind CLIENT) starts there and its context
goes upstream in ``traceparent``. `Tracing.on_row`, a row listener, ends them when the row is
recorded: each attempt span gets its status, error and events (queued, retry back-off, first
content) from the attempt's record and ends at the attempt's own end time; then the request
span gets the GenAI attributes of the answer and ends. A request refused before the relay gets
its span there, from the row's start. The handler itself does nothing for traces, and nothing
here runs per chunk.

Attribute names follow the OpenTelemetry GenAI semantic conventions (docs/observability.md,
"Traces"). Prompt text is recorded only with ``capture_content: true``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from twengine.attempt import AttemptRecord
from twengine.config import Traces
from twengine.destinations import Destination
from twproto.dialect import Dialect
from twserve.observe.logs import outcome
from twserve.observe.otel_env import ENDPOINT_VARIABLES
from twserve.observe.request_ids import TRACEPARENT_HEADER as TRACEPARENT
from twserve.relay.client import RelayOutcome
from twserve.store.sqlite import RequestRow

if TYPE_CHECKING:
    from twserve.relay.loop import RelayRequest

__all__ = (
    "MAX_CAPTURED_CHARS",
    "RequestTrace",
    "Tracing",
    "parse_traceparent",
    "provider_name",
)

log = logging.getLogger("twserve.observe.traces")

# With capture_content: the prompt recorded on the request span, cut at this many characters.
MAX_CAPTURED_CHARS = 16_384

# gen_ai.provider.name by the upstream's wire format (the GenAI conventions' well-known values).
_PROVIDER_NAMES: Mapping[Dialect, str] = {
    Dialect.ANTHROPIC: "anthropic",
    Dialect.OPENAI_CHAT: "openai",
    Dialect.OPENAI_RESPONSES: "openai",
    Dialect.GEMINI: "gcp.gemini",
}
_HEX = frozenset("0123456789abcdef")


def _endpoint(settings: Traces | None, env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL: the config's, else the variables' as the SDK reads them (the
    traces one as it is, the general one with ``/v1/traces``), else None (the SDK's default)."""
    if settings is not None and settings.endpoint:
        return settings.endpoint
    if env.get(ENDPOINT_VARIABLES[0]):
        return env[ENDPOINT_VARIABLES[0]]
    base = env.get(ENDPOINT_VARIABLES[1])
    if base:
        return base if base.endswith("/v1/traces") else base.rstrip("/") + "/v1/traces"
    return None


def provider_name(dest: Destination) -> str:
    """gen_ai.provider.name of `dest`: ``aws.bedrock`` for Bedrock, else by its format."""
    if dest.target.aws is not None or "bedrock" in dest.target.base_url:
        return "aws.bedrock"
    return _PROVIDER_NAMES.get(dest.target.dialect, "openai")


def parse_traceparent(value: bytes) -> SpanContext | None:
    """A W3C ``traceparent`` (version 00 form, or a later version's first four fields) as a
    remote span context; None for anything malformed or all-zero ids."""
    try:
        text = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    parts = text.split("-")
    if len(parts) < 4:
        return None
    version, trace_id, span_id, flags = parts[:4]
    lengths = (len(version), len(trace_id), len(span_id), len(flags))
    if lengths != (2, 32, 16, 2) or not _HEX.issuperset(version + trace_id + span_id + flags):
        return None
    if version == "ff" or (version == "00" and len(parts) != 4):
        return None
    tid, sid = int(trace_id, 16), int(span_id, 16)
    if tid == 0 or sid == 0:
        return None
    return SpanContext(tid, sid, is_remote=True, trace_flags=TraceFlags(int(flags, 16) & 1))


def _traceparent(context: SpanContext) -> bytes:
    flags = 1 if context.trace_flags.sampled else 0
    return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, flags)


class Tracing:
    """The process's tracer: the SDK provider, its batch processor and OTLP/HTTP exporter."""

    def __init__(
        self,
        settings: Traces | None,
        env: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.capture_content = settings is not None and settings.capture_content
        self.endpoint = _endpoint(settings, env)
        self._clock = clock
        sampler: Sampler | None = None
        if settings is not None:
            sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
        # None: the SDK's own choice, OTEL_TRACES_SAMPLER included (parent-based, always on).
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "twserve"})
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        exporter = OTLPSpanExporter(endpoint=self.endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("twserve")
        # The traces of requests in the relay, by request id, until their rows end them.
        self._open: dict[str, RequestTrace] = {}
        log.info("traces on: OTLP/HTTP to %s", self.endpoint or "the SDK's default endpoint")

    def _parent(self, traceparent: bytes | None) -> Context | None:
        remote = parse_traceparent(traceparent) if traceparent is not None else None
        return trace.set_span_in_context(NonRecordingSpan(remote)) if remote else None

    def begin(self, request: RelayRequest, out: RelayOutcome) -> RequestTrace:
        """The span of a request the relay carries, from its arrival, child of the client's
        ``traceparent`` when it sent a valid one; `out` will hold its attempts' records."""
        headers = request.call.headers
        sent = next((value for name, value in headers if name == TRACEPARENT), None)
        arrival = request.arrival
        late = 0.0 if arrival is None else max(0.0, self._clock() - arrival)
        span = self.tracer.start_span(
            "POST",
            context=self._parent(sent),
            kind=SpanKind.SERVER,
            attributes={"twserve.request_id": request.owner},
            start_time=time.time_ns() - int(late * 1e9),
        )
        found = self._open[request.owner] = RequestTrace(self, span, self._clock, out)
        found.capture(request.body)
        return found

    def on_row(self, row: RequestRow) -> None:
        """A gateway row listener: end the request's spans. A request refused before the relay
        has no trace yet: its span is made now, from the row's start to now."""
        found = self._open.pop(row.id, None)
        if found is None:
            span = self.tracer.start_span(
                "POST",
                context=self._parent(row.traceparent),
                kind=SpanKind.SERVER,
                attributes={"twserve.request_id": row.id},
                start_time=int(row.ts * 1e9),
            )
            found = RequestTrace(self, span, self._clock, None)
        found.end(row)

    def shutdown(self) -> None:
        """Export what is queued and stop the processor's thread (blocks: call from a thread)."""
        self.provider.shutdown()


class RequestTrace:
    """One request's spans: the request's own and one per attempt, by attempt index."""

    __slots__ = ("_answered", "_attempts", "_mono", "_out", "_tracing", "_wall_ns", "span")

    def __init__(
        self, tracing: Tracing, span: Span, clock: Callable[[], float], out: RelayOutcome | None
    ) -> None:
        self._tracing = tracing
        self.span = span
        self._out = out
        # The gateway's clock against the wall clock, to place records' times on the span's.
        self._mono, self._wall_ns = clock(), time.time_ns()
        self._attempts: dict[int, tuple[Span, Destination]] = {}
        self._answered: dict[str, Destination] = {}

    def _ns(self, at: float | None) -> int | None:
        if at is None:
            return None
        return self._wall_ns + int((at - self._mono) * 1e9)

    def capture(self, body: bytes) -> None:
        """With capture_content: the client's request body (its prompt) on the request span."""
        if self._tracing.capture_content and self.span.is_recording():
            text = body[: MAX_CAPTURED_CHARS * 4].decode("utf-8", "replace")
            self.span.set_attribute("gen_ai.input.messages", text[:MAX_CAPTURED_CHARS])

    def attempt(self, index: int, dest: Destination) -> tuple[bytes, bytes]:
        """Start attempt `index`'s span; the ``traceparent`` header that carries it upstream."""
        model = dest.target.model
        url = urlsplit(dest.target.base_url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(dest),
            "gen_ai.request.model": model,
            "twserve.upstream": dest.name,
            "twserve.attempt": index,
        }
        if url.hostname:
            attributes["server.address"] = url.hostname
            attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        span = self._tracing.tracer.start_span(
            f"chat {model}",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        self._attempts[index] = (span, dest)
        return TRACEPARENT, _traceparent(span.get_span_context())

    def end(self, row: RequestRow) -> None:
        """End every span: the attempts' from their records, then the request's from `row`."""
        records = self._out.attempts if self._out is not None else ()
        for index, (span, dest) in sorted(self._attempts.items()):
            record = records[index] if index < len(records) else None
            self._end_attempt(span, dest, record)
            self._answered[dest.name] = dest
        self._attempts.clear()
        span = self.span
        if span.is_recording():
            span.update_name(f"POST {row.path}")
            span.set_attributes(_request_attributes(row, self._served(row)))
            stop = self._out.stop_reason if self._out is not None else None
            if stop is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [str(stop.value)])
            if row.error_code is not None and not row.cancelled:
                span.set_status(Status(StatusCode.ERROR, row.error_code))
        span.end()

    def _served(self, row: RequestRow) -> Destination | None:
        """The destination of the upstream that answered (its last attempt)."""
        return self._answered.get(row.provider) if row.provider is not None else None

    def _end_attempt(self, span: Span, dest: Destination, record: AttemptRecord | None) -> None:
        if record is None:  # the request ended before the ledger recorded it
            span.end()
            return
        if span.is_recording():
            if record.retry_round > 0:
                span.add_event(
                    "retry",
                    {
                        "twserve.retry": record.retry_round,
                        "twserve.backoff_ms": record.backoff_ms or 0,
                    },
                    timestamp=self._ns(record.sent_at),
                )
            if record.queued_ms:
                span.add_event(
                    "queued",
                    {"twserve.queued_ms": record.queued_ms},
                    timestamp=self._ns(record.sent_at),
                )
            if record.first_content_at is not None:
                span.add_event("first_content", timestamp=self._ns(record.first_content_at))
            span.set_attribute("twserve.outcome", record.outcome.value)
            if record.status is not None:
                span.set_attribute("http.response.status_code", record.status)
            if record.resend is not None:
                span.set_attribute("twserve.resend", record.resend.value)
            if record.outcome.value not in ("ok", "cancelled"):
                kind = record.error or "error"
                span.set_attribute("error.type", kind)
                span.set_status(Status(StatusCode.ERROR, kind))
        span.end(end_time=self._ns(record.ended_at))


def _request_attributes(row: RequestRow, served: Destination | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "http.request.method": "POST",
        "url.path": row.path,
        "twserve.outcome": outcome(row),
    }
    if row.format is not None:
        attributes["twserve.client_format"] = row.format
    if row.model is not None:
        attributes["gen_ai.request.model"] = row.model
    if row.key_name is not None:
        attributes["twserve.key"] = row.key_name
    if row.correlation_id is not None:
        attributes["twserve.correlation_id"] = row.correlation_id
    if row.status is not None:
        attributes["http.response.status_code"] = row.status
    if row.error_code is not None:
        attributes["error.type"] = row.error_code
    if served is not None:
        attributes["gen_ai.provider.name"] = provider_name(served)
        attributes["gen_ai.response.model"] = served.target.model
        attributes["twserve.upstream"] = served.name
    if row.input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = row.input_tokens
    if row.output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = row.output_tokens
    if row.ttfb_ms is not None:
        attributes["twserve.ttfc_ms"] = row.ttfb_ms
    return attributes
