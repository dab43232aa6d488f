"""Each library, built as a wheel, installs alone and runs the examples of docs/library.md.

A fresh virtual environment per library gets only that library's wheel (twengine's also gets
twproto's, its one dependency of this repository) and whatever the wheels declare, from the
package index pip is configured with; nothing of this checkout is on its path. In it:

* the installed distributions are exactly the library and what it declares;
* every docs/library.md example that imports nothing but the standard library and the
  libraries installed there runs as written (twproto alone runs the conversion examples;
  twengine adds the routing and attempt-machine ones);
* ``import twproto`` stays cheap (time and memory, bounded generously: the figures are in
  docs/library.md).

The wheels are built once per session (`python -m build`), or taken from ``TWSERVE_WHEEL_DIR``
when `.ci/run` has built them already.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.rules.test_docs_examples import DOCS, Block, blocks_of
from tests.rules.test_packaging import pyproject, requirement_name
from tests.support.layout import ROOT

pytestmark = pytest.mark.packaging

LIBS = {"twproto": ROOT / "libs" / "twproto", "twengine": ROOT / "libs" / "twengine"}
#: The wheels each library's environment gets.
WHEELS_FOR = {"twproto": ("twproto",), "twengine": ("twproto", "twengine")}
VERSION = pyproject("twproto")["project"]["version"]


def _wheel_name(dist: str) -> str:
    return f"{dist}-{VERSION}-py3-none-any.whl"


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("TWSERVE_WHEEL_DIR")
    if given and all((Path(given) / _wheel_name(d)).is_file() for d in LIBS):
        return Path(given)
    out = tmp_path_factory.mktemp("wheels")
    for dist, source in LIBS.items():
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        assert (out / _wheel_name(dist)).is_file()
    return out


@dataclass(frozen=True)
class Env:
    lib: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def run(self, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        # -I: no user site, no PYTHON* variables, not the script's folder on sys.path; the
        # working directory is outside the checkout, so only the installed wheels are found.
        return subprocess.run(
            [str(self.python), "-I", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
        )


@pytest.fixture(scope="module", params=sorted(LIBS))
def env(
    request: pytest.FixtureRequest, wheel_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    lib: str = request.param
    root = tmp_path_factory.mktemp(f"venv-{lib}")
    venv.create(root, with_pip=False, symlinks=True)
    wheels = [str(wheel_dir / _wheel_name(d)) for d in WHEELS_FOR[lib]]
    # The test environment's pip installs into the new one (--python): the new environment
    # holds no pip of its own, so its package list is the library and its dependencies only.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(root / "bin" / "python"),
            "install",
            "-q",
            "--no-cache-dir",
            *wheels,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    yield Env(lib=lib, root=root)


def _installed(env: Env, cwd: Path) -> dict[str, str]:
    probe = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
    )
    out = env.run("-c", probe, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_the_environment_holds_the_library_and_its_dependencies_only(
    env: Env, tmp_path: Path
) -> None:
    installed = _installed(env, tmp_path)
    expected = set(WHEELS_FOR[env.lib])
    for dist in WHEELS_FOR[env.lib]:
        expected |= {requirement_name(r) for r in pyproject(dist)["project"]["dependencies"]}
    assert set(installed) == expected, installed
    assert installed["twproto"] == VERSION
    # Nothing of the gateway came along.
    assert not {"twserve", "anyio", "h11", "h2", "rich", "uvloop"} & set(installed)
    where = env.run("-c", f"import {env.lib}; print({env.lib}.__file__)", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(env.root), where.stdout


def _third_party_imports(block: Block) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(block.source)):
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.partition(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names}


def _examples() -> list[Block]:
    return blocks_of("library.md", (DOCS / "library.md").read_text(encoding="utf-8"))


def test_library_examples_run_with_only_the_wheels(env: Env, tmp_path: Path) -> None:
    blocks = [b for b in _examples() if _third_party_imports(b) <= set(WHEELS_FOR[env.lib])]
    # twproto alone: every conversion, stream and failure example; twengine adds routing and
    # the attempt machine. Only the proxy example (it also needs an HTTP client) is left out.
    if env.lib == "twproto":
        assert len(blocks) >= 10
        assert any("translate_request" in b.source for b in blocks)
        assert any("new_stream_translator" in b.source for b in blocks)
    else:
        assert len(blocks) == len(_examples()) - 1
        assert any("AttemptMachine" in b.source or "Router" in b.source for b in blocks)
    failures = []
    for block in blocks:
        script = tmp_path / f"example_{block.line}.py"
        script.write_text(block.source, encoding="utf-8")
        out = env.run(str(script), cwd=tmp_path)
        if out.returncode != 0:
            failures.append(f"{block.name}: {out.stderr.strip().splitlines()[-1:]}")
    assert not failures, failures


# What importing a library costs, measured in the fresh environment (docs/library.md has the
# figures). The bounds are loose: a shared 2-core machine under load must still pass.
_IMPORT_PROBE = """
import json, sys, time
def rss_kib():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
before = rss_kib()
modules = len(sys.modules)
start = time.perf_counter()
import {lib}
took = time.perf_counter() - start
print(json.dumps({{"secs": took, "rss_kib": rss_kib() - before,
                   "modules": len(sys.modules) - modules}}))
"""


def import_figures(env: Env, cwd: Path) -> dict[str, float]:
    """The import's wall time, the resident memory it adds and the modules it loads; the best of
    three runs (the first one also reads the files from disk)."""
    runs = []
    for _ in range(3):
        out = env.run("-c", _IMPORT_PROBE.format(lib=env.lib), cwd=cwd)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
    return min(runs, key=lambda r: r["secs"])


def test_import_is_cheap(env: Env, tmp_path: Path) -> None:
    figures = import_figures(env, tmp_path)
    assert figures["secs"] < 2.0, figures
    assert figures["rss_kib"] < 64 * 1024, figures
