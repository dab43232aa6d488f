"""The model facts routing reads: context windows, output limits and input prices.

Routing needs figures about a model at an upstream that its routing rules do not hold: the
context window (a conversation's turn is decided afresh near it, a context overflow moves on
only to a larger one), the output limit (a conversion to Anthropic of a request without
``max_tokens`` sends it) and the input price (what a ``cheapest`` group orders by). They come
through a `Catalog`, in one place, so the router (`twengine.router`) and the destinations
(`twengine.destinations`) read the same figures:

* `ConfigCatalog` reads only the config: ``providers[].model_specs`` for windows and limits,
  ``billing: free`` as price 0, a ``price_sheet``'s input price times its multiplier.
* `TableCatalog` adds the shipped price table (`twengine.pricing.PriceTable`):
  ``model_specs`` first, then the table; prices as `twengine.pricing.Pricer` works them out.
"""

from __future__ import annotations

from typing import Protocol

from twengine.config.model import Billing, Config, ModelSpec
from twengine.pricing import Pricer, PriceTable

__all__ = ("Catalog", "ConfigCatalog", "TableCatalog")


class Catalog(Protocol):
    """Model figures routing needs beyond its rules: context windows, output limits and input
    prices, of `model` at `provider`."""

    def context_window(self, config: Config, provider: str, model: str) -> int | None:
        """The context window of `model` at `provider`, in tokens (None: unknown)."""
        ...

    def max_output_tokens(self, config: Config, provider: str, model: str) -> int | None:
        """The output limit a conversion to Anthropic fills in when the request has none
        (None: unknown, the converter's default then)."""
        ...

    def input_price(self, config: Config, provider: str, model: str) -> float | None:
        """USD per million input tokens of `model` at `provider` (0: free; None: unpriced)."""
        ...


def _spec(config: Config, provider: str, model: str) -> ModelSpec | None:
    return config.provider(provider).model_spec(model) if config.has_provider(provider) else None


class ConfigCatalog:
    """A `Catalog` that reads only the config.

    Context windows and output limits come from ``providers[].model_specs``. An upstream billed
    ``free`` costs 0; one with a ``price_sheet`` costs the sheet's input price times its
    multiplier; any other is unpriced. twserve passes a `TableCatalog`, which adds the shipped
    price table.
    """

    __slots__ = ()

    def context_window(self, config: Config, provider: str, model: str) -> int | None:
        spec = config.provider(provider).model_spec(model)
        return spec.context_window if spec is not None else None

    def max_output_tokens(self, config: Config, provider: str, model: str) -> int | None:
        spec = _spec(config, provider, model)
        return spec.max_output_tokens if spec is not None else None

    def input_price(self, config: Config, provider: str, model: str) -> float | None:
        upstream = config.provider(provider)
        if upstream.billing is Billing.FREE:
            return 0.0
        if upstream.price_sheet is None:
            return None
        sheet = config.price_sheet(upstream.price_sheet)
        price = sheet.price(model)
        return None if price is None else price.input * sheet.multiplier


class TableCatalog:
    """A `Catalog` over the config and a price table.

    Context windows and output limits: ``providers[].model_specs`` first, then the table.
    Input prices: 0 for ``billing: free``, else as `Pricer` prices (sheet, then table, times
    the sheet's multiplier), None when unpriced — what the ``cheapest`` group orders by.
    """

    __slots__ = ("_config", "_pricer", "table")

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self._config: Config | None = None
        self._pricer: Pricer | None = None

    def _pricing(self, config: Config) -> Pricer:
        # One pricer per config in force; a reload brings a new config object.
        if self._pricer is None or self._config is not config:
            self._config, self._pricer = config, Pricer(config, self.table)
        return self._pricer

    def context_window(self, config: Config, provider: str, model: str) -> int | None:
        spec = _spec(config, provider, model)
        if spec is not None and spec.context_window is not None:
            return spec.context_window
        pricing = self._pricing(config).pricing(provider, model)
        return pricing.context_window if pricing is not None else None

    def max_output_tokens(self, config: Config, provider: str, model: str) -> int | None:
        spec = _spec(config, provider, model)
        if spec is not None and spec.max_output_tokens is not None:
            return spec.max_output_tokens
        return self._pricing(config).max_output_tokens(provider, model)

    def input_price(self, config: Config, provider: str, model: str) -> float | None:
        return self._pricing(config).input_price(provider, model)
