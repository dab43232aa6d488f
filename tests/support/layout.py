"""Where the repository keeps its packages, for the tests that read source files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Each package's source folder: the libraries live under libs/, each a distribution of its own.
PACKAGE_DIRS: dict[str, Path] = {
    "twproto": ROOT / "libs" / "twproto" / "twproto",
    "twengine": ROOT / "libs" / "twengine" / "twengine",
    "twserve": ROOT / "twserve",
    "twmock": ROOT / "twmock",
}
