"""Live config (docs/operations.md, docs/control-plane.md): reload under load, refused
configs, control-plane writes that keep the file's bytes, history and rollback, safe mode,
listener rebind and SIGHUP.

Everything runs on real sockets against a real config file; the gateway is built the way
``twserve serve`` builds it (`twserve.cli.main._serving_app`).
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpcore
import pytest

from tests.twserve.support.live import (
    CONTROL_KEY,
    KEY,
    UPSTREAM_KEY,
    Live,
    config_yaml,
    free_port,
    live_gateway,
    wait_for,
)
from twmock.script import MockSettings, Script
from twserve.cli.main import main as cli_main
from twserve.config.check import config_version
from twserve.config.history import ConfigHistory
from twserve.config.safemode import SAFE_KEY_FILE, control_only_config

STREAM_BODY = json.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()
PLAIN_BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _chat(live: Live, body: bytes = PLAIN_BODY) -> httpcore.Response:
    return httpcore.request(
        "POST",
        live.url + "/v1/chat/completions",
        headers=[(b"authorization", b"Bearer " + KEY.encode())],
        content=body,
        extensions={"timeout": {"connect": 5.0, "read": 20.0, "write": 5.0, "pool": 20.0}},
    )


def _slow(chunks: int = 10, delay: float = 0.05) -> MockSettings:
    return MockSettings(script=Script(chunks=chunks, chunk_delay=delay))


# --- reload under load ----------------------------------------------------------------------


def test_edits_under_64_streams_break_none_and_route_within_a_second(tmp_path: Path) -> None:
    ups = {"a": _slow(), "b": _slow(), "c": _slow()}
    # Each stream lasts about 0.5 s: every edit lands on streams in flight.
    with live_gateway(tmp_path, ups, lambda p, c: config_yaml(p, c)) as live:
        ports, cport = live.mock_ports, live.control_port
        outcomes: list[tuple[int, bool]] = []
        errors: list[str] = []
        stop = False

        async def worker(pool: httpcore.AsyncConnectionPool) -> None:
            while not stop:
                try:
                    resp = await pool.request(
                        "POST",
                        live.url + "/v1/chat/completions",
                        headers=[(b"authorization", b"Bearer " + KEY.encode())],
                        content=STREAM_BODY,
                    )
                except Exception as exc:  # a broken stream is what the test looks for
                    errors.append(repr(exc))
                    return
                outcomes.append((resp.status, resp.content.rstrip().endswith(b"data: [DONE]")))

        def routed() -> list[tuple[str, int]]:
            """The candidates, with weights, the next request for model m gets."""
            _, report = live.control("GET", "/dryrun?model=m")
            return [(c["provider"], c["weight"]) for c in report["candidates"]]

        def scenario() -> dict[str, float]:
            timings: dict[str, float] = {}
            wait_for(lambda: len(outcomes) >= 64)
            # 1. add an upstream and balance over both: b starts taking requests.
            before_b = live.mocks["b"].count()
            live.write(config_yaml(ports, cport, providers=("a", "b"), weights={"a": 1, "b": 1}))
            timings["add"] = wait_for(lambda: sorted(routed()) == [("a", 1), ("b", 1)])
            wait_for(lambda: live.mocks["b"].count() > before_b)
            # 2. change the weights so c, added now, takes nearly everything.
            live.write(
                config_yaml(
                    ports, cport, providers=("a", "b", "c"), weights={"a": 1, "b": 1, "c": 100}
                )
            )
            timings["weights"] = wait_for(lambda: ("c", 100) in routed())
            before_c = live.mocks["c"].count()
            wait_for(lambda: live.mocks["c"].count() > before_c + 10)
            # 3. break the file: refused, the previous config keeps serving.
            rejected = len(live.events_of("ConfigRejected"))
            live.write("providers: [unclosed\n")
            timings["break"] = wait_for(lambda: len(live.events_of("ConfigRejected")) > rejected)
            before_c = live.mocks["c"].count()
            wait_for(lambda: live.mocks["c"].count() > before_c + 10)
            assert ("c", 100) in routed()
            # 4. fix it, leaving a out: a gets nothing new once the fix is in.
            live.write(config_yaml(ports, cport, providers=("b",)))
            timings["fix"] = wait_for(lambda: routed() == [("b", 1)])
            # Streams already sent to a finish there; then a sees no new request.
            wait_for(lambda: live.app.gateway.router.slots.in_flight("a") == 0)
            after_a = live.mocks["a"].count()
            before_b = live.mocks["b"].count()
            wait_for(lambda: live.mocks["b"].count() > before_b + 20)
            assert live.mocks["a"].count() == after_a
            # The edits go faster than the streams: the streams go on until more than 200
            # have ended (each is checked whole below), however soon the edits were done.
            wait_for(lambda: len(outcomes) > 200)
            return timings

        async def run() -> dict[str, float]:
            nonlocal stop
            async with httpcore.AsyncConnectionPool(max_connections=64) as pool:
                with anyio.fail_after(90):
                    async with anyio.create_task_group() as tg:
                        for _ in range(64):
                            tg.start_soon(worker, pool)
                        try:
                            timings = await anyio.to_thread.run_sync(scenario)
                        finally:
                            stop = True
            return timings

        timings = anyio.run(run)
        print(f"seconds from write to routing: {timings}, streams: {len(outcomes)}")
        assert not errors, errors[:3]
        assert len(outcomes) > 200
        assert all(status == 200 and done for status, done in outcomes), [
            o for o in outcomes if o != (200, True)
        ][:5]
        assert max(timings.values()) < 1.0, timings
        rejected = live.events_of("ConfigRejected")[-1]
        assert rejected.stage == "yaml"
        assert rejected.problems[0].code == "config.yaml_invalid"
        assert rejected.problems[0].line == 2  # the unclosed list runs to the end
        assert live.app.gateway.router.slots.in_flight("a") == 0


def test_refused_config_names_stage_line_code_and_hides_secrets(tmp_path: Path) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c)) as live:
        good = live.path.read_text()
        # A misspelled `key` field: its value is a secret the schema does not know to be one.
        bad = good.replace("    key: " + UPSTREAM_KEY, "    kye: " + UPSTREAM_KEY)
        bad = bad.replace("models: [m]", "models: [m]\n    max_concurrent: 0")
        live.write(bad)
        wait_for(lambda: live.events_of("ConfigRejected"))
        event = live.events_of("ConfigRejected")[0]
        assert event.stage == "schema"
        assert event.config_version == config_version(bad.encode())
        by_code = {p.code: p for p in event.problems}
        lines = bad.splitlines()
        unknown = by_code["config.unknown_field"]
        assert lines[unknown.line - 1].strip().startswith("kye:")
        assert UPSTREAM_KEY not in json.dumps(
            [p.__dict__ if hasattr(p, "__dict__") else str(p) for p in event.problems]
        )
        assert UPSTREAM_KEY not in unknown.excerpt and unknown.excerpt.strip() == "kye: ***"
        out_of_range = by_code["config.provider_concurrency_range"]
        assert out_of_range.excerpt.strip() == "max_concurrent: 0"
        assert lines[out_of_range.line - 1].strip() == "max_concurrent: 0"
        # Still serving on the old config, and /status says what was refused.
        assert _chat(live).status == 200
        _, body = live.control("GET", "/status")
        assert body["config"]["last_rejected"]["stage"] == "schema"
        assert body["config"]["config_version"] == config_version(good.encode())


def test_stage_four_refuses_what_the_runtime_cannot_build() -> None:
    from twengine.config import Config, Failover
    from twserve.config.check import ConfigRejection, build_runtime

    # build_config never makes this (config.failover_pause_order); a Config made by hand can.
    with pytest.raises(ConfigRejection) as info:
        build_runtime(Config(failover=Failover(pause_secs=100, max_pause_secs=10)))
    assert info.value.stage_name == "runtime"
    assert info.value.first.code == "config.runtime_failed"
    assert "pause_secs" in info.value.first.message


def test_stage_of_every_problem_code() -> None:
    from twengine.codes import CODES
    from twserve.config.check import STAGES, stage_of

    assert stage_of("config.yaml_invalid") == "yaml"
    assert stage_of("config.unknown_field") == "schema"
    assert stage_of("engine.group_unknown_upstream") == "consistency"
    assert stage_of("config.client_duplicate_name") == "consistency"
    assert stage_of("config.listen_unavailable") == "runtime"
    assert {stage_of(c) for c in CODES if c.startswith(("config.", "engine."))} == set(STAGES)


# --- control-plane writes -------------------------------------------------------------------


def _changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """Lines removed from `old` and added in `new`; everything else must be equal byte for
    byte (the matcher proves it by matching those lines as equal blocks)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    removed: list[str] = []
    added: list[str] = []
    equal = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            equal += i2 - i1
        else:
            removed += a[i1:i2]
            added += b[j1:j2]
    assert equal + len(removed) == len(a) and equal + len(added) == len(b)
    return removed, added


SELECT_GROUP = (
    "\ngroups:\n"
    "  # pick one by hand\n"
    "  - name: pick\n"
    "    type: select\n"
    "    providers: [a, b]   # the two\n"
    "\nroutes:\n  - name: main\n    rules:\n      - {name: all, to: pick}\n"
    "default_route: main\n"
    "# the end\n"
)


def test_small_writes_keep_every_other_byte(tmp_path: Path) -> None:
    def text(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c, providers=("a", "b"), extra=SELECT_GROUP)

    ups = {"a": MockSettings(), "b": MockSettings()}
    with live_gateway(tmp_path, ups, text) as live:
        original = live.path.read_text()
        status, got = live.control("GET", "/config")
        assert status == 200 and got["version"] == config_version(original.encode())
        # Secrets are masked in the read; the comments are all there.
        assert UPSTREAM_KEY not in got["yaml"] and CONTROL_KEY not in got["yaml"]
        assert "# upstreams, in order" in got["yaml"] and "# the two" in got["yaml"]

        status, put = live.control(
            "PUT",
            "/provider-model-spec",
            {
                "provider": "b",
                "model": "m",
                "context_window": 200000,
                "base_version": got["version"],
            },
        )
        assert status == 200, put
        after_spec = live.path.read_text()
        removed, added = _changed_lines(original, after_spec)
        assert removed == [] and added == [
            "    model_specs:\n",
            "      m: {context_window: 200000}\n",
        ]
        assert put["version"] == config_version(after_spec.encode())

        status, put = live.control("PUT", "/group-selected", {"group": "pick", "member": "b"})
        assert status == 200, put
        after_select = live.path.read_text()
        removed, added = _changed_lines(after_spec, after_select)
        assert removed == [] and added == ["    selected: b\n"]
        # The selection is in force: requests go to b.
        before = live.mocks["b"].count()
        assert _chat(live).status == 200
        assert live.mocks["b"].count() == before + 1

        status, put = live.control(
            "PUT", "/provider-model-spec", {"provider": "b", "model": "m", "max_output_tokens": 512}
        )
        assert status == 200, put
        removed, added = _changed_lines(after_select, live.path.read_text())
        assert removed == ["      m: {context_window: 200000}\n"]
        assert added == ["      m: {max_output_tokens: 512}\n"]
        status, put = live.control(
            "PUT", "/provider-model-spec", {"provider": "b", "model": "m", "clear": True}
        )
        assert status == 200, put
        assert live.path.read_text() == after_select.replace(
            "    model_specs:\n      m: {context_window: 200000}\n", ""
        )
        status, providers = live.control("GET", "/providers")
        assert [r["models"] for r in providers["providers"] if r["name"] == "b"] == [
            [
                {
                    "model": "m",
                    "offered": True,
                    "context_window": None,
                    "context_window_source": None,
                    "max_output_tokens": None,
                    "max_output_tokens_source": None,
                    "set_by_hand": False,
                }
            ]
        ]
        assert os.stat(live.path).st_mode & 0o777 == 0o600
        origins = [e["origin"] for e in live.control("GET", "/config/history")[1]["history"]]
        assert origins == ["file", "control", "control", "control", "control"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"provider": "a", "model": "", "context_window": 5}, 400, "control.model_spec_invalid"),
        ({"provider": "a", "model": "  ", "context_window": 5}, 400, "control.model_spec_invalid"),
        (
            {"provider": "a", "model": "gpt-*", "context_window": 5},
            400,
            "control.model_spec_invalid",
        ),
        ({"provider": "a", "model": "m", "context_window": 0}, 400, "control.model_spec_invalid"),
        (
            {"provider": "a", "model": "m", "max_output_tokens": -1},
            400,
            "control.model_spec_invalid",
        ),
        ({"provider": "a", "model": "m"}, 400, "control.model_spec_invalid"),
        ({"provider": "zz", "model": "m", "context_window": 5}, 404, "control.provider_unknown"),
        (
            {"provider": "a", "model": "m", "context_window": 10, "max_output_tokens": 20},
            422,
            "control.config.rejected",
        ),
    ],
)
def test_model_spec_writes_refused(
    tmp_path: Path, body: dict[str, Any], status: int, code: str
) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c)) as live:
        before = live.path.read_bytes()
        got_status, got = live.control("PUT", "/provider-model-spec", body)
        assert (got_status, got["error"]["code"]) == (status, code)
        assert live.path.read_bytes() == before


def test_stale_write_is_409_and_changes_nothing(tmp_path: Path) -> None:
    ups = {"a": MockSettings(), "b": MockSettings()}

    def text(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c, providers=("a", "b"), extra=SELECT_GROUP)

    with live_gateway(tmp_path, ups, text) as live:
        _, got = live.control("GET", "/config")
        status, _ = live.control(
            "PUT",
            "/group-selected",
            {"group": "pick", "member": "a", "base_version": got["version"]},
        )
        assert status == 200
        current = live.path.read_bytes()
        edited = got["yaml"].replace("# the end", "# edited from an old read")
        status, body = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": edited}
        )
        assert status == 409
        assert body["error"]["code"] == "control.config.stale_version"
        assert body["error"]["current_version"] == config_version(current)
        status, body = live.control(
            "PUT",
            "/group-selected",
            {"group": "pick", "member": "b", "base_version": got["version"]},
        )
        assert status == 409
        assert live.path.read_bytes() == current

        # A fresh read, edited and written back with its masks: the secrets survive.
        _, fresh = live.control("GET", "/config")
        edited = fresh["yaml"].replace("# the end", "# edited from a fresh read")
        status, body = live.control(
            "PUT", "/config", {"base_version": fresh["version"], "yaml": edited}
        )
        assert status == 200, body
        written = live.path.read_text()
        assert "# edited from a fresh read" in written
        assert f"key: {UPSTREAM_KEY}-a" in written and f"key: {CONTROL_KEY}" in written
        assert _chat(live).status == 200
        # A refused whole-file write: 422 with the stage and line, the file untouched.
        _, fresh = live.control("GET", "/config")
        broken = fresh["yaml"].replace("type: select", "type: choose")
        status, body = live.control(
            "PUT", "/config", {"base_version": fresh["version"], "yaml": broken}
        )
        assert status == 422
        assert body["error"]["stage"] == "schema"
        problem = body["error"]["problems"][0]
        assert problem["code"] == "config.invalid_choice"
        assert broken.splitlines()[problem["line"] - 1].strip() == "type: choose"
        assert live.path.read_text() == written


def test_a_mask_that_stands_for_no_secret_is_refused(tmp_path: Path) -> None:
    with live_gateway(tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c)) as live:
        before = live.path.read_bytes()
        _, got = live.control("GET", "/config")
        masked = got["yaml"]
        shown = "…" + f"{UPSTREAM_KEY}-a"[-4:]
        assert f"key: {shown}\n" in masked and UPSTREAM_KEY not in masked
        status, body = live.control(
            "PUT",
            "/config",
            {"base_version": got["version"], "yaml": masked.replace(shown, "…zzzz")},
        )
        assert status == 422 and body["error"]["code"] == "control.config.rejected"
        assert "providers[0].key" in body["error"]["message"]
        assert live.path.read_bytes() == before


def test_members_a_reload_adds_to_url_test_get_a_connection_timing(tmp_path: Path) -> None:
    ups = {"a": MockSettings(), "b": MockSettings()}
    with live_gateway(tmp_path, ups, lambda p, c: config_yaml(p, c)) as live:
        router = live.app.gateway.router
        assert router.connection_test("b") is None
        group = "\ngroups:\n  - name: fast\n    type: url-test\n    providers: [a, b]\n"
        live.write(config_yaml(live.mock_ports, live.control_port, providers=("a", "b")) + group)
        wait_for(lambda: router.connection_test("b") is not None)


def test_pause_and_resume_a_provider(tmp_path: Path) -> None:
    ups = {"a": MockSettings(), "b": MockSettings()}

    def text(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c, providers=("a", "b"), weights={"a": 1, "b": 1})

    with live_gateway(tmp_path, ups, text) as live:
        file_before = live.path.read_bytes()
        status, body = live.control("PUT", "/provider-pause", {"provider": "a", "secs": 300})
        assert status == 200 and body["paused"] is True
        before_a = live.mocks["a"].count()
        for _ in range(6):
            assert _chat(live).status == 200
        assert live.mocks["a"].count() == before_a
        # A reload keeps the pause (health carries over for upstreams that stay).
        live.write(live.path.read_text().replace("weight: 1}", "weight: 2}"))
        wait_for(lambda: live.events_of("ConfigReloaded"))
        _, providers = live.control("GET", "/providers")
        row = next(r for r in providers["providers"] if r["name"] == "a")
        assert row["pause_reason"] == "manual" and row["pause_left_secs"] > 200
        status, body = live.control("PUT", "/provider-pause", {"provider": "a", "paused": False})
        assert status == 200 and body["paused"] is False
        for _ in range(6):
            assert _chat(live).status == 200
        assert live.mocks["a"].count() > before_a
        status, body = live.control("PUT", "/provider-pause", {"provider": "zz"})
        assert (status, body["error"]["code"]) == (404, "control.provider_unknown")
        status, body = live.control("PUT", "/provider-pause", {"provider": "a", "secs": 0})
        assert (status, body["error"]["code"]) == (400, "control.request.invalid")
        assert b"weight: 1}" in file_before and live.path.read_bytes() != file_before
        assert [e.reason for e in live.events_of("HealthChanged")] == ["manual", "manual"]


# --- history and rollback -------------------------------------------------------------------


def test_history_and_rollback_running_and_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ups = {"a": MockSettings(), "b": MockSettings()}
    args = ["--config", str(tmp_path / "config.yaml"), "--data-dir", str(tmp_path / "home")]
    with live_gateway(tmp_path, ups, lambda p, c: config_yaml(p, c)) as live:
        first = live.path.read_bytes()
        two = config_yaml(live.mock_ports, live.control_port, providers=("a", "b"))
        live.write(two)
        wait_for(lambda: len(live.events_of("ConfigReloaded")) == 1)
        three = config_yaml(live.mock_ports, live.control_port, providers=("b",))
        live.write(three)
        wait_for(lambda: len(live.events_of("ConfigReloaded")) == 2)
        assert cli_main(["config", "history", *args]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in out] == ["1", "2", "3"]
        assert config_version(first) in out[0] and "(current file)" in out[2]
        # Rolled back while running: the watcher applies the file the CLI wrote.
        assert cli_main(["config", "rollback", "1", *args]) == 0
        assert live.path.read_bytes() == first
        took = wait_for(lambda: len(live.events_of("ConfigReloaded")) == 3)
        assert took < 1.0
        assert [p.name for p in live.app.config.providers] == ["a"]
        assert live.app.live is not None and live.app.live.version == config_version(first)
    # With the gateway stopped.
    capsys.readouterr()
    assert cli_main(["config", "rollback", "2", *args]) == 0
    assert (tmp_path / "config.yaml").read_text() == two
    entries = ConfigHistory(tmp_path / "home").entries()
    assert [(e.number, e.origin) for e in entries] == [
        (1, "file"),
        (2, "file"),
        (3, "file"),
        (4, "cli"),
        (5, "cli"),
    ]
    assert cli_main(["config", "rollback", "99", *args]) == 1
    history_dir = tmp_path / "home" / "config-history"
    assert os.stat(history_dir).st_mode & 0o777 == 0o700
    assert all(os.stat(f).st_mode & 0o777 == 0o600 for f in history_dir.iterdir())


def test_history_keeps_the_last_50(tmp_path: Path) -> None:
    history = ConfigHistory(tmp_path)
    for i in range(60):
        history.record(f"version: 1\n# {i}\n".encode(), "control")
    entries = history.entries()
    assert len(entries) == 50 and entries[0].number == 11 and entries[-1].number == 60
    assert len(list((tmp_path / "config-history").glob("*.yaml"))) == 50
    _, data = history.read(60)
    assert data == b"version: 1\n# 59\n"


# --- safe mode ------------------------------------------------------------------------------


def test_safe_mode_at_start_and_recovery_by_write(tmp_path: Path) -> None:
    def broken(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c).replace(
            "providers:\n", "providers:\n  - name: a\n    base_url: 5\n", 1
        )

    with live_gateway(tmp_path, {"a": MockSettings()}, broken) as live:
        assert live.app.gateway_port is None
        status, body = live.control("GET", "/status")
        assert status == 200
        safe = body["safe_mode"]
        assert safe["code"] == "control.safe_mode"
        assert safe["stage"] in ("schema", "consistency")
        assert safe["line"] is not None and safe["problem_code"].startswith("config.")
        # The broken file is what GET /config shows; a valid write brings the gateway up.
        _, got = live.control("GET", "/config")
        fixed = config_yaml(live.mock_ports, live.control_port)
        status, put = live.control(
            "PUT", "/config", {"base_version": got["version"], "yaml": fixed}
        )
        assert status == 200, put
        wait_for(lambda: live.app.gateway_port is not None)
        assert _chat(live).status == 200
        _, body = live.control("GET", "/status")
        assert body["safe_mode"] is None
        assert live.path.read_text() == fixed


def test_safe_flag_then_recovery_by_file_edit(tmp_path: Path) -> None:
    with live_gateway(
        tmp_path, {"a": MockSettings()}, lambda p, c: config_yaml(p, c), safe=True
    ) as live:
        assert live.app.gateway_port is None
        _, body = live.control("GET", "/status")
        assert body["safe_mode"]["problem_code"] == "control.safe_mode"
        # Editing the file (any change) brings it up too.
        live.write(live.path.read_text() + "# touched\n")
        took = wait_for(lambda: live.app.gateway_port is not None)
        assert took < 1.0
        assert _chat(live).status == 200


def test_safe_mode_defaults_when_the_file_gives_no_control(tmp_path: Path) -> None:
    got = control_only_config("{{{ not yaml", tmp_path, {"TWSERVE_CONTROL_KEY": "from-env-key-123"})
    assert got.source == "defaults" and got.config.listen.control.key == "from-env-key-123"
    assert got.config.listen.control.port == 8789
    got = control_only_config("version: 1\n", tmp_path, {})
    assert got.source == "defaults" and got.key_file == tmp_path / SAFE_KEY_FILE
    assert os.stat(got.key_file).st_mode & 0o777 == 0o600
    again = control_only_config("", tmp_path, {})
    assert again.config.listen.control.key == got.config.listen.control.key
    text = "version: 2\nlisten:\n  control: {port: 9999, key: k-from-file-0123456789}\n"
    got = control_only_config(text, tmp_path, {})
    assert got.source == "config" and got.config.listen.control.port == 9999


# --- listen rebind --------------------------------------------------------------------------


def test_listen_change_rebinds_and_a_busy_port_keeps_the_old(tmp_path: Path) -> None:
    from twserve.app.wiring import GatewayApp
    from twserve.config.live import check_bytes

    first, second = free_port(), free_port()
    path = tmp_path / "config.yaml"
    control_port = free_port()
    text = config_yaml({"a": 9}, control_port, gateway_port=first)
    path.write_text(text)
    app = GatewayApp(
        check_bytes(text.encode(), {}),
        tmp_path,
        env={},
        config_path=path,
        config_data=text.encode(),
    )
    events: list[Any] = []
    app.events.listeners.append(events.append)

    def ping(port: int) -> int:
        resp = httpcore.request(
            "GET",
            f"http://127.0.0.1:{port}/",
            extensions={"timeout": {"connect": 2.0, "read": 5.0}},
        )
        return resp.status

    def control_status(port: int) -> int:
        resp = httpcore.request(
            "GET",
            f"http://127.0.0.1:{port}/status",
            headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
            extensions={"timeout": {"connect": 2.0, "read": 5.0}},
        )
        return resp.status

    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal() as portal:
        fut, bound = portal.start_task(app.run)
        try:
            assert bound.gateway_port == first and ping(first) == 200
            path.write_text(text.replace(f"port: {first}", f"port: {second}"))
            took = wait_for(lambda: app.gateway_port == second)
            assert took < 1.0 and ping(second) == 200
            with pytest.raises(httpcore.ConnectError):
                ping(first)
            # The control plane moves too.
            text = text.replace(f"port: {first}", f"port: {second}")
            new_control = free_port()
            text = text.replace(f"port: {control_port}", f"port: {new_control}")
            path.write_text(text)
            wait_for(lambda: app.control_port == new_control)
            assert control_status(new_control) == 200
            with pytest.raises(httpcore.ConnectError):
                control_status(control_port)
            # A port something else holds: refused, the current listener stays.
            with socket.socket() as blocker:
                blocker.bind(("127.0.0.1", 0))
                blocker.listen()
                busy = blocker.getsockname()[1]
                path.write_text(text.replace(f"port: {second}", f"port: {busy}"))
                wait_for(lambda: any(type(e).__name__ == "ConfigRejected" for e in events))
            rejected = next(e for e in events if type(e).__name__ == "ConfigRejected")
            assert rejected.stage == "runtime"
            problem = rejected.problems[0]
            assert problem.code == "config.listen_unavailable"
            assert problem.excerpt.strip().startswith(f"port: {busy}")
            assert app.gateway_port == second and ping(second) == 200
        finally:
            fut.cancel()


# --- SIGHUP ---------------------------------------------------------------------------------


def test_sighup_reloads_a_change_the_watcher_cannot_see(tmp_path: Path) -> None:
    control_port = free_port()
    path = tmp_path / "config.yaml"
    text = config_yaml({"aaa": 9}, control_port, providers=("aaa",))
    path.write_text(text)
    env = {**os.environ, "TWSERVE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "twserve.cli.main", "serve", "--config", str(path), "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        while "control plane on" not in proc.stdout.readline():
            assert time.monotonic() < deadline and proc.poll() is None

        def names() -> list[str]:
            resp = httpcore.request(
                "GET",
                f"http://127.0.0.1:{control_port}/providers",
                headers=[(b"authorization", b"Bearer " + CONTROL_KEY.encode())],
            )
            return [p["name"] for p in json.loads(resp.content)["providers"]]

        assert names() == ["aaa"]
        # Same size, same inode, the old modification time: the poll sees no change.
        st = os.stat(path)
        with open(path, "r+", encoding="utf-8") as fh:
            fh.write(text.replace("aaa", "bbb"))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        time.sleep(0.6)  # over two polls: long enough for the watcher to have acted
        assert names() == ["aaa"]
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: names() == ["bbb"]) < 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
