"""Upstream credentials read at send time: resolved, checked for what a header can carry, and
described without their value when they cannot be sent."""

from __future__ import annotations

import pytest

from twengine.config import (
    CredentialFault,
    Provider,
    UpstreamCredentials,
    credential_faults,
    header_value_fault,
    resolve_credentials,
)

SECRET = "sk-SECRET-123"


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        (SECRET, None),
        ("Bearer a b\tc", None),
        ("clé-ü", None),  # obs-text bytes are allowed
        ("", "is empty"),
        ("  ", "is only white space"),
        (SECRET + "\n", "ends with a line break"),
        (SECRET + "\r\n", "ends with a line break"),
        ("a\r\nx-evil: 1", "holds a line break or another control character"),
        ("a\x00b", "holds a line break or another control character"),
        (" " + SECRET, "begins or ends with white space"),
        (SECRET + "\t", "begins or ends with white space"),
    ],
)
def test_header_value_fault(value: str, fault: str | None) -> None:
    assert header_value_fault(value) == fault


def test_empty_header_allowed_where_asked() -> None:
    assert header_value_fault("", allow_empty=True) is None


def _provider(**fields: object) -> Provider:
    return Provider(name="p", base_url="https://x.example", **fields)  # type: ignore[arg-type]


def test_resolved() -> None:
    p = _provider(key="${K}", headers=(("x-team", "t-${T}"), ("x-empty", "")))
    assert resolve_credentials(p, {"K": SECRET, "T": "core"}) == UpstreamCredentials(
        key=SECRET, headers=(("x-team", "t-core"), ("x-empty", ""))
    )
    assert resolve_credentials(_provider(), {}) == UpstreamCredentials(key="")


def test_missing_variable_names_it() -> None:
    found = resolve_credentials(_provider(key="${K}"), {})
    assert isinstance(found, CredentialFault)
    assert (found.code, found.field, found.variable) == (
        "gw.upstream.credentials_missing",
        "key",
        "K",
    )


def test_unsendable_value_is_described_not_quoted() -> None:
    p = _provider(key="${K}", headers=(("x-a", "${A}"),))
    faults = credential_faults(p, {"K": SECRET + "\n", "A": "x\ny"})
    assert [(f.code, f.field) for f in faults] == [
        ("gw.upstream.credentials_invalid", "key"),
        ("gw.upstream.credentials_invalid", "headers.x-a"),
    ]
    assert all(SECRET not in f.message and "x\ny" not in f.message for f in faults)
