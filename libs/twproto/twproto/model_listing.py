"""Model-listing bodies in each client format (``GET /v1/models``, ``/v1/models/{id}``,
``/v1beta/models``).

The gateway lists the models it routes (aliases included) in the shape of the asking client's
SDK, with the context window and output limit from the model specs where known:

* OpenAI: ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}``
  (context window and output limit ride along as extra fields, which the SDK keeps);
* Anthropic: ``{"data": [{"type": "model", "id", "display_name", "created_at"}], "has_more":
  false, "first_id", "last_id"}`` plus ``max_input_tokens`` / ``max_tokens`` where known;
* Gemini: ``{"models": [{"name": "models/<id>", "displayName", "inputTokenLimit",
  "outputTokenLimit", "supportedGenerationMethods"}]}``.

Timestamps are arguments (`ModelInfo.created`, unix seconds), never read from a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from twproto import _json
from twproto.dialect import Dialect

__all__ = ("ModelInfo", "encode_model", "encode_model_list")

_GEMINI_METHODS = ("generateContent", "streamGenerateContent", "countTokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """One listed model. `created` is unix seconds (0 when unknown)."""

    id: str
    display_name: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    owned_by: str = "twserve"
    created: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a model needs an id")


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _openai(model: ModelInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": model.id,
        "object": "model",
        "created": model.created,
        "owned_by": model.owned_by,
    }
    if model.context_window is not None:
        out["context_window"] = model.context_window
    if model.max_output_tokens is not None:
        out["max_output_tokens"] = model.max_output_tokens
    return out


def _anthropic(model: ModelInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "model",
        "id": model.id,
        "display_name": model.display_name or model.id,
        "created_at": _rfc3339(model.created),
    }
    if model.context_window is not None:
        out["max_input_tokens"] = model.context_window
    if model.max_output_tokens is not None:
        out["max_tokens"] = model.max_output_tokens
    return out


def _gemini(model: ModelInfo) -> dict[str, Any]:
    name = model.id if model.id.startswith("models/") else f"models/{model.id}"
    out: dict[str, Any] = {
        "name": name,
        "baseModelId": name.removeprefix("models/"),
        "version": "001",
        "displayName": model.display_name or model.id,
    }
    if model.context_window is not None:
        out["inputTokenLimit"] = model.context_window
    if model.max_output_tokens is not None:
        out["outputTokenLimit"] = model.max_output_tokens
    out["supportedGenerationMethods"] = list(_GEMINI_METHODS)
    return out


_ENCODERS = {
    Dialect.ANTHROPIC: _anthropic,
    Dialect.OPENAI_CHAT: _openai,
    Dialect.OPENAI_RESPONSES: _openai,
    Dialect.GEMINI: _gemini,
}


def encode_model(dialect: Dialect, model: ModelInfo) -> bytes:
    """One model (``GET /v1/models/{id}``) in `dialect`'s shape."""
    return _json.dumps(_ENCODERS[dialect](model))


def encode_model_list(dialect: Dialect, models: list[ModelInfo] | tuple[ModelInfo, ...]) -> bytes:
    """A model listing in `dialect`'s shape, in the given order."""
    items = [_ENCODERS[dialect](m) for m in models]
    body: dict[str, Any]
    if dialect is Dialect.ANTHROPIC:
        body = {
            "data": items,
            "has_more": False,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
        }
    elif dialect is Dialect.GEMINI:
        body = {"models": items}
    else:
        body = {"object": "list", "data": items}
    return _json.dumps(body)
