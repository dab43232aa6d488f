"""Every Lua script twserve runs on Redis names its keys only through ``KEYS``.

A Redis Cluster routes a script by the keys it is given and refuses one whose keys lie in
different slots; a key a script builds for itself (from a literal, ``..`` or ``ARGV``) may lie on
another node, where the script cannot reach it. So each ``redis.call`` on a key must take it from
``KEYS[...]``, directly or through locals and function parameters that only ever hold ``KEYS``
entries — checked here on every script passed to `RedisState.script` (or `register_script`)
anywhere in twserve. That the keys given share one hash tag (one slot) is checked on every call
the tests make (`tests/conftest.py`, `scripts_keep_keys_in_one_slot`) and by the Cluster tests
(tests/twserve/topology).

One script is given keys of several slots: `twserve.shared.admission.ADMISSION`, which chains
a request's key limit (``ADMIT``), load-balance turn (``SWRR_STEP``) and slot leases
(``ACQUIRE``) into one round trip. It is a single-server script (one server, or the master
Sentinel names), never sent to a Cluster, where those run one after another: each of its parts
is one of the scripts checked here, given keys of one slot, and the conftest check asserts on
every call that it goes to no Cluster and that each part's keys share one slot; the Cluster
round-trip tests (tests/twserve/shared/test_redis_round_trips.py) run every case on a real
Cluster, which would refuse it.
"""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.support.layout import ROOT

# Commands whose first argument is no key.
KEYLESS = {"PUBLISH", "SPUBLISH", "TIME", "ECHO", "PING", "INFO"}

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*,\s*")
_ASSIGN = re.compile(r"^\s*(?:local\s+)?(\w+(?:\s*,\s*\w+)*)\s*=(?!=)\s*(.+?)\s*$")
_FUNCTION = re.compile(r"function\s+(\w+)\s*\(([^)]*)\)")
_KEYS = re.compile(r"KEYS\[[^\]]+\]")


def _args(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose ``(`` is at `start` - 1."""
    depth, out, cur = 0, [], ""
    for ch in text[start:]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                out.append(cur.strip())
                return out
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    raise ValueError("unbalanced call")


def _split(expr: str) -> list[str]:
    return _args(expr + ")", 0)


_WORD = re.compile(r"[A-Za-z_]\w*")


def _scopes(lua: str) -> list[str]:
    """Per line of `lua` (comments and strings blanked), the function it lies in (``""``: the
    script's body)."""
    stack: list[str] = []
    out = []
    for line in lua.splitlines():
        code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", line.split("--", 1)[0])
        out.append(next((f for f in reversed(stack) if f), ""))
        words = _WORD.findall(code)
        for i, word in enumerate(words):
            if word == "function":
                stack.append(words[i + 1] if i + 1 < len(words) else "?")
                if not out[-1]:
                    out[-1] = stack[-1]
            elif word in ("if", "for", "while"):
                stack.append("")
            elif word == "end" and stack:
                stack.pop()
    return out


def key_problems(lua: str) -> list[str]:
    """What in `lua` names a key other than through ``KEYS`` (empty: nothing). Names are
    told apart by the function that declares them (a parameter, a ``local``), else the body's."""
    lines = lua.splitlines()
    scopes = _scopes(lua)
    declared: dict[str, set[str]] = {}
    for fn in _FUNCTION.finditer(lua):
        declared.setdefault(fn[1], set()).update(p.strip() for p in fn[2].split(",") if p.strip())
    for line, scope in zip(lines, scopes, strict=True):
        found = re.match(r"^\s*local\s+(\w+(?:\s*,\s*\w+)*)\s*=", line)
        if found and scope:
            declared.setdefault(scope, set()).update(n.strip() for n in found[1].split(","))

    def qualify(name: str, scope: str) -> str:
        return f"{scope}.{name}" if name in declared.get(scope, ()) else f".{name}"

    bindings: dict[str, list[tuple[str, str]]] = {}
    for line, scope in zip(lines, scopes, strict=True):
        code = line.split("--", 1)[0]
        found = _ASSIGN.match(code)
        if found and not code.lstrip().startswith(("if ", "for ", "return ", "while ")):
            names = [n.strip() for n in found[1].split(",")]
            values = _split(found[2])
            for i, name in enumerate(names):
                value = values[i] if i < len(values) else "nil"
                bindings.setdefault(qualify(name, scope), []).append((value, scope))
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)

    def scope_at(pos: int) -> str:
        row = next(i for i in range(len(lines)) if offsets[i + 1] > pos)
        return scopes[row]

    for fn in _FUNCTION.finditer(lua):
        params = [p.strip() for p in fn[2].split(",") if p.strip()]
        for param in params:  # a function never called here binds nothing
            bindings.setdefault(f"{fn[1]}.{param}", [])
        for call in re.finditer(rf"(?<![\w.]){fn[1]}\(", lua):
            if lua[max(0, call.start() - 9) : call.start()].endswith("function "):
                continue
            given = _args(lua, call.end())
            where = scope_at(call.start())
            for i, param in enumerate(params):
                value = given[i] if i < len(given) else "nil"
                bindings[f"{fn[1]}.{param}"].append((value, where))
    # The names that hold keys: all of them at first, less each one bound to anything but a
    # key, until none is left to remove (so a key passed round in a circle stays a key).
    keyish = set(bindings)

    def is_key(expr: str, scope: str) -> bool:
        return _KEYS.fullmatch(expr) is not None or qualify(expr, scope) in keyish

    changed = True
    while changed:
        changed = False
        for name, values in bindings.items():
            if name in keyish and not all(is_key(v, where) for v, where in values):
                keyish.discard(name)
                changed = True
    problems = []
    for call in _CALL.finditer(lua):
        if call[1].upper() in KEYLESS:
            continue
        key = _args(lua, call.end())[0]
        if not is_key(key, scope_at(call.start())):
            problems.append(f"redis.call('{call[1]}', {key}, ...): the key is not from KEYS")
    return problems


def _scripts() -> list[tuple[str, str, str]]:
    """(module, name, text) of every script registered in twserve."""
    found = []
    for path in sorted((ROOT / "twserve").rglob("*.py")):
        source = path.read_text()
        if "script(" not in source:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("script", "register_script")
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                name = node.args[0].id
                text = getattr(importlib.import_module(module), name, None)
                if text is None:
                    continue  # a parameter (`RedisState.script` itself), not a script
                assert isinstance(text, str), f"{module}.{name} is not a script's text"
                found.append((module, name, text))
    return found


SCRIPTS = _scripts()


def test_the_walk_finds_the_scripts() -> None:
    names = {(m.rsplit(".", 1)[-1], n) for m, n, _ in SCRIPTS}
    assert {("limits", "ADMIT"), ("limits", "SETTLE"), ("router", "SET_PAUSE")} <= names


@pytest.mark.parametrize(("module", "name", "text"), SCRIPTS, ids=[n for _, n, _ in SCRIPTS])
def test_every_script_takes_its_keys_from_KEYS(module: str, name: str, text: str) -> None:
    assert key_problems(text) == [], f"{module}.{name}"


def test_the_check_sees_a_key_built_inside_a_script() -> None:
    assert key_problems("redis.call('GET', KEYS[1])") == []
    assert key_problems("local k = KEYS[2]\nredis.call('SET', k, ARGV[1])") == []
    assert key_problems("redis.call('GET', 'twserve:' .. ARGV[1])")
    assert key_problems("local k = ARGV[1]\nredis.call('DEL', k)")
    # A parameter is a key only when every call gives it one.
    lua = "local function f(k) return redis.call('GET', k) end\nf(KEYS[1])\nf(ARGV[1])"
    assert key_problems(lua)
    assert key_problems("redis.call('PUBLISH', ARGV[1], ARGV[2])") == []
    # Names are per function: the body's `held` (a number) is not the parameter.
    lua = (
        "local function f(held)\n  redis.call('HDEL', held, 'x')\nend\nf(KEYS[1])\nlocal held = 5\n"
    )
    assert key_problems(lua) == []


def test_the_one_script_of_several_slots_chains_scripts_checked_here() -> None:
    from twserve.shared import admission

    texts = {text for _, _, text in SCRIPTS}
    assert admission.ADMISSION in texts
    # Each part is a registered script as it stands (checked above), wrapped as a function.
    assert set(admission.PARTS.values()) <= texts
    for name, text in admission.PARTS.items():
        assert f"local function {name}_part(KEYS, ARGV)\n{text}\nend\n" in admission.ADMISSION
