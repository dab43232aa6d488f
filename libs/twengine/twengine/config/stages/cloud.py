"""Stage 2 for a cloud platform's provider fields (docs/cloud.md): ``protocol: vertex-gemini``,
``vertex-anthropic`` or ``azure-openai`` with ``project``, ``location``, ``credentials_file``
(Vertex) or ``api_version``, ``deployments``, ``api`` and ``auth`` (Azure). A field of one
platform on another protocol is refused (``config.cloud_field_protocol``)."""

from __future__ import annotations

from enum import StrEnum

from twengine.config.model import CloudPlatform, CloudSettings
from twengine.config.stages.fields import _as_model, _as_secret, _at, _Fields, _Problems
from twproto.dialect import Dialect

__all__ = ()

_VERTEX_FIELDS = ("project", "location", "credentials_file")
_AZURE_FIELDS = ("api_version", "deployments", "api", "auth")
_FIELDS = {
    CloudPlatform.VERTEX_GEMINI: _VERTEX_FIELDS,
    CloudPlatform.VERTEX_ANTHROPIC: _VERTEX_FIELDS,
    CloudPlatform.AZURE_OPENAI: _AZURE_FIELDS,
}


class _AzureApi(StrEnum):
    """Which OpenAI API an Azure upstream is sent: Chat Completions or Responses."""

    CHAT = "chat"
    RESPONSES = "responses"


class _AzureAuth(StrEnum):
    """What an Azure upstream's `key` is: the resource key (``api-key`` header) or a
    Microsoft Entra ID access token (``Authorization: Bearer``)."""

    API_KEY = "api-key"
    ENTRA_ID = "entra-id"


def _platform(f: _Fields) -> CloudPlatform | None:
    raw = f.raw("protocol")
    return CloudPlatform(raw) if isinstance(raw, str) and raw in set(CloudPlatform) else None


def _deployments(out: _Problems, f: _Fields) -> tuple[tuple[str, str], ...]:
    table = f.mapping("deployments")
    if table is None:
        return ()
    pairs: list[tuple[str, str]] = []
    for model, deployment in table.items():
        path = _at(f.at("deployments"), str(model))
        name = _as_model(out, path, model)
        value = _as_model(out, path, deployment)
        if name is not None and value is not None:
            pairs.append((name, value))
    return tuple(pairs)


def _cloud(out: _Problems, f: _Fields) -> tuple[CloudSettings, Dialect] | None:
    """The provider's cloud settings and the format it speaks; None for any other protocol
    (where the platforms' fields are refused)."""
    platform = _platform(f)
    allowed = _FIELDS.get(platform, ()) if platform is not None else ()
    for field_name in (*_VERTEX_FIELDS, *_AZURE_FIELDS):
        if f.has(field_name) and field_name not in allowed:
            out.add(
                "config.cloud_field_protocol",
                f.at(field_name),
                f"{field_name} is a field of protocol "
                + (
                    "vertex-gemini or vertex-anthropic"
                    if field_name in _VERTEX_FIELDS
                    else "azure-openai"
                )
                + " only",
            )
    if platform is None:
        return None

    def template(name: str) -> str | None:
        return _as_secret(out, f.at(name), f.raw(name)) if f.has(name) else None

    if platform is CloudPlatform.AZURE_OPENAI:
        api = f.choice("api", _AzureApi, _AzureApi.CHAT)
        auth = f.choice("auth", _AzureAuth, _AzureAuth.API_KEY)
        settings = CloudSettings(
            platform=platform,
            api_version=template("api_version"),
            deployments=_deployments(out, f),
            entra=auth is _AzureAuth.ENTRA_ID,
        )
        dialect = Dialect.OPENAI_RESPONSES if api is _AzureApi.RESPONSES else Dialect.OPENAI_CHAT
        return settings, dialect
    settings = CloudSettings(
        platform=platform,
        project=template("project"),
        location=template("location"),
        credentials_file=template("credentials_file"),
    )
    gemini = platform is CloudPlatform.VERTEX_GEMINI
    return settings, Dialect.GEMINI if gemini else Dialect.ANTHROPIC
