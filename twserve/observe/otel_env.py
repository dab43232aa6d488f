"""Whether traces are on, decided without importing opentelemetry (twserve.observe.traces does,
and is imported only when this says yes)."""

from __future__ import annotations

from collections.abc import Mapping

from twengine.config import Traces

__all__ = ("ENDPOINT_VARIABLES", "traces_wanted")

# The variables every OpenTelemetry SDK reads for the OTLP traces endpoint, in its order.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def traces_wanted(settings: Traces | None, env: Mapping[str, str]) -> bool:
    """Traces are on with an ``observability.traces`` section, or an OTLP endpoint variable
    set, unless OTEL_SDK_DISABLED is ``true`` (as the SDK reads it)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return settings is not None or any(env.get(name) for name in ENDPOINT_VARIABLES)
