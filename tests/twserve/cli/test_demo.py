"""`twserve demo --once`: the newcomer's first command answers every banner request."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from twserve.cli.demo import banner_requests, curl_line, demo_config, run_demo


def test_demo_once_answers_every_banner_request(capsys: pytest.CaptureFixture[str]) -> None:
    anyio.run(lambda: run_demo(once=True))
    out = capsys.readouterr().out
    titles = [t for t, *_ in banner_requests(1)]
    assert out.count("HTTP 200") == len(titles) - 1  # the pool request prints rows only
    rows = [line for line in out.splitlines() if line.startswith("[row]")]
    assert len(rows) == len(titles) - 1 + 10
    assert all("status=200" in row for row in rows)
    pool = [row for row in rows if "claude-pool" in row]
    served = {m.group(1) for row in pool if (m := re.search(r"via (\S+)", row))}
    # Ten requests at 5:3:2 reach at least the two heavier members.
    assert {"pool-main", "pool-relay"} <= served
    # Conversions in the banner really went to the other format's upstream.
    assert any("openai-chat claude-demo" in r and "via mock-anthropic" in r for r in rows)
    assert any("gemini gpt-demo-responses" in r and "via mock-responses" in r for r in rows)


def test_curl_lines_quote_bodies() -> None:
    _title, url, headers, body = banner_requests(8788)[0]
    line = curl_line(url, headers, body)
    assert line.startswith("curl -N http://127.0.0.1:8788/v1/messages ")
    assert "x-api-key: demo-key" in line and "'content-type: application/json'" in line


def test_demo_upstreams_take_the_mock_script_header() -> None:
    # Every demo upstream is the mock, so a curl's x-mock-script may script its answer.
    providers = demo_config(9).providers
    assert providers and all(p.forward_mock_headers for p in providers)


def test_demo_on_a_taken_port_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        demo = subprocess.run(
            [sys.executable, "-m", "twserve.cli.main", "demo", "--port", str(port)],
            capture_output=True,
            text=True,
            env={**os.environ, "TWSERVE_HOME": str(tmp_path)},
            timeout=30,
        )
    assert demo.returncode == 2, demo.stderr
    assert "Traceback" not in demo.stderr and "ExceptionGroup" not in demo.stderr
    last = demo.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gw.listen.cannot_bind: cannot listen on 127.0.0.1:{port}")


def test_the_demo_logs_each_request_with_its_fields(tmp_path: Path) -> None:
    demo = subprocess.run(
        [sys.executable, "-m", "twserve.cli.main", "demo", "--once", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "TWSERVE_HOME": str(tmp_path)},
        timeout=120,
    )
    assert demo.returncode == 0, demo.stderr
    access = [line for line in demo.stderr.splitlines() if "twserve.access" in line]
    assert access, demo.stderr
    # Each access line carries its fields (docs/observability.md), not the bare message.
    assert all("request_id=" in line and "status=200" in line for line in access), access
