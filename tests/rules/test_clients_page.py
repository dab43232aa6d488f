"""docs/clients.md and `twserve connect` agree, client by client.

Each client's section carries ``<!-- twserve connect CLIENT -->``. Every environment variable
the section names (an UPPER_SNAKE word) and every config key it shows in backticks or in its
code blocks (a lower_snake word followed by ``=``, or ``selectedType``) must be in what the
command prints for that client, and every variable the command prints or unsets must be named
in the section: a variable renamed in one place fails here until the other follows.
"""

from __future__ import annotations

import re

import pytest

from tests.support.layout import ROOT
from twserve.cli.connect import CLIENTS, Target, connect_lines

PAGE = ROOT / "docs" / "clients.md"
MARKER = re.compile(r"^<!-- twserve connect ([a-z-]+) -->$", re.M)
VARIABLE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
CONFIG_KEY = re.compile(r"^\s*([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\s*=", re.M)
# JSON settings keys the page shows for a client (Gemini CLI's auth setting).
JSON_KEYS = re.compile(r'"(selectedType)"')


def sections() -> dict[str, str]:
    """CLIENT → the text of its section (from its heading to the next)."""
    text = PAGE.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    for match in MARKER.finditer(text):
        start = text.rfind("\n## ", 0, match.start())
        end = text.find("\n## ", match.end())
        out[match[1]] = text[start : end if end != -1 else len(text)]
    return out


def names_in(text: str) -> set[str]:
    return (
        set(VARIABLE.findall(text)) | set(CONFIG_KEY.findall(text)) | set(JSON_KEYS.findall(text))
    )


def printed(client: str) -> str:
    target = Target(url="http://127.0.0.1:8788", key="sk-tw-test", model="some-model")
    return "\n".join(connect_lines(client, target))


def test_every_client_has_a_section() -> None:
    assert sorted(sections()) == sorted(CLIENTS)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_page_names_only_what_the_command_prints(client: str) -> None:
    section = sections()[client]
    output = printed(client)
    missing = {name for name in names_in(section) if name not in output}
    assert not missing, f"docs/clients.md names {sorted(missing)} for {client}; not printed"


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_command_prints_only_what_the_page_names(client: str) -> None:
    section = sections()[client]
    variables = set(
        re.findall(r"^(?:# *)?(?:export|unset) ([A-Z][A-Z0-9_]*)", printed(client), re.M)
    )
    assert variables or client == "curl"
    unnamed = {v for v in variables if v not in section}
    assert not unnamed, f"`twserve connect {client}` prints {sorted(unnamed)}; the page lacks it"


def test_the_checker_finds_names() -> None:
    text = 'export ANTHROPIC_BASE_URL=x\nwire_api = "responses"\n{"selectedType": "k"} `MODEL`'
    assert names_in(text) == {"ANTHROPIC_BASE_URL", "wire_api", "selectedType"}
