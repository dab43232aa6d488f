"""The models the gateway lists (``GET /v1/models``, ``/v1beta/models``, ``…/models/{id}``).

Every model an upstream lists in the config, then every alias, each with the context window and
output limit its ``model_specs`` give (for an alias: those of the first target that has one).
A key is shown the ones its route can reach (`twengine.rules.may_reach`): a model its rules
deny, or that none of the upstreams they send it to offers, is neither listed nor found. The
answer's shape follows the client's format (`twproto.model_listing`).
"""

from __future__ import annotations

from twengine.admission import LocalAnswer, Refusal, RequestView
from twengine.config import Config
from twengine.pricing import PriceTable
from twengine.rules import may_reach
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.model_listing import ModelInfo, encode_model, encode_model_list
from twproto.paths import Operation, PathRoute

__all__ = ("answer_models", "configured_models", "listed_models")


def configured_models(config: Config) -> frozenset[str]:
    """Every model name the config writes: upstreams' model lists and specs, aliases and their
    targets, the models rules set or pin, price sheets' models. A bounded set, unlike the
    names clients send (the metrics label their series with these only)."""
    names: set[str] = set()
    for provider in config.providers:
        names.update(provider.models or ())
        names.update(name for name, _ in provider.model_specs)
    for alias in config.aliases:
        names.add(alias.name)
        names.update(alias.targets)
    for route in config.routes:
        for rule in route.rules:
            if rule.overrides.model is not None:
                names.add(rule.overrides.model)
            if rule.to is not None:
                names.update(pin.model for pin in rule.to.pinned)
    for sheet in config.pricing.sheets:
        names.update(name for name, _ in sheet.models)
    return frozenset(names)


def listed_models(config: Config, table: PriceTable | None = None) -> list[ModelInfo]:
    """The models the gateway lists, in config order; `table` fills the context window and
    output limit that ``model_specs`` leave out."""
    specs: dict[str, tuple[int | None, int | None]] = {}
    for provider in config.providers:
        for name in provider.models or ():
            spec = provider.model_spec(name)
            known = specs.get(name, (None, None))
            if spec is not None:
                known = (known[0] or spec.context_window, known[1] or spec.max_output_tokens)
            specs[name] = known
    if table is not None:
        for name, (context, output) in specs.items():
            if context is None or output is None:
                specs[name] = (
                    context or table.context_window(name),
                    output or table.max_output_tokens(name),
                )
    for alias in config.aliases:
        if alias.name not in specs:
            targets = [specs.get(t, (None, None)) for t in alias.targets]
            specs[alias.name] = next((t for t in targets if t != (None, None)), (None, None))
    return [
        ModelInfo(
            id=name,
            display_name=name,
            context_window=window,
            max_output_tokens=output,
            owned_by="twserve",
        )
        for name, (window, output) in specs.items()
    ]


# The formats a client answered in a listing's shape may send requests in: OpenAI's listing
# serves Chat and Responses clients alike.
_SPEAKERS = {
    Dialect.OPENAI_CHAT: frozenset({Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES}),
    Dialect.OPENAI_RESPONSES: frozenset({Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES}),
    Dialect.ANTHROPIC: frozenset({Dialect.ANTHROPIC}),
    Dialect.GEMINI: frozenset({Dialect.GEMINI}),
}


def answer_models(
    config: Config,
    route: PathRoute,
    dialect: Dialect,
    *,
    client: str | None = None,
    table: PriceTable | None = None,
) -> LocalAnswer | Refusal:
    """The listing, or the one model `route` names, in `dialect`'s shape, of the models gateway
    key `client` can reach (its ``allowed_models`` among them); 404 for a model not listed."""
    speakers = _SPEAKERS[dialect]
    key = config.client(client) if client is not None and config.has_client(client) else None
    infos = [
        info
        for info in listed_models(config, table)
        if (key is None or key.allows_model(info.id))
        and may_reach(config, client, speakers, info.id)
    ]
    if route.operation is Operation.GET_MODEL:
        wanted = (route.model or "").removeprefix("models/")
        info = next((i for i in infos if i.id == wanted), None)
        if info is None:
            error = GatewayError(
                status=404,
                category=ErrorCategory.REQUEST,
                code="gw.request.not_found",
                message=f"model {wanted!r} not found",
            )
            return Refusal(error=error)
        body = encode_model(dialect, info)
    else:
        body = encode_model_list(dialect, infos)
    return LocalAnswer(
        status=200,
        headers=((b"content-type", b"application/json"),),
        body=body,
        input_tokens=0,
        view=RequestView(),
    )
