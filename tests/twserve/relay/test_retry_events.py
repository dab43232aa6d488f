"""A retry round is announced (RequestRetrying) and its end too (RequestDequeued) (docs/failover.md,
"Retry rounds"; docs/control-plane.md, "Events")."""

from __future__ import annotations

import json
from pathlib import Path

import httpcore

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script
from twserve.events import RequestDequeued, RequestRetrying


def test_retry_round_is_published(tmp_path: Path) -> None:
    flaky = MockSettings(script=Script(fail_first=1, error=ErrorSpec(status=503)))
    with running_stack(
        tmp_path, {"a": Upstream("anthropic", flaky)}, config={"failover": {"wait_secs": 6}}
    ) as st:
        seen: list[object] = []
        st.app.events.listeners.append(seen.append)
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        resp = httpcore.request(
            "POST",
            st.url + "/v1/messages",
            headers=[(b"x-api-key", KEY.encode())],
            content=json.dumps(body).encode(),
        )
    assert resp.status == 200
    retrying = [e for e in seen if isinstance(e, RequestRetrying)]
    dequeued = [e for e in seen if isinstance(e, RequestDequeued)]
    assert len(retrying) == 1 and len(dequeued) == 1
    assert retrying[0].retry == 1 and 1500 <= retrying[0].backoff_ms <= 2500
    assert dequeued[0].provider == "a" and dequeued[0].retry == 1
    assert dequeued[0].id == retrying[0].id
    assert seen.index(retrying[0]) < seen.index(dequeued[0])
