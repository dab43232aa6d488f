"""Build twserve/data/prices.json from LiteLLM's model price list, taken from its wheel on PyPI.

    python scripts/build_prices.py                 # pip download the newest litellm wheel
    python scripts/build_prices.py --wheel PATH    # use a wheel already downloaded

The wheel is only read (``model_prices_and_context_window_backup.json`` inside it); LiteLLM is
never installed or imported. The data file records the package version and the date it was
built, and keeps the chat models of the providers listed in ``twserve.usage.prices.KEPT_PROVIDERS``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twserve.usage.prices import convert_litellm  # noqa: E402

MEMBER = "litellm/model_prices_and_context_window_backup.json"
OUT = ROOT / "twserve" / "data" / "prices.json"


def _download(into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "litellm", "-d", str(into)],
        check=True,
    )
    wheels = sorted(into.glob("litellm-*.whl"))
    if not wheels:
        raise SystemExit("pip download produced no litellm wheel")
    return wheels[-1]


def dump(data: dict[str, object]) -> str:
    """Compact JSON with one model per line, so that a refresh reads as a short diff."""
    models = data["models"]
    assert isinstance(models, dict)
    head = {k: v for k, v in data.items() if k != "models"}
    lines = [json.dumps(head, separators=(",", ":"))[:-1] + ',"models":{']
    items = list(models.items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(json.dumps(name) + ":" + json.dumps(entry, separators=(",", ":")) + comma)
    lines.append("}}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="a litellm wheel already downloaded")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or _download(Path(tmp))
        m = re.match(r"litellm-([^-]+)-", wheel.name)
        version = m.group(1) if m else "unknown"
        with zipfile.ZipFile(wheel) as zf:
            source = json.loads(zf.read(MEMBER))
    data = convert_litellm(
        source,
        package="litellm",
        version=version,
        retrieved=dt.datetime.now(dt.UTC).date().isoformat(),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = dump(data)
    args.out.write_text(text, encoding="utf-8")
    print(f"{len(data['models'])} models from litellm {version} → {args.out} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
