"""The command line's side of the control plane: asking a running gateway, over HTTP, for
what the CLI prints (``twserve dryrun --control URL``).

A blocking client (httpcore, imported only when a command asks), kept apart from the server
module so that the gateway never loads it and the CLI reads its answers without the server's
code paths. Errors come back as the plane's own `ControlRequestError`, with its code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from twproto import json_loads
from twserve.control.plane import ControlRequestError

__all__ = ("fetch_dryrun",)


def fetch_dryrun(
    base_url: str,
    control_key: str,
    *,
    model: str,
    key_name: str | None = None,
    dialect: str | None = None,
    stream: bool = False,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Ask a running gateway's control plane for a dry-run (the CLI's ``--control``).

    Raises `ControlRequestError` with the server's code when it refuses, and `ConnectionError`
    when it cannot be reached or does not answer as a control plane.
    """
    params = {"model": model, "stream": "1" if stream else "0"}
    if key_name:
        params["key"] = key_name
    if dialect:
        params["dialect"] = dialect
    url = base_url.rstrip("/") + "/dryrun?" + urlencode(params)
    import httpcore  # the command line's, not the gateway's: loaded only here

    try:
        response = httpcore.request(
            "GET",
            url,
            headers=[(b"authorization", b"Bearer " + control_key.encode())],
            extensions={"timeout": {"connect": timeout, "read": timeout, "pool": timeout}},
        )
    except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.UnsupportedProtocol) as exc:
        raise ConnectionError(f"{base_url}: {exc or type(exc).__name__}") from None
    try:
        data = json_loads(response.content)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConnectionError(f"{base_url} answered {response.status} without control-plane JSON")
    if response.status != 200:
        error = data.get("error") or {}
        raise ControlRequestError(
            response.status, str(error.get("code")), str(error.get("message"))
        )
    return data
