"""url-test groups rank by a connection test timed at startup until samples exist."""

from __future__ import annotations

import time
from pathlib import Path

from tests.twserve.support.stack import Upstream, running_stack


def test_startup_connection_test_feeds_url_test_ordering(tmp_path: Path) -> None:
    config = {
        "groups": [{"name": "fast", "type": "url-test", "providers": ["a", "b"]}],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "fast"}]}],
    }
    ups = {"a": Upstream("anthropic"), "b": Upstream("anthropic")}
    with running_stack(tmp_path, ups, config=config) as st:
        router = st.app.gateway.router
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and None in (
            router.connection_test("a"),
            router.connection_test("b"),
        ):
            time.sleep(0.02)
        timed = [router.connection_test(name) for name in ("a", "b")]
    assert all(t is not None and 0 <= t < 5 for t in timed), timed
