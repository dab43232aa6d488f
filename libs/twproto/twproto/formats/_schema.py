"""JSON Schema → the OpenAPI subset Gemini's ``parameters`` / ``responseSchema`` accept.

Gemini answers 400 ("Unknown name \"additionalProperties\"…", see
tests/data/fixtures/errors/gemini-400-invalid-argument-schema.json) to keywords outside its
Schema message. Rather than chase a list of rejected keywords, the sanitiser keeps an allow-list
(`_KEPT`) and rewrites the constructs that have an equivalent:

* ``$ref`` is inlined from ``$defs`` / ``definitions`` (a cycle becomes a bare object);
* ``type: [T, "null"]`` and ``anyOf: [X, {type: null}]`` become ``nullable: true``;
* ``const: v`` becomes ``enum: [v]``; ``oneOf`` becomes ``anyOf``; ``allOf`` is merged;
* ``enum`` keeps only string values (Gemini enums are strings);
* ``format`` survives only where Gemini knows it (``enum``, ``date-time``, int32/64, float,
  double);
* ``required`` keeps only names that are in ``properties``.

Everything removed is reported by keyword so the conversion can say what it dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ("sanitize_schema",)

_KEPT = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "items",
        "minimum",
        "maximum",
        "default",
    }
)
_FORMATS = frozenset({"enum", "date-time", "int32", "int64", "float", "double"})
_MAX_DEPTH = 32


def sanitize_schema(schema: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A Gemini-acceptable copy of `schema` and the keywords that were removed."""
    removed: set[str] = set()
    if not isinstance(schema, Mapping):
        return {"type": "object"}, ()
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        table = schema.get(key)
        if isinstance(table, Mapping):
            defs.update(table)
    out = _clean(schema, defs, removed, (), 0)
    return out, tuple(sorted(removed))


def _resolve(ref: str, defs: Mapping[str, Any]) -> Any:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            return defs.get(ref[len(prefix) :])
    return None


def _clean(
    schema: Mapping[str, Any],
    defs: Mapping[str, Any],
    removed: set[str],
    seen: tuple[str, ...],
    depth: int,
) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        removed.add("(depth)")
        return {"type": "object"}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, defs)
        removed.add("$ref")
        if not isinstance(target, Mapping) or ref in seen:
            return {"type": "object"}
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _clean(merged, defs, removed, (*seen, ref), depth + 1)

    src = dict(schema)
    if "allOf" in src:
        parts = src.pop("allOf")
        removed.add("allOf")
        if isinstance(parts, list):
            for part in parts:
                if not isinstance(part, Mapping):
                    continue
                if isinstance(part.get("$ref"), str):
                    resolved = _resolve(part["$ref"], defs)
                    part = resolved if isinstance(resolved, Mapping) else {}
                for key, value in part.items():
                    if key == "properties" and isinstance(value, Mapping):
                        src["properties"] = {**dict(src.get("properties") or {}), **value}
                    elif key == "required" and isinstance(value, list):
                        src["required"] = [*list(src.get("required") or []), *value]
                    else:
                        src.setdefault(key, value)
    if "oneOf" in src and "anyOf" not in src:
        src["anyOf"] = src.pop("oneOf")
        removed.add("oneOf")
    if "const" in src:
        const = src.pop("const")
        removed.add("const")
        if isinstance(const, str):
            src["enum"] = [const]
            src.setdefault("type", "string")

    out: dict[str, Any] = {}
    nullable = False
    kind = src.get("type")
    if isinstance(kind, list):
        types = [t for t in kind if t != "null"]
        nullable = len(types) != len(kind)
        if len(types) == 1:
            out["type"] = types[0]
        elif types:
            # Several non-null types: Gemini has anyOf for that.
            out["anyOf"] = [{"type": t} for t in types]
    elif isinstance(kind, str) and kind != "null":
        out["type"] = kind

    for key, value in src.items():
        if key == "type":
            continue
        if key not in _KEPT:
            removed.add(key)
            continue
        if key == "properties":
            if isinstance(value, Mapping):
                out["properties"] = {
                    str(name): _clean(sub, defs, removed, seen, depth + 1)
                    if isinstance(sub, Mapping)
                    else {"type": "string"}
                    for name, sub in value.items()
                }
        elif key == "items":
            if isinstance(value, Mapping):
                out["items"] = _clean(value, defs, removed, seen, depth + 1)
            elif isinstance(value, list) and value and isinstance(value[0], Mapping):
                removed.add("items(tuple)")
                out["items"] = _clean(value[0], defs, removed, seen, depth + 1)
        elif key == "anyOf":
            if isinstance(value, list):
                options = [v for v in value if isinstance(v, Mapping)]
                non_null = [v for v in options if v.get("type") != "null"]
                if len(non_null) != len(options):
                    nullable = True
                cleaned = [_clean(v, defs, removed, seen, depth + 1) for v in non_null]
                if len(cleaned) == 1:
                    for k, v in cleaned[0].items():
                        out.setdefault(k, v)
                elif cleaned:
                    out["anyOf"] = cleaned
        elif key == "enum":
            if isinstance(value, list):
                strings = [v for v in value if isinstance(v, str)]
                if len(strings) == len(value) and strings:
                    out["enum"] = strings
                    out.setdefault("type", "string")
                else:
                    removed.add("enum(non-string)")
        elif key == "format":
            if value in _FORMATS:
                out["format"] = value
            else:
                removed.add("format")
        elif key == "required":
            if isinstance(value, list):
                out["required"] = [v for v in value if isinstance(v, str)]
        else:
            out[key] = value

    if "properties" in out:
        out.setdefault("type", "object")
    if "required" in out:
        names = out.get("properties") or {}
        required = [r for r in dict.fromkeys(out["required"]) if r in names]
        if required:
            out["required"] = required
        else:
            del out["required"]
    if "format" in out and out.get("type") != "string" and out["format"] in ("enum", "date-time"):
        del out["format"]
    if nullable:
        out["nullable"] = True
    return out
