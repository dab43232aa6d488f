"""The operator console at /ui/ in a real browser (Debian's chromium through Playwright) against
a gateway started from a real config file, with mock upstreams and the official SDKs as clients.

One gateway and one browser for the module; each test opens a page of its own and ends by
checking that the page logged no error it did not provoke (CSP violations included). The
store starts with 100 000 rows, so every Traffic page here reads a large store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import anthropic
import httpcore
import openai
import pytest
from playwright.sync_api import Browser

from benchmarks.e2e.requests_listing import synthetic_rows
from tests.twserve.support.browser import Console, chromium, console_page
from tests.twserve.support.live import (
    CONTROL_KEY,
    KEY,
    UPSTREAM_KEY,
    Live,
    live_gateway,
    wait_for,
)
from twmock.script import ErrorSpec, MockSettings, Script
from twserve.console.static import CSP
from twserve.store.sqlite import RequestStore

pytestmark = [pytest.mark.browser, pytest.mark.sdk]

ROWS = 100_000


def config_text(ports: Mapping[str, int], control_port: int) -> str:
    """Upstream ``a`` answers; ``bad`` always fails with a 500, so ``flaky`` (routed to the
    fallback group ``[bad, a]``) fails over to ``a``."""
    return (
        "# console browser test\n"
        "version: 1\n\n"
        "listen:\n"
        "  gateway:\n    bind: 127.0.0.1\n    port: 8788\n"
        "  control:\n    bind: 127.0.0.1\n"
        f"    port: {control_port}\n    key: {CONTROL_KEY}\n\n"
        "clients:\n"
        f"  - name: tester\n    key: {KEY}\n\n"
        "providers:\n"
        "  - name: a  # the one that answers\n"
        "    protocol: openai-chat\n"
        f"    base_url: http://127.0.0.1:{ports['a']}/v1\n"
        f"    key: {UPSTREAM_KEY}-a\n"
        "    models: [m, flaky, gpt-4o]\n"
        "  - name: bad\n"
        "    protocol: openai-chat\n"
        f"    base_url: http://127.0.0.1:{ports['bad']}/v1\n"
        f"    key: {UPSTREAM_KEY}-bad\n"
        "    models: [flaky]\n"
        "  - name: slow\n"
        "    protocol: openai-chat\n"
        f"    base_url: http://127.0.0.1:{ports['slow']}/v1\n"
        f"    key: {UPSTREAM_KEY}-slow\n"
        "    models: [slow]\n\n"
        "groups:\n  - name: fo\n    type: fallback\n    providers: [bad, a]\n\n"
        "routes:\n  - name: main\n    rules:\n"
        "      - {name: flaky, when: {model: flaky}, to: fo}\n"
        "      - {name: slow, when: {model: slow}, to: slow}\n"
        "      - {name: all, to: a}\n"
        "default_route: main\n"
    )


def _fill(path: Path, count: int) -> None:
    """`count` rows over the last ten days, written by the store's own writer."""
    import anyio

    store = RequestStore(path)
    now = time.time()

    async def write() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            for n, row in enumerate(synthetic_rows(count, start=now - 10 * 86400, span=86400 * 9)):
                store.record(row)
                if n % 1000 == 999:
                    await anyio.sleep(0)
            store.close()

    anyio.run(write)
    store.close_db()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("console-ui")
    home = tmp / "home"
    home.mkdir(mode=0o700)
    _fill(home / "requests.sqlite3", ROWS)
    upstreams = {
        "a": MockSettings(),
        "bad": MockSettings(script=Script(error=ErrorSpec(status=500))),
        # A stream of about ten seconds, to abort from the page.
        "slow": MockSettings(script=Script(text="slow words " * 120, chunk_delay=0.03)),
    }
    with live_gateway(tmp, upstreams, config_text) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def console(live: Live, browser: Browser) -> Iterator[Console]:
    with console_page(browser, f"http://127.0.0.1:{live.control_port}") as c:
        yield c


def _chat(live: Live, model: str = "m", key: str = KEY) -> str:
    """One chat through the openai SDK; the answer's x-request-id."""
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        raw.parse()
        return str(raw.headers["x-request-id"])
    finally:
        client.close()


def _get(url: str, headers: list[tuple[bytes, bytes]] | None = None) -> httpcore.Response:
    return httpcore.request("GET", url, headers=headers or [])


def test_the_page_is_served_by_the_control_listener_only_with_its_security_headers(
    live: Live,
) -> None:
    resp = _get(f"http://127.0.0.1:{live.control_port}/ui/")
    assert resp.status == 200
    headers = {k.decode().lower(): v.decode() for k, v in resp.headers}
    assert headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    assert "unsafe-inline" not in CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["content-type"].startswith("text/html")
    js = _get(f"http://127.0.0.1:{live.control_port}/ui/js/app.js")
    assert (
        js.status == 200
        and b"sessionStorage" in _get(f"http://127.0.0.1:{live.control_port}/ui/js/api.js").content
    )
    # Only the page's own files; nothing outside the folder.
    assert _get(f"http://127.0.0.1:{live.control_port}/ui/../plane.py").status == 404
    assert _get(f"http://127.0.0.1:{live.control_port}/ui/static.py").status == 404
    # The data stays behind the key, and the gateway's port has no page.
    assert _get(f"http://127.0.0.1:{live.control_port}/requests").status == 401
    assert _get(live.url + "/ui/").status in (401, 404)
    assert b"twserve console" not in _get(live.url + "/ui/").content


def test_a_write_from_another_origin_is_refused(live: Live) -> None:
    auth = (b"authorization", b"Bearer " + CONTROL_KEY.encode())
    url = f"http://127.0.0.1:{live.control_port}/keys"
    resp = httpcore.request(
        "POST",
        url,
        headers=[auth, (b"origin", b"http://evil.example"), (b"content-type", b"application/json")],
        content=b'{"name": "csrf"}',
    )
    assert resp.status == 403 and b"control.request.cross_origin" in resp.content
    assert "csrf" not in live.path.read_text()


def test_config_tools_over_the_api(live: Live) -> None:
    text = live.path.read_text()
    _, config = live.control("GET", "/config")
    status, ok = live.control("POST", "/config/check", {"yaml": config["yaml"]})
    assert (status, ok["ok"], ok["problems"]) == (200, True, [])
    status, bad = live.control("POST", "/config/check", {"yaml": "version: 1\nprovidrs: []\n"})
    assert status == 200 and bad["ok"] is False and bad["problems"][0]["line"] == 2
    assert live.path.read_text() == text  # a check writes nothing
    history = live.control("GET", "/config/history")[1]["history"]
    status, entry = live.control("GET", f"/config/history/{history[-1]['number']}")
    assert status == 200 and entry["current"] is True and CONTROL_KEY not in entry["yaml"]
    status, missing = live.control("GET", "/config/history/9999")
    assert (status, missing["error"]["code"]) == (404, "control.request.not_found")
    status, stale = live.control(
        "POST", "/config/rollback", {"number": history[-1]["number"], "base_version": "blake3:0"}
    )
    assert (status, stale["error"]["code"]) == (409, "control.config.stale_version")
    status, wrong = live.control("GET", "/config/rollback")
    assert (status, wrong["error"]["code"]) == (405, "control.request.method_not_allowed")
    status, invalid = live.control("POST", "/config/rollback", {"number": "x"})
    assert (status, invalid["error"]["code"]) == (400, "control.request.invalid")
    # /ui goes to /ui/; HEAD answers without a body.
    redirect = _get(f"http://127.0.0.1:{live.control_port}/ui")
    assert redirect.status == 308 and (b"location", b"/ui/") in redirect.headers
    head = httpcore.request("HEAD", f"http://127.0.0.1:{live.control_port}/ui/app.css")
    assert head.status == 200 and head.content == b""


def test_sign_in(console: Console) -> None:
    console.sign_in("not-the-key")
    console.page.wait_for_selector("#signin .error")
    assert "not the control key" in console.page.inner_text("#signin .error")
    console.sign_in()
    assert console.page.inner_text("#nav a.active") == "Traffic"
    # The key is kept in the tab, never in the URL.
    assert CONTROL_KEY not in console.page.url
    stored = console.page.evaluate("() => sessionStorage.getItem('twserve.control-key')")
    assert stored == CONTROL_KEY
    console.page.click("#signout")
    console.page.wait_for_selector("#signin")
    assert console.page.evaluate("() => sessionStorage.getItem('twserve.control-key')") is None
    assert console.unexpected_errors(401) == []


def test_a_request_from_the_openai_sdk_appears_in_traffic_within_a_second(
    console: Console, live: Live
) -> None:
    console.sign_in()
    console.page.wait_for_selector("#traffic-table tbody tr")
    # The first page over the 100 000-row store, as the page's own fetch saw it.
    first_ms = int(console.page.get_attribute("#traffic-state", "data-ms") or "0")
    assert first_ms < 200, first_ms
    wait_for(lambda: live.app.events.subscribers > 0, timeout=5)
    started = time.monotonic()
    request_id = _chat(live)
    answered = time.monotonic()
    # Shown as running from its events, then as its stored row: within a second of the answer.
    console.page.wait_for_function(
        "id => { const r = document.querySelector(`#traffic-table tr[data-id='${id}']`);"
        " return r && !r.classList.contains('running') && r.innerText.includes('200'); }",
        arg=request_id,
        timeout=1000,
    )
    assert time.monotonic() - answered < 1.0
    assert answered - started < 5.0
    top = console.page.locator("#traffic-table tbody tr").first
    assert top.get_attribute("data-id") == request_id
    assert "tester" in top.inner_text() and "200" in top.inner_text()
    assert console.unexpected_errors() == []


def test_filters_and_paging(console: Console) -> None:
    console.sign_in()
    console.page.wait_for_selector("#traffic-table tbody tr")
    console.page.fill("#traffic-filters input[name=key]", "key-3")
    console.page.fill("#traffic-filters input[name=status]", "5xx")
    console.page.click("#traffic-filters button[type=submit]")
    console.page.wait_for_function(
        "() => document.querySelectorAll('#traffic-table tbody tr').length === 50"
        " && [...document.querySelectorAll('#traffic-table tbody tr')]"
        ".every(r => r.innerText.includes('key-3') && r.innerText.includes('502'))"
    )
    console.page.click("#traffic-more")
    console.page.wait_for_function(
        "() => document.querySelectorAll('#traffic-table tbody tr').length === 100"
    )
    ids = console.page.eval_on_selector_all(
        "#traffic-table tbody tr", "rows => rows.map(r => r.dataset.id)"
    )
    assert len(set(ids)) == 100
    console.page.click("#traffic-filters button[type=reset]")
    assert console.unexpected_errors() == []


def test_a_request_that_failed_over_shows_both_attempts(console: Console, live: Live) -> None:
    request_id = _chat(live, model="flaky")
    console.sign_in(fragment=f"#/request/{request_id}")
    console.page.wait_for_selector("#page-request table tbody tr")
    rows = console.page.locator("#page-request section:has(h2:text-matches('Attempts')) tbody tr")
    assert rows.count() == 2
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert "bad" in first and "failed" in first and "500" in first
    assert "\ta\t" in f"\t{second}\t" and "ok" in second
    decision = console.page.inner_text("#page-request section:has(h2:text('Decision'))")
    assert "fo" in decision and "flaky" in decision
    assert request_id in console.page.inner_text("#page-request")
    assert console.unexpected_errors() == []


def test_aborting_a_running_stream_from_the_page(console: Console, live: Live) -> None:
    """The Abort button of a running request's Routing view ends the openai SDK's stream with
    an error it raises, and the upstream is not paused or blamed for it."""
    console.sign_in()
    console.page.wait_for_selector("#traffic-table tbody tr")
    wait_for(lambda: live.app.events.subscribers > 0, timeout=5)
    outcome: dict[str, object] = {}

    def stream() -> None:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        try:
            chunks = client.chat.completions.create(
                model="slow", stream=True, messages=[{"role": "user", "content": "hi"}]
            )
            for _chunk in chunks:
                outcome["content"] = True
        except openai.APIError as err:
            outcome["error"] = err
        finally:
            client.close()
        outcome["done"] = True

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        running = console.page.locator("#traffic-table tr.running").first
        running.wait_for()
        wait_for(lambda: "content" in outcome, timeout=10)
        running.click()
        console.page.click("#abort")
        console.page.wait_for_selector("#abort-result:has-text('Aborted')")
        thread.join(timeout=10)
    finally:
        thread.join(timeout=30)
    assert outcome.get("done") and isinstance(outcome.get("error"), openai.APIError), outcome
    error = outcome["error"]
    assert isinstance(error, openai.APIError)
    assert "aborted by the gateway's operator" in str(error)
    assert error.code == "gw.request.aborted", error.body
    _, providers = live.control("GET", "/providers")
    slow = next(p for p in providers["providers"] if p["name"] == "slow")
    assert slow["paused_until"] is None and slow["failures_in_row"] == 0
    # The page turns to the stored row: cancelled, with its attempt.
    console.page.wait_for_selector("#page-request section:has(h2:text-matches('Attempts'))")
    assert "cancelled" in console.page.inner_text("#page-request")
    assert console.unexpected_errors() == []


def _anthropic_status(live: Live, key: str) -> int:
    client = anthropic.Anthropic(base_url=live.url, api_key=key, max_retries=0, timeout=20)
    try:
        client.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    except anthropic.APIStatusError as err:
        return err.status_code
    finally:
        client.close()
    return 200


def test_a_key_created_on_the_page_works_from_anthropic_until_revoked(
    console: Console, live: Live
) -> None:
    console.sign_in(fragment="#/keys")
    console.page.fill("#key-create input[name=name]", "from-page")
    console.page.fill("#key-create input[name=limits]", '[{"per": "day", "requests": 50}]')
    console.page.click("#key-create button[type=submit]")
    secret = console.page.input_value("#new-secret")
    assert secret.startswith("tw-")
    assert _anthropic_status(live, secret) == 200
    console.page.click("#secret-done")
    # Masked everywhere on the page from now on. The click refreshes the table, and the row
    # drawn at creation (0 / 50) stays until that refresh lands: wait for the counted request.
    row = console.page.locator('#keys tr[data-key="from-page"]')
    row.filter(has_text="day requests: 1 / 50").wait_for()
    assert secret not in console.page.content()
    assert "…" + secret[-4:] in row.inner_text()
    assert "day requests: 1 / 50" in row.inner_text()
    row.locator("button[data-action=revoke]").click()
    row.locator("button[data-action=revoke]").click()  # confirm
    console.page.wait_for_selector('#keys tr[data-key="from-page"]', state="detached")
    assert _anthropic_status(live, secret) == 401
    assert "from-page" not in live.path.read_text()
    assert console.unexpected_errors() == []


def _openai_status(live: Live, key: str, model: str = "m") -> tuple[int, str | None]:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as err:
        body = err.body if isinstance(err.body, dict) else {}
        return err.status_code, body.get("code")
    finally:
        client.close()
    return 200, None


def test_allowed_models_expiry_and_a_rotation_overlap_from_the_page(
    console: Console, live: Live
) -> None:
    console.sign_in(fragment="#/keys")
    console.page.fill("#key-create input[name=name]", "scoped")
    console.page.fill("#key-create input[name=allowed_models]", "m")
    console.page.click("#key-create button[type=submit]")
    old = console.page.input_value("#new-secret")
    console.page.click("#secret-done")
    assert _openai_status(live, old) == (200, None)
    assert _openai_status(live, old, "flaky") == (403, "gw.key.model_not_allowed")
    row = console.page.locator('#keys tr[data-key="scoped"]')
    row.wait_for()
    # Rotate keeping the old secret for an hour: both work.
    row.locator("button[data-action=rotate]").click()
    row.locator("input[name=overlap_secs]").fill("3600")
    row.locator("button:text('Rotate now')").click()
    new = console.page.input_value("#new-secret")
    assert new != old
    assert _openai_status(live, new) == (200, None) and _openai_status(live, old) == (200, None)
    console.page.click("#secret-done")
    row.locator("text=old secret until").wait_for()
    # An expiry in the past: the key is refused from then on.
    row.locator("button[data-action=edit]").click()
    row.locator("input[name=expires_at]").fill("2020-01-01T00:00")
    row.locator(".edit button[type=submit]").click()
    row.locator(".badge:text('expired')").wait_for()
    assert _openai_status(live, new)[0] == 401
    row.locator("button[data-action=revoke]").click()
    row.locator("button[data-action=revoke]").click()
    console.page.wait_for_selector('#keys tr[data-key="scoped"]', state="detached")
    assert console.unexpected_errors() == []


def test_a_config_with_a_typo_is_refused_with_its_code_and_line(
    console: Console, live: Live
) -> None:
    before = live.path.read_text()
    console.sign_in(fragment="#/config")
    console.page.wait_for_function("() => document.querySelector('#config-text').value.length > 0")
    text = console.page.input_value("#config-text")
    lines = text.split("\n")
    typo_line = next(i for i, line in enumerate(lines) if "protocol: openai-chat" in line) + 1
    lines[typo_line - 1] = lines[typo_line - 1].replace("protocol:", "protocl:")
    console.page.fill("#config-text", "\n".join(lines))
    console.page.click("#config-save")
    diff = console.page.inner_text("#config-review .diff")
    assert "- " + "    protocol: openai-chat" in diff and "+     protocl: openai-chat" in diff
    console.page.click("#config-confirm")
    problem = console.page.locator(f'#problems li[data-line="{typo_line}"]').first
    problem.wait_for()
    code = problem.get_attribute("data-code")
    assert code and code.startswith("config.")
    assert f"line {typo_line}" in problem.inner_text() and code in problem.inner_text()
    # Beside the line: the gutter marks it and the note column says why.
    assert console.page.get_attribute(f'.gutter div[data-line="{typo_line}"]', "class") == "bad"
    assert code in console.page.inner_text(f'#line-notes div[data-line="{typo_line}"]')
    # The file is untouched and the gateway keeps serving.
    assert live.path.read_text() == before
    assert _chat(live)
    assert console.unexpected_errors(422) == []


def test_rollback_from_the_page(console: Console, live: Live) -> None:
    original = live.path.read_bytes()
    console.sign_in(fragment="#/config")
    console.page.wait_for_function("() => document.querySelector('#config-text').value.length > 0")
    text = console.page.input_value("#config-text")
    console.page.fill(
        "#config-text", text.replace("# console browser test", "# edited on the page")
    )
    console.page.click("#config-save")
    console.page.click("#config-confirm")
    console.page.wait_for_selector("#saved")
    assert "# edited on the page" in live.path.read_text()
    number = console.page.get_attribute(
        "#config-history tbody tr:nth-child(2) button[data-rollback]", "data-rollback"
    )
    console.page.click(f'#config-history button[data-rollback="{number}"]')
    assert "# edited on the page" in console.page.inner_text("#config-review .diff")
    console.page.click("#rollback-confirm")
    console.page.wait_for_selector(f"#saved:has-text('Rolled back to #{number}')")
    assert live.path.read_bytes() == original
    wait_for(lambda: any(e.origin == "control" for e in live.events_of("ConfigReloaded")))
    assert _chat(live)
    assert console.unexpected_errors() == []


def test_upstreams_pause_resume_and_model_spec(console: Console, live: Live) -> None:
    console.sign_in(fragment="#/upstreams")
    card = console.page.locator('#upstreams .card[data-upstream="a"]')
    card.wait_for()
    card.locator("button[data-action=pause]").click()
    card.locator("button[data-action=resume]").wait_for()
    assert "paused manual until" in card.inner_text()
    _, providers = live.control("GET", "/providers")
    assert next(p for p in providers["providers"] if p["name"] == "a")["paused_until"]
    card.locator("button[data-action=resume]").click()
    card.locator("button[data-action=pause]").wait_for()
    _, providers = live.control("GET", "/providers")
    assert next(p for p in providers["providers"] if p["name"] == "a")["paused_until"] is None
    # Figures from the price table say so.
    priced = card.locator("tr:has(td:text-is('gpt-4o'))").inner_text()
    assert "128,000" in priced and "price table" in priced
    # A model spec set by hand, shown with where it came from, and in the file.
    card.locator("tr:has(td:text-is('m')) button").click()
    form = console.page.locator("#spec-a form")
    form.locator("input[name=context_window]").fill("64000")
    form.locator("button[type=submit]").click()
    console.page.wait_for_selector(
        '#upstreams .card[data-upstream="a"] tr:has(td:text-is("m")):has-text("64,000")'
    )
    row = card.locator("tr:has(td:text-is('m'))").inner_text()
    assert "set by hand" in row
    assert "context_window: 64000" in live.path.read_text()
    card.locator("tr:has(td:text-is('m')) button").click()
    console.page.click("#spec-a form button:text('Clear spec')")
    console.page.wait_for_selector(
        '#upstreams .card[data-upstream="a"] tr:has(td:text-is("m")):not(:has-text("64,000"))'
    )
    assert "context_window: 64000" not in live.path.read_text()
    assert console.unexpected_errors() == []


def test_groups_show_factors_and_the_dry_run_names_the_next_upstream(
    console: Console, live: Live
) -> None:
    console.sign_in(fragment="#/groups")
    group = console.page.locator("#groups .card:has(h2:text-is('fo'))")
    group.wait_for()
    text = group.inner_text()
    assert "fallback" in text and "bad" in text and "Automatic factor" in text
    console.page.fill("#dryrun input[name=model]", "flaky")
    console.page.click("#dryrun button[type=submit]")
    console.page.wait_for_selector("#dryrun-next")
    _, report = live.control("GET", "/dryrun?model=flaky")
    assert console.page.inner_text("#dryrun-next") == report["next"]
    assert "rule flaky" in console.page.inner_text("#dryrun-result")
    assert console.unexpected_errors() == []


#: Each page, and what shows once it has loaded its data.
PAGES = {
    "#/traffic": "#traffic-table table",
    "#/upstreams": "#upstreams .card",
    "#/groups": "#groups .card",
    "#/keys": "#keys table",
    "#/usage": "#usage .chart",
    "#/config": "#config-history table",
}


@pytest.mark.parametrize("fragment", list(PAGES))
@pytest.mark.parametrize("width", [1280, 390])
def test_every_page_loads_clean_at_both_widths(
    browser: Browser, live: Live, fragment: str, width: int
) -> None:
    with console_page(browser, f"http://127.0.0.1:{live.control_port}", width=width) as c:
        c.sign_in(fragment=fragment)
        c.page.wait_for_selector(PAGES[fragment])
        assert c.page.locator(".error").count() == 0, c.page.inner_text("main")
        # Nothing is wider than the window: wide tables scroll inside their own box.
        overflow = c.page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, overflow
        assert c.unexpected_errors() == []
