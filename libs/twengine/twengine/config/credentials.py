"""An upstream's credentials, resolved from the environment and checked before they are sent.

An upstream's ``key`` and ``headers`` may hold ``${VAR}`` templates that are read when a request
is sent (so a rotated variable needs no reload). Two things can go wrong then, and neither may
turn into a crash, a traceback carrying the secret, or a 500 for a request that had a healthy
candidate besides:

* the variable is not set — the candidate is skipped (``gw.upstream.credentials_missing``);
* the value cannot travel in an HTTP header: a trailing newline pasted along with a key, a
  control character, white space at either end, or nothing at all. The HTTP client would refuse
  it (h11's ``LocalProtocolError``), with the value in the error's text. The candidate is skipped
  (``gw.upstream.credentials_invalid``).

`resolve_credentials` returns the resolved credentials or a `CredentialFault` that names the
field and the variable but never the value. The config validator runs the same check at load
with the environment it is given: a value that cannot be sent refuses the config, a variable
not set yet is a warning (it may be set before a request needs it).

The header-value grammar is RFC 9110's ``field-value`` as h11 enforces it: visible characters
and obs-text bytes, with spaces and tabs only between them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from twengine.config.model import Provider
from twengine.config.template import TemplateError, resolve_template

__all__ = (
    "CredentialFault",
    "UpstreamCredentials",
    "credential_faults",
    "header_value_fault",
    "resolve_credentials",
)

_FIELD_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def header_value_fault(value: str, *, allow_empty: bool = False) -> str | None:
    """Why `value` cannot be sent as an HTTP header value, or None when it can.

    An empty value is a fault unless `allow_empty` (a key that is empty authenticates nobody;
    an extra header may be empty on purpose). The reason describes the value's shape (``ends
    with a line break``), never its content.
    """
    raw = value.encode("utf-8", "surrogatepass")
    if not raw:
        return None if allow_empty else "is empty"
    if not raw.strip(b" \t"):
        return "is only white space"
    if _FIELD_VALUE.fullmatch(raw):
        return None
    if raw[-1:] in (b"\n", b"\r"):
        return "ends with a line break"
    if _CONTROL.search(raw):
        return "holds a line break or another control character"
    return "begins or ends with white space"


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamCredentials:
    """An upstream's key (``""`` for none) and extra headers, ready to send."""

    key: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CredentialFault:
    """Why an upstream's credentials cannot be sent now.

    `code` is ``gw.upstream.credentials_missing`` (a variable is not set) or
    ``gw.upstream.credentials_invalid``; `field` is ``key`` or ``headers.<name>``; `variable`
    names the unset variable. `message` never holds the value.
    """

    provider: str
    field: str
    code: str
    message: str
    variable: str | None = None


def _resolve(
    provider: str, field: str, template: str, env: Mapping[str, str]
) -> str | CredentialFault:
    try:
        value = resolve_template(template, env)
    except TemplateError as exc:
        if exc.variable is not None:
            return CredentialFault(
                provider=provider,
                field=field,
                code="gw.upstream.credentials_missing",
                message=f"upstream {provider!r}: {field} needs environment variable "
                f"{exc.variable}, which is not set",
                variable=exc.variable,
            )
        return CredentialFault(
            provider=provider,
            field=field,
            code="gw.upstream.credentials_invalid",
            message=f"upstream {provider!r}: {field} is not a valid template",
        )
    fault = header_value_fault(value, allow_empty=field != "key")
    if fault is not None:
        return CredentialFault(
            provider=provider,
            field=field,
            code="gw.upstream.credentials_invalid",
            message=f"upstream {provider!r}: {field} {fault}; it cannot be sent in a header",
        )
    return value


def _fields(provider: Provider) -> list[tuple[str, str]]:
    fields = [("key", provider.key)] if provider.key is not None else []
    return fields + [(f"headers.{name}", value) for name, value in provider.headers]


def resolve_credentials(
    provider: Provider, env: Mapping[str, str]
) -> UpstreamCredentials | CredentialFault:
    """`provider`'s key and headers with every ``${VAR}`` read from `env`, each checked to be
    sendable; the first problem found otherwise."""
    values: dict[str, str] = {}
    for field, template in _fields(provider):
        found = _resolve(provider.name, field, template, env)
        if isinstance(found, CredentialFault):
            return found
        values[field] = found
    return UpstreamCredentials(
        key=values.get("key", ""),
        headers=tuple((name, values[f"headers.{name}"]) for name, _ in provider.headers),
    )


def credential_faults(provider: Provider, env: Mapping[str, str]) -> tuple[CredentialFault, ...]:
    """Every problem with `provider`'s key and headers under `env`, one per field."""
    faults = []
    for field, template in _fields(provider):
        found = _resolve(provider.name, field, template, env)
        if isinstance(found, CredentialFault):
            faults.append(found)
    return tuple(faults)
