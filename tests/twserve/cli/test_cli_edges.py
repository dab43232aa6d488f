"""The command line's edges: ``--version``, a reader of stdout that goes away, and price lists
with figures that are no prices (NaN, Infinity, negative)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import Upstream, running_stack
from twmock.script import MockSettings, Script, Usage
from twserve.cli.main import main
from twserve.store.sqlite import RequestStore
from twserve.usage.prices import USER_FILE, load_price_table


def _cli(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twserve.cli.main", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )


def test_version() -> None:
    done = _cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"twserve {importlib.metadata.version('twserve')}\n"


def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    RequestStore(tmp_path / "requests.sqlite3").close_db()
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte (`| head` that ended)
    try:
        done = _cli("usage", "--json", "--data-dir", str(tmp_path), stdout=write)
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141  # 128 + SIGPIPE, as `cat` killed by the signal reports
    # With a reader, the same command prints its JSON and succeeds.
    done = _cli("usage", "--json", "--data-dir", str(tmp_path))
    assert done.returncode == 0 and json.loads(done.stdout)["rows"] == []


# LiteLLM's list as its JSON reader takes it: NaN and Infinity are read as floats.
NOT_PRICES = """{
  "claude-nan-1": {"litellm_provider": "anthropic", "mode": "chat",
                   "input_cost_per_token": NaN, "output_cost_per_token": 1e-05},
  "claude-inf-1": {"litellm_provider": "anthropic", "mode": "chat",
                   "input_cost_per_token": 1e-06, "output_cost_per_token": Infinity},
  "claude-minus-1": {"litellm_provider": "anthropic", "mode": "chat",
                     "input_cost_per_token": 1e-06, "output_cost_per_token": 1e-05,
                     "cache_read_input_token_cost": -1e-07},
  "gemini/gemini-tier-1": {"litellm_provider": "gemini", "mode": "chat",
                           "input_cost_per_token": 1e-06, "output_cost_per_token": 1e-05,
                           "input_cost_per_token_above_200k_tokens": -Infinity},
  "claude-fine-1": {"litellm_provider": "anthropic", "mode": "chat",
                    "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05}
}"""


def test_prices_update_refuses_figures_that_are_no_prices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "litellm.json"
    source.write_text(NOT_PRICES)
    assert main(["prices", "update", "--from", str(source), "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "saved 1 model prices" in out.out
    assert "left out 4 model(s)" in out.err
    for name in ("claude-nan-1", "claude-inf-1", "claude-minus-1", "gemini/gemini-tier-1"):
        assert name in out.err
    saved = (tmp_path / USER_FILE).read_text()
    assert "NaN" not in saved and "Infinity" not in saved
    table = load_price_table(tmp_path)
    assert sorted(table.models) == ["claude-fine-1"]


def test_a_model_priced_nan_by_hand_is_served_stored_and_unpriced(tmp_path: Path) -> None:
    # A hand-edited prices.json (json.dump writes NaN as it is).
    data = {
        "models": {
            "claude-nan-1": {"input": math.nan, "output": 15.0},
            "claude-fine-1": {"input": 3.0, "output": 15.0},
        }
    }
    (tmp_path / USER_FILE).write_text(json.dumps(data))
    assert "NaN" in (tmp_path / USER_FILE).read_text()
    script = Script(text="hello", usage=Usage(input=10, output=20))
    upstreams = {"a": Upstream("anthropic", MockSettings(script=script))}
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        for model in ("claude-nan-1", "claude-fine-1"):
            answer = c.anthropic.messages.create(
                model=model, max_tokens=9, messages=[{"role": "user", "content": "x"}]
            )
            assert answer.content[0].type == "text"
        rows = {row["model"]: row for row in st.wait_rows(2)}
    assert set(rows) == {"claude-nan-1", "claude-fine-1"}
    assert rows["claude-nan-1"]["cost_micros"] is None
    assert rows["claude-fine-1"]["cost_micros"] == 10 * 3 + 20 * 15
