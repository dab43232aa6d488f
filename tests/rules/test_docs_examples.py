"""The Python examples in docs/ run as written.

Every ```python block of docs/library.md runs, and on the other pages under docs/ every block
whose fence directly follows a line ``<!-- runnable -->`` (blank lines between are allowed).
Each block runs on its own, in a fresh namespace, as a script would: an exception or a failed
assertion fails the test, named by the page and the line of the block.
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import re
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import openai
import pytest
from anyio.from_thread import start_blocking_portal

from tests.support.layout import ROOT
from twmock import MockSettings, parse_script, run_mock

DOCS = ROOT / "docs"
ALL_BLOCKS = ("library.md",)
MARKER = "<!-- runnable -->"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    source: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: str, text: str) -> list[Block]:
    """The runnable python blocks of one page (see the module docstring)."""
    run_all = page in ALL_BLOCKS
    lines = text.splitlines()
    found: list[Block] = []
    marked = False
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m is None:
            if line.strip() == MARKER:
                marked = True
            elif line.strip():
                marked = False
            i += 1
            continue
        # A fenced block: find its end (the same fence character, at least as long).
        fence = m["fence"]
        indent = len(m["indent"])
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        i += 1
        language = m["info"].strip().split(" ")[0].lower()
        if language in ("python", "py") and (run_all or marked):
            found.append(Block(page=page, line=start + 1, source="\n".join(body) + "\n"))
        elif marked and not run_all:
            raise AssertionError(f"{page}:{start + 1}: {MARKER} is not followed by a python block")
        marked = False
    return found


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for path in sorted(DOCS.glob("*.md")):
        out += blocks_of(path.name, path.read_text(encoding="utf-8"))
    return out


BLOCKS = all_blocks()


def test_library_page_has_examples() -> None:
    assert sum(b.page == "library.md" for b in BLOCKS) >= 8


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_example_runs(block: Block) -> None:
    # The code object is named after the page, and every line number is shifted to the page's
    # own, so a traceback points into the markdown file.
    filename = str(DOCS / block.page)
    source = "\n" * block.line + block.source
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.name}: the example does not compile (line {exc.lineno}): {exc.msg}")
    namespace: dict[str, object] = {"__name__": f"docs_example_{block.line}"}
    try:
        exec(code, namespace)
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        where = f"line {frames[-1].lineno}" if frames else "unknown line"
        detail = "".join(traceback.format_exception_only(exc)).strip()
        pytest.fail(f"{block.name}: the example failed at {where}: {detail}")


def test_marker_finds_blocks() -> None:
    page = "\n".join(
        [
            "<!-- runnable -->",
            "",
            "```python",
            "x = 1",
            "```",
            "",
            "```python",
            "not run",
            "```",
            "<!-- runnable -->",
            "text in between",
            "```python",
            "not run either",
            "```",
        ]
    )
    (block,) = blocks_of("other.md", page)
    assert (block.line, block.source) == (3, "x = 1\n")
    assert len(blocks_of("library.md", page)) == 3


# --- library.md: only the facades, and the proxy on loopback ---------------------------------


def _library_blocks() -> list[Block]:
    return [b for b in BLOCKS if b.page == "library.md"]


@pytest.mark.parametrize("block", _library_blocks(), ids=lambda b: b.name)
def test_library_examples_import_only_the_top_and_the_doors(block: Block) -> None:
    # The tiers of tests/rules/test_facades.py: `twproto` / `twengine`, or one of their doors
    # one level down (`twproto.ir`, `twengine.config`), never a module behind a door.
    for node in ast.walk(ast.parse(block.source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            top, _, rest = name.partition(".")
            if top not in ("twproto", "twengine") or not rest:
                continue
            assert "." not in rest and not rest.startswith("_"), f"{block.name} imports {name}"
            assert importlib.util.find_spec(name) is not None, f"{block.name} imports {name}"


def _proxy_block() -> Block:
    (block,) = [b for b in _library_blocks() if "class ChatToAnthropic" in b.source]
    return block


TEXT = "Hello from the mock upstream, converted."


@pytest.fixture
def proxy() -> Iterator[tuple[dict[str, Any], str, Any]]:
    """The proxy of docs/library.md section 8, run as written, in front of a mock upstream.

    Yields the example's namespace, the proxy's base URL and the mock. The mock's profiles
    (a path prefix each) are the upstreams a test points ``ANTHROPIC_URL`` at."""
    block = _proxy_block()
    namespace: dict[str, Any] = {"__name__": "docs_proxy_example"}
    exec(compile("\n" * block.line + block.source, str(DOCS / block.page), "exec"), namespace)
    settings = MockSettings(
        script=parse_script({"text": TEXT, "chunk_size": 6}),
        profiles={
            "limited": parse_script({"error": {"status": 429, "message": "slow down"}}),
            "broken": parse_script({"text": TEXT, "chunk_size": 6, "break_after": 2}),
            "opening-error": parse_script({"text": TEXT, "stream_error_before_content": True}),
            "opening-break": parse_script({"text": TEXT, "break_after": 0}),
        },
    )
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(run_mock(settings)) as mock,
    ):
        namespace["ANTHROPIC_URL"] = mock.url
        namespace["ANTHROPIC_KEY"] = "upstream-key"
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), namespace["ChatToAnthropic"])
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield namespace, f"http://127.0.0.1:{server.server_address[1]}/v1", mock
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)
            namespace["pool"].close()


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=5)


def test_proxy_streams_an_anthropic_answer_to_the_openai_sdk(proxy: Any) -> None:
    _, base_url, mock = proxy
    with _client(base_url) as client:
        stream = client.chat.completions.create(
            model="claude-proxy-1",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
            ],
            stream=True,
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TEXT
    assert len(chunks) > 5  # streamed piece by piece, not buffered into one
    assert {c.model for c in chunks} == {"claude-proxy-1"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    upstream = mock.received[-1]
    assert (upstream.path, upstream.header("x-api-key")) == ("/v1/messages", "upstream-key")
    assert upstream.header("anthropic-version") == "2023-06-01"
    sent = upstream.json()
    assert sent == {
        "model": "claude-proxy-1",
        "max_tokens": 8192,  # Anthropic requires it; the translator's default
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
    }


def test_proxy_answers_a_whole_request(proxy: Any) -> None:
    _, base_url, mock = proxy
    with _client(base_url) as client:
        answer = client.chat.completions.create(
            model="claude-proxy-1", messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
    assert answer.choices[0].message.content == TEXT
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert mock.received[-1].json().get("stream") in (None, False)
    assert mock.received[-1].json()["max_tokens"] == 50


def test_proxy_passes_an_upstream_error_in_the_clients_shape(proxy: Any) -> None:
    namespace, base_url, mock = proxy
    namespace["ANTHROPIC_URL"] = mock.url + "/limited"
    with _client(base_url) as client, pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            model="claude-proxy-1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert info.value.status_code == 429
    assert "slow down" in str(info.value)


def test_proxy_ends_a_broken_stream_with_an_error_the_sdk_raises(proxy: Any) -> None:
    namespace, base_url, mock = proxy
    namespace["ANTHROPIC_URL"] = mock.url + "/broken"
    with _client(base_url) as client:
        stream = client.chat.completions.create(
            model="claude-proxy-1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        seen = []
        with pytest.raises(openai.APIError, match="broke off"):
            for chunk in stream:
                seen.append(chunk)
    assert seen  # content arrived before the break


def test_proxy_answers_an_error_event_before_content_with_an_error(proxy: Any) -> None:
    # The upstream's 200 stream opens with an overloaded error event: the opening hold keeps the
    # client from seeing a 200 stream that breaks at once; it gets an error answer instead.
    namespace, base_url, mock = proxy
    namespace["ANTHROPIC_URL"] = mock.url + "/opening-error"
    with httpcore.ConnectionPool() as pool:
        reply = pool.request(
            "POST",
            base_url + "/chat/completions",
            content=json.dumps(
                {
                    "model": "claude-proxy-1",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                }
            ).encode(),
        )
    assert reply.status == 529
    assert dict(reply.headers)[b"content-type"] == b"application/json"
    error = json.loads(reply.content)["error"]
    assert error["code"] == "gw.upstream.stream_opening_error"
    assert "Overloaded" in error["message"]
    with _client(base_url) as client, pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="claude-proxy-1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert info.value.status_code == 529
    assert mock.received[-1].path == "/opening-error/v1/messages"


def test_proxy_answers_a_stream_broken_before_content_with_an_error(proxy: Any) -> None:
    namespace, base_url, mock = proxy
    namespace["ANTHROPIC_URL"] = mock.url + "/opening-break"
    with _client(base_url) as client, pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="claude-proxy-1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert info.value.status_code == 502
    assert isinstance(info.value.body, dict)
    assert info.value.body["code"] == "gw.upstream.stream_ended_early"


def test_proxy_refuses_a_request_it_cannot_convert(proxy: Any) -> None:
    _, base_url, mock = proxy
    before = len(mock.received)
    with httpcore.ConnectionPool() as pool:
        reply = pool.request("POST", base_url + "/chat/completions", content=b"[1, 2]")
    assert reply.status == 400
    assert json.loads(reply.content)["error"]["type"] == "invalid_request_error"
    assert len(mock.received) == before  # nothing went upstream
