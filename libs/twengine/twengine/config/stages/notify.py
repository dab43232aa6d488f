"""Stage 2's reader of ``notifications[]``: where the gateway POSTs its alerts.

Each entry needs a ``url`` (http:// or https:// with a host), a ``secret`` the body is signed
with (kept as written, ``${VAR}`` templates included; with an environment given, resolved for
the check: a variable not set, or a secret under `MIN_SECRET_CHARS` characters, refuses the
config) and a non-empty ``events`` list. Names default to the entry's place
(``notifications[0]``) and must differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from twengine.config import defaults
from twengine.config.model import Notification, NotifyEvent, NotifyFormat
from twengine.config.schema import SECTIONS
from twengine.config.stages.fields import (
    _as_choice,
    _as_secret,
    _as_text,
    _entries,
    _Fields,
    _Problems,
)
from twengine.config.template import TemplateError, resolve_template

__all__ = ()

# An HMAC key shorter than this is guessable from a few signed bodies.
MIN_SECRET_CHARS = 16

_URL = re.compile(r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::\d{1,5})?(?:[/?][^\s#]*)?")


def _notifications(
    out: _Problems, top: _Fields, env: Mapping[str, str] | None
) -> list[Notification]:
    found: list[Notification] = []
    names: set[str] = set()
    for index, (path, item) in enumerate(_entries(out, top, "notifications")):
        f = _Fields.of(out, path, item, SECTIONS["notifications[]"])
        if f is None:
            continue
        name = f.name(required=False) or f"notifications[{index}]"
        if name in names:
            out.add("config.notify_duplicate_name", f.at("name"), f"{name!r} is named twice")
        names.add(name)
        url = _url(out, f)
        secret = _secret(out, f, env)
        events = _events(out, f)
        bounds = defaults.NOTIFICATIONS
        timeout = f.number("timeout_secs", bounds["timeout_secs"])
        attempts = f.integer("max_attempts", bounds["max_attempts"])
        backoff = f.number("backoff_secs", bounds["backoff_secs"])
        queued = f.integer("max_queued", bounds["max_queued"])
        fmt = f.choice("format", NotifyFormat, NotifyFormat.JSON)
        if url is None or secret is None or events is None:
            continue
        found.append(
            Notification(
                name=name,
                url=url,
                secret=secret,
                events=events,
                format=fmt,
                timeout_secs=timeout or 0.0,
                max_attempts=attempts or 1,
                backoff_secs=backoff or 0.0,
                max_queued=queued or 1,
            )
        )
    return found


def _url(out: _Problems, f: _Fields) -> str | None:
    raw = f.required("url")
    text = _as_text(out, f.at("url"), raw) if f.has("url") else None
    if text is None:
        return None
    if _URL.fullmatch(text) is None:
        out.add(
            "config.url_invalid",
            f.at("url"),
            f"{text!r} is not an http:// or https:// URL with a host",
        )
        return None
    return text


def _secret(out: _Problems, f: _Fields, env: Mapping[str, str] | None) -> str | None:
    raw = f.required("secret")
    if not f.has("secret"):
        return None
    path = f.at("secret")
    secret = _as_secret(out, path, raw)
    if secret is None:
        return None
    if env is None and "${" in secret:
        return secret  # checked when the environment is at hand
    try:
        value = resolve_template(secret, env or {})
    except TemplateError as exc:
        out.add(exc.code, path, exc.message)
        return None
    if len(value) < MIN_SECRET_CHARS:
        out.add(
            "config.notify_secret_short",
            path,
            f"the secret has {len(value)} characters; at least {MIN_SECRET_CHARS} are needed",
        )
        return None
    return secret


def _events(out: _Problems, f: _Fields) -> tuple[NotifyEvent, ...] | None:
    f.required("events")
    items = _entries(out, f, "events")
    if not f.has("events"):
        return None
    if not items:
        out.add("config.notify_events_empty", f.at("events"), "events lists nothing to send")
        return None
    events: list[NotifyEvent] = []
    for path, value in items:
        event = _as_choice(out, path, value, NotifyEvent)
        if event is None:
            return None
        if event not in events:
            events.append(event)
    return tuple(events)
