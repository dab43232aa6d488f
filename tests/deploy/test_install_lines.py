"""The documentation installs the project from this repository or from wheels built from it:
the three distributions are on no package index, so a `pip install twserve` would fetch some
other project's package of that name, or fail."""

from __future__ import annotations

import re
import shlex

from tests.support.layout import ROOT

OURS = ("twserve", "twproto", "twengine")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def install_targets(text: str) -> list[str]:
    """Every requirement a `pip install` line of `text` names (options dropped)."""
    targets: list[str] = []
    for match in re.finditer(r"pip\s+install\s+([^\n`]*)", text.replace("\\\n", " ")):
        try:
            words = shlex.split(match[1], comments=True)
        except ValueError:
            words = match[1].split()
        for word in words:
            if word in ("&&", "||", ";", "|"):
                break
            if not word.startswith("-"):
                targets.append(word)
    return targets


def names_an_index_package(target: str) -> bool:
    name = re.split(r"[\[<>=!~; ]", target, maxsplit=1)[0].lower()
    return name in OURS


def test_no_page_installs_the_project_from_an_index() -> None:
    found = [
        f"{page.relative_to(ROOT)}: pip install {target}"
        for page in PAGES
        for target in install_targets(page.read_text(encoding="utf-8"))
        if names_an_index_package(target)
    ]
    assert not found, found


def test_deployment_page_installs_from_the_checkout_and_from_wheels() -> None:
    targets = install_targets((ROOT / "docs" / "deployment.md").read_text(encoding="utf-8"))
    assert {"./libs/twproto", "./libs/twengine", "./[postgres,redis]"} <= set(targets)
    assert any(
        t.startswith("dist/twserve-") and t.endswith(".whl[postgres,redis]") for t in targets
    )


def test_checker_finds_an_index_install() -> None:
    line = "python3 -m venv v && v/bin/pip install -q 'twserve[postgres,redis]' && v/bin/twserve"
    assert install_targets(line) == ["twserve[postgres,redis]"]
    assert names_an_index_package("twserve[postgres,redis]")
    assert not names_an_index_package("./libs/twproto")
    assert not names_an_index_package("dist/twproto-0.1.0-py3-none-any.whl")
