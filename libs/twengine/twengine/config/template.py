"""``${VAR}`` templates in keys and header values.

Secrets stay out of the config file: ``key: ${OPENAI_API_KEY}``. The config keeps the template
text; twserve expands it with the environment when it needs the value (at send time for upstream
keys and headers), so a rotated variable takes effect without a reload and the secret never sits
in the `Config`.

Grammar: ``${NAME}`` with NAME matching ``[A-Za-z_][A-Za-z0-9_]*`` is replaced by the variable's
value; ``$${`` stands for a literal ``${``; any other ``$`` is itself. An unclosed ``${`` or a bad
name is malformed (`config.template_invalid`); a variable absent from the environment is
`config.env_missing`. The environment is an argument: this module reads nothing itself. Messages
never quote the value, which is a secret or holds one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ("TemplateError", "resolve_template", "template_variables")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A template that is malformed or names a missing variable.

    `code` is ``config.template_invalid`` or ``config.env_missing``; `variable` names the missing
    variable for the latter.
    """

    def __init__(self, code: str, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.variable = variable


def _expand(value: str, env: Mapping[str, str] | None) -> tuple[str, tuple[str, ...]]:
    # One scanner serves both the check (env None: only collect names) and the expansion.
    out: list[str] = []
    names: list[str] = []
    i = 0
    while True:
        j = value.find("$", i)
        if j < 0:
            out.append(value[i:])
            break
        out.append(value[i:j])
        if value.startswith("$${", j):
            out.append("${")
            i = j + 3
        elif value.startswith("${", j):
            end = value.find("}", j + 2)
            if end < 0:
                # The value is a secret, or holds one: messages describe it, never quote it.
                raise TemplateError(
                    "config.template_invalid", "the value has a '${' that is never closed by '}'"
                )
            name = value[j + 2 : end]
            if not _NAME.fullmatch(name):
                raise TemplateError(
                    "config.template_invalid",
                    "the value has a '${…}' that is not a variable reference: names are "
                    "letters, digits and _ (write $${ for a literal '${')",
                )
            names.append(name)
            if env is not None:
                if name not in env:
                    raise TemplateError(
                        "config.env_missing",
                        f"environment variable {name} is not set",
                        variable=name,
                    )
                out.append(env[name])
            i = end + 1
        else:
            out.append("$")
            i = j + 1
    return "".join(out), tuple(names)


def template_variables(value: str) -> tuple[str, ...]:
    """The variable names `value` refers to, in order; raises `TemplateError` when malformed."""
    return _expand(value, None)[1]


def resolve_template(value: str, env: Mapping[str, str]) -> str:
    """`value` with every ``${VAR}`` replaced from `env`; raises `TemplateError`."""
    return _expand(value, env)[0]
