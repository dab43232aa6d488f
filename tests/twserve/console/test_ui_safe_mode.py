"""The console against a gateway in safe mode (its config file refused at startup): every page
loads and says so, the Config page names the problem beside its line, and fixing the file on the
page starts the gateway's port. One gateway and one browser for the module.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from playwright.sync_api import Browser

from tests.twserve.support.browser import chromium, console_page
from tests.twserve.support.live import KEY, Live, config_yaml, live_gateway, wait_for
from twmock.script import MockSettings

pytestmark = [pytest.mark.browser, pytest.mark.sdk]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    def broken(ports: dict[str, int], control_port: int) -> str:
        return config_yaml(ports, control_port).replace("protocol:", "protocl:")

    with live_gateway(tmp_path_factory.mktemp("safe-ui"), {"a": MockSettings()}, broken) as lv:
        assert lv.app.gateway_port is None
        yield lv


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


PAGES = {
    "#/traffic": "#traffic-table table",
    "#/upstreams": "#upstreams p, #upstreams .card",
    "#/groups": "#groups p, #groups .card",
    "#/keys": "#keys table",
    "#/usage": "#usage .chart",
}


def test_every_page_works_in_safe_mode(browser: Browser, live: Live) -> None:
    with console_page(browser, f"http://127.0.0.1:{live.control_port}") as c:
        c.sign_in()
        c.page.wait_for_selector("#banner:has-text('Safe mode')")
        assert "protocl" in c.page.inner_text("#banner") or "line" in c.page.inner_text("#banner")
        for fragment, ready in PAGES.items():
            c.go(fragment)
            c.page.wait_for_selector(ready)
            assert c.page.locator("main .error").count() == 0, (fragment, c.page.inner_text("main"))
        assert c.unexpected_errors() == []


def test_the_file_is_fixed_from_the_config_page(browser: Browser, live: Live) -> None:
    with console_page(browser, f"http://127.0.0.1:{live.control_port}") as c:
        c.sign_in(fragment="#/config")
        c.page.wait_for_selector("#safe-mode .safe")
        text = c.page.input_value("#config-text")
        line = text.split("\n").index("    protocl: openai-chat") + 1
        problem = c.page.locator(f'#problems li[data-line="{line}"]').first
        problem.wait_for()
        assert (problem.get_attribute("data-code") or "").startswith("config.")
        c.page.fill("#config-text", text.replace("protocl:", "protocol:"))
        c.page.click("#config-check")
        c.page.wait_for_selector("#check-ok")
        c.page.click("#config-save")
        c.page.click("#config-confirm")
        c.page.wait_for_selector("#saved")
        wait_for(lambda: live.app.gateway_port is not None, timeout=10)
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        try:
            answer = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            client.close()
        assert answer.choices[0].message.content
        c.page.wait_for_selector("#banner", state="hidden")
        assert c.unexpected_errors() == []
