"""The key management API on a gateway started from a real config file: every write goes to the
file through the live config (validation, version check, history), the new key is in force
before the answer, and secrets are shown once.

One gateway for the module (its mock upstream answers every request); each test works on keys
of its own names, so the order of the tests does not matter.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import anthropic
import openai
import pytest

from tests.twserve.support.live import (
    CONTROL_KEY,
    KEY,
    Live,
    config_yaml,
    live_gateway,
    wait_for,
)
from twmock.script import MockSettings
from twserve.console.keys_api import KEY_PREFIX


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    def text(p: Mapping[str, int], c: int) -> str:
        return (
            config_yaml(p, c)
            + "\nroutes:\n  - name: other\n    rules:\n      - {name: all, to: a}\n"
        )

    tmp = tmp_path_factory.mktemp("keys")
    with live_gateway(tmp, {"a": MockSettings()}, text) as running:
        yield running


def _ask(live: Live, key: str) -> int:
    """The status a one-message chat through the openai SDK ends with."""
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as err:
        return err.status_code
    finally:
        client.close()
    return 200


def _version(live: Live) -> str:
    _, body = live.control("GET", "/config")
    return str(body["version"])


def _added_and_removed(before: str, after: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.ndiff(before.splitlines(), after.splitlines()))
    return (
        [d[2:] for d in diff if d.startswith("+ ")],
        [d[2:] for d in diff if d.startswith("- ")],
    )


def test_create_shows_the_secret_once_and_the_key_works_at_once(live: Live) -> None:
    before = live.path.read_text()
    history_before = len(live.control("GET", "/config/history")[1]["history"])
    status, body = live.control(
        "POST", "/keys", {"name": "alice", "limits": [{"per": "day", "requests": 100}]}
    )
    assert status == 201, body
    secret = body["key"]
    assert secret.startswith(KEY_PREFIX) and len(secret) == len(KEY_PREFIX) + 43
    assert body["shown_once"] is True and body["version"] == _version(live)
    # In force before the answer: the SDK's first request with it passes.
    assert _ask(live, secret) == 200
    # The file gained the entry and nothing else changed (comments included).
    added, removed = _added_and_removed(before, live.path.read_text())
    assert removed == []
    assert added == [
        "  - name: alice",
        f"    key: {secret}",
        "    limits: [{per: day, requests: 100}]",
    ]
    # Never shown again: /keys masks it, /config masks it.
    _, keys = live.control("GET", "/keys")
    row = next(k for k in keys["keys"] if k["name"] == "alice")
    assert row["key"] == "…" + secret[-4:]
    _, config = live.control("GET", "/config")
    assert secret not in config["yaml"]
    history = live.control("GET", "/config/history")[1]["history"]
    assert len(history) == history_before + 1 and history[-1]["origin"] == "control"
    wait_for(lambda: any(e.origin == "control" for e in live.events_of("ConfigReloaded")))


def test_rotate_refuses_the_old_secret_at_once(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "rot"})
    old = created["key"]
    assert _ask(live, old) == 200
    status, body = live.control("POST", "/keys/rot/rotate")
    assert status == 200, body
    new = body["key"]
    assert new != old and new.startswith(KEY_PREFIX)
    assert _ask(live, old) == 401
    assert _ask(live, new) == 200
    assert old not in live.path.read_text() and new in live.path.read_text()


def test_revoke_removes_the_entry_and_refuses_the_key(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "gone"})
    assert _ask(live, created["key"]) == 200
    status, body = live.control("DELETE", "/keys/gone")
    assert (status, body["revoked"]) == (200, True)
    assert _ask(live, created["key"]) == 401
    assert "name: gone" not in live.path.read_text()
    status, body = live.control("DELETE", "/keys/gone")
    assert (status, body["error"]["code"]) == (404, "control.key_unknown")
    # The module's own key still serves.
    assert _ask(live, KEY) == 200


def test_disable_and_enable(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "paused-key"})
    secret = created["key"]
    status, body = live.control("PATCH", "/keys/paused-key", {"disabled": True})
    assert (status, body["changed"]) == (200, ["disabled"])
    assert "key" not in body  # a patch never echoes the secret
    assert _ask(live, secret) == 401
    assert "    disabled: true" in live.path.read_text()
    live.control("PATCH", "/keys/paused-key", {"disabled": None})
    assert _ask(live, secret) == 200
    assert "disabled:" not in live.path.read_text()


def test_edit_limits_and_route(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "limited"})
    secret = created["key"]
    status, _ = live.control(
        "PATCH",
        "/keys/limited",
        {"limits": [{"per": "day", "requests": 1}], "route": "other", "max_concurrent": 2},
    )
    assert status == 200
    assert _ask(live, secret) == 200
    assert _ask(live, secret) == 429  # the one request of the day is spent
    _, keys = live.control("GET", "/keys")
    row = next(k for k in keys["keys"] if k["name"] == "limited")
    assert row["route"] == "other" and row["max_concurrent"] == 2
    assert [(lim["per"], lim["amount"]) for lim in row["limits"]] == [("day", 1)]
    # A route that does not exist: the config's own refusal, with its code and line.
    before = live.path.read_bytes()
    status, body = live.control("PATCH", "/keys/limited", {"route": "nowhere"})
    assert (status, body["error"]["code"]) == (422, "control.config.rejected")
    problem = body["error"]["problems"][0]
    assert problem["code"] == "engine.client_route_unknown" and problem["line"] > 0
    assert live.path.read_bytes() == before


def test_refusals(live: Live) -> None:
    cases = [
        ("POST", "/keys", {"name": "tester"}, 409, "control.key_exists"),
        ("POST", "/keys", {"name": "bad name"}, 400, "control.key_invalid"),
        (
            "POST",
            "/keys",
            {"name": "x", "key": "sk-literal-secret-0123"},
            400,
            "control.key_invalid",
        ),
        ("POST", "/keys", {"name": "x", "colour": "red"}, 400, "control.key_invalid"),
        ("POST", "/keys", {"name": "x", "limits": "lots"}, 400, "control.key_invalid"),
        ("PATCH", "/keys/nobody", {"disabled": True}, 404, "control.key_unknown"),
        ("PATCH", "/keys/tester", {}, 400, "control.key_invalid"),
        ("PATCH", "/keys/tester", {"disabled": "yes"}, 400, "control.key_invalid"),
        ("POST", "/keys/nobody/rotate", None, 404, "control.key_unknown"),
        ("GET", "/keys/tester/rotate", None, 405, "control.request.method_not_allowed"),
        ("PUT", "/keys/tester", {}, 405, "control.request.method_not_allowed"),
        ("POST", "/keys", [1], 400, "control.request.bad_json"),
    ]
    before = live.path.read_bytes()
    for method, path, body, status, code in cases:
        got, answer = live.control(method, path, body)
        assert (got, answer["error"]["code"]) == (status, code), (method, path, body, answer)
    # A write based on an older version changes nothing.
    got, answer = live.control(
        "PATCH", "/keys/tester", {"disabled": True, "base_version": "blake3:000000000000"}
    )
    assert (got, answer["error"]["code"]) == (409, "control.config.stale_version")
    assert live.path.read_bytes() == before
    assert _ask(live, KEY) == 200


def test_a_key_from_the_environment_stays_a_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSOLE_TEST_KEY", "env-key-for-the-console-test-0123")

    def text(p: Mapping[str, int], c: int) -> str:
        return config_yaml(p, c)

    with live_gateway(tmp_path, {"a": MockSettings()}, text) as running:
        status, body = running.control(
            "POST", "/keys", {"name": "from-env", "key": "${CONSOLE_TEST_KEY}"}
        )
        assert status == 201 and body == body | {
            "key": "${CONSOLE_TEST_KEY}",
            "shown_once": False,
        }
        assert '    key: "${CONSOLE_TEST_KEY}"' in running.path.read_text()
        assert _ask(running, "env-key-for-the-console-test-0123") == 200
        status, body = running.control("POST", "/keys/from-env/rotate")
        assert (status, body["error"]["code"]) == (409, "control.key_from_env")
        assert CONTROL_KEY not in str(body)


def test_request_listing_filters_and_pages_over_the_control_listener(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "lister"})
    for _ in range(5):
        assert _ask(live, created["key"]) == 200
    assert _ask(live, created["key"] + "x") == 401  # refused before any key: no row of its own

    def listed() -> list[dict[str, object]]:
        _, body = live.control("GET", "/requests?key=lister&limit=2")
        return list(body["requests"])

    wait_for(lambda: len(listed()) == 2)
    seen: list[str] = []
    path = "/requests?key=lister&limit=2&status=2xx"
    while True:
        status, body = live.control("GET", path)
        assert status == 200, body
        assert all(r["key_name"] == "lister" and r["status"] == 200 for r in body["requests"])
        seen += [str(r["id"]) for r in body["requests"]]
        if body["next"] is None:
            break
        path = f"/requests?key=lister&limit=2&status=2xx&before={body['next']}"
    assert len(seen) == len(set(seen)) == 5
    _, one = live.control("GET", f"/requests?q={seen[2]}")
    assert [r["id"] for r in one["requests"]] == [seen[2]]
    assert one["requests"][0]["routing"]["attempts"][0]["provider"] == "a"
    _, none = live.control("GET", "/requests?key=lister&status=5xx")
    assert none == {"requests": [], "limit": 50, "next": None}
    status, body = live.control("GET", "/requests?status=teapot")
    assert (status, body["error"]["code"]) == (400, "control.request.invalid")


def _refusal(live: Live, key: str, model: str = "m") -> tuple[int, str | None]:
    """The status and gateway code a chat through the openai SDK ends with (200, None: ok)."""
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as err:
        body = err.body if isinstance(err.body, dict) else {}
        return err.status_code, body.get("code")
    finally:
        client.close()
    return 200, None


def _key_row(live: Live, name: str) -> dict[str, object]:
    _, keys = live.control("GET", "/keys")
    return next(k for k in keys["keys"] if k["name"] == name)


def test_expires_at_refuses_the_key_from_then_on(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "expiring", "expires_at": 4102444800})
    secret = created["key"]
    assert _refusal(live, secret) == (200, None)
    row = _key_row(live, "expiring")
    assert (row["expires_at"], row["expired"]) == (4102444800.0, False)
    # An ISO time in the past: refused at once, in the client's format, with its code.
    status, body = live.control("PATCH", "/keys/expiring", {"expires_at": "2020-01-01T00:00:00Z"})
    assert (status, body["changed"]) == (200, ["expires_at"])
    assert "    expires_at: 2020-01-01T00:00:00Z" in live.path.read_text()
    assert _refusal(live, secret) == (401, "gw.auth.key_expired")
    with anthropic.Anthropic(base_url=live.url, api_key=secret, max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
    assert "expired at 2020-01-01T00:00:00+00:00" in str(refused.value)
    assert _key_row(live, "expiring")["expired"] is True
    # Removed: the key opens the gateway again.
    live.control("PATCH", "/keys/expiring", {"expires_at": None})
    assert _refusal(live, secret) == (200, None)
    # Not a time: the config's own check refuses the write, with its code and line.
    status, body = live.control("PATCH", "/keys/expiring", {"expires_at": "soon"})
    assert status == 422
    assert [p["code"] for p in body["error"]["problems"]] == ["config.time_invalid"]


def test_allowed_models_refuse_other_models(live: Live) -> None:
    _, created = live.control(
        "POST", "/keys", {"name": "narrow", "allowed_models": ["gpt-*", "claude-*"]}
    )
    secret = created["key"]
    assert "    allowed_models: [gpt-*, claude-*]" in live.path.read_text()
    assert _key_row(live, "narrow")["allowed_models"] == ["gpt-*", "claude-*"]
    assert _refusal(live, secret, "m") == (403, "gw.key.model_not_allowed")
    with anthropic.Anthropic(base_url=live.url, api_key=secret, max_retries=0) as client:
        with pytest.raises(anthropic.PermissionDeniedError) as refused:
            client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
    assert "may not use the model 'm'" in str(refused.value)
    # The module's own key has no list: any model.
    assert _refusal(live, KEY, "m") == (200, None)
    live.control("PATCH", "/keys/narrow", {"allowed_models": "m"})
    assert _refusal(live, secret, "m") == (200, None)
    live.control("PATCH", "/keys/narrow", {"allowed_models": None})
    assert _key_row(live, "narrow")["allowed_models"] is None
    status, body = live.control("PATCH", "/keys/narrow", {"allowed_models": []})
    assert (status, body["error"]["code"]) == (400, "control.key_invalid")


def test_rotate_with_an_overlap_keeps_the_old_secret_until_then(live: Live) -> None:
    _, created = live.control("POST", "/keys", {"name": "overlap"})
    old = created["key"]
    status, body = live.control("POST", "/keys/overlap/rotate", {"overlap_secs": 2})
    assert status == 200, body
    new = body["key"]
    assert body["previous_key_until"] is not None
    # Both secrets open the gateway during the overlap; the old one is never shown.
    assert _refusal(live, old) == (200, None) and _refusal(live, new) == (200, None)
    row = _key_row(live, "overlap")
    assert row["previous_key_active"] is True and old[-4:] not in json.dumps(row)
    _, config = live.control("GET", "/config")
    assert old not in config["yaml"] and new not in config["yaml"]
    # Then the old one lapses: refused as a wrong key.
    wait_for(lambda: _refusal(live, old) == (401, "gw.auth.bad_key"), timeout=10, step=0.3)
    assert _refusal(live, new) == (200, None)
    assert _key_row(live, "overlap")["previous_key_active"] is False
    # A rotation without an overlap refuses the old secret at once and drops the previous one.
    _, again = live.control("POST", "/keys/overlap/rotate", {"overlap_secs": 3600})
    assert _refusal(live, new) == (200, None)
    _, last = live.control("POST", "/keys/overlap/rotate")
    assert _refusal(live, again["key"]) == (401, "gw.auth.bad_key")
    assert _refusal(live, last["key"]) == (200, None)
    assert "previous_key" not in live.path.read_text().split("name: overlap")[1].split("- name")[0]
    for wrong in ({"overlap_secs": 0}, {"overlap_secs": 10**9}, {"overlap_secs": "1h"}):
        status, body = live.control("POST", "/keys/overlap/rotate", wrong)
        assert (status, body["error"]["code"]) == (400, "control.key_invalid")
