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

from twengine.config.model import BedrockSettings, Provider
from twengine.config.template import TemplateError, resolve_template
from twproto.bedrock import AwsAuth
from twproto.sigv4 import AwsCredentials

__all__ = (
    "CredentialFault",
    "UpstreamCredentials",
    "bedrock_key",
    "credential_faults",
    "header_value_fault",
    "resolve_aws",
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
    provider: str, field: str, template: str, env: Mapping[str, str], *, secret: bool = False
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
    fault = header_value_fault(value, allow_empty=field != "key" and not secret)
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
    """Every problem with `provider`'s key and headers under `env`, one per field (and, for a
    Bedrock provider, the first problem with its AWS credentials)."""
    faults = []
    for field, template in _fields(provider):
        found = _resolve(provider.name, field, template, env)
        if isinstance(found, CredentialFault):
            faults.append(found)
    if provider.bedrock is not None:
        aws = resolve_aws(provider, env)
        if isinstance(aws, CredentialFault):
            faults.append(aws)
    return tuple(faults)


# Each AWS field, and the standard variables read (in order) when the config leaves it out.
_AWS_ENV: dict[str, tuple[str, ...]] = {
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "aws_access_key_id": ("AWS_ACCESS_KEY_ID",),
    "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "aws_session_token": ("AWS_SESSION_TOKEN",),
}
# A Bedrock API key in the environment, used when neither `key` nor an access key is set.
_BEDROCK_KEY_ENV = "AWS_BEARER_TOKEN_BEDROCK"


def _aws_field(
    provider: str,
    field: str,
    template: str | None,
    env: Mapping[str, str],
    *,
    required: bool,
) -> str | CredentialFault | None:
    if template is not None:
        return _resolve(provider, field, template, env, secret=True)
    for variable in _AWS_ENV[field]:
        if env.get(variable):
            return _resolve(provider, field, "${" + variable + "}", env, secret=True)
    if not required:
        return None
    variable = _AWS_ENV[field][0]
    return CredentialFault(
        provider=provider,
        field=field,
        code="gw.upstream.credentials_missing",
        message=f"upstream {provider!r}: {field} is not in the config and environment "
        f"variable {variable} is not set",
        variable=variable,
    )


def _fault(found: CredentialFault | None) -> CredentialFault:
    assert found is not None  # a required field is a value or a fault
    return found


def resolve_aws(provider: Provider, env: Mapping[str, str]) -> AwsAuth | CredentialFault:
    """How a ``bedrock-anthropic`` provider signs, from its config fields, else the standard
    AWS variables in `env`: its region, and SigV4 credentials — or none when it has a Bedrock
    API key (`key`, else ``AWS_BEARER_TOKEN_BEDROCK``; the caller sends it as a bearer
    token). A value missing or that cannot be sent is a `CredentialFault`: the upstream is
    skipped, like any missing credential."""
    aws = provider.bedrock if provider.bedrock is not None else BedrockSettings()
    name = provider.name
    region = _aws_field(name, "region", aws.region, env, required=True)
    if not isinstance(region, str):
        return _fault(region)
    configured_keys = aws.access_key_id is not None or aws.secret_access_key is not None
    if provider.key is not None or (not configured_keys and env.get(_BEDROCK_KEY_ENV)):
        return AwsAuth(region=region)
    key_id = _aws_field(name, "aws_access_key_id", aws.access_key_id, env, required=True)
    if not isinstance(key_id, str):
        return _fault(key_id)
    secret = _aws_field(name, "aws_secret_access_key", aws.secret_access_key, env, required=True)
    if not isinstance(secret, str):
        return _fault(secret)
    # A session token belongs to the key it was issued with: the environment's only to the
    # environment's key.
    token_template = aws.session_token
    if token_template is None and aws.access_key_id is not None:
        token: str | CredentialFault | None = None
    else:
        token = _aws_field(name, "aws_session_token", token_template, env, required=False)
    if isinstance(token, CredentialFault):
        return token
    return AwsAuth(
        region=region,
        credentials=AwsCredentials(key_id, secret, token),
    )


def bedrock_key(provider: Provider, env: Mapping[str, str]) -> str | CredentialFault:
    """The Bedrock API key of a provider with no `key`: ``AWS_BEARER_TOKEN_BEDROCK``."""
    return _resolve(provider.name, "key", "${" + _BEDROCK_KEY_ENV + "}", env)
