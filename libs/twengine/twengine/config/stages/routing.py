"""Stage 2 for the routing sections: ``aliases``, ``groups`` and ``routes`` with their rules.

A check that needs only the entry's own fields is made here (a group's weights against its
type, a rule's conditions and its one target); whether the names they point at exist is
stage 3's (`twengine.config.stages.consistency`). Each entry is returned as a `_Placed`, its
value with the path it was read at; a group's members and a route's rules keep the paths of
their items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twengine.config import defaults
from twengine.config.model import (
    ALL_UPSTREAMS,
    Alias,
    BalanceBy,
    Comparison,
    Group,
    GroupMember,
    GroupType,
    OnMatch,
    PinnedTarget,
    RoutingRule,
    SetOverrides,
    Target,
    TargetKind,
    When,
    parse_comparison,
)
from twengine.config.schema import SECTIONS
from twengine.config.stages.fields import (
    _ABSENT,
    _as_choice,
    _as_model,
    _as_name,
    _as_text,
    _at,
    _entries,
    _Fields,
    _is_seq,
    _kind,
    _one_or_many,
    _Placed,
    _Problems,
)
from twproto.dialect import Dialect
from twproto.ir import ReasoningLevel

__all__ = ()


def _aliases(out: _Problems, top: _Fields) -> list[_Placed]:
    mapping = top.mapping("aliases")
    if mapping is None:
        return []
    placed: list[_Placed] = []
    for alias, value in mapping.items():
        path = _at("aliases", str(alias))
        name = _as_model(out, path, alias)
        if value is None or (_is_seq(value) and not value):
            out.add("engine.alias_empty", path, "an alias needs at least one model name")
            continue
        items = _one_or_many(out, path, value) or []
        targets = [_as_model(out, tpath, t) for tpath, t in items]
        if name is None or any(t is None for t in targets):
            continue
        placed.append(
            _Placed(path=path, value=Alias(name=name, targets=tuple(t for t in targets if t)))
        )
    return placed


def _member(
    out: _Problems, path: str, item: object, group_type: GroupType | None
) -> GroupMember | None:
    if isinstance(item, str):
        name = _as_name(out, path, item)
        return None if name is None else GroupMember(provider=name)
    f = _Fields.of(out, path, item, SECTIONS["groups[].providers[]"])
    if f is None:
        return None
    name = f.name()
    weight = 1
    if f.has("weight"):
        if group_type is not None and group_type is not GroupType.LOAD_BALANCE:
            out.add(
                "engine.group_weight_not_load_balance",
                f.at("weight"),
                f"weights only apply to load-balance groups, not {group_type.value}",
            )
        else:
            weight = (
                f.integer("weight", defaults.GROUP_WEIGHT, code="engine.group_weight_out_of_range")
                or 1
            )
    return None if name is None else GroupMember(provider=name, weight=weight)


def _groups(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "groups"):
        f = _Fields.of(out, path, item, SECTIONS["groups[]"])
        if f is None:
            continue
        name = f.name()
        type_given = f.has("type")
        group_type = f.choice("type", GroupType)
        if not type_given:
            group_type = GroupType.FALLBACK
        members: list[GroupMember] = []
        member_paths: list[str] = []
        if f.required("providers") is not _ABSENT:
            entries = _entries(out, f, "providers")
            if not entries and _is_seq(f.raw("providers")):
                out.add(
                    "engine.group_empty", f.at("providers"), "a group needs at least one upstream"
                )
            for mpath, mitem in entries:
                member = _member(out, mpath, mitem, group_type)
                if member is None:
                    continue
                if any(m.provider == member.provider for m in members):
                    out.add(
                        "engine.group_upstream_twice",
                        mpath,
                        f"{member.provider!r} is listed twice in group {name!r}",
                    )
                    continue
                members.append(member)
                member_paths.append(mpath)
        selected = f.name("selected", required=False)
        if selected is not None and group_type is not None:
            if group_type is not GroupType.SELECT:
                out.add(
                    "engine.group_selected_not_select",
                    f.at("selected"),
                    f"selected only applies to select groups, not {group_type.value}",
                )
                selected = None
            elif not any(m.provider == selected for m in members):
                out.add(
                    "engine.group_selected_unknown",
                    f.at("selected"),
                    f"{selected!r} is not a member of group {name!r}",
                )
                selected = None
        balance_by = f.choice("balance_by", BalanceBy, BalanceBy.WEIGHTS)
        if f.has("balance_by") and group_type not in (None, GroupType.LOAD_BALANCE):
            assert group_type is not None
            out.add(
                "engine.group_balance_by_not_load_balance",
                f.at("balance_by"),
                f"balance_by only applies to load-balance groups, not {group_type.value}",
            )
        if name is None:
            continue
        group = Group(
            name=name,
            type=group_type or GroupType.FALLBACK,
            members=tuple(members),
            selected=selected,
            balance_by=balance_by,
            resume=f.boolean("resume", False),
        )
        placed.append(_Placed(path=path, value=group, parts=tuple(member_paths)))
    return placed


def _when(out: _Problems, f: _Fields) -> When:
    wf = f.fields("when", SECTIONS["routes[].rules[].when"])
    if wf is None:
        return When()

    def texts(name: str, check: Any) -> tuple[Any, ...]:
        value = wf.raw(name)
        if value is _ABSENT:
            return ()
        items = _one_or_many(out, wf.at(name), value)
        if items is None:
            return ()
        found = [check(out, p, v) for p, v in items]
        return tuple(v for v in found if v is not None)

    def comparison(name: str) -> Comparison | None:
        value = wf.raw(name)
        if value is _ABSENT:
            return None
        if not isinstance(value, str | int):
            out.add(
                "engine.rule_comparison_invalid",
                wf.at(name),
                f"expected a comparison such as '>200k', got {_kind(value)}",
            )
            return None
        try:
            return parse_comparison(value)
        except ValueError as exc:
            out.add("engine.rule_comparison_invalid", wf.at(name), str(exc))
            return None

    def glob(o: _Problems, path: str, value: object) -> str | None:
        text = _as_text(o, path, value)
        if text is not None and not text.strip():
            o.add("config.model_name_invalid", path, "a model pattern cannot be blank")
            return None
        return text

    def dialect(o: _Problems, path: str, value: object) -> Dialect | None:
        return _as_choice(o, path, value, Dialect)

    return When(
        model=texts("model", glob),
        client=texts("client", _as_name),
        dialect=texts("dialect", dialect),
        input_tokens=comparison("input_tokens"),
        max_tokens=comparison("max_tokens"),
        tool_count=comparison("tool_count"),
        tools=wf.boolean("tools"),
        image=wf.boolean("image"),
        thinking=wf.boolean("thinking"),
        stream=wf.boolean("stream"),
        provider_would_be=texts("provider_would_be", _as_name),
    )


def _set(out: _Problems, f: _Fields) -> SetOverrides:
    sf = f.fields("set", SECTIONS["routes[].rules[].set"])
    if sf is None:
        return SetOverrides()
    model = _as_model(out, sf.at("model"), sf.raw("model")) if sf.has("model") else None
    return SetOverrides(
        model=model,
        max_tokens=sf.integer("max_tokens", defaults.SET_MAX_TOKENS)
        if sf.has("max_tokens")
        else None,
        reasoning=sf.choice("reasoning", ReasoningLevel),
    )


def _target(out: _Problems, f: _Fields) -> Target | None:
    value = f.raw("to")
    path = f.at("to")
    if value is _ABSENT:
        return None
    if isinstance(value, str):
        if value == ALL_UPSTREAMS:
            return Target(kind=TargetKind.ALL)
        name = _as_name(out, path, value)
        # The kind is settled in the consistency stage, once every name is known.
        return None if name is None else Target(kind=TargetKind.PROVIDER, name=name)
    items: list[tuple[str, object]]
    if isinstance(value, Mapping):
        items = [(path, value)]
    elif _is_seq(value):
        assert isinstance(value, Sequence)
        items = [(_at(path, i), item) for i, item in enumerate(value)]
        if not items:
            out.add("engine.rule_unknown_target", path, "to: [] names no upstream")
            return None
    else:
        out.add(
            "config.wrong_type",
            path,
            f"to is an upstream or group name, {ALL_UPSTREAMS}, or a list of "
            f"{{provider, model}}; got {_kind(value)}",
        )
        return None
    pins: list[PinnedTarget] = []
    for ipath, item in items:
        pf = _Fields.of(out, ipath, item, SECTIONS["routes[].rules[].to[]"])
        if pf is None:
            continue
        provider = pf.name("provider")
        model_raw = pf.required("model")
        model = None if model_raw is _ABSENT else _as_model(out, pf.at("model"), model_raw)
        if provider is not None and model is not None:
            pins.append(PinnedTarget(provider=provider, model=model))
    if len(pins) != len(items):
        return None
    return Target(kind=TargetKind.PINNED, pinned=tuple(pins))


def _deny(out: _Problems, f: _Fields, rule_name: str | None) -> str | None:
    value = f.raw("deny")
    if value is _ABSENT or value is False:
        return None
    if value is True:
        return f"denied by rule {rule_name!r}"
    if isinstance(value, str) and value.strip():
        return str(value)
    out.add(
        "config.wrong_type",
        f.at("deny"),
        f"deny is true or a message for the client, got {_kind(value)}",
    )
    return None


def _rule(out: _Problems, path: str, item: object) -> RoutingRule | None:
    f = _Fields.of(out, path, item, SECTIONS["routes[].rules[]"])
    if f is None:
        return None
    name = f.name()
    when = _when(out, f)
    to = _target(out, f)
    overrides = _set(out, f)
    deny = _deny(out, f, name)
    on_match = f.choice("on_match", OnMatch)
    has_to, has_deny = f.has("to"), f.has("deny") and f.raw("deny") is not False
    if has_to and has_deny:
        out.add("engine.rule_to_and_deny", path, "a rule either routes (to) or refuses (deny)")
    elif not has_to and not has_deny and not f.has("set"):
        out.add("engine.rule_no_action", path, "a rule needs to, deny or set")
    if when.per_hop:
        if has_to or has_deny:
            out.add(
                "engine.rule_hop_only_set",
                path,
                "a provider_would_be rule is judged per upstream tried; it may only set",
            )
        elif on_match is not OnMatch.CONTINUE:
            out.add(
                "engine.rule_hop_needs_continue",
                f.at("on_match"),
                "a provider_would_be rule cannot end rule matching; write on_match: continue",
            )
    elif (has_to or has_deny) and on_match is OnMatch.CONTINUE:
        out.add(
            "engine.rule_continue_with_target",
            f.at("on_match"),
            "a rule with to or deny decides the request; on_match: continue cannot apply",
        )
    if name is None:
        return None
    return RoutingRule(
        name=name, when=when, to=to, overrides=overrides, deny=deny, on_match=on_match
    )


def _routes(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "routes"):
        f = _Fields.of(out, path, item, SECTIONS["routes[]"])
        if f is None:
            continue
        name = f.name()
        rules = [_Placed(path=p, value=_rule(out, p, i)) for p, i in _entries(out, f, "rules")]
        resume = f.boolean("resume", False)
        if name is not None:
            placed.append(_Placed(path=path, value=(name, [r for r in rules if r.value], resume)))
    return placed
