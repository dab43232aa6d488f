"""The console page's files at ``/ui/`` on the control listener (docs/console.md, "The page").

The page is static HTML, CSS and ES modules shipped in the wheel beside this module
(``twserve/console/ui/``) and served as they are: no build step, nothing generated per request.
The files hold no secret and no data, so they are served without the control key (the page
has to load before it can ask for one); everything the page shows it fetches from the control
plane's own paths with the key, which the page keeps in the tab's ``sessionStorage`` and sends
in the ``Authorization`` header, never in a URL.

Each answer carries a Content-Security-Policy that allows scripts, styles and connections
from this origin only — no inline script or style, no frames around the page — and
``X-Content-Type-Options: nosniff``. The files are read once, on first ask, and kept: a
console nobody opens costs nothing.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["CSP", "SECURITY_HEADERS", "UI_PREFIX", "ui_file"]

UI_PREFIX = "/ui"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)

_TYPES = {
    "html": b"text/html; charset=utf-8",
    "css": b"text/css; charset=utf-8",
    "js": b"text/javascript; charset=utf-8",
    "svg": b"image/svg+xml",
}


def _clean(path: str) -> tuple[str, ...] | None:
    """The parts of a ``/ui/…`` path, or None for a path outside the page's files."""
    rest = path[len(UI_PREFIX) :].lstrip("/") or "index.html"
    parts = tuple(rest.split("/"))
    for part in parts:
        if not part or part.startswith(".") or "\\" in part:
            return None
    return parts


@functools.cache
def _read(parts: tuple[str, ...]) -> tuple[bytes, bytes] | None:
    suffix = parts[-1].rpartition(".")[2]
    content_type = _TYPES.get(suffix)
    if content_type is None:
        return None
    node = resources.files("twserve.console").joinpath("ui", *parts)
    try:
        return content_type, node.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def ui_file(path: str) -> tuple[bytes, bytes] | None:
    """The content type and bytes of the page's file at `path` (``/ui/``, ``/ui/js/app.js``),
    or None when there is none."""
    parts = _clean(path)
    return None if parts is None else _read(parts)
