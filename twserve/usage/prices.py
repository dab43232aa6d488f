"""The price table's files: the copy shipped with the package, the user's refreshed copy, and the
conversion from LiteLLM's model price list that makes both.

Theory of operation
-------------------
Prices come from LiteLLM's ``model_prices_and_context_window_backup.json``, a public, cited list
that LiteLLM ships inside its package on PyPI. `convert_litellm` keeps the chat models of the
providers a gateway in front of coding agents meets (Anthropic, OpenAI, Gemini on AI Studio and
Vertex, and a few common relays' own models), and writes, per model, what pricing needs: USD per
million tokens for input, output, cache reads, cache writes (5 minutes and 1 hour), the
above-N-tokens tiers where the source has them, and the context window and output limit.

``scripts/build_prices.py`` runs the conversion on the wheel and writes
``twserve/data/prices.json``, which ships with the package: nothing is downloaded at run time.
``twserve prices update --from FILE_OR_URL`` runs the same conversion on a file or URL the
operator names and saves the result as ``prices.json`` in the data directory; from then on that
copy is read instead of the shipped one (`load_price_table`).

The JSON is read here (IO) and handed to `twengine.pricing.PriceTable.from_data` (pure).
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.request
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from twengine.pricing import PriceTable

__all__ = [
    "KEPT_PROVIDERS",
    "USER_FILE",
    "convert_litellm",
    "fetch_source",
    "load_price_data",
    "load_price_table",
    "save_user_prices",
    "shipped_price_data",
]

USER_FILE = "prices.json"
# Refuse a source larger than this: LiteLLM's list is a few MB; anything far bigger is not it.
MAX_SOURCE_BYTES = 64 * 1024 * 1024

# LiteLLM provider name → the provider written in our table. Earlier entries win when two
# providers list the same bare model name (the first party's price is the one to show).
KEPT_PROVIDERS: Mapping[str, str] = {
    "anthropic": "anthropic",
    "openai": "openai",
    "gemini": "gemini",
    "vertex_ai-language-models": "vertex",
    "deepseek": "deepseek",
    "xai": "xai",
    "moonshot": "moonshot",
    "zai": "zai",
    "mistral": "mistral",
}
_MODES = ("chat", "responses")

# LiteLLM's per-token figures → ours (per million tokens).
_BASE_FIELDS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write": "cache_creation_input_token_cost",
    "cache_write_1h": "cache_creation_input_token_cost_above_1hr",
}
_TIER = re.compile(
    r"(?P<field>input_cost_per_token|output_cost_per_token|cache_read_input_token_cost"
    r"|cache_creation_input_token_cost(?P<hour>_above_1hr)?)_above_(?P<k>\d+)k_tokens"
)
_TIER_FIELD = {
    "input_cost_per_token": "input",
    "output_cost_per_token": "output",
    "cache_read_input_token_cost": "cache_read",
    "cache_creation_input_token_cost": "cache_write",
}


def _per_million(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    # Per token → per million, rounded to drop float noise (3e-06 * 1e6 = 2.9999999999999996).
    return round(float(value) * 1_000_000, 6)


def _unusable(value: object) -> bool:
    """A figure that is a number but no price: NaN, ±Infinity (JSON readers take them) or below
    zero. Such a figure would price a request at NaN, which no row and no limit can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not math.isfinite(value) or value < 0


def _has_unusable_figure(raw: Mapping[str, Any]) -> bool:
    return any(
        _unusable(value)
        for name, value in raw.items()
        if name in _BASE_FIELDS.values() or _TIER.fullmatch(name)
    )


def _limit(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _entry(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for ours, theirs in _BASE_FIELDS.items():
        figure = _per_million(raw.get(theirs))
        if figure is not None:
            out[ours] = figure
    if "input" not in out or "output" not in out:
        return None
    tiers: dict[int, dict[str, float]] = {}
    for name, value in raw.items():
        m = _TIER.fullmatch(name)
        if m is None:
            continue
        figure = _per_million(value)
        if figure is None:
            continue
        field = "cache_write_1h" if m["hour"] else _TIER_FIELD[m["field"]]
        tiers.setdefault(int(m["k"]) * 1000, {})[field] = figure
    if tiers:
        out["tiers"] = [{"above": above, **tiers[above]} for above in sorted(tiers)]
    context = _limit(raw.get("max_input_tokens"))
    output = _limit(raw.get("max_output_tokens"))
    if context is not None:
        out["context_window"] = context
    if output is not None:
        out["max_output_tokens"] = output
    return out


def _bare_name(name: str) -> str:
    # "gemini/gemini-2.5-pro" → "gemini-2.5-pro": upstreams are sent the bare name.
    return name.rsplit("/", 1)[-1]


def convert_litellm(
    source: Mapping[str, Any],
    *,
    package: str,
    version: str,
    retrieved: str,
    refused: list[str] | None = None,
) -> dict[str, Any]:
    """Our price data from LiteLLM's model price JSON (see the module docs). A model with a
    figure that is not a finite number of zero or more is left out, and its name appended to
    `refused`: unpriced, it counts as unpriced everywhere, where a NaN price counted nowhere."""
    models: dict[str, dict[str, Any]] = {}
    rank: dict[str, int] = {}
    order = list(KEPT_PROVIDERS)
    for name, raw in source.items():
        if not isinstance(raw, Mapping) or raw.get("mode") not in _MODES:
            continue
        provider = raw.get("litellm_provider")
        if not isinstance(provider, str) or provider not in KEPT_PROVIDERS:
            continue
        if _has_unusable_figure(raw):
            if refused is not None:
                refused.append(name)
            continue
        entry = _entry(raw)
        if entry is None:
            continue
        entry = {"provider": KEPT_PROVIDERS[provider], **entry}
        bare = _bare_name(name)
        place = order.index(provider)
        if bare in models and rank[bare] <= place:
            continue
        models[bare] = entry
        rank[bare] = place
    return {
        "source": "LiteLLM model_prices_and_context_window_backup.json",
        "package": package,
        "version": version,
        "retrieved": retrieved,
        "unit": "USD per million tokens",
        "models": dict(sorted(models.items())),
    }


def shipped_price_data() -> dict[str, Any]:
    """The price data shipped with the package."""
    text = resources.files("twserve").joinpath("data", "prices.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def load_price_data(data_dir: Path | None) -> dict[str, Any]:
    """The user's refreshed copy in `data_dir` when there is a readable one, else the shipped."""
    if data_dir is not None:
        path = data_dir / USER_FILE
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("models"), dict):
            return data
    return shipped_price_data()


def load_price_table(data_dir: Path | None) -> PriceTable:
    """The price table the gateway prices with (see `load_price_data`)."""
    return PriceTable.from_data(load_price_data(data_dir))


def fetch_source(location: str, *, timeout: float = 60.0) -> bytes:
    """The bytes of a LiteLLM price list at a file path or an http(s) URL."""
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=timeout) as resp:
            data: bytes = resp.read(MAX_SOURCE_BYTES + 1)
    else:
        with open(location, "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"{location} is larger than {MAX_SOURCE_BYTES} bytes")
    return data


def save_user_prices(data_dir: Path, data: Mapping[str, Any]) -> Path:
    """Write `data` as the user's price table, atomically, mode 0600."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / USER_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"), sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path
