"""The config file as ``GET /config`` shows it: every secret masked, wherever it is written.

A secret is masked on the parsed value's own text (`twserve.config.edit.secret_spans`), so a key
written as a block scalar (``key: |``), over several lines, in quotes with escapes
(``"sk-\\x41…"``) or in a flow mapping is hidden whole: comparing the parsed value with the line
it starts on misses all of these.

Comments are not parsed values, and people paste keys into them (``# old key: sk-…``). A comment
line that holds a secret is dropped from the view, and a comment at the end of a line that holds
one is cut off: one of the file's secrets or the value its ``${VAR}`` resolves to, a
commented-out ``key:``/``redis_url:``/``postgres_dsn:`` with a value that is not a ``${VAR}``
reference, or a word shaped like a key (`twserve.config.check.key_shaped`). A file that does not
parse (in safe mode) has no parsed values: every line goes through the excerpt redaction
(`twserve.config.check.redact`), and comments are dropped by the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ruamel.yaml.error import YAMLError

from twengine.config import TemplateError, resolve_template
from twserve.config.check import comment_holds_secret, redact, split_lines
from twserve.config.edit import replace_secrets, secret_spans

__all__ = ["masked_config"]

# Shorter values are too likely to be found in ordinary words ("me" in a comment).
_MIN_SECRET = 6


def masked_config(
    text: str, mask: Callable[[str], str | None], env: Mapping[str, str] | None = None
) -> str:
    """`text` with every secret replaced by `mask(value)` and comments that hold one dropped;
    `env` resolves ``${VAR}`` values so that a comment holding the resolved key is caught."""
    try:
        spans = secret_spans(text)
        masked = replace_secrets(text, lambda _path, value: mask(value))
    except YAMLError:
        return _masked_unparsed(text)
    secrets: set[str] = set()
    for span in spans:
        if "${" not in span.value:
            secrets.add(span.value.strip())
        elif env is not None:
            # A `${VAR}` reference is no secret; the value it stands for is.
            try:
                secrets.add(resolve_template(span.value, env).strip())
            except TemplateError:
                pass
    known = sorted((s for s in secrets if len(s) >= _MIN_SECRET), key=len, reverse=True)
    kept = []
    for line in split_lines(masked, keepends=True):
        shown = _shown_line(line, known)
        if shown is not None:
            kept.append(shown)
    return "".join(kept)


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _trailing_comment(body: str) -> int | None:
    """Where the comment at the end of a ``field: value`` line starts: a ``#`` after white
    space with no quote left open before it; None when there is none."""
    for match in re.finditer(r"\s#", body):
        head = body[: match.start()]
        if head.count('"') % 2 == 0 and head.count("'") % 2 == 0:
            return match.start()
    return None


def _shown_line(line: str, known: list[str]) -> str | None:
    """The line as shown, None to drop it."""
    body = line.rstrip("\r\n")
    eol = line[len(body) :]
    held = any(s in body for s in known)
    if _is_comment(body):
        return None if held or comment_holds_secret(body.lstrip()) else line
    at = _trailing_comment(body)
    if at is not None and (comment_holds_secret(body[at:].lstrip()) or held):
        body = body[:at].rstrip()
    # Whatever is left of a secret (a value is masked already): hidden in place.
    for secret in known:
        body = body.replace(secret, "***")
    return body + eol


def _masked_unparsed(text: str) -> str:
    kept = []
    for line in split_lines(text, keepends=True):
        body = line.rstrip("\r\n")
        eol = line[len(body) :]
        if _is_comment(body):
            if comment_holds_secret(body.lstrip()):
                continue
            kept.append(line)
            continue
        kept.append(redact(body) + eol)
    return "".join(kept)
