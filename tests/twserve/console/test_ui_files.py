"""The console page's files: every one ships in the wheel (a package-data glob of pyproject.toml
matches it), every ES module import names a file that exists, and nothing on the page is
inline script or style, which its Content-Security-Policy would refuse.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib

from tests.support.layout import ROOT
from twserve.console.static import ui_file

UI = ROOT / "twserve" / "console" / "ui"
_IMPORT = re.compile(r"""^\s*import\s[^"']*["']([^"']+)["'];""", re.M)


def test_every_file_is_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = data["tool"]["setuptools"]["package-data"]["twserve.console"]
    files = [p.relative_to(UI.parent).as_posix() for p in UI.rglob("*") if p.is_file()]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not in the wheel"


def test_imports_resolve_and_are_served() -> None:
    for module in UI.rglob("*.js"):
        for target in _IMPORT.findall(module.read_text(encoding="utf-8")):
            assert target.startswith("./"), (module.name, target)
            path = (module.parent / target).resolve()
            assert path.is_file(), (module.name, target)
            served = ui_file("/ui/" + path.relative_to(UI).as_posix())
            assert served is not None and served[0].startswith(b"text/javascript")


def test_no_inline_script_or_style() -> None:
    html = (UI / "index.html").read_text(encoding="utf-8")
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
    assert "<style" not in html and " style=" not in html
    assert re.findall(r"\son[a-z]+\s*=", html) == []  # no inline event handlers
    for module in UI.rglob("*.js"):
        text = module.read_text(encoding="utf-8")
        for markup in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "eval(", "new Function"):
            assert markup not in text, (module.name, markup)
        assert ".style." not in text and '"style"' not in text, module.name


def test_only_the_page_files_are_served() -> None:
    assert ui_file("/ui/") is not None and ui_file("/ui/index.html") is not None
    for path in ("/ui/../static.py", "/ui/.hidden", "/ui/js//app.js", "/ui/js\\app.js"):
        assert ui_file(path) is None, path
    assert ui_file("/ui/nothing.js") is None
