"""Screenshots of each console page for docs/console.md, taken in Debian's chromium through
Playwright against a gateway with mock upstreams, some traffic and a few thousand stored rows.

    python scripts/console_screenshots.py [--out docs/images/console] [--width 1280 --height 800]

The gateway is the one the browser tests start (tests/twserve/support/live.py): a real config
file, mock upstreams on loopback, the openai SDK as the client. Each page is saved as a JPEG of
the viewport (quality 70: about 100 KB a page; ``--format png`` for PNG); a failing upstream and
a failed-over request give the Routing view two attempts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402
from playwright.sync_api import Page  # noqa: E402

from tests.twserve.console.test_ui_browser import _fill, config_text  # noqa: E402
from tests.twserve.support.browser import chromium, console_page  # noqa: E402
from tests.twserve.support.live import KEY, live_gateway  # noqa: E402
from twmock.script import ErrorSpec, MockSettings, Script  # noqa: E402

PAGES = {
    "traffic": ("#/traffic", "#traffic-table tbody tr"),
    "upstreams": ("#/upstreams", "#upstreams .card"),
    "groups": ("#/groups", "#groups .card"),
    "keys": ("#/keys", "#keys table"),
    "usage": ("#/usage", "#usage .chart"),
    "config": ("#/config", "#config-history table"),
}


def _shot(page: Page, stem: Path, kind: str) -> Path:
    if kind == "png":
        path = stem.with_suffix(".png")
        page.screenshot(path=str(path), type="png")
    else:
        path = stem.with_suffix(".jpg")
        page.screenshot(path=str(path), type="jpeg", quality=70)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "console")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--format", choices=("jpeg", "png"), default="jpeg")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    upstreams = {
        "a": MockSettings(),
        "bad": MockSettings(script=Script(error=ErrorSpec(status=500))),
        "slow": MockSettings(script=Script(text="slow words " * 120, chunk_delay=0.03)),
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "home").mkdir(mode=0o700)
        _fill(tmp / "home" / "requests.sqlite3", 5000)
        with live_gateway(tmp, upstreams, config_text) as live:
            client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
            for _ in range(6):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            raw = client.chat.completions.with_raw_response.create(
                model="flaky", messages=[{"role": "user", "content": "hi"}]
            )
            failed_over = raw.headers["x-request-id"]
            client.close()
            base = f"http://127.0.0.1:{live.control_port}"
            with (
                chromium() as browser,
                console_page(browser, base, width=args.width, height=args.height) as c,
            ):
                c.sign_in()
                shots = dict(PAGES)
                shots["request"] = (f"#/request/{failed_over}", "#page-request table")
                for name, (fragment, ready) in shots.items():
                    c.go(fragment)
                    c.page.wait_for_selector(ready)
                    if name == "usage":
                        c.page.select_option("#usage-form select[name=span]", "7d")
                        c.page.click("#usage-form button[type=submit]")
                        c.page.wait_for_selector("#usage .chart rect")
                    if name == "groups":
                        c.page.fill("#dryrun input[name=model]", "flaky")
                        c.page.click("#dryrun button[type=submit]")
                        c.page.wait_for_selector("#dryrun-next")
                    time.sleep(0.3)
                    path = _shot(c.page, args.out / name, args.format)
                    print(f"{path}: {path.stat().st_size // 1024} KB")
                c.page.set_viewport_size({"width": 390, "height": 800})
                c.go("#/traffic")
                c.page.wait_for_selector("#traffic-table tbody tr")
                time.sleep(0.3)
                path = _shot(c.page, args.out / "traffic-narrow", args.format)
                print(f"{path}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
