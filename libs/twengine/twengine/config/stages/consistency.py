"""Stage 3: the checks across sections, once every section has been read.

Names that point elsewhere must exist (group members, rule targets and pins, key routes, rule
clients), names must be unique within their kind, and some settings depend on others: a key
limit on the retention its rebuild needs, a gateway key on differing from the control key, an
upstream's key and headers on the environment they are read from. Each check takes the entries
as stage 2 placed them (`twengine.config.stages.sections`, `twengine.config.stages.providers`,
`twengine.config.stages.routing`: value and path), so a problem names the field it is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from twengine.config.cloud_access import cloud_faults
from twengine.config.credentials import credential_faults
from twengine.config.model import (
    Alias,
    Client,
    ControlListen,
    Group,
    Provider,
    Retention,
    RouteConfig,
    RoutingRule,
    TargetKind,
)
from twengine.config.stages.fields import _at, _Placed, _Problems
from twengine.config.template import TemplateError, resolve_template

__all__ = ()


def _duplicates(out: _Problems, placed: Sequence[_Placed], code: str, what: str) -> None:
    first: dict[str, str] = {}
    for entry in placed:
        name = entry.value.name
        if name in first:
            out.add(
                code, _at(entry.path, "name"), f"{what} {name!r} is already used at {first[name]}"
            )
        else:
            first[name] = entry.path


def _check_clients(
    out: _Problems,
    clients: Sequence[_Placed],
    routes: set[str],
    control_key: str | None,
    retention: Retention,
) -> None:
    _duplicates(out, clients, "config.client_duplicate_name", "key name")
    keys: dict[str, str] = {}
    for entry in clients:
        client: Client = entry.value
        # A rotation's previous key opens the gateway too, until its time: it counts here.
        for field, secret in (("key", client.key), ("previous_key", client.previous_key)):
            if not secret:
                continue
            # The message names the other entry, never the key itself.
            if secret in keys:
                out.add(
                    "config.client_duplicate_key",
                    _at(entry.path, field),
                    f"the same key is already given to {keys[secret]!r}",
                )
            else:
                keys[secret] = client.name
            if control_key is not None and secret == control_key:
                out.add(
                    "config.client_key_is_control_key",
                    _at(entry.path, field),
                    "a gateway key must differ from the control key",
                )
        if client.route is not None and client.route not in routes:
            out.add(
                "engine.client_route_unknown",
                _at(entry.path, "route"),
                f"route {client.route!r} is not defined",
            )
        seen: dict[tuple[object, ...], str] = {}
        for i, limit in enumerate(client.limits):
            # The same window and measure twice: only the smaller could ever refuse.
            same = (limit.per, limit.measure, limit.cache_reads)
            if same in seen:
                out.add(
                    "config.key_limit_duplicate",
                    entry.parts[i],
                    f"key {client.name!r} already has a per-{limit.per.value} "
                    f"{limit.measure.value} limit at {seen[same]}; give each window and "
                    "measure one limit",
                )
            else:
                seen[same] = entry.parts[i]
            if retention.row_days < limit.per.retention_days:
                out.add(
                    "config.key_limit_retention",
                    _at(entry.parts[i], "per"),
                    f"a per-{limit.per.value} limit is rebuilt from stored rows at startup; "
                    f"retention.row_days must be at least {limit.per.retention_days}, "
                    f"is {retention.row_days}",
                )


def _control_key(
    out: _Problems, control: ControlListen, env: Mapping[str, str] | None
) -> str | None:
    """The control key as a caller presents it: its ``${VAR}`` read from `env`. The control
    plane reads the variable per request, so the `Config` keeps the template; but a variable
    that is not set would lock every caller out without a word, so with `env` it refuses the
    config. Without `env` the key as written."""
    key = control.key
    if key is None or env is None or not control.enabled:
        return key
    try:
        return resolve_template(key, env)
    except TemplateError as exc:
        if exc.variable is not None:  # a malformed template is reported with the field
            out.add(
                exc.code,
                "listen.control.key",
                f"{exc.message}; the control plane would let nobody in",
            )
        return None


def _check_credentials(
    out: _Problems, providers: Sequence[_Placed], env: Mapping[str, str] | None
) -> None:
    """Upstream keys and headers are read at send time; at load, a value that could never be
    sent refuses the config, and a variable not set yet is a warning (requests skip the
    upstream until it is). Without `env` only values written out in full are checked."""
    for entry in providers:
        faults = credential_faults(entry.value, env or {}) + cloud_faults(entry.value, env or {})
        for found in faults:
            if not found.field.startswith("headers."):
                path = _at(entry.path, found.field)  # key, region, aws_*, project, location
            else:
                path = _at(_at(entry.path, "headers"), found.field.removeprefix("headers."))
            if found.variable is None:
                out.add("config.secret_invalid", path, found.message)
            elif env is not None:
                out.warn(
                    "config.env_missing",
                    path,
                    f"environment variable {found.variable} is not set; requests skip this "
                    "upstream until it is",
                )


def _check_groups(
    out: _Problems, groups: Sequence[_Placed], providers: set[str], aliases: set[str]
) -> None:
    _duplicates(out, groups, "engine.group_duplicate_name", "group name")
    group_names = {g.value.name for g in groups}
    for entry in groups:
        group: Group = entry.value
        if group.name in providers:
            out.add(
                "engine.name_taken",
                _at(entry.path, "name"),
                f"{group.name!r} is already an upstream's name",
            )
        for i, member in enumerate(group.members):
            if member.provider in providers:
                continue
            if member.provider in group_names:
                why = "is a group; groups list upstreams only"
            elif member.provider in aliases:
                why = "is a model alias, not an upstream"
            else:
                why = "is not an upstream"
            out.add(
                "engine.group_unknown_upstream",
                entry.parts[i],
                f"{member.provider!r} {why}",
            )


def _check_routes(
    out: _Problems,
    routes: Sequence[_Placed],
    providers: Mapping[str, Provider],
    groups: set[str],
    clients: set[str],
    aliases: Mapping[str, Alias],
) -> list[RouteConfig]:
    first: dict[str, str] = {}
    built: list[RouteConfig] = []
    for entry in routes:
        route_name, rules, resume = entry.value
        if route_name in first:
            out.add(
                "engine.route_duplicate_name",
                _at(entry.path, "name"),
                f"route name {route_name!r} is already used at {first[route_name]}",
            )
        else:
            first[route_name] = entry.path
        seen: dict[str, str] = {}
        finished: list[RoutingRule] = []
        for placed in rules:
            rule: RoutingRule = placed.value
            if rule.name in seen:
                out.add(
                    "engine.rule_duplicate_name",
                    _at(placed.path, "name"),
                    f"rule name {rule.name!r} is already used at {seen[rule.name]}",
                )
            else:
                seen[rule.name] = placed.path
            for i, client in enumerate(rule.when.client):
                if client not in clients:
                    cpath = _at(_at(placed.path, "when"), "client")
                    out.add(
                        "engine.rule_unknown_client",
                        _at(cpath, i) if len(rule.when.client) > 1 else cpath,
                        f"{client!r} is not a gateway key name",
                    )
            for provider in rule.when.provider_would_be:
                if provider not in providers:
                    out.add(
                        "engine.rule_hop_unknown_upstream",
                        _at(_at(placed.path, "when"), "provider_would_be"),
                        f"{provider!r} is not an upstream",
                    )
            to = rule.to
            if to is not None and to.kind is TargetKind.PROVIDER and to.name is not None:
                if to.name in groups:
                    to = replace(to, kind=TargetKind.GROUP)
                elif to.name not in providers:
                    out.add(
                        "engine.rule_unknown_target",
                        _at(placed.path, "to"),
                        f"{to.name!r} is neither an upstream nor a group",
                    )
            if to is not None and to.kind is TargetKind.PINNED:
                pinned: set[str] = set()
                for i, pin in enumerate(to.pinned):
                    ppath = (
                        _at(_at(placed.path, "to"), i)
                        if len(to.pinned) > 1
                        else _at(placed.path, "to")
                    )
                    provider_obj = providers.get(pin.provider)
                    if pin.provider in pinned:
                        # A request tries each upstream once; a second pin could never be sent.
                        out.add(
                            "engine.pinned_upstream_twice",
                            _at(ppath, "provider"),
                            f"{pin.provider!r} is pinned twice in this rule; pin each upstream "
                            "once (an alias can offer it several model names)",
                        )
                    pinned.add(pin.provider)
                    if provider_obj is None:
                        out.add(
                            "engine.pinned_unknown_upstream",
                            _at(ppath, "provider"),
                            f"{pin.provider!r} is not an upstream",
                        )
                    elif provider_obj.model_to_send(pin.model, aliases.get(pin.model)) is None:
                        out.add(
                            "engine.pinned_model_not_offered",
                            _at(ppath, "model"),
                            f"upstream {pin.provider!r} does not list model {pin.model!r}",
                        )
            finished.append(replace(rule, to=to))
        built.append(RouteConfig(name=route_name, rules=tuple(finished), resume=resume))
    return built


def _check_aliases(out: _Problems, aliases: Sequence[_Placed]) -> None:
    names = {a.value.name for a in aliases}
    for entry in aliases:
        alias: Alias = entry.value
        for target in alias.targets:
            # A name may list itself: an upstream that knows the alias name literally gets it.
            if target in names and target != alias.name:
                out.add(
                    "engine.alias_to_alias",
                    entry.path,
                    f"{target!r} is itself an alias; list the model names it stands for",
                )
