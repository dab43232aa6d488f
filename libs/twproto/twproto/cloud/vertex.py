"""Google Vertex AI as an upstream: ``vertex-gemini`` and ``vertex-anthropic``.

Both publishers sit under one resource path, ``/v1/projects/{project}/locations/{location}/
publishers/{publisher}/models/{model}``, on the location's endpoint (`vertex_base_url`):

* **Gemini** (``publishers/google``) takes the Gemini API's body unchanged, at
  ``:generateContent``, ``:streamGenerateContent`` (``?alt=sse`` for SSE, else a JSON array) and
  ``:countTokens``;
* **Anthropic** (``publishers/anthropic``) takes the Anthropic Messages body without ``model``
  (the model is in the path) and with ``anthropic_version: vertex-2023-10-16``, at
  ``:rawPredict`` (whole) and ``:streamRawPredict`` (``stream: true`` stays in the body; the
  answer is the Messages API's SSE).

Either way the credential is a Google OAuth access token sent as ``Authorization: Bearer``
(docs/cloud.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from twproto import _json

__all__ = (
    "VERTEX_ANTHROPIC_VERSION",
    "VertexPublisher",
    "VertexRoute",
    "vertex_anthropic_body",
    "vertex_base_url",
    "vertex_path",
)

VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"


class VertexPublisher(StrEnum):
    """Whose models a Vertex upstream reaches: Google's (Gemini) or Anthropic's (Claude)."""

    GOOGLE = "google"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True, kw_only=True)
class VertexRoute:
    """Where a Vertex upstream's models are: the project, the location (``global`` or a region
    such as ``us-east5``) and the publisher."""

    project: str
    location: str
    publisher: VertexPublisher


def vertex_base_url(location: str) -> str:
    """The Vertex AI endpoint of `location`: ``aiplatform.googleapis.com`` for ``global``, else
    the regional ``{location}-aiplatform.googleapis.com``."""
    if location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def _method(route: VertexRoute, *, stream: bool, count: bool, sse: bool) -> str:
    if route.publisher is VertexPublisher.ANTHROPIC:
        return "streamRawPredict" if stream else "rawPredict"
    if count:
        return "countTokens"
    if not stream:
        return "generateContent"
    return "streamGenerateContent" + ("?alt=sse" if sse else "")


def vertex_path(
    route: VertexRoute, model: str, *, stream: bool, count: bool = False, sse: bool = True
) -> str:
    """The path (with query) of `model`'s method on Vertex: `stream` picks the streaming
    method, `count` Gemini's ``countTokens``, `sse` False a Gemini stream as a JSON array."""
    segment = "-._~"
    return (
        f"/v1/projects/{quote(route.project, safe=segment)}"
        f"/locations/{quote(route.location, safe=segment)}"
        f"/publishers/{route.publisher.value}/models/{quote(model, safe=segment + '@')}:"
        + _method(route, stream=stream, count=count, sse=sse)
    )


def vertex_anthropic_body(body: bytes) -> bytes:
    """The Anthropic Messages `body` (already translated for the upstream) as Vertex takes it:
    no ``model``, ``anthropic_version`` set (kept when the client wrote its own)."""
    obj: dict[str, Any] = _json.loads(body)
    obj.pop("model", None)
    obj.setdefault("anthropic_version", VERTEX_ANTHROPIC_VERSION)
    return _json.dumps(obj)
