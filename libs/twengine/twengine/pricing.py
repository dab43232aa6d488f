"""What a request cost: the price table, price sheets, and cost from reported usage.

Theory of operation
-------------------
A price is USD per million tokens, which is the same number as micro-dollars per token; cost is
kept in integer micro-dollars (1 USD = 1_000_000), the unit of the request store and of cost
limits. Cost is worked out from the usage the upstream *reported* — never from an estimate — with
every kind of token at its own rate:

    cost = input × in + cache_read × read + cache_write_5m × write + cache_write_1h × write_1h
           + output × out

where ``input`` is the uncached input (twproto's normalised usage) and reasoning tokens are part
of ``output``. Sums are exact (`Decimal` on the figures as written) and rounded half-up to a whole
micro-dollar once, at the end.

*Tiers.* Some models cost more per token once the prompt is long (Gemini 2.5 Pro, Claude with the
1M context: "above 200k tokens"). The prompt is every input token, cached or not; when it is over
a tier's threshold, *all* the request's tokens take that tier's rates (that is how both vendors
bill). A tier that does not name a figure keeps the base one.

*Missing figures.* A model without a cache-read price is charged its input price for cache reads,
one without a cache-write price its input price for writes, and one without a 1-hour write price
its 5-minute write price: no discount is assumed that the source does not state.

*Three states.* Every cost is `CostState.KNOWN` (a number), `FREE` (the upstream is
``billing: free``: 0) or `UNKNOWN` (no price for the model: no number — None, never 0 — so that a
total can say it is incomplete). `LOCAL` marks token counts answered by the gateway itself.

*Sheets.* ``pricing.sheets[]`` carry one's own prices per model and a `multiplier`; an upstream
with ``price_sheet:`` is priced from its sheet where the sheet lists the model, else from the
shipped table, and the multiplier applies to both. `Pricer` puts table, sheets and billing
together; it is built once per config and price table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from twengine.config.model import Billing, Config, ModelPrice
from twproto.ir import Usage

__all__ = (
    "Cost",
    "CostState",
    "ModelPricing",
    "PriceTable",
    "Pricer",
    "Rates",
    "Tier",
    "cost_of",
)


class CostState(StrEnum):
    """How a stored cost was arrived at (docs/limits-and-costs.md, "Cost states")."""

    KNOWN = "known"  # priced from the usage the upstream reported
    FREE = "free"  # a ``billing: free`` upstream
    UNKNOWN = "unknown"  # usage reported, but the model has no price: NULL, never 0
    LOCAL = "local"  # answered by the gateway itself (a token count)
    # No usage reported (a stream cancelled or abandoned before its usage event): the gateway's
    # estimate, which is what the key's limits counted.
    ESTIMATED = "estimated"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """USD per million tokens (= micro-dollars per token) for each kind of token."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Tier:
    """Rates that apply to a whole request once its prompt is over `above` tokens."""

    above: int
    rates: Rates


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPricing:
    """One model's prices and limits. `tiers` ascend by threshold."""

    name: str
    rates: Rates
    provider: str | None = None
    tiers: tuple[Tier, ...] = ()
    context_window: int | None = None
    max_output_tokens: int | None = None

    def rates_for(self, prompt_tokens: int) -> Rates:
        """The rates for a request whose prompt (all input, cached or not) is `prompt_tokens`."""
        rates = self.rates
        for tier in self.tiers:
            if prompt_tokens > tier.above:
                rates = tier.rates
        return rates


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """A cost in one of its states; `micros` is None exactly when the state is UNKNOWN."""

    state: CostState
    micros: int | None

    @property
    def counted(self) -> int:
        """What the cost adds to a cost limit or a total: unknown and free count 0."""
        return self.micros or 0


UNKNOWN = Cost(state=CostState.UNKNOWN, micros=None)
FREE = Cost(state=CostState.FREE, micros=0)

_ONE = Decimal(1)


def _dec(value: float) -> Decimal:
    # The shortest repr of a float is the figure as written in the data ("0.3", not 0.2999…).
    return Decimal(repr(value))


def cost_of(usage: Usage, pricing: ModelPricing, *, multiplier: float = 1.0) -> Cost:
    """The known cost of `usage` at `pricing`'s rates (see the module docs for the rules)."""
    rates = pricing.rates_for(usage.total_input_tokens)
    write_1h = min(max(usage.cache_write_1h_tokens, 0), usage.cache_write_tokens)
    write_5m = usage.cache_write_tokens - write_1h
    total = (
        usage.input_tokens * _dec(rates.input)
        + usage.output_tokens * _dec(rates.output)
        + usage.cache_read_tokens * _dec(rates.cache_read)
        + write_5m * _dec(rates.cache_write)
        + write_1h * _dec(rates.cache_write_1h)
    )
    if multiplier != 1.0:
        total *= _dec(multiplier)
    micros = int(total.quantize(_ONE, rounding=ROUND_HALF_UP))
    return Cost(state=CostState.KNOWN, micros=max(micros, 0))


# --- the table ------------------------------------------------------------------------------


_FIGURES = ("input", "output", "cache_read", "cache_write", "cache_write_1h")


def _figure(raw: Mapping[str, Any], name: str) -> float | None:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def _unusable(raw: Mapping[str, Any]) -> bool:
    """Whether `raw` gives a figure that is a number but no price (NaN, ±Infinity, below zero):
    the cost of a request at such a price is NaN, which no row and no limit can count."""
    for name in _FIGURES:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value) or value < 0:
            return True
    return False


def _count(raw: Mapping[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _rates(raw: Mapping[str, Any], base: Rates | None) -> Rates | None:
    given = {n: _figure(raw, n) for n in _FIGURES}
    input_rate = given["input"]
    output_rate = given["output"]
    if base is not None:
        input_rate = base.input if input_rate is None else input_rate
        output_rate = base.output if output_rate is None else output_rate
    if input_rate is None or output_rate is None:
        return None

    def pick(name: str, fallback: float) -> float:
        value = given[name]
        if value is not None:
            return value
        if base is not None:
            return float(getattr(base, name))
        return fallback

    read = pick("cache_read", input_rate)
    write = pick("cache_write", input_rate)
    return Rates(
        input=input_rate,
        output=output_rate,
        cache_read=read,
        cache_write=write,
        cache_write_1h=pick("cache_write_1h", write),
    )


def _model(name: str, raw: object) -> ModelPricing | None:
    if not isinstance(raw, Mapping) or _unusable(raw):
        return None
    tiers_raw = raw.get("tiers") or ()
    if any(isinstance(t, Mapping) and _unusable(t) for t in tiers_raw):
        return None  # a model priced wrongly anywhere is not priced: it shows as unpriced
    rates = _rates(raw, None)
    if rates is None:
        return None
    tiers: list[Tier] = []
    for item in raw.get("tiers") or ():
        if not isinstance(item, Mapping):
            continue
        above = _count(item, "above")
        tier_rates = _rates(item, rates)
        if above is not None and tier_rates is not None:
            tiers.append(Tier(above=above, rates=tier_rates))
    provider = raw.get("provider")
    return ModelPricing(
        name=name,
        rates=rates,
        provider=provider if isinstance(provider, str) else None,
        tiers=tuple(sorted(tiers, key=lambda t: t.above)),
        context_window=_count(raw, "context_window"),
        max_output_tokens=_count(raw, "max_output_tokens"),
    )


# A dated snapshot name ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06", Vertex's
# "claude-sonnet-4-5@20250929") falls back to its undated name.
_DATED = re.compile(r"(?:[-@]\d{8}|-\d{4}-\d{2}-\d{2})$")
# Vertex AI's date suffix (``@20250929``).
_AT_DATE = re.compile(r"@(\d{8})$")
# A dot between digits, as in a version ("4.5").
_VERSION_DOT = re.compile(r"(?<=\d)\.(?=\d)")
# A Bedrock model id (``anthropic.claude-3-5-sonnet-20240620-v1:0``), perhaps a cross-region
# inference profile's (``us.anthropic.…``, ``global.anthropic.…``): the vendor's own name inside.
_BEDROCK_ID = re.compile(
    r"(?:(?:us|eu|apac|jp|au|ca|us-gov|global)\.)?"
    r"(?:anthropic|meta|mistral|amazon|cohere|ai21|deepseek|openai|qwen|writer)\."
    r"(?P<name>.+?)(?:-v\d+(?::\d+)?)?(?::\d+k?)?"
)


class PriceTable:
    """Model prices by name (the shipped table, or the user's refreshed copy)."""

    def __init__(
        self,
        models: Mapping[str, ModelPricing],
        *,
        package: str | None = None,
        version: str | None = None,
        retrieved: str | None = None,
    ) -> None:
        self.models: Mapping[str, ModelPricing] = MappingProxyType(dict(models))
        self._lower = {name.lower(): p for name, p in models.items()}
        self.package = package
        self.version = version
        self.retrieved = retrieved

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PriceTable:
        """The table from price data (``twserve/data/prices.json``'s shape); entries that do
        not make sense are left out rather than failing the whole table."""
        models: dict[str, ModelPricing] = {}
        raw_models = data.get("models")
        if isinstance(raw_models, Mapping):
            for name, raw in raw_models.items():
                if isinstance(name, str) and name:
                    pricing = _model(name, raw)
                    if pricing is not None:
                        models[name] = pricing

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        return cls(
            models, package=text("package"), version=text("version"), retrieved=text("retrieved")
        )

    def lookup(self, model: str) -> ModelPricing | None:
        """`model`'s prices: by exact name, case-insensitively, without a ``vendor/`` prefix
        (relays' ``anthropic/claude-…``), with a version's dots as dashes (relays write
        ``claude-sonnet-4.5`` for ``claude-sonnet-4-5``), as the vendor's name inside a Bedrock
        model id or inference profile (``us.anthropic.claude-…-v1:0``, an ARN's last segment),
        as Vertex's ``@``-dated Claude id (``claude-sonnet-4-5@20250929``) and Azure's
        ``gpt-35-turbo``, then without a date suffix."""
        found = self.models.get(model)
        if found is not None:
            return found
        # Vertex AI's Claude ids date a model with ``@`` (``claude-sonnet-4-5@20250929``): read
        # as the dash the vendor writes, so the dated entry is found before the undated one.
        name = _AT_DATE.sub(r"-\1", model.lower())
        bare = name.rsplit("/", 1)[-1]
        # Exact spellings first: ``gpt-4.1`` is a name of its own, not ``gpt-4-1``.
        names = [name, bare, _VERSION_DOT.sub("-", bare)]
        bedrock = _BEDROCK_ID.fullmatch(bare)
        if bedrock is not None:
            names.append(bedrock["name"])
        # Azure's names drop the dot of ``gpt-3.5`` (``gpt-35-turbo``).
        names.append(bare.replace("gpt-35", "gpt-3.5"))
        candidates = dict.fromkeys(names)
        for candidate in candidates:
            found = self._lower.get(candidate)
            if found is not None:
                return found
            undated = _DATED.sub("", candidate)
            if undated != candidate:
                found = self._lower.get(undated)
                if found is not None:
                    return found
        return None

    def max_output_tokens(self, model: str) -> int | None:
        """The table's output limit for `model` (conversion to Anthropic fills it in)."""
        found = self.lookup(model)
        return found.max_output_tokens if found is not None else None

    def context_window(self, model: str) -> int | None:
        found = self.lookup(model)
        return found.context_window if found is not None else None


def _sheet_pricing(model: str, price: ModelPrice, table: ModelPricing | None) -> ModelPricing:
    base = table.rates if table is not None else None
    read = price.cache_read
    write = price.cache_write
    if read is None:
        read = base.cache_read if base is not None else price.input
    if write is None:
        write = base.cache_write if base is not None else price.input
    write_1h = base.cache_write_1h if base is not None and price.cache_write is None else write
    return ModelPricing(
        name=model,
        rates=Rates(
            input=price.input,
            output=price.output,
            cache_read=read,
            cache_write=write,
            cache_write_1h=write_1h,
        ),
        context_window=table.context_window if table is not None else None,
        max_output_tokens=table.max_output_tokens if table is not None else None,
    )


class Pricer:
    """Prices per (upstream, model sent) under one config and one price table."""

    def __init__(self, config: Config, table: PriceTable) -> None:
        self.config = config
        self.table = table
        self._cache: dict[tuple[str, str], tuple[ModelPricing | None, float, bool]] = {}

    def _resolve(self, provider: str, model: str) -> tuple[ModelPricing | None, float, bool]:
        key = (provider, model)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        free = False
        multiplier = 1.0
        pricing: ModelPricing | None = None
        if self.config.has_provider(provider):
            p = self.config.provider(provider)
            free = p.billing is Billing.FREE
            table_pricing = self.table.lookup(model)
            pricing = table_pricing
            if p.price_sheet is not None:
                sheet = self.config.price_sheet(p.price_sheet)
                multiplier = sheet.multiplier
                own = sheet.price(model)
                if own is not None:
                    pricing = _sheet_pricing(model, own, table_pricing)
        else:
            pricing = self.table.lookup(model)
        result = (pricing, multiplier, free)
        if len(self._cache) < 10_000:  # model names come from clients: bound the memo
            self._cache[key] = result
        return result

    def pricing(self, provider: str, model: str) -> ModelPricing | None:
        """The prices `provider` charges for `model` before the multiplier (None: unpriced)."""
        return self._resolve(provider, model)[0]

    def is_free(self, provider: str) -> bool:
        return self.config.has_provider(provider) and (
            self.config.provider(provider).billing is Billing.FREE
        )

    def cost(self, provider: str, model: str, usage: Usage) -> Cost:
        """What `usage` on `provider` for `model` cost, in one of the three states."""
        pricing, multiplier, free = self._resolve(provider, model)
        if free:
            return FREE
        if pricing is None:
            return UNKNOWN
        return cost_of(usage, pricing, multiplier=multiplier)

    def input_price(self, provider: str, model: str) -> float | None:
        """USD per million uncached input tokens (0 when free, None when unpriced): what the
        ``cheapest`` group orders by."""
        pricing, multiplier, free = self._resolve(provider, model)
        if free:
            return 0.0
        if pricing is None:
            return None
        return pricing.rates.input * multiplier

    def max_output_tokens(self, provider: str, model: str) -> int | None:
        """The output limit the price table gives for `model` (model_specs outrank it)."""
        pricing = self._resolve(provider, model)[0]
        return pricing.max_output_tokens if pricing is not None else None
