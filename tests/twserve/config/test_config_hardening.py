"""Config hardening: ``${VAR}`` gateway keys on every path that builds a serving config, secrets
hidden in ``GET /config`` however they are written, YAML aliases and deep nesting refused and
never parsed on the event loop, names without control or separator characters, and a broken
config on a fresh data directory starting safe mode.

Where the symptom is on the wire, the gateway is a real ``twserve serve`` subprocess or the app
as ``serve`` builds it, on loopback sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import pytest

from tests.twserve.support.live import (
    CONTROL_KEY,
    KEY,
    Live,
    config_yaml,
    free_port,
    live_gateway,
    wait_for,
)
from twmock.script import MockSettings
from twserve.cli.main import _serving_app
from twserve.cli.main import main as cli_main
from twserve.config.check import MAX_DEPTH, ConfigRejection, check_config_text, redact
from twserve.config.history import ConfigHistory
from twserve.config.mask import masked_config
from twserve.control.plane import mask_secret

TIMEOUT = {"timeout": {"connect": 5.0, "read": 30.0, "write": 5.0, "pool": 30.0}}
GW_SECRET = "gw-from-the-environment-0123456789"


def _get(url: str, key: str | None = None) -> httpcore.Response:
    headers = [] if key is None else [(b"authorization", b"Bearer " + key.encode())]
    return httpcore.request("GET", url, headers=headers, extensions=TIMEOUT)


def _models(port: int, key: str) -> int:
    return _get(f"http://127.0.0.1:{port}/v1/models", key).status


# --- `twserve serve` in a subprocess ----------------------------------------------------------


@dataclass
class Served:
    proc: subprocess.Popen[str]
    gateway_port: int | None = None
    control_port: int | None = None
    stdout: str = ""
    stderr: str = ""

    def control(self, path: str, key: str = CONTROL_KEY) -> tuple[int, Any]:
        resp = _get(f"http://127.0.0.1:{self.control_port}{path}", key)
        return resp.status, json.loads(resp.content)


@contextmanager
def serve(
    path: Path, home: Path, env: Mapping[str, str], *, wait_for_control: bool = True
) -> Iterator[Served]:
    """``twserve serve --config path --data-dir home --port 0`` until it says where it listens
    (the control plane's line comes last); stopped with SIGTERM at the end, its output kept."""
    command = [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(path)]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(home), "--port", "0"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served(proc=proc)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while wait_for_control:
            line = proc.stdout.readline()
            served.stdout += line
            if line.startswith("twserve listening on"):
                served.gateway_port = int(line.rsplit(":", 1)[1])
            if line.startswith("control plane on"):
                served.control_port = int(line.rsplit(":", 1)[1])
                break
            assert proc.poll() is None and time.monotonic() < deadline, served.stdout
        yield served
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        served.stdout += out
        served.stderr = err


def _templated_config(control_port: int, *, control_key: str = CONTROL_KEY) -> str:
    return (
        "version: 1\n"
        "listen:\n"
        "  gateway: {bind: 127.0.0.1}\n"
        f"  control: {{bind: 127.0.0.1, port: {control_port}, key: '{control_key}'}}\n"
        "clients:\n"
        "  - name: me\n"
        "    key: ${TW_TEST_GW_KEY}\n"
        "providers: []\n"
    )


def test_serve_resolves_a_templated_gateway_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_templated_config(free_port()))
    with serve(path, tmp_path / "home", {"TW_TEST_GW_KEY": GW_SECRET}) as served:
        assert served.gateway_port is not None, served.stdout
        # The variable's value signs in; the template's text is no key.
        assert _models(served.gateway_port, GW_SECRET) == 200
        assert _models(served.gateway_port, "${TW_TEST_GW_KEY}") == 401
        status, keys = served.control("/keys")
        assert status == 200
        assert keys["keys"][0]["key"] == mask_secret(GW_SECRET) == "…6789"
        assert GW_SECRET not in json.dumps(keys)
        # GET /config shows the file as written: the template, never the value.
        status, got = served.control("/config")
        assert status == 200 and "${TW_TEST_GW_KEY}" in got["yaml"]
        assert GW_SECRET not in got["yaml"]


def test_serve_with_an_unset_gateway_key_variable_starts_in_safe_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_templated_config(free_port()))
    env = {k: v for k, v in os.environ.items() if k != "TW_TEST_GW_KEY"}
    with serve(path, tmp_path / "home", {}) as served:
        assert served.gateway_port is None, served.stdout
        status, body = served.control("/status")
        assert status == 200
        assert body["safe_mode"]["problem_code"] == "config.env_missing"
        assert "TW_TEST_GW_KEY" in body["safe_mode"]["message"]
    assert "TW_TEST_GW_KEY" not in env
    err = served.stderr
    assert "starting in safe mode" in err and "config.env_missing" in err


def test_an_unset_control_key_variable_is_said_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_TEST_GW_KEY", GW_SECRET)
    monkeypatch.delenv("TW_TEST_CONTROL_KEY", raising=False)
    monkeypatch.setenv("TWSERVE_CONTROL_KEY", "safe-mode-key-from-the-env-0123")
    path = tmp_path / "config.yaml"
    control_port = free_port()
    path.write_text(_templated_config(control_port, control_key="${TW_TEST_CONTROL_KEY}"))
    app = _serving_app(path, tmp_path, port=0, safe=False)
    assert app is not None
    app.store.close_db()  # built to look at, not run (it would listen on the default port)
    assert app.safe_mode is not None
    err = capsys.readouterr().err
    assert "config.env_missing" in err and "TW_TEST_CONTROL_KEY" in err
    assert "let nobody in" in err
    # The control plane is not locked: safe mode falls back to the documented key, and says
    # why the file's could not be used.
    assert app.config.listen.control.key == "safe-mode-key-from-the-env-0123"
    assert "listen.control.key" in err and "defaults" in err
    # With the variable set, the same file serves, and the control plane takes its value.
    control_key = "control-from-the-env-0123456789"
    monkeypatch.setenv("TW_TEST_CONTROL_KEY", control_key)
    app = _serving_app(path, tmp_path, port=0, safe=False)
    assert app is not None and app.safe_mode is None
    assert app.config.clients[0].key == GW_SECRET
    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal() as portal:
        future, bound = portal.start_task(app.run)
        try:
            url = f"http://127.0.0.1:{bound.control_port}/status"
            assert _get(url, control_key).status == 200
            assert _get(url, "${TW_TEST_CONTROL_KEY}").status == 401
        finally:
            future.cancel()


# --- reload, PUT /config, rollback, safe-mode recovery ----------------------------------------


def _with_templated_key(text: str) -> str:
    return text.replace(f"key: {KEY}\n", "key: ${TW_TEST_GW_KEY}\n", 1)


def _status(live: Live, key: str) -> int:
    return _models(live.app.gateway_port or 0, key)


def test_every_path_that_applies_a_config_resolves_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_TEST_GW_KEY", GW_SECRET)
    monkeypatch.delenv("TW_TEST_UNSET", raising=False)
    with live_gateway(tmp_path, {"a": MockSettings()}, config_yaml) as live:
        plain = live.path.read_text()
        templated = _with_templated_key(plain)
        assert templated != plain
        # A file edit.
        live.write(templated)
        wait_for(lambda: _status(live, GW_SECRET) == 200)
        assert _status(live, KEY) == 401 and _status(live, "${TW_TEST_GW_KEY}") == 401
        # PUT /config back to the plain key, then to a template again.
        _, got = live.control("GET", "/config")
        status, _ = live.control("PUT", "/config", {"base_version": got["version"], "yaml": plain})
        assert status == 200 and _status(live, KEY) == 200
        _, got = live.control("GET", "/config")
        status, put = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": templated}
        )
        assert status == 200, put
        assert _status(live, GW_SECRET) == 200 and _status(live, "${TW_TEST_GW_KEY}") == 401
        # A variable that is not set refuses the write; the config in force stays.
        _, got = live.control("GET", "/config")
        unset = templated.replace("${TW_TEST_GW_KEY}", "${TW_TEST_UNSET}")
        status, put = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": unset}
        )
        assert status == 422
        assert put["error"]["problems"][0]["code"] == "config.env_missing"
        assert _status(live, GW_SECRET) == 200
        # Rollback to the plain entry and forward to the templated one, through the CLI.
        entries = ConfigHistory(live.data_dir).entries()
        numbers = {e.version: e.number for e in entries}
        from twserve.config.check import config_version

        to_plain = numbers[config_version(plain.encode())]
        to_templated = numbers[config_version(templated.encode())]
        args = ["--config", str(live.path), "--data-dir", str(live.data_dir)]
        assert cli_main(["config", "rollback", str(to_plain), *args]) == 0
        wait_for(lambda: _status(live, KEY) == 200)
        assert cli_main(["config", "rollback", str(to_templated), *args]) == 0
        wait_for(lambda: _status(live, GW_SECRET) == 200)
        assert _status(live, "${TW_TEST_GW_KEY}") == 401
        # A rollback to an entry whose variable is gone is refused.
        monkeypatch.delenv("TW_TEST_GW_KEY")
        assert cli_main(["config", "rollback", str(to_templated), *args]) == 1


def test_safe_mode_recovery_resolves_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_TEST_GW_KEY", GW_SECRET)

    def broken(ports: Mapping[str, int], control: int) -> str:
        return config_yaml(ports, control).replace("version: 1\n", "version: 1\nbogus: 1\n")

    with live_gateway(tmp_path, {"a": MockSettings()}, broken) as live:
        assert live.app.gateway_port is None
        _, got = live.control("GET", "/config")
        fixed = _with_templated_key(config_yaml(live.mock_ports, live.control_port))
        status, put = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": fixed}
        )
        assert status == 200, put
        wait_for(lambda: live.app.gateway_port is not None)
        assert _status(live, GW_SECRET) == 200 and _status(live, "${TW_TEST_GW_KEY}") == 401


# --- a broken config on a fresh data directory ------------------------------------------------


def test_a_broken_config_on_a_fresh_data_dir_starts_safe_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: 1\nproviders: 5\n")  # no usable listen.control: the defaults
    home = tmp_path / "new" / "home"
    env = {"TWSERVE_CONTROL_KEY": ""}
    with serve(path, home, env, wait_for_control=False) as served:
        key_file = home / "safe-mode-control-key"
        # The key file is written before the control plane binds its (default) port.
        wait_for(lambda: key_file.exists() or served.proc.poll() is not None)
        assert key_file.exists()
    err = served.stderr
    assert "Traceback" not in err, err
    assert "starting in safe mode" in err and "config.wrong_type" in err
    assert os.stat(home).st_mode & 0o777 == 0o700
    assert os.stat(key_file).st_mode & 0o777 == 0o600


# --- GET /config masks every secret ---------------------------------------------------------

BLOCK = "sk-block-scalar-secret-4242424242"
ESCAPED = "sk-escaped-secret-ABCDEFGHIJ"
MULTI = "sk-multi-line secret-0987654321"
FLOW = "sk-flow-mapping-secret-55555"
OLD = "sk-ant-api03-Xq7bT2mN9pL4vR8wK1zz"


def _secret_config(control_port: int) -> str:
    return (
        "version: 1\n"
        "listen:\n"
        "  gateway: {bind: 127.0.0.1}\n"
        "  control:\n"
        "    bind: 127.0.0.1\n"
        f"    port: {control_port}\n"
        f"    key: {CONTROL_KEY}\n"
        "clients:\n"
        "  - name: block\n"
        "    key: |-\n"
        f"      {BLOCK}\n"
        "  - name: escaped\n"
        '    key: "sk-escaped-secret-\\x41\\x42CDEFGHIJ"\n'
        "  - name: multi\n"
        "    key: sk-multi-line\n"
        "      secret-0987654321  # the key is long\n"
        f"  - {{name: flow, key: '{FLOW}'}}\n"
        f"# previous key: {OLD}\n"
        f"#  key: {BLOCK}\n"
        "#  key: ${SOME_VARIABLE}\n"
        "# upstreams below\n"
        "providers: []\n"
    )


def test_get_config_masks_secrets_however_they_are_written(tmp_path: Path) -> None:
    config = check_config_text(_secret_config(free_port()), {})
    assert [c.key for c in config.clients] == [BLOCK, ESCAPED, MULTI, FLOW]
    with live_gateway(tmp_path, {}, lambda _p, control: _secret_config(control)) as live:
        status, got = live.control("GET", "/config")
        assert status == 200
        shown = got["yaml"]
        for secret in (BLOCK, ESCAPED, MULTI, FLOW, OLD, CONTROL_KEY):
            for part in (secret, secret[:12], secret[-10:]):
                assert part not in shown, (part, shown)
        assert "sk-escaped-secret-\\x41" not in shown and "secret-0987654321" not in shown
        # Comments without a secret stay, a `${VAR}` one included; the masks read back.
        assert "# upstreams below" in shown and "#  key: ${SOME_VARIABLE}" in shown
        assert "previous key" not in shown
        assert "…4242" in shown and "…GHIJ" in shown
        # Writing the masked text back keeps every key (the comments with secrets are gone).
        status, put = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": shown}
        )
        assert status == 200, put
        written = check_config_text(live.path.read_text(), {})
        assert [c.key for c in written.clients] == [BLOCK, ESCAPED, MULTI, FLOW]
        assert written.listen.control.key == CONTROL_KEY
        assert OLD not in live.path.read_text()


def test_get_config_in_safe_mode_masks_the_broken_file(tmp_path: Path) -> None:
    def broken(ports: Mapping[str, int], control: int) -> str:
        return _secret_config(control).replace("providers: []", "providers: 5")

    with live_gateway(tmp_path, {}, broken) as live:
        assert live.app.gateway_port is None
        status, got = live.control("GET", "/config")
        assert status == 200 and got["safe_mode"] is True
        shown = got["yaml"]
        for secret in (BLOCK, ESCAPED, MULTI, FLOW, OLD, CONTROL_KEY, "secret-0987654321"):
            assert secret not in shown, (secret, shown)
        assert "# upstreams below" in shown and "providers: 5" in shown


def test_a_file_that_does_not_parse_is_masked_line_by_line() -> None:
    text = _secret_config(8789) + "providers: [unclosed\n"
    shown = masked_config(text, mask_secret, {})
    for secret in (BLOCK, FLOW, OLD, CONTROL_KEY, "secret-0987654321", "sk-escaped"):
        assert secret not in shown, (secret, shown)
    assert "# upstreams below" in shown and "#  key: ${SOME_VARIABLE}" in shown
    assert "  - name: block" in shown and "    port: 8789" in shown


def test_masked_config_drops_a_comment_holding_a_resolved_key() -> None:
    text = (
        "version: 1\n"
        "clients:\n"
        "  - name: me\n"
        "    key: ${TW_KEY}   # was " + GW_SECRET + "\n"
        "# " + GW_SECRET + "\n"
        "providers: []\n"
    )
    shown = masked_config(text, mask_secret, {"TW_KEY": GW_SECRET})
    assert GW_SECRET not in shown
    assert "    key: ${TW_KEY}\n" in shown and "providers: []" in shown


def test_excerpts_hide_continuation_lines_and_secret_comments() -> None:
    assert redact(f"      {BLOCK}") == "      ***"
    assert redact(f"# old: {OLD}") == "# ***"
    assert redact(f"    port: 8080  # {OLD}") == "    port: 8080"
    assert redact("  - gpt-5") == "  - gpt-5"
    assert redact("# upstreams below") == "# upstreams below"


# --- YAML aliases and nesting ---------------------------------------------------------------


def _laughs(levels: int = 9) -> str:
    """Nested aliases: each level names the previous one nine times (`levels` 9 makes 9**9
    nodes out of under a kilobyte)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_aliases_and_deep_nesting_are_refused_at_once() -> None:
    text = "version: 1\n" + _laughs()
    assert len(text) < 1000
    started = time.monotonic()
    with pytest.raises(ConfigRejection) as info:
        check_config_text(text, {})
    assert time.monotonic() - started < 1.0
    assert info.value.stage_name == "yaml"
    assert info.value.first.code == "config.yaml_alias" and info.value.first.line == 2
    # An anchor alone is refused too: it does nothing a config needs.
    with pytest.raises(ConfigRejection) as info:
        check_config_text("version: 1\nproviders: &p []\n", {})
    assert info.value.first.code == "config.yaml_alias"
    deep = "version: 1\nproviders: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    with pytest.raises(ConfigRejection) as info:
        check_config_text(deep, {})
    assert info.value.first.code == "config.yaml_too_deep"
    # Far deeper than the interpreter's recursion limit: still one finding, no RecursionError.
    with pytest.raises(ConfigRejection) as info:
        check_config_text("version: 1\nproviders: " + "[" * 5000 + "\n", {})
    assert info.value.first.code == "config.yaml_too_deep"


def _healthz_while(live: Live, work: Any) -> tuple[float, int, Any]:
    """Run `work()` in a thread and ask ``/healthz`` over and over until it ends: the slowest
    answer, how many answers came while it ran, and what `work` returned."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    worst = 0.0
    count = 0
    thread.start()
    while thread.is_alive():
        started = time.monotonic()
        resp = httpcore.request("GET", live.url + "/healthz", extensions=TIMEOUT)
        assert resp.status == 200
        worst = max(worst, time.monotonic() - started)
        count += 1
    thread.join()
    return worst, count, result[0]


def test_an_aliased_put_neither_stalls_the_gateway_nor_applies(tmp_path: Path) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, config_yaml) as live:
        _, got = live.control("GET", "/config")
        text = live.path.read_text() + _laughs(7)
        body = {"base_version": got["version"], "yaml": text}
        worst, _, answer = _healthz_while(live, lambda: live.control("PUT", "/config", body))
        status, put = answer
        assert status == 422 and put["error"]["problems"][0]["code"] == "config.yaml_alias"
        assert worst < 1.0


def test_a_slow_config_is_parsed_off_the_event_loop(tmp_path: Path) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, config_yaml) as live:
        _, got = live.control("GET", "/config")
        # Valid YAML that takes the reader a while: a long list of names in a comment-free
        # field that the schema then refuses.
        text = live.path.read_text() + "bogus:\n" + "  - xxxxxxxxxxxxxxxx\n" * 8_000
        body = {"base_version": got["version"], "yaml": text}
        started = time.monotonic()
        worst, count, answer = _healthz_while(live, lambda: live.control("PUT", "/config", body))
        took = time.monotonic() - started
        status, put = answer
        assert status == 422 and put["error"]["problems"][0]["code"] == "config.unknown_field"
        # The parse took long enough to be seen, and /healthz kept answering meanwhile.
        assert took > 0.3 and count >= 3, (took, count)
        assert worst < took / 2, (worst, took)


# --- names ---------------------------------------------------------------------------------


def test_a_model_name_with_a_separator_is_refused_and_small_writes_go_on(tmp_path: Path) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, config_yaml) as live:
        for bad in ("m\u2028x", "m\u2029", "m\x85n", "m\x00", "m\u200bz"):
            status, body = live.control(
                "PUT", "/provider-model-spec", {"provider": "a", "model": bad, "context_window": 9}
            )
            assert status == 400, (bad, body)
            assert body["error"]["code"] == "control.model_spec_invalid"
        # A file that holds one where it may, in a quoted header value, above the lines a small
        # write edits: they are still found, counted as YAML counts lines (not at U+2028).
        text = live.path.read_text().replace(
            "  - name: a  # upstream a\n",
            '  - headers: {x-note: "a\u2028b"}\n    name: a  # upstream a\n',
        )
        assert "\u2028" in text
        live.write(text)
        wait_for(lambda: live.events_of("ConfigReloaded"))
        status, body = live.control(
            "PUT", "/provider-model-spec", {"provider": "a", "model": "m", "context_window": 9000}
        )
        assert status == 200, body
        status, body = live.control(
            "PUT", "/provider-model-spec", {"provider": "a", "model": "n", "max_output_tokens": 50}
        )
        assert status == 200, body
        # A write that replaces a line in place, and one that removes one.
        status, body = live.control(
            "PUT", "/provider-model-spec", {"provider": "a", "model": "m", "context_window": 7000}
        )
        assert status == 200, body
        status, body = live.control(
            "PUT", "/provider-model-spec", {"provider": "a", "model": "n", "clear": True}
        )
        assert status == 200, body
        written = check_config_text(live.path.read_text(), {})
        specs = dict(written.provider("a").model_specs)
        assert list(specs) == ["m"] and specs["m"].context_window == 7000
        assert dict(written.provider("a").headers)["x-note"] == "a\u2028b"


def test_a_config_over_max_config_bytes_is_refused_unread(tmp_path: Path) -> None:
    def small(ports: Mapping[str, int], control: int) -> str:
        return config_yaml(ports, control).replace(
            f"    key: {CONTROL_KEY}\n", f"    key: {CONTROL_KEY}\n    max_config_bytes: 4096\n"
        )

    with live_gateway(tmp_path, {"a": MockSettings()}, small) as live:
        assert live.app.config.listen.control.max_config_bytes == 4096
        _, got = live.control("GET", "/config")
        text = live.path.read_text()
        padded = text + "#" * (4097 - len(text.encode())) + "\n"
        status, body = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": padded}
        )
        assert status == 413 and body["error"]["code"] == "control.config.too_large"
        assert live.path.read_text() == text
        status, body = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": text + "# ok\n"}
        )
        assert status == 200, body
