"""Access tokens for Vertex AI upstreams, obtained through google-auth (``twserve[vertex]``).

A Vertex upstream without a static ``key`` names where its token comes from
(`twengine.config.cloud_access.GoogleTokenSource`): a key file (a service account's JSON key,
or any credentials file google-auth reads) or the application-default credentials. `CloudTokens`
keeps one google-auth credentials object per source, loaded once, and its token:

* a token google-auth calls **fresh** is used as it is;
* a **stale** one (valid, but within google-auth's refresh threshold of its expiry, 3 min 45 s)
  is refreshed ahead of its expiry by the first request that sees it, while every request that
  arrives during that refresh goes on with the still-valid token;
* with no token, or an expired one, requests wait for the one refresh under way (and use its
  token, even one already stale: a token shorter-lived than the threshold is stale from the
  start);
* a stale token whose refresh fails is still used until it expires.

google-auth's ``refresh`` (a blocking HTTP call to the token endpoint) and the loading of the
file run in a worker thread, never on the event loop, and one refresh at a time per source. A
source that cannot give a token (google-auth not installed, the file unreadable, the token
endpoint refusing) is a `CredentialFault` with code ``gw.upstream.token_unavailable``: that
upstream is skipped like one whose key is missing (docs/cloud.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from twengine.catalog import Catalog
from twengine.config import Config
from twengine.config.cloud_access import GoogleTokenSource
from twengine.config.credentials import CredentialFault
from twengine.destinations import Destination, no_usable_credentials, request_destinations
from twengine.rules import Candidate
from twproto.errors import GatewayError

__all__ = ["GOOGLE_SCOPES", "CloudTokens"]

# The scope Vertex AI's generative endpoints take.
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

_CODE = "gw.upstream.token_unavailable"


def _load(source: GoogleTokenSource) -> Any:
    """The google-auth credentials of `source` (blocking: reads files, may probe metadata).

    A key file is read as its ``type`` says, with that type's own loader (google-auth's
    type-guessing loader is deprecated: a file from elsewhere could name any credential type):
    a service account's key or an ``authorized_user`` file (``gcloud auth
    application-default login``). Other types are refused here; they work through
    application-default credentials."""
    import google.auth

    if source.file is None:
        credentials, _project = google.auth.default(scopes=list(GOOGLE_SCOPES))
        return credentials
    with open(source.file, encoding="utf-8") as handle:
        info = json.load(handle)
    kind = info.get("type") if isinstance(info, dict) else None
    if kind == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=list(GOOGLE_SCOPES)
        )
    if kind == "authorized_user":
        from google.oauth2 import credentials as user

        return user.Credentials.from_authorized_user_info(  # type: ignore[no-untyped-call]
            info, scopes=list(GOOGLE_SCOPES)
        )
    raise _Unsupported(str(kind))


class _Unsupported(ValueError):
    """A key file of a type read only through application-default credentials."""


def _refresh(credentials: Any) -> None:
    """One refresh of `credentials` (blocking: an HTTP call to the token endpoint)."""
    from google.auth.transport.requests import Request

    credentials.refresh(Request())


class _Entry:
    __slots__ = ("credentials", "lock", "refreshed")

    def __init__(self) -> None:
        self.credentials: Any = None
        self.lock = anyio.Lock()
        self.refreshed = 0  # refreshes made, so a waiter sees that one happened meanwhile


def _state(credentials: Any) -> str:
    """google-auth's view of the token: ``fresh``, ``stale`` (valid, refresh ahead) or
    ``invalid`` (none, or expired)."""
    if credentials is None:
        return "invalid"
    return str(credentials.token_state.name).lower()


class CloudTokens:
    """Vertex AI access tokens by source, cached and refreshed ahead of expiry; see the module
    docstring."""

    def __init__(self) -> None:
        self._entries: dict[GoogleTokenSource, _Entry] = {}
        # How many refreshes were made (tests and the docs' figures read it).
        self.refreshes = 0

    async def token(self, source: GoogleTokenSource, provider: str) -> str | CredentialFault:
        """A valid access token for `source`, or why there is none (for upstream `provider`)."""
        entry = self._entries.setdefault(source, _Entry())
        state = _state(entry.credentials)
        if state == "fresh" or (state == "stale" and entry.lock.locked()):
            return str(entry.credentials.token)
        seen = entry.refreshed
        async with entry.lock:
            # Another request may have refreshed while this one waited: its token is used, even
            # one already stale (a token shorter-lived than the threshold is stale from the start).
            now = _state(entry.credentials)
            if now == "fresh" or (now == "stale" and entry.refreshed != seen):
                return str(entry.credentials.token)
            # A stale token stays usable if its refresh fails.
            fallback = str(entry.credentials.token) if now == "stale" else None
            try:
                if entry.credentials is None:
                    entry.credentials = await anyio.to_thread.run_sync(_load, source)
                await anyio.to_thread.run_sync(_refresh, entry.credentials)
                self.refreshes += 1
                entry.refreshed += 1
            except ImportError:
                return self._fault(provider, "google-auth is not installed (twserve[vertex])")
            except _Unsupported as exc:
                return self._fault(provider, f"a key file of type {exc} (use ADC for it)")
            except Exception as exc:
                if fallback is not None and _state(entry.credentials) == "stale":
                    return fallback
                # The file's path, a token endpoint's answer: the type alone, never a value.
                return self._fault(provider, f"{type(exc).__name__} from google-auth")
            token = entry.credentials.token
            if not token:
                return self._fault(provider, "google-auth gave no token")
            return str(token)

    @staticmethod
    def _fault(provider: str, why: str) -> CredentialFault:
        return CredentialFault(
            provider=provider,
            field="credentials_file",
            code=_CODE,
            message=f"upstream {provider!r}: no Vertex AI access token: {why}",
        )

    async def destinations(
        self,
        config: Config,
        candidates: Sequence[Candidate],
        sticky: str | None,
        env: Mapping[str, str],
        catalog: Catalog | None = None,
        *,
        counting: bool = False,
    ) -> tuple[list[Destination], list[CredentialFault], GatewayError | None]:
        """`twengine.destinations.request_destinations`, with each Vertex destination's token
        put in (`fill`)."""
        usable, faults, refused = request_destinations(
            config, candidates, sticky, env, catalog, counting=counting
        )
        if refused is None and any(d.token_source is not None for d in usable):
            return await self.fill(usable, faults)
        return usable, faults, refused

    async def fill(
        self,
        usable: Sequence[Destination],
        faults: Sequence[CredentialFault],
    ) -> tuple[list[Destination], list[CredentialFault], GatewayError | None]:
        """`usable` with each Vertex destination's token put in (those without one skipped,
        their faults after `faults`), and the refusal when none is left."""
        kept: list[Destination] = []
        skipped = list(faults)
        for dest in usable:
            if dest.token_source is None:
                kept.append(dest)
                continue
            found = await self.token(dest.token_source, dest.name)
            if isinstance(found, CredentialFault):
                skipped.append(found)
                continue
            target = dataclasses.replace(dest.target, key=found)
            kept.append(dataclasses.replace(dest, target=target))
        if skipped and not kept:
            return kept, skipped, no_usable_credentials(skipped)
        return kept, skipped, None
