"""Azure OpenAI as an upstream: the ``azure-openai`` protocol, Chat Completions or Responses.

A resource (``https://{resource}.openai.azure.com``) serves a model through a *deployment*
named by its owner. Two path families reach it:

* with an ``api_version`` (``2024-10-21``…): Chat at
  ``/openai/deployments/{deployment}/chat/completions?api-version=…``, Responses at
  ``/openai/responses?api-version=…`` (the deployment in the body's ``model``);
* the v1 API (``api_version`` unset or ``v1``): ``/openai/v1/chat/completions`` and
  ``/openai/v1/responses``, the deployment in the body's ``model``.

Either way the body's ``model`` is the deployment name. The credential is the resource's key in
the ``api-key`` header, or a Microsoft Entra ID access token as ``Authorization: Bearer``
(docs/cloud.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from twproto import _json
from twproto.dialect import Dialect

__all__ = (
    "AzureRoute",
    "azure_body",
    "azure_key_headers",
    "azure_path",
)

Header = tuple[bytes, bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class AzureRoute:
    """How an Azure OpenAI upstream is reached: the deployment serving the model, the
    ``api-version`` (None: the v1 paths) and whether the key is an Entra ID token (`entra`:
    sent as a bearer token instead of ``api-key``)."""

    deployment: str
    api_version: str | None = None
    entra: bool = False


def azure_path(route: AzureRoute, dialect: Dialect) -> str:
    """The path (with query) of the Chat (`dialect` OpenAI Chat) or Responses call."""
    version = route.api_version
    responses = dialect is Dialect.OPENAI_RESPONSES
    if version is None or version == "v1":
        return "/openai/v1/responses" if responses else "/openai/v1/chat/completions"
    query = "?api-version=" + quote(version, safe="-._~")
    if responses:
        return "/openai/responses" + query
    return f"/openai/deployments/{quote(route.deployment, safe='-._~')}/chat/completions" + query


def azure_body(body: bytes, route: AzureRoute, model: str) -> bytes:
    """`body` (already translated for the upstream, with `model` in it) with the deployment
    name as its ``model``; unchanged when the deployment is named as the model."""
    if route.deployment == model:
        return body
    obj: dict[str, Any] = _json.loads(body)
    obj["model"] = route.deployment
    return _json.dumps(obj)


def azure_key_headers(route: AzureRoute, key: str) -> list[Header]:
    """The header carrying `key`: ``api-key``, or ``Authorization: Bearer`` for an Entra ID
    token (none for an empty key)."""
    if not key:
        return []
    if route.entra:
        return [(b"authorization", b"Bearer " + key.encode())]
    return [(b"api-key", key.encode())]
