"""How a cloud platform's upstream is reached, read from its fields and the environment at send
time (docs/cloud.md).

* **Vertex AI** (``vertex-gemini``, ``vertex-anthropic``): the ``project`` (else
  ``GOOGLE_CLOUD_PROJECT``) and ``location`` (else ``GOOGLE_CLOUD_LOCATION``, else
  ``global``), which also names the endpoint when ``base_url`` is not set. The credential is an
  OAuth access token: the provider's ``key`` as a static token, or one the gateway obtains
  (`GoogleTokenSource`) from a key file — ``credentials_file``, else
  ``GOOGLE_APPLICATION_CREDENTIALS`` — or from application-default credentials.
* **Azure OpenAI** (``azure-openai``): the deployment of the model sent (``deployments``, else
  the model's own name), the ``api_version``, and the ``key`` (else ``AZURE_OPENAI_API_KEY``,
  or with ``auth: entra-id`` ``AZURE_OPENAI_AD_TOKEN``).

A value missing or that cannot be sent is a `CredentialFault`: the upstream is skipped like any
upstream whose key is missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from twengine.config.credentials import CredentialFault, _resolve
from twengine.config.model import CloudPlatform, CloudSettings, Provider
from twproto.cloud import AzureRoute, VertexPublisher, VertexRoute, vertex_base_url

__all__ = ("CloudAccess", "GoogleTokenSource", "cloud_faults", "resolve_cloud")

# A Vertex location names a host (``{location}-aiplatform.googleapis.com``).
_LOCATION = re.compile(r"[a-z][a-z0-9-]{0,62}")
_DEFAULT_LOCATION = "global"


@dataclass(frozen=True, slots=True, kw_only=True)
class GoogleTokenSource:
    """Where a Vertex upstream's access token comes from: a key file (a service account's JSON
    key, or any credentials file google-auth reads), or with `file` None the
    application-default credentials. The gateway obtains, caches and refreshes the token."""

    file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudAccess:
    """A cloud upstream as its attempts reach it: the platform's route, the base URL (the
    configured one, else the Vertex location's endpoint), the key to send (``""`` while a
    token is still to be obtained from `token_source`)."""

    route: VertexRoute | AzureRoute
    base_url: str
    key: str
    token_source: GoogleTokenSource | None = None


def _field(
    provider: str,
    field: str,
    template: str | None,
    variable: str,
    env: Mapping[str, str],
) -> str | CredentialFault | None:
    """`template` resolved, else `variable`'s value, else None."""
    if template is not None:
        return _resolve(provider, field, template, env, secret=True)
    if env.get(variable):
        return _resolve(provider, field, "${" + variable + "}", env, secret=True)
    return None


def _missing(provider: str, field: str, variable: str) -> CredentialFault:
    return CredentialFault(
        provider=provider,
        field=field,
        code="gw.upstream.credentials_missing",
        message=f"upstream {provider!r}: {field} is not in the config and environment "
        f"variable {variable} is not set",
        variable=variable,
    )


def _vertex(
    provider: Provider, cloud: CloudSettings, key: str, env: Mapping[str, str]
) -> CloudAccess | CredentialFault:
    name = provider.name
    project = _field(name, "project", cloud.project, "GOOGLE_CLOUD_PROJECT", env)
    if project is None:
        return _missing(name, "project", "GOOGLE_CLOUD_PROJECT")
    if isinstance(project, CredentialFault):
        return project
    location = _field(name, "location", cloud.location, "GOOGLE_CLOUD_LOCATION", env)
    if isinstance(location, CredentialFault):
        return location
    location = location or _DEFAULT_LOCATION
    if not _LOCATION.fullmatch(location):
        return CredentialFault(
            provider=name,
            field="location",
            code="gw.upstream.credentials_invalid",
            message=f"upstream {name!r}: location is not a Vertex AI location name",
        )
    publisher = (
        VertexPublisher.GOOGLE
        if cloud.platform is CloudPlatform.VERTEX_GEMINI
        else VertexPublisher.ANTHROPIC
    )
    route = VertexRoute(project=project, location=location, publisher=publisher)
    base_url = provider.base_url or vertex_base_url(location)
    if provider.key is not None:
        return CloudAccess(route=route, base_url=base_url, key=key)  # a static access token
    file = _field(
        name, "credentials_file", cloud.credentials_file, "GOOGLE_APPLICATION_CREDENTIALS", env
    )
    if isinstance(file, CredentialFault):
        return file
    return CloudAccess(
        route=route, base_url=base_url, key="", token_source=GoogleTokenSource(file=file)
    )


def _azure(
    provider: Provider, cloud: CloudSettings, model: str, key: str, env: Mapping[str, str]
) -> CloudAccess | CredentialFault:
    name = provider.name
    version: str | None = None
    if cloud.api_version is not None:
        found_version = _resolve(name, "api_version", cloud.api_version, env, secret=True)
        if isinstance(found_version, CredentialFault):
            return found_version
        version = found_version
    if provider.key is None:
        variable = "AZURE_OPENAI_AD_TOKEN" if cloud.entra else "AZURE_OPENAI_API_KEY"
        found = _field(name, "key", None, variable, env)
        if found is None:
            return _missing(name, "key", variable)
        if isinstance(found, CredentialFault):
            return found
        key = found
    route = AzureRoute(deployment=cloud.deployment(model), api_version=version, entra=cloud.entra)
    return CloudAccess(route=route, base_url=provider.base_url, key=key)


def resolve_cloud(
    provider: Provider, model: str, key: str, env: Mapping[str, str]
) -> CloudAccess | CredentialFault:
    """How `provider` (a cloud platform's: `provider.cloud` is set) is reached for `model`,
    its `key` already resolved (``""`` for none), the rest read from its fields and `env`."""
    cloud = provider.cloud
    assert cloud is not None
    if cloud.platform is CloudPlatform.AZURE_OPENAI:
        return _azure(provider, cloud, model, key, env)
    return _vertex(provider, cloud, key, env)


def cloud_faults(provider: Provider, env: Mapping[str, str]) -> tuple[CredentialFault, ...]:
    """The first problem with a cloud provider's own fields under `env` (none for any other
    provider), as the config check reports it (its key is checked with the others)."""
    if provider.cloud is None:
        return ()
    found = resolve_cloud(provider, "", "", env)
    return (found,) if isinstance(found, CredentialFault) else ()
