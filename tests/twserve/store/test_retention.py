"""Retention and body storage (docs/limits-and-costs.md): the clean-up deletes the right rows
and bodies; bodies are kept only when asked, cut at body_max_bytes; a schema-1 store upgrades in
place and keeps its history; the price table refreshes from a URL."""

from __future__ import annotations

import http.server
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from tests.twserve.support.sdk_clients import sdk_clients
from tests.twserve.support.stack import Upstream, running_stack
from tests.twserve.usage.test_key_limits import T0, FakeWall
from twmock.script import MockSettings, Script, Usage
from twserve.cli.main import main
from twserve.store.sqlite import RequestStore
from twserve.usage.prices import USER_FILE, load_price_table, shipped_price_data

DAY = 86_400.0
SCRIPT = Script(text="x" * 5000, usage=Usage(input=10, output=20))


def _old_rows(db: Path, rows: list[tuple[str, float]]) -> None:
    with closing(sqlite3.connect(db)) as conn:
        conn.executemany(
            "INSERT INTO requests (id, ts, path, key_name, counted, settled_ts) "
            "VALUES (?, ?, '/v1/messages', 'tester', 1, ?)",
            [(i, ts, ts) for i, ts in rows],
        )
        conn.executemany(
            "INSERT INTO bodies (id, ts, request, answer) VALUES (?, ?, x'00', x'00')",
            [(i, ts) for i, ts in rows],
        )
        conn.commit()


def test_cleanup_deletes_rows_and_bodies_past_their_days(tmp_path: Path) -> None:
    wall = FakeWall(T0)
    config = {"retention": {"row_days": 30, "body_days": 2, "store_bodies": True}}
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SCRIPT))}
    with running_stack(tmp_path, upstreams, config=config, wall=wall):
        pass  # creates the store
    _old_rows(
        tmp_path / "requests.sqlite3",
        [
            ("gone", T0 - 31 * DAY),  # row and body go
            ("kept", T0 - 29 * DAY),  # row stays, body goes
            ("fresh", T0 - 1 * DAY),  # both stay
        ],
    )
    with running_stack(tmp_path, upstreams, config=config, wall=wall) as st:
        # The clean-up runs at startup, then hourly.
        rows, bodies = st.portal.call(st.app.maintenance.prune)
        with closing(sqlite3.connect(tmp_path / "requests.sqlite3")) as db:
            ids = {r[0] for r in db.execute("SELECT id FROM requests")}
            body_ids = {r[0] for r in db.execute("SELECT id FROM bodies")}
    assert ids == {"kept", "fresh"}
    assert body_ids == {"fresh"}
    assert (rows, bodies) == (0, 0)  # nothing left to delete on a second pass


def test_bodies_are_kept_only_when_asked_and_cut_at_the_limit(tmp_path: Path) -> None:
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SCRIPT))}
    config = {"retention": {"store_bodies": True, "body_max_bytes": 1024}}
    with running_stack(tmp_path / "on", upstreams, config=config) as st, sdk_clients(st.url) as c:
        c.openai.chat.completions.create(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
        )
        (row,) = st.wait_rows(1)
        body = st.portal.call(st.app.store.body, row["id"])
    assert body is not None and body["truncated"] is True
    assert json.loads(body["request"])["messages"][0]["content"] == "hi"
    assert len(body["answer"]) == 1024 and body["answer"].startswith(b'{"id"')
    with running_stack(tmp_path / "off", upstreams) as st, sdk_clients(st.url) as c:
        c.openai.chat.completions.create(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
        )
        st.wait_rows(1)
        with closing(sqlite3.connect(tmp_path / "off" / "requests.sqlite3")) as db:
            assert db.execute("SELECT COUNT(*) FROM bodies").fetchone()[0] == 0


_V1 = """
CREATE TABLE requests (
    id TEXT PRIMARY KEY, ts REAL NOT NULL, key_name TEXT, session TEXT, path TEXT NOT NULL,
    format TEXT, model TEXT, provider TEXT, status INTEGER, stream INTEGER NOT NULL DEFAULT 0,
    ttfb_ms INTEGER, duration_ms INTEGER, input_tokens INTEGER, output_tokens INTEGER,
    cache_read_tokens INTEGER, cache_write_tokens INTEGER, reasoning_tokens INTEGER,
    cost_micros INTEGER, cost_state TEXT, routing TEXT, translated TEXT, error_code TEXT,
    local INTEGER NOT NULL DEFAULT 0, cancelled INTEGER NOT NULL DEFAULT 0
);
PRAGMA user_version = 1;
"""


def test_upgrading_a_schema_1_store_keeps_history_and_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.executescript(_V1)
        db.execute(
            "INSERT INTO requests (id, ts, path, key_name, provider, status, duration_ms, "
            "input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_micros) "
            "VALUES ('old', 1000.0, '/v1/messages', 'k', 'a', 200, 2000, 10, 20, 30, 40, 99)"
        )
        db.execute(
            "INSERT INTO requests (id, ts, path, key_name, status) "
            "VALUES ('refused', 1001.0, '/v1/messages', 'k', 401)"
        )
        db.commit()
    store = RequestStore(path)
    store.close_db()
    with closing(sqlite3.connect(path)) as db:
        db.row_factory = sqlite3.Row
        rows = {r["id"]: dict(r) for r in db.execute("SELECT * FROM requests")}
        version = db.execute("PRAGMA user_version").fetchone()[0]
    # 2: limits and bodies; 3: the client's correlation id; 4: listing indexes; 5: Responses state
    assert version == 5
    old = rows["old"]
    assert old["counted"] == 1 and old["settled_ts"] == 1002.0
    assert (old["limit_tokens"], old["limit_cache_reads"], old["limit_cost"]) == (70, 30, 99)
    assert rows["refused"]["counted"] == 0


@contextmanager
def _serve_file(data: bytes) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/prices.json"
    finally:
        server.shutdown()
        server.server_close()


LITELLM_SAMPLE = {
    "sample_spec": {"mode": "one of: chat, embedding"},
    "claude-sonnet-4-6": {
        "litellm_provider": "anthropic",
        "mode": "chat",
        "input_cost_per_token": 4e-06,
        "output_cost_per_token": 2e-05,
        "cache_read_input_token_cost": 4e-07,
        "cache_creation_input_token_cost": 5e-06,
        "cache_creation_input_token_cost_above_1hr": 8e-06,
        "max_input_tokens": 1000000,
        "max_output_tokens": 128000,
    },
    "gemini/gemini-9-pro": {
        "litellm_provider": "gemini",
        "mode": "chat",
        "input_cost_per_token": 1e-06,
        "output_cost_per_token": 8e-06,
        "input_cost_per_token_above_200k_tokens": 2e-06,
        "output_cost_per_token_above_200k_tokens": 1.2e-05,
    },
    "dall-e-9": {"litellm_provider": "openai", "mode": "image_generation"},
    "bedrock/x": {"litellm_provider": "bedrock", "mode": "chat", "input_cost_per_token": 1e-06},
}


def test_prices_update_from_a_url_on_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _serve_file(json.dumps(LITELLM_SAMPLE).encode()) as url:
        assert main(["prices", "update", "--from", url, "--data-dir", str(tmp_path)]) == 0
    assert "saved 2 model prices" in capsys.readouterr().out
    table = load_price_table(tmp_path)
    sonnet = table.lookup("claude-sonnet-4-6")
    assert sonnet is not None and sonnet.rates.input == 4.0 and sonnet.rates.cache_write_1h == 8.0
    pro = table.lookup("gemini-9-pro")
    assert pro is not None and pro.tiers[0].above == 200_000 and pro.tiers[0].rates.input == 2.0
    assert table.lookup("dall-e-9") is None and table.lookup("x") is None
    assert (tmp_path / USER_FILE).stat().st_mode & 0o777 == 0o600
    # A gateway started now prices with the refreshed copy.
    upstreams = {"a": Upstream("anthropic", MockSettings(script=SCRIPT))}
    with running_stack(tmp_path, upstreams) as st, sdk_clients(st.url) as c:
        c.anthropic.messages.create(
            model="claude-sonnet-4-6", max_tokens=9, messages=[{"role": "user", "content": "x"}]
        )
        (row,) = st.wait_rows(1)
    assert row["cost_micros"] == 10 * 4 + 20 * 20
    assert main(["prices", "show", "claude-sonnet-4-6", "--data-dir", str(tmp_path)]) == 0
    assert '"input": 4.0' in capsys.readouterr().out


def test_prices_update_refuses_what_is_not_a_price_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["prices", "update", "--from", str(bad), "--data-dir", str(tmp_path)]) == 1
    assert (
        main(["prices", "update", "--from", str(tmp_path / "no"), "--data-dir", str(tmp_path)]) == 1
    )
    assert not (tmp_path / USER_FILE).exists()
    # The shipped table stays in use.
    assert load_price_table(tmp_path).version == shipped_price_data()["version"]
    assert "cannot read a price list" in capsys.readouterr().err


def test_maintenance_follows_a_time_zone_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt
    from zoneinfo import ZoneInfo

    from twengine.config import build_config
    from twengine.pricing import PriceTable
    from twserve.app.maintenance import Maintenance
    from twserve.usage.keeper import UsageKeeper

    config = build_config(
        {
            "version": 1,
            "clients": [{"name": "k", "key": "x", "limits": [{"per": "day", "requests": 9}]}],
            "providers": [{"name": "a", "base_url": "http://127.0.0.1:9/v1"}],
        }
    )
    usage = UsageKeeper(config, PriceTable.from_data({}), wall=lambda: T0, tz=dt.UTC)
    store = RequestStore(tmp_path / "r.sqlite3")
    try:
        maintenance = Maintenance(usage, store, lambda: config)
        paris = ZoneInfo("Europe/Paris")
        monkeypatch.setattr("twserve.app.maintenance.local_tz", lambda: paris)
        assert maintenance._tz_moved()
        assert usage.tz is paris and usage.limits.tz is paris
        assert not maintenance._tz_moved()  # once moved, nothing more to do
        # A pinned zone never moves.
        pinned = Maintenance(usage, store, lambda: config, pinned_tz=dt.UTC)
        monkeypatch.setattr("twserve.app.maintenance.local_tz", lambda: dt.UTC)
        assert not pinned._tz_moved()
    finally:
        store.close_db()
