"""The four validation stages of a config, located and redacted for people.

A config is in force only when all four stages pass (docs/operations.md, "Live reload"):

1. **yaml** — the text parses as YAML and its top level is a mapping;
2. **schema** — every field is known, of the right type and in range;
3. **consistency** — names that point elsewhere exist, names are unique, settings that depend
   on each other agree;
4. **runtime** — the objects that serve requests (router, balancers, slots, key ring, address
   filter) build from it, and a changed listener can bind.

Stages 2 and 3 run together inside `twengine.config.build_config`, which collects every
problem; this module sorts them back into their stages by code, so that a rejection names the
earliest stage that failed. Each problem is located at a line of the file, found from the path
of the field through ruamel's round-trip nodes, and carries an excerpt of that line with every
secret in it replaced by ``***`` — a rejection is published on the event stream and must never
show a key.

The YAML reader refuses what a config never needs and a hostile text would use to stall the
gateway: anchors and aliases (``&a``/``*a``: nested aliases expand a kilobyte into billions of
nodes, `config.yaml_alias`) and nesting deeper than `MAX_DEPTH` (`config.yaml_too_deep`; a
config is at most seven levels deep). Lines are counted the way YAML counts them — ``\r\n``,
``\r`` or ``\n`` — never at U+2028 or other separators Python's `str.splitlines` breaks on.

`config_version` names a file's exact bytes: ``blake3:`` and 12 hex digits. BLAKE3 is fast on
files of any size and is the same on every platform; 48 bits tell the versions of one gateway's
history apart with room to spare, and the name says which hash it is if it ever changes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import blake3
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer, ComposerError, MaxDepthExceededError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent

from twengine.attempt import AttemptSettings
from twengine.callers import AddressFilter, KeyRing
from twengine.config import Config, ConfigError, Problem, build_config
from twengine.router import Router

__all__ = [
    "MAX_DEPTH",
    "STAGES",
    "ConfigRejection",
    "Finding",
    "build_runtime",
    "check_config_text",
    "comment_holds_secret",
    "commented_secret",
    "compose_document",
    "config_version",
    "key_shaped",
    "load_document",
    "locate",
    "plain",
    "redact",
    "secret_values",
    "split_lines",
    "stage_of",
]

STAGES = ("yaml", "schema", "consistency", "runtime")

# Codes of problems found by cross-checking fields (stage 3); every other `config.` code but
# the YAML one is a schema problem (stage 2). Every `engine.` code is a consistency problem.
_CONSISTENCY = frozenset(
    {
        "config.port_conflict",
        "config.client_duplicate_name",
        "config.client_duplicate_key",
        "config.client_key_is_control_key",
        "config.key_limit_retention",
        "config.key_limit_duplicate",
        "config.default_key_unknown",
        "config.provider_duplicate_name",
        "config.price_sheet_duplicate",
        "config.price_sheet_unknown",
        "config.failover_pause_order",
        "config.listen_limits_conflict",
        "config.slow_start_too_short",
        "config.model_spec_output_exceeds_window",
    }
)
_RUNTIME = frozenset({"config.runtime_failed", "config.listen_unavailable"})

# Fields whose values are secrets wherever they appear; every value under `headers` is one too.
_SECRET_FIELDS = frozenset({"key", "previous_key", "redis_url", "postgres_dsn"})
_EXCERPT_MAX = 200
_MASK = "***"


_YAML_CODES = frozenset({"config.yaml_invalid", "config.yaml_alias", "config.yaml_too_deep"})


def stage_of(code: str) -> str:
    """The validation stage a problem's code belongs to."""
    if code in _YAML_CODES:
        return "yaml"
    if code in _RUNTIME:
        return "runtime"
    if code.startswith("engine.") or code in _CONSISTENCY:
        return "consistency"
    return "schema"


def config_version(data: bytes) -> str:
    """The version of a config file: ``blake3:`` and the first 12 hex digits of its hash."""
    return "blake3:" + blake3.blake3(data).hexdigest()[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One problem of a rejected config: its stage and code, the field's path, the line of the
    file it is on (1-based; None when it has none), a message and the redacted line."""

    stage: str
    code: str
    path: str
    line: int | None
    message: str
    excerpt: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "code": self.code,
            "path": self.path,
            "line": self.line,
            "message": self.message,
            "excerpt": self.excerpt,
        }


class ConfigRejection(Exception):
    """A config that did not pass; `stage` is the earliest stage that failed."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__(findings)
        self.findings = tuple(findings)
        self.stage = min((STAGES.index(f.stage) for f in findings), default=0)
        self.stage_name = STAGES[self.stage]

    @property
    def first(self) -> Finding:
        """The first finding of the earliest failed stage."""
        return next(f for f in self.findings if f.stage == self.stage_name)

    def __str__(self) -> str:
        return "\n  ".join(
            [f"the config failed its {self.stage_name} stage"]
            + [
                f"{f.code} line {f.line if f.line is not None else '?'}"
                f"{' at ' + f.path if f.path else ''}: {f.message}"
                for f in self.findings
            ]
        )


# The deepest nesting a config is read with. The deepest a valid config goes is seven levels
# (routes → rules → when → model → list); 32 leaves room for any layout and stops a text of
# brackets from recursing the reader into the ground.
MAX_DEPTH = 32
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str, *, keepends: bool = False) -> list[str]:
    """`text`'s lines as YAML counts them (``\r\n``, ``\r``, ``\n``), so that line N here is
    line N of a ruamel mark; `str.splitlines` also breaks at U+2028, form feeds and the like."""
    lines: list[str] = []
    start = 0
    for match in _LINE_BREAK.finditer(text):
        lines.append(text[start : match.end() if keepends else match.start()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


class AliasRefused(ComposerError):
    """An anchor or alias in a config (`config.yaml_alias`)."""


class _PlainComposer(Composer):
    """ruamel's composer, refusing anchors and aliases before they are expanded."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise AliasRefused(
                None,
                None,
                "anchors and aliases (&name, *name) are not accepted in a config: "
                "write each value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.Composer = _PlainComposer
    yaml.max_depth = MAX_DEPTH
    return yaml


def load_document(text: str) -> Any:
    """The round-trip document of `text` (raises ruamel's `YAMLError`, `AliasRefused` among
    them)."""
    return _yaml().load(io.StringIO(text))


def compose_document(text: str) -> Any:
    """The node tree of `text` (with each node's start and end in the text), read as
    `load_document` reads it."""
    return _yaml().compose(io.StringIO(text))


def plain(node: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists."""
    if isinstance(node, dict):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def secret_values(node: Any, *, under_headers: bool = False) -> Iterator[str]:
    """Every secret string in a parsed config: keys, header values, DSNs."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and (under_headers or str(k) in _SECRET_FIELDS):
                yield v
            else:
                yield from secret_values(v, under_headers=str(k) == "headers")
    elif isinstance(node, list):
        for v in node:
            yield from secret_values(v, under_headers=under_headers)


def redact(line: str, secrets: Sequence[str] = ()) -> str:
    """A line of the file fit to show.

    Every known secret is replaced. Beyond that the rule is conservative, because a line in
    error may be one whose meaning is not known (a misspelled ``kye: sk-…`` is not known to be
    a key): a ``field: value`` line shows its value only when the value is a number, a boolean
    or null, or the field is one whose values are names and choices (`_SHOWN`). A line that is
    no ``field: value`` — a list item, a block scalar's or a multi-line value's continuation —
    shows only such a value too, and a comment only when nothing in it is shaped like a key.
    """
    line = _mask_known(line, secrets)
    match = re.match(r"^(\s*(?:-\s+)?)([^:#]+?)(\s*:\s+|\s*:$)(.*)$", line)
    if match:
        field = match.group(2).strip().strip("\"'")
        value, comment = _split_comment(match.group(4))
        if comment_holds_secret(comment):
            comment = ""
        if value and field not in _SHOWN and not _PLAIN_VALUE.match(value):
            value = _MASK
        line = match.group(1) + match.group(2) + match.group(3) + value + comment
    else:
        bare = re.match(r"^(\s*(?:-\s+)?)(.*)$", line)
        assert bare is not None
        value, comment = _split_comment(bare.group(2))
        if value.startswith("#"):
            value, comment = "", value
        if comment_holds_secret(comment):
            comment = "# " + _MASK if not value else ""
        # A list item may be a name; any other bare line continues a value above it.
        item = "-" in bare.group(1)
        named = item and _BARE_NAME.fullmatch(value) and not key_shaped(value)
        if value and not (_PLAIN_VALUE.match(value) or named):
            value = _MASK
        line = bare.group(1) + value + comment
    line = line.rstrip()
    if len(line) > _EXCERPT_MAX:
        line = line[:_EXCERPT_MAX] + "…"
    return line


# A word of key characters, and a run in it of letters and digits without a separator: API keys
# and tokens hold a long random run ("sk-ant-api03-Xq7bT2…"); model names, dates and versions
# ("claude-sonnet-4-5-20250929") are short runs between hyphens.
_KEY_WORD = re.compile(r"[\w\-+/=.~]{20,}")
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{12,}")


def key_shaped(text: str) -> bool:
    """Whether `text` holds a word shaped like a key: 20 or more key characters with a run of
    12 or more letters and digits, both among them."""
    for word in _KEY_WORD.findall(text):
        for run in _RANDOM_RUN.findall(word):
            if any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
                return True
    return False


_COMMENTED_SECRET = re.compile(
    r"^\s*#\s*(?:-\s*)?[\"']?(?:key|redis_url|postgres_dsn)[\"']?\s*:\s*(?P<value>\S.*?)\s*$"
)
_TEMPLATE_ONLY = re.compile(r"[\"']?\$\{[A-Za-z_][A-Za-z0-9_]*\}[\"']?")


def commented_secret(comment: str) -> bool:
    """Whether `comment` (from its ``#``) is a commented-out ``key:``, ``redis_url:`` or
    ``postgres_dsn:`` with a value other than a ``${VAR}`` reference."""
    match = _COMMENTED_SECRET.match(comment)
    if match is None:
        return False
    value = re.split(r"\s#", match["value"], maxsplit=1)[0].strip()
    return not _TEMPLATE_ONLY.fullmatch(value)


def comment_holds_secret(comment: str) -> bool:
    """Whether `comment` may hold a secret: a commented-out secret field, or a word shaped like
    a key (`key_shaped`)."""
    return commented_secret(comment) or key_shaped(comment)


# A list item that is a name (a model, an upstream) and not shaped like a key.
_BARE_NAME = re.compile(r"[\w.@/+-]{1,40}")


def _mask_known(text: str, secrets: Sequence[str]) -> str:
    for secret in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text


# Fields whose values are names, choices and numbers, never secrets.
_SHOWN = frozenset(
    {
        "version",
        "name",
        "protocol",
        "type",
        "bind",
        "port",
        "to",
        "route",
        "default_route",
        "default_key",
        "balance_by",
        "billing",
        "selected",
        "reasoning",
        "price_sheet",
        "on_match",
        "per",
        "model",
        "weight",
    }
)
_PLAIN_VALUE = re.compile(
    r"^(?:[-+]?\d[\d_.]*[kKmM]?|true|false|null|~|yes|no|on|off|\[\]|\{\})\s*$", re.I
)


def _split_comment(value: str) -> tuple[str, str]:
    match = re.search(r"\s+#.*$", value)
    if match is None or any(q in value[: match.start()] for q in "\"'"):
        return value.strip(), ""
    return value[: match.start()].strip(), value[match.start() :]


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _line_of(doc: Any, path: str) -> int | None:
    """The 1-based line of the deepest part of `path` (``providers[2].key``) found in `doc`."""
    line: int | None = None
    node = doc
    for match in _PATH_PART.finditer(path):
        name, index = match.group(1), match.group(2)
        if index is not None and isinstance(node, CommentedSeq):
            i = int(index)
            if i >= len(node):
                break
            line = node.lc.item(i)[0] + 1
            node = node[i]
        elif name is not None and isinstance(node, CommentedMap):
            if name not in node:
                break
            line = node.lc.key(name)[0] + 1
            node = node[name]
        else:
            break
    return line


def locate(text: str, path: str) -> tuple[int | None, str]:
    """The 1-based line of the field at `path` in `text` and that line redacted."""
    lines = split_lines(text)
    try:
        doc = load_document(text)
    except YAMLError:
        return None, ""
    line = _line_of(doc, path)
    if line is None or line > len(lines):
        return line, ""
    return line, redact(lines[line - 1], list(secret_values(plain(doc))))


def _finding(problem: Problem, doc: Any, lines: Sequence[str], secrets: Sequence[str]) -> Finding:
    line = _line_of(doc, problem.path) if doc is not None else None
    excerpt = redact(lines[line - 1], secrets) if line is not None and line <= len(lines) else ""
    return Finding(
        stage=stage_of(problem.code),
        code=problem.code,
        path=problem.path,
        line=line,
        message=problem.message,
        excerpt=excerpt,
    )


def _yaml_finding(exc: YAMLError, lines: Sequence[str]) -> Finding:
    line: int | None = None
    message = "the config is not valid YAML"
    code = "config.yaml_invalid"
    if isinstance(exc, AliasRefused):
        code = "config.yaml_alias"
    elif isinstance(exc, MaxDepthExceededError):
        code = "config.yaml_too_deep"
        exc.problem = f"the config nests deeper than {MAX_DEPTH} levels"
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            line = mark.line + 1
        # Only the problem's own words: ruamel's full text quotes the offending line unredacted.
        message = " ".join(p for p in (exc.context, exc.problem) if p) or message
    excerpt = redact(lines[line - 1]) if line is not None and line <= len(lines) else ""
    return Finding(
        stage="yaml",
        code=code,
        path="",
        line=line,
        message=message,
        excerpt=excerpt,
    )


def check_config_text(text: str, env: Mapping[str, str]) -> Config:
    """Stages 1–3: YAML text → `Config`, or `ConfigRejection` listing every problem found.

    `env` is the environment ``${VAR}`` templates are read from: gateway keys are resolved with
    it (the `Config` holds the values clients present), and a variable it lacks in a gateway or
    control key refuses the config (`config.env_missing`)."""
    lines = split_lines(text)
    try:
        doc = load_document(text)
    except YAMLError as exc:
        raise ConfigRejection([_yaml_finding(exc, lines)]) from None
    if not isinstance(doc, dict):
        raise ConfigRejection(
            [
                Finding(
                    stage="yaml",
                    code="config.yaml_invalid",
                    path="",
                    line=1 if lines else None,
                    message="the config must be a mapping",
                    excerpt=redact(lines[0]) if lines else "",
                )
            ]
        )
    data = plain(doc)
    try:
        return build_config(data, env)
    except ConfigError as err:
        secrets = list(secret_values(data))
        raise ConfigRejection([_finding(p, doc, lines, secrets) for p in err.problems]) from None


def build_runtime(config: Config) -> None:
    """Stage 4: build the objects a gateway serves with, as `Gateway.apply_config` will, so a
    config that would fail there is refused before anything is swapped."""
    try:
        Router(config)
        AttemptSettings.from_failover(config.failover)
        KeyRing.of([(c.key, c.name) for c in config.clients])
        AddressFilter(list(config.listen.gateway.allow_from))
    except Exception as exc:  # any failure here is the config's, reported and not raised on
        secrets = [c.key for c in config.clients] + [p.key for p in config.providers if p.key]
        raise ConfigRejection(
            [
                Finding(
                    stage="runtime",
                    code="config.runtime_failed",
                    path="",
                    line=None,
                    message=_mask_known(f"{type(exc).__name__}: {exc}", secrets),
                    excerpt="",
                )
            ]
        ) from None
