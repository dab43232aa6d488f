"""``twserve check`` reads ``${VAR}`` from the environment: a gateway key whose variable is not
set refuses the config; an upstream key's is a warning; no secret is ever printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from twserve.cli.main import main

SECRET = "sk-live-SECRET-0123456789"


def test_check_refuses_an_unset_gateway_key_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TW_GATEWAY_KEY", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nclients:\n  - {name: me, key: '${TW_GATEWAY_KEY}'}\n")
    assert main(["check", "--config", str(path)]) == 1
    assert "config.env_missing" in capsys.readouterr().err
    monkeypatch.setenv("TW_GATEWAY_KEY", SECRET)
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err


def test_check_warns_about_an_unset_upstream_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TW_UPSTREAM_KEY", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\nproviders:\n  - {name: a, base_url: 'https://x.example', "
        "key: '${TW_UPSTREAM_KEY}'}\n"
    )
    assert main(["check", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "TW_UPSTREAM_KEY" in err and "config.env_missing" in err
    # A value no header can carry refuses the config, without echoing it.
    monkeypatch.setenv("TW_UPSTREAM_KEY", SECRET + "\n")
    assert main(["check", "--config", str(path)]) == 1
    out = capsys.readouterr()
    assert "config.secret_invalid" in out.err and SECRET not in out.out + out.err
