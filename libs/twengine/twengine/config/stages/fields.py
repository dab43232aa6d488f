"""Stage 2's readers: one config field at a time, checked for its type and shape.

`_Fields` reads one mapping of the config through the section's allowed field names (from
`twengine.config.schema`), so an unknown field (usually a misspelling) is reported with the
nearest known name; its methods read a field as text, a name, a number within its `Bound`, a
choice of an enum, a nested mapping or a list. The `_as_*` functions check one value wherever it
sits (a list item, a mapping key). Each problem goes to a `_Problems`, which collects them all
rather than stop at the first; a field that fails reads as its default (or None), so one mistake
does not cascade.

`_Placed` is how a list section's entry travels from stage 2 to stage 3: its value with the path
it was read at.

Nothing here is API: these are the shared tools of `build_config`'s stages
(`sections`, `providers`, `routing` and `consistency` beside this module), private to
`twengine.config`.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, TypeVar, overload

from twengine.codes import CODES
from twengine.config.defaults import Bound
from twengine.config.model import ALL_UPSTREAMS
from twengine.config.problem import Problem
from twengine.config.template import TemplateError, template_variables

__all__ = ()


class _Absent(Enum):
    ABSENT = 0


_ABSENT = _Absent.ABSENT
_E = TypeVar("_E", bound=StrEnum)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
_WILDCARD = re.compile(r"[*?\[\]]")


class _Problems:
    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.warnings: list[Problem] = []

    def add(self, code: str, path: str, message: str) -> None:
        # An unregistered code is a bug here, not a config problem.
        assert code in CODES, code
        self.items.append(Problem(code=code, path=path, message=message))

    def warn(self, code: str, path: str, message: str) -> None:
        assert code in CODES, code
        self.warnings.append(Problem(code=code, path=path, message=message))


def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def _is_seq(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, Mapping):
        return "a mapping"
    if _is_seq(value):
        return "a list"
    return type(value).__name__


def _as_text(out: _Problems, path: str, value: object) -> str | None:
    if isinstance(value, str):
        return str(value)
    out.add("config.wrong_type", path, f"expected text, got {_kind(value)}")
    return None


def _as_time(out: _Problems, path: str, value: object) -> float | None:
    """A wall-clock time: unix seconds, or an ISO 8601 date or date-time (YAML may have read it
    as one already); without an offset it is UTC."""
    when: dt.datetime | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and 0 <= value < 1e11:
            return float(value)
    elif isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, dt.date):
        when = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            when = None
    if when is None:
        out.add(
            "config.time_invalid",
            path,
            f"expected unix seconds or an ISO 8601 time (2026-12-31T23:00:00Z), got {value!r}",
        )
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _as_bool(out: _Problems, path: str, value: object) -> bool | None:
    if isinstance(value, bool):
        return bool(value)
    out.add("config.wrong_type", path, f"expected true or false, got {_kind(value)}")
    return None


def _as_number(out: _Problems, path: str, value: object, bound: Bound, code: str) -> float | None:
    name = path.rsplit(".", 1)[-1]
    if isinstance(value, bool) or not isinstance(value, int | float):
        out.add("config.wrong_type", path, f"{name} must be a number, got {_kind(value)}")
        return None
    if bound.integer and not isinstance(value, int):
        out.add("config.wrong_type", path, f"{name} must be a whole number, got {value}")
        return None
    if not math.isfinite(value) or not bound.holds(value):
        out.add(code, path, f"{name} must be {bound.describe()}, got {value}")
        return None
    return float(value) if not bound.integer else int(value)


def _as_choice(out: _Problems, path: str, value: object, enum: type[_E]) -> _E | None:
    choices = ", ".join(e.value for e in enum)
    if not isinstance(value, str):
        out.add("config.wrong_type", path, f"expected one of {choices}; got {_kind(value)}")
        return None
    try:
        return enum(str(value))
    except ValueError:
        out.add("config.invalid_choice", path, f"{value!r} is not one of {choices}")
        return None


# Control and format characters, line and paragraph separators, and every space but U+0020:
# none belongs in a name, and a U+2028 in one breaks the file's lines for tools that split on it.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp", "Zs"})


def _unprintable(text: str) -> str | None:
    """The first character of `text` that has no place in a name, as ``U+XXXX``; None."""
    for char in text:
        if char != " " and unicodedata.category(char) in _UNPRINTABLE:
            return f"U+{ord(char):04X}"
    return None


def _printable(out: _Problems, path: str, text: str) -> bool:
    found = _unprintable(text)
    if found is not None:
        out.add(
            "config.name_unprintable",
            path,
            f"the name holds {found}, a control or separator character; names are visible text",
        )
    return found is None


def _as_name(out: _Problems, path: str, value: object) -> str | None:
    text = _as_text(out, path, value)
    if text is None:
        return None
    if not _printable(out, path, text):
        return None
    if not text.strip() or text != text.strip():
        out.add("config.name_invalid", path, f"{text!r} is not a usable name")
        return None
    if text == ALL_UPSTREAMS:
        out.add("config.name_invalid", path, f"{ALL_UPSTREAMS} is reserved for 'every upstream'")
        return None
    return text


def _as_model(out: _Problems, path: str, value: object) -> str | None:
    """An exact model name: not blank, no wildcard, visible characters."""
    text = _as_text(out, path, value)
    if text is None or not _printable(out, path, text):
        return None
    if not text.strip():
        out.add("config.model_name_invalid", path, "a model name cannot be blank")
        return None
    if _WILDCARD.search(text):
        out.add(
            "config.model_name_invalid",
            path,
            f"{text!r} is a pattern; an exact model name is needed here",
        )
        return None
    return text


def _as_secret(out: _Problems, path: str, value: object) -> str | None:
    """A key as written: non-empty, ``${VAR}`` templates well-formed. Never echoed."""
    text = _as_text(out, path, value)
    if text is None:
        return None
    if not text.strip():
        out.add("config.key_empty", path, "a key cannot be empty")
        return None
    try:
        template_variables(text)
    except TemplateError as exc:
        out.add(exc.code, path, exc.message)
        return None
    return text


class _Fields:
    """One mapping being read: only `allowed` field names may appear in it.

    A value of None (a YAML key written without a value) counts as absent, so ``route:`` with
    nothing after it means the same as no ``route`` line.
    """

    def __init__(
        self, out: _Problems, path: str, data: Mapping[Any, Any], allowed: Iterable[str]
    ) -> None:
        self.out = out
        self.path = path
        known = tuple(allowed)
        self.values: dict[str, object] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                out.add("config.wrong_type", path, f"field names are text, got {key!r}")
                continue
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                out.add("config.unknown_field", _at(path, key), f"unknown field {key!r}{hint}")
                continue
            self.values[str(key)] = value

    @classmethod
    def of(cls, out: _Problems, path: str, value: object, allowed: Iterable[str]) -> _Fields | None:
        if not isinstance(value, Mapping):
            out.add("config.wrong_type", path, f"expected a mapping, got {_kind(value)}")
            return None
        return cls(out, path, value, allowed)

    def at(self, name: str) -> str:
        return _at(self.path, name)

    def raw(self, name: str) -> object:
        value = self.values.get(name)
        return _ABSENT if value is None else value

    def has(self, name: str) -> bool:
        return self.raw(name) is not _ABSENT

    def required(self, name: str) -> object:
        value = self.raw(name)
        if value is _ABSENT:
            self.out.add("config.missing_field", self.at(name), f"{name} is required")
        return value

    def fields(self, name: str, allowed: Iterable[str]) -> _Fields | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        return _Fields.of(self.out, self.at(name), value, allowed)

    def mapping(self, name: str) -> Mapping[Any, Any] | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        if not isinstance(value, Mapping):
            self.out.add(
                "config.wrong_type", self.at(name), f"expected a mapping, got {_kind(value)}"
            )
            return None
        return value

    def sequence(self, name: str) -> Sequence[object] | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        if not _is_seq(value):
            self.out.add("config.wrong_type", self.at(name), f"expected a list, got {_kind(value)}")
            return None
        assert isinstance(value, Sequence)
        return value

    @overload
    def text(self, name: str, default: str) -> str: ...
    @overload
    def text(self, name: str, default: None = None) -> str | None: ...
    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_text(self.out, self.at(name), value)
        return default if found is None else found

    def name(self, field_name: str = "name", *, required: bool = True) -> str | None:
        value = self.required(field_name) if required else self.raw(field_name)
        if value is _ABSENT:
            return None
        return _as_name(self.out, self.at(field_name), value)

    @overload
    def boolean(self, name: str, default: bool) -> bool: ...
    @overload
    def boolean(self, name: str, default: None = None) -> bool | None: ...
    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_bool(self.out, self.at(name), value)
        return default if found is None else found

    def number(self, name: str, bound: Bound, *, code: str = "config.out_of_range") -> float | None:
        """The value, the bound's default when absent, or None when invalid and no default."""
        value = self.raw(name)
        if value is not _ABSENT:
            found = _as_number(self.out, self.at(name), value, bound, code)
            if found is not None:
                return found
        return None if bound.default is None else float(bound.default)

    def integer(self, name: str, bound: Bound, *, code: str = "config.out_of_range") -> int | None:
        found = self.number(name, bound, code=code)
        return None if found is None else int(found)

    @overload
    def choice(self, name: str, enum: type[_E], default: _E) -> _E: ...
    @overload
    def choice(self, name: str, enum: type[_E], default: None = None) -> _E | None: ...
    def choice(self, name: str, enum: type[_E], default: _E | None = None) -> _E | None:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        found = _as_choice(self.out, self.at(name), value, enum)
        return default if found is None else found


def _entries(out: _Problems, f: _Fields, name: str) -> list[tuple[str, object]]:
    """(path, item) for each item of list field `name`."""
    items = f.sequence(name)
    if items is None:
        return []
    return [(_at(f.at(name), i), item) for i, item in enumerate(items)]


def _one_or_many(out: _Problems, path: str, value: object) -> list[tuple[str, object]] | None:
    """A scalar or a non-empty list of them, as (path, item) pairs."""
    if not _is_seq(value):
        return [(path, value)]
    assert isinstance(value, Sequence)
    if not value:
        out.add(
            "config.wrong_type",
            path,
            "an empty list matches nothing; leave the condition out to match anything",
        )
        return None
    return [(_at(path, i), item) for i, item in enumerate(value)]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Placed:
    """A parsed entry and where it sits, for consistency messages."""

    path: str
    value: Any
    # Paths of the entry's sub-items that survived parsing (group members, key limits), in
    # step with the value's tuple of them.
    parts: tuple[str, ...] = ()
