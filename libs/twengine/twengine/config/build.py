"""Validation: parsed config data → `Config`, or `ConfigError` naming every problem.

twserve parses the YAML (stage 1, ``config.yaml_invalid``) and hands over plain mappings,
sequences and scalars. `build_config` runs the remaining stages in order; each stage lives in
a module of its own under `twengine.config.stages`:

2. **Schema** (`stages.fields` reads one field; `stages.sections`, `stages.providers` and
   `stages.routing` one section each) — each section
   is read field by field. Every mapping is read through `_Fields`, which knows the section's
   allowed field names, so an unknown field (usually a misspelling) is reported with the
   nearest known name. Types, required fields and ranges are checked here, comparisons such as
   ``">200k"`` are parsed, and templates are checked for syntax.
3. **Consistency** (`stages.consistency`) — names that point elsewhere (group
   members, rule targets, key routes, `default_route`, price sheets) must exist, names must be
   unique, and some settings depend on others (key limits on retention, the slow-start wait on
   its switch).
4. **Build** (here) — the `Config` is assembled. It is only made when no problem was found.

Every problem is collected, not only the first: an operator fixing a config wants the whole
list in one go. To keep one mistake from causing a cascade of others, a field that fails its
check is replaced by its default and its entry is kept as long as its *name* is sound — so a
provider with a bad URL still counts as a known upstream for the groups that list it.

A problem carries a stable code from `twengine.codes`, the path of the offending field in the
config (``providers[2].max_concurrent``), and a message for people. Messages never repeat a
secret.
"""

from __future__ import annotations

from collections.abc import Mapping

from twengine.config.model import AnswerModel, Config, Pricing
from twengine.config.problem import Problem
from twengine.config.schema import SECTIONS
from twengine.config.stages.consistency import (
    _check_aliases,
    _check_clients,
    _check_credentials,
    _check_groups,
    _check_routes,
    _control_key,
    _duplicates,
)
from twengine.config.stages.fields import _ABSENT, _at, _Fields, _kind, _Problems
from twengine.config.stages.notify import _notifications
from twengine.config.stages.providers import _providers
from twengine.config.stages.routing import _aliases, _groups, _routes
from twengine.config.stages.sections import (
    _clients,
    _failover,
    _listen,
    _not_built,
    _observability,
    _pool,
    _pricing,
    _retention,
    _state,
    _store,
)

__all__ = ("ConfigError", "Problem", "build_config")


class ConfigError(Exception):
    """A config that cannot be used; `problems` lists everything found, in config order."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the config"
        return "\n  ".join([head, *(str(p) for p in self.problems)])


def build_config(data: Mapping[str, object], env: Mapping[str, str] | None = None) -> Config:
    """Validate parsed config data and build the `Config`.

    Raises `ConfigError` listing every problem found: schema problems section by section, then
    consistency problems.

    `env` is the environment ``${VAR}`` templates are read from. With it, gateway keys are
    resolved (a variable that is not set refuses the config, as it does for the control key,
    which stays a template in the `Config`) and upstream keys and headers are
    checked (a value that cannot be sent refuses the config; a variable that is not set is a
    warning in `Config.warnings`). Without it — checking a config's shape only — templates are
    checked for syntax and kept as written.
    """
    out = _Problems()
    if not isinstance(data, Mapping):
        raise ConfigError(
            (
                Problem(
                    code="config.yaml_invalid",
                    path="",
                    message=f"the config must be a mapping, got {_kind(data)}",
                ),
            )
        )
    top = _Fields(out, "", data, SECTIONS[""])

    # Stage 2: schema.
    version = top.required("version")
    if version is not _ABSENT and (
        isinstance(version, bool) or not isinstance(version, int) or version != 1
    ):
        out.add(
            "config.version_unsupported",
            "version",
            f"this twserve reads config version 1, got {version!r}",
        )
    listen = _listen(out, top)
    retention = _retention(out, top)
    failover = _failover(out, top)
    sheets = _pricing(out, top)
    clients = _clients(out, top, env)
    providers = _providers(out, top)
    aliases = _aliases(out, top)
    groups = _groups(out, top)
    routes = _routes(out, top)
    default_route = top.name("default_route", required=False)
    default_key = top.name("default_key", required=False)
    answer_model = top.choice("answer_model", AnswerModel, AnswerModel.REQUESTED)
    state = _state(out, top)
    store = _store(out, top, env)
    observability = _observability(out, top)
    pool = _pool(out, top)
    notifications = _notifications(out, top, env)
    _not_built(out, data)

    # Stage 3: consistency.
    provider_map = {p.value.name: p.value for p in providers}
    alias_map = {a.value.name: a.value for a in aliases}
    route_names = {r.value[0] for r in routes}
    client_names = {c.value.name for c in clients}
    _duplicates(out, sheets, "config.price_sheet_duplicate", "price sheet")
    control_key = _control_key(out, listen.control, env)
    _check_clients(out, clients, route_names, control_key, retention)
    if default_key is not None and default_key not in client_names:
        out.add("config.default_key_unknown", "default_key", f"{default_key!r} is not a key name")
    _duplicates(out, providers, "config.provider_duplicate_name", "upstream name")
    sheet_names = {s.value.name for s in sheets}
    for entry in providers:
        sheet = entry.value.price_sheet
        if sheet is not None and sheet not in sheet_names:
            out.add(
                "config.price_sheet_unknown",
                _at(entry.path, "price_sheet"),
                f"{sheet!r} is not in pricing.sheets",
            )
    _check_credentials(out, providers, env)
    _check_aliases(out, aliases)
    _check_groups(out, groups, set(provider_map), set(alias_map))
    built_routes = _check_routes(
        out, routes, provider_map, {g.value.name for g in groups}, client_names, alias_map
    )
    if default_route is not None and default_route not in route_names:
        out.add(
            "engine.default_route_unknown",
            "default_route",
            f"route {default_route!r} is not defined",
        )

    if out.items:
        raise ConfigError(tuple(out.items))

    # Stage 4: build.
    return Config(
        version=1,
        listen=listen,
        clients=tuple(c.value for c in clients),
        providers=tuple(p.value for p in providers),
        aliases=tuple(a.value for a in aliases),
        groups=tuple(g.value for g in groups),
        routes=tuple(built_routes),
        default_route=default_route,
        default_key=default_key,
        failover=failover,
        answer_model=answer_model,
        retention=retention,
        pricing=Pricing(sheets=tuple(s.value for s in sheets)),
        state=state,
        store=store,
        observability=observability,
        pool=pool,
        notifications=tuple(notifications),
        warnings=tuple(out.warnings),
    )
